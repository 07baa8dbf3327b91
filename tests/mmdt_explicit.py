"""MMDT in the paper's form (Problem 2) with an explicit transform ``W``: a test reference.

Hoffman et al.'s formulation as written in the MMDTL2 paper: alternate

- W-step: ``min_W ½‖W‖² + c_t Σ_km hinge(y_km (θ_kᵀ W x̂_m + b_k))``,
- SVM-step: ``min_Θ̂ ½‖Θ̂‖² + c_t Σ hinge_t + c_s Σ hinge_s`` on ``[Xs, W X̂t]``,

starting from a source-only SVM. The W-step dual is the MMDTL2 dual with ``A = I``,
``G = X̂tᵀ X̂t`` and no L2 term (paper, end of Section 4):

    max_a −½ aᵀ Y ((ΘᵀΘ) ⊗ (X̂tᵀX̂t)) Y a + (1 − Y b̃)ᵀ a,   0 ≤ a ≤ c_t,

and ``W = Θ (Υ ⊙ Λ)ᵀ X̂tᵀ`` is formed explicitly (``Ls × (Lt + 1)`` doubles). This is the
explicit-W implementation whose memory the paper's Figure 8 shows exploding; it is also an
independent check of the Gram-form MMDTL2 at ``c_f = 1``, ``c_d = 0`` (no ``C``, ``G`` or
``Kz`` algebra here).
"""

from __future__ import annotations

import numpy as np

from mmdtl2_dist.core.qp import solve_box_qp
from mmdtl2_dist.core.svm import linear_svm, one_vs_rest


def fit_mmdt_explicit(
    Xs: np.ndarray,
    ys: np.ndarray,
    Xt: np.ndarray,
    yt: np.ndarray,
    n_classes: int,
    *,
    c_t: float = 1.0,
    c_s: float = 0.05,
    max_iter: int = 20,
    tol: float = 1e-5,
    qp_solver: str = "dcd",
    qp_tol: float = 1e-8,
):
    """Fit MMDT (paper form) with explicit ``W`` and ``Θ``.

    Parameters
    ----------
    Xs : ndarray (N, Ls)
        Source samples; ``ys`` (N,) labels encoded 0..K-1.
    Xt : ndarray (M, Lt)
        Labelled target samples; ``yt`` (M,) labels encoded 0..K-1.
    n_classes : int
        K.
    c_t, c_s : float
        Target and source hinge weights.
    max_iter, tol : int, float
        Alternations and relative stall tolerance on the change of ``W``.

    Returns
    -------
    W : ndarray (Ls, Lt + 1)
    Theta : ndarray (Ls, K)
    b : ndarray (K,)
    n_iter : int
    """
    N, M, K = Xs.shape[0], Xt.shape[0], n_classes
    Xh = np.hstack([Xt, np.ones((M, 1))])
    Kt = Xh @ Xh.T
    Yt = one_vs_rest(yt, K)
    Theta, b = linear_svm(Xs, ys, K, np.full(N, c_s), qp_solver, qp_tol)
    cost = np.r_[np.full(N, c_s), np.full(M, c_t)]
    W = np.zeros((Xs.shape[1], Xh.shape[1]))
    y = Yt.ravel()
    n_iter = 0
    for n_iter in range(1, max_iter + 1):  # noqa: B007
        H = np.kron(Theta.T @ Theta, Kt) * np.outer(y, y)
        f = 1.0 - y * np.repeat(b, M)
        a = solve_box_qp(H, f, 0.0, c_t, solver=qp_solver, tol=qp_tol).x
        W_new = Theta @ (Yt * a.reshape(K, M)) @ Xh
        V = np.vstack([Xs, Xh @ W_new.T])
        Theta, b = linear_svm(V, np.r_[ys, yt], K, cost, qp_solver, qp_tol)
        change = np.linalg.norm(W_new - W) / max(1.0, np.linalg.norm(W_new))
        W = W_new
        if change <= tol:
            break
    return W, Theta, b, n_iter
