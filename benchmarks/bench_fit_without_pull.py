"""The rule's candidate D fitted with and without the L2 pull on pixel shifts, timed by part.

    python benchmarks/bench_fit_without_pull.py --data DIR [--shifts coil2-coil1 mnist-usps]
        [--labels 10 20] [--c-d 0 0.1] [--out benchmarks/results/fit_without_pull.json]

Without the pull (``c_d = 0``) the W-step's dual kernel is ``Kt / c_f``, not shrunk by
``(c_f I + E)⁻¹``: its QPs need many more coordinate sweeps and Newton polishes, and the
alternation more steps (BENCHMARKS.md, "The pull validated by the guard"). This fits D
(shared-PCA prior ``d = 4C``, weight 0.5, ``c_f = 1``, the product's core path
:func:`mmdtl2_dist.core.methods.fit_predict`) on the first split of
``bench_rule_pixels.py``'s dev seed with ``n`` labelled targets a class, every other target
sample unlabelled and scored, and records per fit: the wall time, the W-steps' and
SVM-steps' time, the alternations, the W-steps' sweeps and the predictions (to compare
two versions of the solver). ``DIR`` as for ``bench_rule_pixels.py``. One process, one
BLAS thread; the compiled kernels are warmed up on a small fit first.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_rule_pixels import SEEDS, SHIFTS, labelled_rows, load_shift  # noqa: E402


def one_fit(data: Path, shift: str, n: int, c_d: float) -> dict:
    """D with ``c_d`` on the shift's first dev split: times, alternations, predictions."""
    from mmdtl2_dist.core import auto
    from mmdtl2_dist.core import mmdtl2 as core
    from mmdtl2_dist.core.methods import fit_predict
    from mmdtl2_dist.core.pool import SamplePool, pool_problem
    from mmdtl2_dist.core.preprocessing import fit_preprocessing
    from mmdtl2_dist.core.priors import learnt_pca_map

    Xs, ys, Xt, yt = load_shift(data, shift)
    rng = np.random.default_rng([SEEDS["dev"], list(SHIFTS).index(shift), n, 0])
    lab = labelled_rows(yt, n, rng)
    rest = np.setdiff1d(np.arange(len(yt)), lab)
    Zs = fit_preprocessing(Xs, "l2_zscore").transform(Xs)
    Zt = fit_preprocessing(Xt, "l2_zscore").transform(Xt)
    pool = SamplePool(Zs @ Zs.T, Zt @ Zt.T, Zs @ Zt.T, np.arange(len(Zs)), lab, rest)
    n_classes, p = len(np.unique(ys)), pool.Kyy.shape[0]
    pmap = learnt_pca_map(pool, auto.pca_dim("D", n_classes, p), np.ones(p, bool))
    prob = pool_problem(pool, ys, yt[lab], pmap)
    infos, real = [], core._alternate
    core._alternate = lambda *a, **k: (f := real(*a, **k), infos.append(f.info))[0]
    try:
        t0 = time.perf_counter()
        res = fit_predict("mmdtl2", {**auto.rule_params("D", None), "c_d": c_d}, prob)
        wall = time.perf_counter() - t0
    finally:
        core._alternate = real
    info = infos[-1]
    pred = np.asarray(res.y_pred)
    return {
        "shift": shift, "labels": n, "c_d": c_d, "wstep_variables": n_classes * len(lab),
        "fit_s": wall, "wstep_s": info["time_wstep_s"], "svm_s": info["time_svm_s"],
        "alternations": info["n_iter"], "wstep_sweeps": info["qp_iterations"],
        "accuracy": 100 * float(np.mean(pred == yt[rest])), "predictions": pred.tolist(),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--shifts", nargs="+", default=["coil2-coil1", "mnist-usps"])
    ap.add_argument("--labels", nargs="+", type=int, default=[10, 20])
    ap.add_argument("--c-d", nargs="+", type=float, default=[0.0, 0.1])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/fit_without_pull.json"))
    args = ap.parse_args()
    if args.out.is_dir():
        ap.error(f"--out {args.out} is a folder; give a file name.")
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        one_fit(args.data, args.shifts[0], 2, 0.0)  # compile the kernels
        rows = []
        for shift in args.shifts:
            for n in args.labels:
                for c_d in args.c_d:
                    rows.append(one_fit(args.data, shift, n, c_d))
                    r = rows[-1]
                    print(f"{shift} n={n} c_d={c_d:g}: fit {r['fit_s']:.1f} s (W-steps "
                          f"{r['wstep_s']:.1f} s, SVM-steps {r['svm_s']:.1f} s), "
                          f"{r['alternations']} alternations, {r['accuracy']:.2f} %",
                          flush=True)  # fmt: skip
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python " + " ".join(sys.argv), "commit": commit,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "load_average_after": os.getloadavg(), "fits": rows,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
