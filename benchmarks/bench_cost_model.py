"""The Gram cost model against a GPU run's measured tile times, one plan predicting another.

    python benchmarks/bench_cost_model.py [benchmarks/results/gram_gpu_h200.json]

Reads the stored result of ``benchmarks/bench_gram_gpu.py`` (no GPU needed here). For each
run it calibrates the model's four rates on that run's own phase times (features read per
second of ``read``, copied per second of ``transfer``, useful flops per second of
``product``, Gram bytes written per second of ``write + check + digest``) and predicts
the tile time of every run of the same precision with another tile plan
(:func:`mmdtl2_dist.engine.cost.predict_gram_seconds`, one GPU worker), against the busy
time the run measured. The model without the GPU terms (writing at the read rate, no
copies: the CPU calibration) is printed beside it. Writes ``<input>_cost_model.md``.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from mmdtl2_dist.engine.cost import predict_gram_seconds
from mmdtl2_dist.engine.plan import gram_tile_plan

ITEMSIZE = 4  # the store's float32 features


def written_bytes(n: int, tile_rows: int) -> float:
    """Gram bytes the plan's tiles write (a GPU diagonal tile writes its whole square)."""
    return sum(8.0 * (t.a1 - t.a0) * (t.b1 - t.b0) for t in gram_tile_plan(n, tile_rows))


def calibrated_rates(run: dict, n: int, n_features: int) -> dict:
    """The model's rates from one run's phase times (seconds summed over its tiles)."""
    ph, features = run["phases"], run["rows_read"] * n_features * ITEMSIZE
    return {
        "flops_per_s": run["useful_flops"] / ph["product"],
        "read_bytes_per_s": features / ph["read"],
        "transfer_bytes_per_s": features / ph["transfer"],
        "write_bytes_per_s": written_bytes(n, run["tile_rows"])
        / (ph["write"] + ph["check"] + ph["digest"]),
    }


def busy_seconds(run: dict) -> float:
    """The tiles' measured busy time (one worker: their wall time), from the timing text."""
    return float(re.search(r"busy ([0-9.]+) s", run["timing_text"]).group(1))


def predictions(result: dict) -> list[dict]:
    """Every (calibration run, predicted run) pair of one precision and two plans."""
    n, n_features = result["shape"]
    runs = [r for r in result["runs"] if "phases" in r]
    rows = []
    for cal in runs:
        rates = calibrated_rates(cal, n, n_features)
        cpu_form = {k: rates[k] for k in ("flops_per_s", "read_bytes_per_s")}
        for run in runs:
            if run is cal or run["precision"] != cal["precision"]:
                continue
            kw = dict(tile_rows=run["tile_rows"], workers=1)
            rows.append({
                "precision": run["precision"],
                "calibrated_on": cal["tile_rows"],
                "predicted": run["tile_rows"],
                "measured_s": busy_seconds(run),
                "model_s": predict_gram_seconds(n, n_features, **kw, **rates)["seconds"],
                "cpu_form_s": predict_gram_seconds(n, n_features, **kw, **cpu_form)["seconds"],
            })  # fmt: skip
    return rows


def table(rows: list[dict], result: dict) -> str:
    """The predictions as a Markdown table."""
    lines = [
        f"# Cost model against `{result['command']}` ({result['card']})",
        "",
        "| precision | rates from the plan of | predicts the plan of | measured tile time "
        "| model (GPU terms) | / measured | model without them | / measured |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['precision']} | {r['calibrated_on']:,} rows | {r['predicted']:,} rows "
            f"| {r['measured_s']:.2f} s | {r['model_s']:.2f} s "
            f"| {r['model_s'] / r['measured_s']:.0%} | {r['cpu_form_s']:.2f} s "
            f"| {r['cpu_form_s'] / r['measured_s']:.0%} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).parent / "results" / "gram_gpu_h200.json"
    ap.add_argument("result", nargs="?", type=Path, default=default)
    args = ap.parse_args(argv)
    result = json.loads(args.result.read_text())
    text = table(predictions(result), result)
    print(text)
    args.result.with_name(args.result.stem + "_cost_model.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
