"""CPU time of the Office-Caltech10 study's fits, per method, in one process.

The core columns of ``studies/office_caltech10.toml`` (the skada baselines aside) fitted
on every split of the 12 shifts with one BLAS thread, timed by ``time.process_time`` so
that other jobs on a shared machine inflate the figures less than the study's own wall
clock fit times. Run it from the checkout to measure, and from another commit's checkout
for the other side of a comparison (BENCHMARKS.md, "Office study fit time").

    python benchmarks/bench_office_fits.py [--splits 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import tomllib
from pathlib import Path

import numpy as np
from office_splits import split_problem
from threadpoolctl import threadpool_limits

from mmdtl2_dist.core.methods import METHODS, fit_predict
from mmdtl2_dist.datasets.office_caltech import N_TRIALS, SHIFTS

SPEC = Path(__file__).resolve().parents[1] / "studies" / "office_caltech10.toml"


def core_columns(spec: Path = SPEC) -> list[tuple[str, str, dict]]:
    """``(label, method, params)`` of the spec's fixed-parameter methods that the core fits.

    Columns with a selection (``select``) are left out: the study records their fit and
    selection times itself.
    """
    methods = tomllib.loads(spec.read_text())["methods"]
    return [
        (m["label"], m["method"], m.get("params", {}))
        for m in methods
        if m["method"] in METHODS and "select" not in m and "select" not in m.get("params", {})
    ]


def time_columns(n_splits: int) -> dict[str, dict]:
    """CPU seconds and mean accuracy (%) of each core column over the splits."""
    problems = [split_problem(s, t, k) for s, t in SHIFTS for k in range(n_splits)]
    out = {}
    with threadpool_limits(1):
        fit_predict("target_svm", {}, problems[0][0])  # loads the compiled kernels
        for label, method, params in core_columns():
            t0 = time.process_time()
            acc = [np.mean(fit_predict(method, params, p).y_pred == yq) for p, yq in problems]
            cpu = time.process_time() - t0
            out[label] = {"cpu_s": cpu, "fits": len(problems), "accuracy": 100 * np.mean(acc)}
            print(f"{label:<22} {cpu:8.2f} CPU-s  {100 * np.mean(acc):.4f} %", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", type=int, default=N_TRIALS, help="splits per shift (1-20)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    load = os.getloadavg()
    res = time_columns(args.splits)
    total = sum(r["cpu_s"] for r in res.values())
    print(f"total {total:.2f} CPU-s; load average at start {load[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"load_average": load, "columns": res}, indent=1))


if __name__ == "__main__":
    main()
