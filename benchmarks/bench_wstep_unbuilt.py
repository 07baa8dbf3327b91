"""A W-step-like box QP solved with its Hessian built and unbuilt (seeded; prints).

    python benchmarks/bench_wstep_unbuilt.py [--classes 20] [--targets 300]

The Hessian ``diag(s) (A ⊗ B) diag(s)`` of ``classes × targets`` variables, with
synthetic positive semi-definite factors (``A`` of rank 8, as ``ΘᵀΘ`` is of low rank;
``B`` like ``G``) and Jacobi-scaled, solved by :func:`mmdtl2_dist.core.dcd.dcd_box_qp`
from the unbuilt :class:`~mmdtl2_dist.core.kron.ScaledKron` and from the built array
(its building timed with the solve). Both to the same tolerance; their sweeps and
residuals are printed beside the times.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mmdtl2_dist.core.dcd import dcd_box_qp
from mmdtl2_dist.core.kron import ScaledKron
from mmdtl2_dist.core.qp import jacobi_scale


def problem(K: int, M: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    P, Q = rng.standard_normal((K, 8)), rng.standard_normal((M, 40))
    A, B = P @ P.T, Q @ Q.T / 40 + 0.05 * np.eye(M)
    y = np.where(rng.random(K * M) < 0.1, 1.0, -1.0)
    d = jacobi_scale(np.kron(np.diag(A), np.diag(B)))
    f = d * (1.0 + 0.3 * rng.standard_normal(K * M))
    return ScaledKron(A, B, y * d), f, np.zeros(K * M), 1.0 / d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--classes", type=int, default=20)
    ap.add_argument("--targets", type=int, default=300)
    args = ap.parse_args()
    H, f, lb, ub = problem(args.classes, args.targets)
    small = problem(2, 3)
    dcd_box_qp(small[0], small[1], small[2], small[3], None, 1e-8)  # compile the sweeps
    dcd_box_qp(small[0].dense(), small[1], small[2], small[3], None, 1e-8)
    for name in ("unbuilt", "built"):
        t0 = time.perf_counter()
        r = dcd_box_qp(H if name == "unbuilt" else H.dense(), f, lb, ub, None, 1e-8)
        print(f"{name}: {time.perf_counter() - t0:.2f} s, {r.sweeps} sweeps, residual "
              f"{r.residual:.1e}, K M = {f.size:,}")  # fmt: skip


if __name__ == "__main__":
    main()
