"""The SVM-step: one-vs-rest linear SVMs with per-sample costs, in the dual, on a Gram.

Used by the MMDTL2 alternation (:mod:`mmdtl2_dist.core.mmdtl2`, on source samples and
transformed targets) and by the source and target SVM baselines
(:mod:`mmdtl2_dist.core.methods`; :func:`linear_svm` on explicit features for the
estimators). Each class's dual is a
box QP solved by :func:`mmdtl2_dist.core.qp.solve_prescaled_box_qp`, its Jacobi-scaled
Hessian assembled in one compiled pass (:func:`mmdtl2_dist.core.dcd.svm_hessian`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mmdtl2_dist.core.dcd import svm_hessian
from mmdtl2_dist.core.qp import jacobi_scale, solve_prescaled_box_qp


def one_vs_rest(y: np.ndarray, K: int) -> np.ndarray:
    """``Y`` (K, n): +1 where ``y == k`` else −1."""
    return np.where(y[None, :] == np.arange(K)[:, None], 1.0, -1.0)


@dataclass
class SVMStepResult:
    """One-vs-rest SVMs: ``coef`` (n, K) on the training vectors, ``b`` (K,), QP results."""

    coef: np.ndarray
    b: np.ndarray
    qps: list


def svm_step(
    Kv: np.ndarray,
    Y: np.ndarray,
    cost: np.ndarray,
    *,
    solver: str = "dcd",
    tol: float = 1e-8,
    alpha0: np.ndarray | None = None,
) -> SVMStepResult:
    """One-vs-rest linear SVMs with per-sample costs and a regularised bias, in the dual.

    For each class k the dual of ``min ½(‖θ‖² + b²) + Σ_i c_i max(0, 1 − y_i(θᵀv_i + b))``
    is the box QP ``min ½ αᵀ (Y (Kv + 1) Y) α − 1ᵀα``, ``0 ≤ α ≤ c``: the bias is a
    constant feature of value 1 (as liblinear does), so there is no equality constraint.
    Then ``θ = Σ α_i y_i v_i`` and ``b = Σ α_i y_i``. It is solved in the signed variables
    ``β = Y α`` (the coefficients): ``min ½ βᵀ (Kv + 1) β − yᵀβ`` with ``β_i`` between 0
    and ``y_i c_i``, whose Hessian is the same for every class, so it is built (scaled)
    once per call instead of once per class. ``y_i = ±1`` makes the two problems exact
    mirrors: every step of the solvers on one is the other's with signs flipped, which
    IEEE rounding preserves, so ``α`` is the same to the bit.

    Parameters
    ----------
    Kv : ndarray of shape (n, n)
        Gram of the training vectors (source samples and transformed targets).
    Y : ndarray of shape (K, n)
        One-vs-rest labels.
    cost : ndarray of shape (n,)
        Per-sample hinge weights (``c_s`` for source, ``c_t`` for target samples).
    solver, tol : see :func:`mmdtl2_dist.core.qp.solve_box_qp`.
    alpha0 : ndarray of shape (K, n), optional
        Warm start.

    Returns
    -------
    SVMStepResult
        ``coef[:, k] = α_k ⊙ y_k``.
    """
    K, n = Y.shape
    Kv = np.ascontiguousarray(Kv, dtype=np.float64)
    if not np.all(np.isfinite(Kv)):
        raise ValueError("the SVM-step Gram has NaN or Inf entries; check the input features.")
    coef = np.zeros((n, K))
    qps = []
    # Two classes: the second one-vs-rest problem is the first with every label flipped,
    # the same QP (Hessian Y Kb Y unchanged), so α is shared and coef, b change sign.
    mirrored = K == 2 and np.array_equal(Y[1], -Y[0])
    d = jacobi_scale(np.diag(Kv) + 1.0)
    Hs = svm_hessian(Kv, d)  # the scaled Hessian of every class's signed dual
    for k in range(K):
        y = Y[k]
        if mirrored and k == 1:
            coef[:, 1] = -coef[:, 0]
            qps.append(qps[0])
            continue
        res = solve_prescaled_box_qp(
            Hs, y, d, np.minimum(0.0, y * cost), np.maximum(0.0, y * cost), solver=solver,
            tol=tol, x0=None if alpha0 is None else alpha0[k] * y,
        )  # fmt: skip
        coef[:, k] = res.x
        res.x = res.x * y  # α, as the callers read it
        qps.append(res)
    return SVMStepResult(coef, coef.sum(axis=0), qps)


def linear_svm(V, y_enc, K, cost, qp_solver="dcd", qp_tol=1e-8):
    """One-vs-rest linear SVMs on explicit features ``V`` (n, L); returns ``(Θ (L, K), b)``.

    With fewer features than samples (``L + 1 < n``) the dual Hessian ``Y (V Vᵀ + 1) Y`` is
    singular (rank ``L + 1``) and the primal, with ``L + 1 + n`` variables and an
    interior-point solver, is the better-conditioned problem; otherwise the dual box QP.
    Both solve ``min ½(‖θ‖² + b²) + Σ c_i hinge_i`` exactly.
    """
    n, L = V.shape
    if L + 1 < n:
        from mmdtl2_dist.core.reference import svm_primal

        return svm_primal(V, y_enc, K, cost)
    res = svm_step(V @ V.T, one_vs_rest(y_enc, K), cost, solver=qp_solver, tol=qp_tol)
    return V.T @ res.coef, res.b
