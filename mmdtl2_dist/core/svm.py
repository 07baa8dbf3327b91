"""The SVM-step: one-vs-rest linear SVMs with per-sample costs, in the dual, on a Gram.

Used by the MMDTL2 alternation (:mod:`mmdtl2_dist.core.mmdtl2`, on source samples and
transformed targets) and by the source and target SVM baselines
(:mod:`mmdtl2_dist.core.methods`; :func:`linear_svm` on explicit features for the
estimators). Each class's dual is a
box QP solved by :func:`mmdtl2_dist.core.qp.solve_prescaled_box_qp`, its Jacobi-scaled
Hessian assembled in one compiled pass (:func:`mmdtl2_dist.core.dcd.svm_hessian`).
"""

from __future__ import annotations

import copy
import hashlib
import threading
from collections import OrderedDict
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


#: Most columns ``L + 1`` (features and bias) for which :func:`linear_svm` solves the primal.
PRIMAL_MAX_COLUMNS = 32


def linear_svm(V, y_enc, K, cost, qp_solver="dcd", qp_tol=1e-8):
    """One-vs-rest linear SVMs on explicit features ``V`` (n, L); returns ``(Θ (L, K), b)``.

    Both routes solve ``min ½(‖θ‖² + b²) + Σ c_i hinge_i`` exactly. The dual box QP, unless
    there are at most :data:`PRIMAL_MAX_COLUMNS` columns and fewer than samples: then its
    Hessian ``Y (V Vᵀ + 1) Y`` has rank ``L + 1`` of ``n`` and coordinate descent crawls
    along the null space, while the primal (``L + 1 + n`` variables, an interior-point
    solver, about ``n L²`` a step) is cheap. The primal's cost grows like ``L²``: with
    1,000 samples it took 0.05, 1.0 and 22 s for 10, 100 and 800 features against 0.7,
    0.2 and 0.1 s for the dual, and 436 s against 0.6 s for 2,048 features and 2,795
    samples (BENCHMARKS.md, "Linear SVMs on explicit features"). The dual holds two
    ``n × n`` arrays; where they would not fit in the available memory and there are
    fewer columns than samples, the primal (``O(n L)`` memory) is solved instead.
    """
    from mmdtl2_dist.core.memory import available_bytes

    n, L = V.shape
    if L + 1 < n and (L + 1 <= PRIMAL_MAX_COLUMNS or 16 * n * n > available_bytes()):
        from mmdtl2_dist.core.reference import svm_primal

        return svm_primal(V, y_enc, K, cost)
    res = svm_step(V @ V.T, one_vs_rest(y_enc, K), cost, solver=qp_solver, tol=qp_tol)
    return V.T @ res.coef, res.b


#: :func:`svm_step_reused` keeps this many results.
REUSED_SVMS = 4
_reused: OrderedDict[bytes, SVMStepResult] = OrderedDict()
_reused_lock = threading.Lock()


def svm_step_reused(
    Kv: np.ndarray, Y: np.ndarray, cost: np.ndarray, *, solver: str = "dcd", tol: float = 1e-8
) -> SVMStepResult:
    """:func:`svm_step` from a cold start, reusing the result of an identical recent call.

    For MMDTL2's first SVM, which depends only on the source samples, their labels,
    ``c_s`` and the solver: the candidates of ``select="auto"`` or of a grid, on every
    fold, and the other methods of a study's split start from the same one (up to 13 of
    the rule's 17 fits). The solvers are deterministic, so a reused result is the one a new
    solve would give, to the bit. Calls are told apart by a hash of every input
    (blake2b: 25 ms for a 2,600-sample Gram, against seconds for the solve); the last
    :data:`REUSED_SVMS` results are kept, and each caller gets its own copy.
    """
    key = _svm_key(Kv, Y, cost, solver, tol)
    with _reused_lock:
        hit = _reused.get(key)
        if hit is not None:
            _reused.move_to_end(key)
            return copy.deepcopy(hit)
    res = svm_step(Kv, Y, cost, solver=solver, tol=tol)
    with _reused_lock:
        _reused[key] = copy.deepcopy(res)
        while len(_reused) > REUSED_SVMS:
            _reused.popitem(last=False)
    return res


def _svm_key(Kv, Y, cost, solver: str, tol: float) -> bytes:
    h = hashlib.blake2b(digest_size=20)
    for a in (Kv, Y, cost):
        a = np.ascontiguousarray(a, dtype=np.float64)
        h.update(repr(a.shape).encode())
        h.update(memoryview(a).cast("B"))
    h.update(f"{solver}|{tol!r}".encode())
    return h.digest()
