"""What ``select="auto"`` costs against one fit of the configuration it picks.

    python benchmarks/bench_selection_cost.py [--splits 20]
        [--out benchmarks/results/selection_cost.json]

The issue's target: the selection costs at most 10 single fits of the chosen
configuration, measured on the Office study (Office-Caltech10 SURF, Hoffman's 20 splits
of the 12 shifts, 3 labelled targets a class, the whole target domain in the pool as the
study's transductive protocol has it). For every split, in one process with one BLAS
thread, the wall time of

- the selection (:func:`~mmdtl2_dist.core.auto.select_auto`: the pool's
  eigendecompositions, every candidate's fold fits, the self-training check's refits),
- the rule's final fit of the pick (the labelled and pseudo-labelled targets, scoring the
  test samples and the unlabelled targets it smooths over, its prior reused from the
  selection) and the neighbour smoothing of its scores on a hard shift, and
- **one plain fit of the chosen configuration**, as a user fitting it alone would run it:
  the pool's Gram formed, the pick's prior built (a shared-PCA pick: the pool's
  eigendecomposition and the prior's blocks; nothing for the identity prior or the target
  SVM) and the pick fitted once on the labelled targets (no pseudo-labels, no smoothing:
  those are the rule's),

and the number of fits. Reported, as the median, the 90th percentile, the ratio of the
sums over the splits and the number of splits above 10: selection / one plain fit (the
target's measure), and selection / the rule's own final fit and smoothing. Each split is
timed once; the study's own ``cv_s`` and ``fit_s`` measure the selection and the rest
with a Ray worker's overheads around them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
from office_splits import split_pool
from threadpoolctl import threadpool_limits

from mmdtl2_dist.core.auto import AutoChoice, select_auto
from mmdtl2_dist.core.auto_fit import smoothed_result
from mmdtl2_dist.core.methods import fit_predict
from mmdtl2_dist.core.pool import SamplePool, pool_problem
from mmdtl2_dist.core.priors import learnt_pca_map
from mmdtl2_dist.datasets.office_caltech import SHIFTS


def timed_split(source: str, target: str, k: int) -> dict:
    pool, ys, yt, yq = split_pool(source, target, k)
    t0 = time.perf_counter()
    choice = select_auto(pool, ys, yt)
    t1 = time.perf_counter()
    res = fit_predict(choice.method, choice.params, choice.problem)
    t2 = time.perf_counter()
    res = smoothed_result(res, pool, choice.neighbours)
    t3 = time.perf_counter()
    return {
        "shift": f"{source}-{target}", "split": k, "pick": choice.pick,
        "n_fits": choice.n_fits, "select_s": t1 - t0, "fit_s": t2 - t1, "smooth_s": t3 - t2,
        "plain_fit_s": plain_fit_seconds(pool, ys, yt, choice),
        "accuracy": 100 * float(np.mean(res.y_pred == yq)),
    }  # fmt: skip


def plain_fit_seconds(pool: SamplePool, ys, yt, choice: AutoChoice) -> float:
    """Wall time of the chosen configuration fitted once from the split's Grams alone."""
    t0 = time.perf_counter()
    fresh = SamplePool(pool.Kss, pool.Ktt, pool.Kst, pool.source_train, pool.target_train,
                       pool.target_test)  # fmt: skip
    pmap = learnt_pca_map(fresh, choice.pca_dim, np.ones(fresh.Kyy.shape[0], bool))
    fit_predict(choice.method, choice.params, pool_problem(fresh, ys, yt, pmap))
    return time.perf_counter() - t0


def ratios(runs: list[dict], denominator) -> dict:
    r = np.array([u["select_s"] / denominator(u) for u in runs])
    total = sum(u["select_s"] for u in runs) / sum(denominator(u) for u in runs)
    return {
        "median": float(np.median(r)), "p90": float(np.quantile(r, 0.9)), "sums": total,
        "above_10": int((r > 10).sum()),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--splits", type=int, default=20, help="Hoffman's splits per shift")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/selection_cost.json"))
    args = ap.parse_args()
    t0, load0 = time.perf_counter(), os.getloadavg()
    with threadpool_limits(1):
        runs = [timed_split(s, t, k) for s, t in SHIFTS for k in range(args.splits)]
    summary = {
        "selection / one plain fit of the chosen configuration": ratios(
            runs, lambda u: u["plain_fit_s"]
        ),
        "selection / the rule's final fit and smoothing": ratios(
            runs, lambda u: u["fit_s"] + u["smooth_s"]
        ),
        "fits": {"min": min(u["n_fits"] for u in runs), "max": max(u["n_fits"] for u in runs)},
        "mean accuracy": float(np.mean([u["accuracy"] for u in runs])),
    }
    print(json.dumps(summary, indent=1))
    meta = {
        "command": "python benchmarks/bench_selection_cost.py " + " ".join(os.sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "load_average_before": load0,
        "load_average_after": os.getloadavg(),
        "seconds": time.perf_counter() - t0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
