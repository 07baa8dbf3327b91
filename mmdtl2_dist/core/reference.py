"""Reference solvers in the feature (primal) form, for small dimensions only.

These are the correctness references of the Gram-form dual (and the paper's timing
comparison): they build ``W`` and ``Θ`` explicitly and solve the *primal* QPs,
a route that shares nothing with the dual assembly of :mod:`mmdtl2_dist.core.mmdtl2`
(no ``G``, no ``C``, no kernels, no box QP), with an interior-point solver (Clarabel).

Primal W-step (paper Appendix A, Lemma 4, with the prior ``W0``)
----------------------------------------------------------------
With ``w = vec(W)`` row-major (length ``Ls (Lt+1)``) and ``ξ`` (K·M):

    min ½ wᵀ V w − q̄ᵀ w + c_t 1ᵀ ξ
    s.t. ξ ≥ 0,  y_km (vec(θ_k x̂_mᵀ)ᵀ w + b_k) ≥ 1 − ξ_km,

where ``V = I_Ls ⊗ A``, ``A = c_f I + X̂t S_M X̂tᵀ`` and ``q̄ = vec(c_f W0 + Xs S X̂tᵀ)``
(the paper's ``q`` plus the prior's ``c_f W0``). Memory is O((Ls Lt)²) in the worst case:
this is why the paper calls the primal impractical beyond ``L ≈ 180``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from mmdtl2_dist.core.errors import QPSolveError
from mmdtl2_dist.core.mmdtl2 import MMDTL2Params, similarity_weights
from mmdtl2_dist.core.svm import one_vs_rest


def augment(X: np.ndarray) -> np.ndarray:
    """Append the constant 1 to every sample (rows): ``x̂ = (x, 1)``."""
    return np.hstack([X, np.ones((X.shape[0], 1))])


def _primal_solve(P, q, A, lo, what):
    """``min ½xᵀPx + qᵀx`` s.t. ``A x ≥ lo`` with Clarabel (interior point).

    An interior-point method is used on purpose: it shares nothing with the
    coordinate-descent and operator-splitting solvers of the dual, and it stays accurate
    on the badly scaled problems (``c_f`` = 1e-6 with ``c_d = 0``) where first-order
    methods stall.
    """
    import clarabel

    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = settings.tol_gap_rel = 1e-11
    settings.tol_feas = 1e-11
    settings.max_iter = 500
    cone = [clarabel.NonnegativeConeT(A.shape[0])]
    solver = clarabel.DefaultSolver(
        sp.triu(sp.csc_matrix(P), format="csc"),
        np.asarray(q, float),
        -sp.csc_matrix(A),
        -lo,
        cone,
        settings,
    )
    sol = solver.solve()
    if str(sol.status) not in ("Solved", "AlmostSolved"):
        raise QPSolveError(f"Clarabel could not solve the primal {what}: status {sol.status}.")
    return np.asarray(sol.x)


def wstep_primal(
    Xs: np.ndarray,
    ys: np.ndarray,
    Xt: np.ndarray,
    yt: np.ndarray,
    Theta: np.ndarray,
    b: np.ndarray,
    params: MMDTL2Params,
    W0: np.ndarray | None = None,
) -> np.ndarray:
    """Solve the W-step in the primal; returns ``W`` of shape (Ls, Lt + 1).

    Parameters
    ----------
    Xs : ndarray (N, Ls)
        Source samples (rows).
    ys, yt : ndarray
        Labels encoded 0..K-1.
    Xt : ndarray (M, Lt)
        Labelled target samples (rows, not augmented).
    Theta : ndarray (Ls, K)
        Hyperplane weights; ``b`` (K,) their biases.
    params : MMDTL2Params
        ``c_f``, ``c_d``, ``c_t`` are used.
    W0 : ndarray (Ls, Lt + 1), optional
        Prior transform (default zero, the paper).
    """
    N, Ls = Xs.shape
    M, Lt = Xt.shape
    K = Theta.shape[1]
    Xh = augment(Xt)  # (M, Lt+1)
    D = Lt + 1
    S = similarity_weights(ys, yt, params.c_d)
    A = params.c_f * np.eye(D) + Xh.T @ (S.sum(axis=0)[:, None] * Xh)
    W0 = np.zeros((Ls, D)) if W0 is None else W0
    qbar = (params.c_f * W0 + Xs.T @ S @ Xh).ravel()
    nw, nx = Ls * D, K * M
    P = sp.block_diag([sp.kron(sp.identity(Ls), sp.csc_matrix(A)), sp.csc_matrix((nx, nx))])
    q = np.r_[-qbar, np.full(nx, params.c_t)]
    Y = one_vs_rest(yt, K)
    # Row k*M+m: y_km vec(θ_k x̂_mᵀ)ᵀ w + ξ_km ≥ 1 − y_km b_k.
    Phi = np.einsum("lk,md->kmld", Theta, Xh).reshape(nx, nw)
    cons = sp.vstack(
        [
            sp.hstack([sp.csc_matrix(Y.ravel()[:, None] * Phi), sp.identity(nx)]),
            sp.hstack([sp.csc_matrix((nx, nw)), sp.identity(nx)]),
        ]
    )
    lo = np.r_[1.0 - (Y * b[:, None]).ravel(), np.zeros(nx)]
    x = _primal_solve(P, q, cons, lo, "W-step")
    return x[:nw].reshape(Ls, D)


def svm_primal(V: np.ndarray, y: np.ndarray, K: int, cost: np.ndarray):
    """One-vs-rest linear SVMs with a regularised bias, solved in the primal (Clarabel).

    ``min ½(‖θ_k‖² + b_k²) + Σ_i c_i ξ_i`` s.t. ``y_ki (θ_kᵀ v_i + b_k) ≥ 1 − ξ_i``, ``ξ ≥ 0``.
    Returns ``(Theta (L, K), b (K,))``.
    """
    n, L = V.shape
    Y = one_vs_rest(y, K)
    Theta = np.zeros((L, K))
    b = np.zeros(K)
    P = sp.block_diag([sp.identity(L + 1), sp.csc_matrix((n, n))])
    q = np.r_[np.zeros(L + 1), cost]
    Vh = augment(V)
    for k in range(K):
        cons = sp.vstack(
            [
                sp.hstack([sp.csc_matrix(Y[k][:, None] * Vh), sp.identity(n)]),
                sp.hstack([sp.csc_matrix((n, L + 1)), sp.identity(n)]),
            ]
        )
        lo = np.r_[np.ones(n), np.zeros(n)]
        x = _primal_solve(P, q, cons, lo, "SVM")
        Theta[:, k], b[k] = x[:L], x[L]
    return Theta, b


def fit_mmdtl2_features(
    Xs: np.ndarray,
    ys: np.ndarray,
    Xt: np.ndarray,
    yt: np.ndarray,
    n_classes: int,
    params: MMDTL2Params,
    *,
    W0: np.ndarray | None = None,
    n_iter: int | None = None,
):
    """The alternation with explicit ``W`` and ``Θ`` (linear kernel), primal solvers only.

    Runs exactly ``n_iter`` alternations (default ``params.max_iter``) after a source-only
    SVM. Returns ``(W, Theta, b)``; a target sample ``x`` scores ``Θᵀ W x̂ + b``.
    """
    N = Xs.shape[0]
    M = Xt.shape[0]
    K = n_classes
    Theta, b = svm_primal(Xs, ys, K, np.full(N, params.c_s))
    cost = np.r_[np.full(N, params.c_s), np.full(M, params.c_t)]
    W = None
    for _ in range(params.max_iter if n_iter is None else n_iter):
        W = wstep_primal(Xs, ys, Xt, yt, Theta, b, params, W0)
        V = np.vstack([Xs, augment(Xt) @ W.T])
        Theta, b = svm_primal(V, np.r_[ys, yt], K, cost)
    return W, Theta, b


def box_qp(H: np.ndarray, f: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> np.ndarray:
    """``min ½ xᵀHx − fᵀx`` s.t. ``lb ≤ x ≤ ub`` by interior point (Clarabel), clipped.

    The reference of the box-QP solvers of :mod:`mmdtl2_dist.core.qp`: no coordinate
    descent, no operator splitting. ``ub`` may hold ``+inf``.
    """
    lb, ub = np.asarray(lb, dtype=np.float64), np.asarray(ub, dtype=np.float64)
    n = f.shape[0]
    fin = np.isfinite(ub)
    A = np.vstack([np.eye(n), -np.eye(n)[fin]])
    x = _primal_solve(0.5 * (H + H.T), -np.asarray(f, float), A, np.r_[lb, -ub[fin]], "box QP")
    return np.clip(x, lb, ub)
