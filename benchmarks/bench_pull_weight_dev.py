"""The L2 pull's weight ``c_d`` and more labelled targets: a dev probe on raw pixels.

    python benchmarks/bench_pull_weight_dev.py --data DIR [--splits 4]

MMDTL2's W-step pulls every labelled target towards the source samples of its class,
``½ Σ_nm s_nm ‖W x̂_m − x_n‖²`` with ``s_nm = c_d [y_n = y_m]``: for a target of class
``k`` that is ``N_k c_d ‖W x̂_m − μ_k‖²`` plus a constant (``μ_k`` the class's source
mean, ``N_k`` its source count), so the pull grows with the source's size and, summed,
with the number of labelled targets, against ``½ c_f ‖W − W0‖²``. This probe fits the
rule's default candidate D (shared-PCA prior ``d = 4C``, weight 0.5, ``c_f = 1``) with the
core's ``c_d = 0.1`` and smaller values, beside the target SVM, on the pixel dev splits of
``bench_rule_pixels.py`` (seed 2040; every source image labelled; no self-training) at 3
and 10 labels a class. ``DIR`` holds that script's data. Writes
``benchmarks/results/pull_weight_dev.{json,md}``.
"""

from __future__ import annotations

import argparse
import itertools
import json
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from bench_rule_pixels import SEEDS, SHIFTS, labelled_rows, load_shift
from threadpoolctl import threadpool_limits

from mmdtl2_dist.core import auto
from mmdtl2_dist.core.methods import fit_predict
from mmdtl2_dist.core.pool import SamplePool
from mmdtl2_dist.core.preprocessing import fit_preprocessing
from mmdtl2_dist.core.priors import learnt_pca_map

PULL_WEIGHTS = (0.1, 0.05, 0.02, 0.01, 0.0)
PROBED = ("mnist-usps", "coil1-coil2")


def one_split(job) -> dict:
    """D at every ``c_d`` of :data:`PULL_WEIGHTS` and the target SVM on one split (%)."""
    data, shift, n, split = job
    with threadpool_limits(1):
        Xs, ys, Xt, yt = load_shift(Path(data), shift)
        rng = np.random.default_rng([SEEDS["dev"], list(SHIFTS).index(shift), n, split])
        lab = labelled_rows(yt, n, rng)
        rest = np.setdiff1d(np.arange(len(yt)), lab)
        Zs = fit_preprocessing(Xs, "l2_zscore").transform(Xs)
        Zt = fit_preprocessing(Xt, "l2_zscore").transform(Xt)
        pool = SamplePool(Zs @ Zs.T, Zt @ Zt.T, Zs @ Zt.T, np.arange(len(Zs)), lab, rest)
        p = pool.Kyy.shape[0]
        pmap = learnt_pca_map(pool, auto.pca_dim("D", len(np.unique(ys)), p), np.ones(p, bool))
        prob = auto.pool_problem(pool, ys, yt[lab], pmap)
        acc = lambda res: 100 * float(np.mean(res.y_pred == yt[rest]))  # noqa: E731
        out = {"job": [shift, n, split]}
        for c_d in PULL_WEIGHTS:
            out[f"D c_d={c_d:g}"] = acc(
                fit_predict("mmdtl2", {**auto.rule_params("D", None), "c_d": c_d}, prob)
            )
        out["target SVM"] = acc(
            fit_predict("target_svm", {}, auto.pool_problem(pool, ys, yt[lab], None))
        )
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--splits", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    jobs = [(str(args.data), s, n, k) for s in PROBED for n in (3, 10) for k in range(args.splits)]
    with Pool(args.workers) as workers:
        records = workers.map(one_split, jobs)
    keys = [k for k in records[0] if k != "job"]
    lines = [f"# `python benchmarks/bench_pull_weight_dev.py --data DIR --splits {args.splits}`",
             "", "| shift | labels | " + " | ".join(keys) + " |",
             "|---|---:|" + "---:|" * len(keys)]  # fmt: skip
    for s, n in itertools.product(PROBED, (3, 10)):
        rs = [r for r in records if r["job"][:2] == [s, n]]
        lines.append(
            f"| {s} | {n} | "
            + " | ".join(f"{np.mean([r[k] for r in rs]):.1f}" for k in keys)
            + " |"
        )
    out = Path(__file__).parent / "results" / "pull_weight_dev"
    out.with_suffix(".json").write_text(json.dumps(records))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
