"""Study benchmarks: the bundled Office-Caltech10 study, and the paper-scale synthetic one.

    python benchmarks/bench_study.py office      # 12 shifts x 20 splits x all methods
    python benchmarks/bench_study.py synthetic   # 734 + 279 samples, 64,896-d, 10 x 12

    python benchmarks/bench_study.py office --executor local   # worker processes, no Ray

Each runs the real study end to end (``run_study``: data, Grams, trials, MLflow on
SQLite, report) in a fresh folder with ``--num-cpus`` CPUs, on the Ray Tune executor (a
local Ray, the default) or the local one (``--executor local``), and prints and writes
(``benchmarks/results/study_<which>.json``, ``study_<which>_local.json`` for the local
executor):

- the total wall time and its stages: executor start, data + Gram, trials, report;
- where the CPU time of the trial phase (CPUs x its wall time) went: method fits
  (``solver_cpu_s``), Gram slicing, other in-trial time, idle CPUs while trials were
  still waiting to start (``scheduling_idle_cpu_s``: the executor and driver-side MLflow
  overhead) and idle CPUs after the last trial started (``tail_idle_cpu_s``: load
  imbalance); see ``mmdtl2_dist.study.timing.study_timing``.

``synthetic`` also measures the alternative the Gram-once design avoids: computing each
trial's kernel blocks (Kss, Ktt, Ktq, Kst, Ksq and the test norms) from the features
of the split. It times that for a sample of units (reading the rows from the store,
preprocessing them, the products) and extrapolates to every fit of the study; the ratio
is (that + solver time) / (the study's measured time).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from mmdtl2_dist.study.runner import run_study  # noqa: E402
from mmdtl2_dist.study.spec import load_spec  # noqa: E402

SPECS = {"office": "office_caltech10.toml", "synthetic": "synthetic_conv3.toml"}


def feature_kernel_cost(out: Path, n_units: int = 6, seed: int = 0) -> dict:
    """Time the per-unit kernel blocks computed from features (the avoided design)."""
    from mmdtl2_dist.core.preprocessing import l2_normalize
    from mmdtl2_dist.store.feature_store import FeatureStore
    from mmdtl2_dist.study.splits import labelled_subset
    from mmdtl2_dist.study.trial import load_plan

    plan = load_plan(str(out / "plan.json"))
    pair = plan.pairs[0]
    fs = FeatureStore.open(pair.store)
    rng = np.random.default_rng(seed)
    times = []
    for _ in range(n_units):
        sp = pair.splits[int(rng.integers(len(pair.splits)))]
        n = int(rng.choice([1, 5, 20, 40]))
        t = labelled_subset(sp, pair.y_target, n)
        t0 = time.perf_counter()
        Xs = l2_normalize(fs.read(pair.source, pair.source_space, np.sort(sp.source_train)))
        Xt = l2_normalize(fs.read(pair.target, pair.target_space, np.sort(t)))
        Xq = l2_normalize(fs.read(pair.target, pair.target_space, sp.target_test))
        _ = Xs @ Xs.T, Xt @ Xt.T, Xt @ Xq.T, Xs @ Xt.T, Xs @ Xq.T, (Xq * Xq).sum(1)
        times.append(time.perf_counter() - t0)
    return {
        "units_timed": n_units,
        "per_unit_s": float(np.mean(times)),
        "per_unit_s_min": float(np.min(times)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", choices=sorted(SPECS))
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--executor", choices=["local", "ray"], default="ray")
    ap.add_argument("--output", default=None, help="study folder (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the study folder")
    args = ap.parse_args()
    tmp = Path(args.output or tempfile.mkdtemp(prefix=f"bench_study_{args.which}_"))
    if tmp.exists() and args.output:
        shutil.rmtree(tmp)
    spec = load_spec(ROOT / "studies" / SPECS[args.which], output=tmp)
    t0 = time.perf_counter()
    rep = run_study(spec, executor=args.executor, num_cpus=args.num_cpus, progress=True)
    total = time.perf_counter() - t0
    stages = json.loads((tmp / "study.json").read_text())["last_run"]
    tab = rep["table"]
    row = {
        "which": args.which,
        "spec": SPECS[args.which],
        "num_cpus": args.num_cpus,
        "load_average_1_5_15": os.getloadavg(),
        "total_s": total,
        **{k: v for k, v in stages.items() if k not in ("trials_t0", "trials_t1")},
        **rep["timing"],
    }
    payloads = [json.loads(p.read_text()) for p in (tmp / "results").glob("*.json")]
    row["solver_cpu_s_by_method"] = {
        label: float(sum(p["solver_s"] for p in payloads if p["label"] == label))
        for label in dict.fromkeys(p["label"] for p in payloads)
    }
    if args.which == "synthetic":
        fk = feature_kernel_cost(tmp)
        row["feature_kernels"] = fk
        # Parallel like the study: the per-unit products over the same slots.
        projected = (row["fits"] * fk["per_unit_s"] + row["solver_cpu_s"]) / args.num_cpus
        row["feature_kernel_projected_s"] = projected
        row["speedup_vs_feature_kernels"] = projected / total
    row["accuracy_table"] = tab[tab["pair"] == tab["pair"].iloc[-1]][
        ["n_per_class", "label", "mean", "std", "marks"]
    ].to_dict("records")
    suffix = "" if args.executor == "ray" else f"_{args.executor}"
    res = ROOT / "benchmarks" / "results" / f"study_{args.which}{suffix}.json"
    res.parent.mkdir(parents=True, exist_ok=True)
    res.write_text(json.dumps(row, indent=1, default=float))
    print(rep["summary"])
    print()
    for k, v in row.items():
        if k != "accuracy_table":
            print(f"{k:34s} {v:.2f}" if isinstance(v, float) else f"{k:34s} {v}")
    print(f"wrote {res}")
    if not args.keep and not args.output:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
