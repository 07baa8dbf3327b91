"""Fit time of MMDTL2 (linear) from precomputed Grams, split into W-step and SVM-step.

Issue 2's figures: N = 367, M = 80, K = 2 (the paper's NBI sizes) and N = 2,000, M = 400,
K = 10. Features are seeded synthetic CNN-like vectors (L = 4,096, class means plus noise,
a device shift on the target); only their Grams enter the timed fit. One BLAS thread
(small matrices are faster single-threaded on this shared 2-core machine).

    python benchmarks/bench_fit.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from mmdtl2_dist.core.mmdtl2 import MMDTL2Params, fit_mmdtl2_gram

CASES = [(367, 80, 2), (2000, 400, 10)]


def make_grams(N, M, K, L=4096, seed=0):
    rng = np.random.default_rng(seed)
    mu = rng.standard_normal((K, L)) * 0.15
    ys = np.arange(N) % K
    yt = np.arange(M) % K
    Xs = np.maximum(mu[ys] + rng.standard_normal((N, L)) * 0.3, 0)
    shift = rng.standard_normal(L) * 0.1
    Xt = np.maximum(mu[yt] + shift + rng.standard_normal((M, L)) * 0.3, 0)
    Xs /= np.linalg.norm(Xs, axis=1, keepdims=True)
    Xt /= np.linalg.norm(Xt, axis=1, keepdims=True)
    Kz = np.zeros((N + M, N + M))
    Kz[:N, :N] = Xs @ Xs.T
    return Kz, Xt @ Xt.T + 1.0, ys, yt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fit.json")
    args = ap.parse_args()
    rows = []
    for N, M, K in CASES:
        Kz, Kt, ys, yt = make_grams(N, M, K)
        best = None
        with threadpool_limits(1):
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                fit = fit_mmdtl2_gram(Kz, Kt, ys, yt, K, MMDTL2Params())
                total = time.perf_counter() - t0
                if best is None or total < best["total_s"]:
                    best = {
                        "N": N, "M": M, "K": K, "KM": K * M, "total_s": total,
                        "wstep_s": fit.info["time_wstep_s"], "svm_s": fit.info["time_svm_s"],
                        "n_iter": fit.info["n_iter"],
                        "max_wstep_kkt": max(fit.info["qp_kkt_residual"]),
                        "max_svm_kkt": max(fit.info["svm_kkt_residual"]),
                    }  # fmt: skip
        rows.append(best)
        print(
            f"N={N:5d} M={M:4d} K={K:2d}: fit {best['total_s']:.3f} s "
            f"(W-step {best['wstep_s']:.3f} s, SVM-step {best['svm_s']:.3f} s, "
            f"{best['n_iter']} alternations, KKT W {best['max_wstep_kkt']:.0e} / "
            f"SVM {best['max_svm_kkt']:.0e})"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": f"{platform.machine()}, 2 cores, 24 GB (shared)", "repeats": args.repeats}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
