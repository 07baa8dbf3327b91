"""MMDTL2 on Gram matrices: the problem, the SVM-step, the alternation, prediction.

Notation, equation, lemma and corollary numbers follow Tamaki et al. (the paper: *Domain
Adaptation with L2 constraints for classifying images from different endoscope systems*).

The problem (paper eq. (9)-(10), generalised with a prior transform ``W0``)
-----------------------------------------------------------------------------
Alternate between

- **W-step**: ``min_W ½ c_f ‖W − W0‖² + c_t Σ_km ξ_km + ½ Σ_nm s_nm ‖W x̂_m − x_n‖²``
  s.t. ``y_km (θ_kᵀ W x̂_m + b_k) ≥ 1 − ξ_km``, ``ξ ≥ 0``;
- **SVM-step**: ``min_Θ̂ ½ ‖Θ̂‖² + c_t Σ_km hinge(y_km θ̂_kᵀ (W x̂_m; 1))``
  ``+ c_s Σ_kn hinge(y_kn θ̂_kᵀ x̂_n)``
  (one-vs-rest, the bias regularised with the weights),

where ``s_nm = c_d [y_n = y_m]``. ``W0 = 0`` is the paper. With ``W = W0 + Δ`` the W-step is
the paper's problem in ``Δ`` with two changes: every constraint gets the offset
``θ_kᵀ W0 x̂_m`` (added to ``b_k``), and the L2 pull targets the residuals
``x_n − W0 x̂_m``. The paper's derivation (appendix, Lemmas 3-7 and Corollary 1) then goes
through unchanged with ``q = vec(Σ s_nm (x_n − W0 x̂_m) x̂_mᵀ) = vec((Xs S − W0 X̂t S_M) X̂tᵀ)``
and ``b̃_km = b_k + θ_kᵀ W0 x̂_m``, giving the dual

    max_a −½ aᵀ Y ((ΘᵀΘ) ⊗ G) Y a + (1 − Y b̃ − Y vec(Θᵀ R G))ᵀ a,  0 ≤ a ≤ c_t,

with ``R = Xs S − W0 X̂t S_M`` (paper: ``R = Xs S``), class-major ``a`` and row-major vec,
and the retrieval (paper Corollary 2) ``Δ = (R + Θ (Υ ⊙ Λ)ᵀ) X̂tᵀ A⁻¹``; that dual is
assembled and solved in :mod:`mmdtl2_dist.core.wstep`.

Everything on Gram matrices
---------------------------
Let ``u_m = W0 x̂_m`` (``0`` for the paper's prior, ``μ x_m`` for the identity prior with weight
``μ``, ``μ (M x_m + w)`` for a user map ``[M | w]``) and ``Z = [Xs, U]`` (N + M vectors of the
source space). Θ always lies in the span of ``Z``: ``Θ = Z β``. Then ``R = Z R_c`` with
``R_c = [S; −S_M]``, the transformed training targets are ``W x̂_m = Z ω_m`` with
``Ω = E_u + Γ G``, ``Γ = R_c + β (Υ⊙Λ)ᵀ`` and ``E_u = [0; I_M]``, and all the algorithm needs is
``Kz = ZᵀZ`` and the target kernel ``Kt``. A new target sample scores
``P k(x̂) + βᵀ Zᵀ u(x) + b`` with ``P = βᵀ Kz Γ C``.

Stable forms of C and G
-----------------------
``C = (c_f I + Kt S_M)⁻¹`` and ``G = C Kt`` are computed from a factor ``Kt = R_t R_tᵀ``
(eigen-decomposition, rank r) and ``E = R_tᵀ S_M R_t``:

    G = R_t (c_f I_r + E)⁻¹ R_tᵀ,       C|range(Kt) = R_t (c_f I_r + E)⁻¹ R_t⁺.

Every inverse is of a positive definite matrix whose eigenvalues are ``c_f + e_i ≥ c_f``,
no ``S_M⁻¹`` (classes with no source sample, ``c_d = 0``) and no ``Kt⁻¹`` (M > L_t + 1)
appear, and no ``1/c_f`` is subtracted from another (the form of paper eq. (83) loses all
digits for ``c_f ≤ 1e-7``; this one stays exact for ``c_f`` down to 1e-12, tested).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np

from mmdtl2_dist.core.errors import QPSolveError
from mmdtl2_dist.core.params import DEFAULTS, WEIGHT_ADVICE, check_values
from mmdtl2_dist.core.preprocessing import SCALE_FIX, check_scale
from mmdtl2_dist.core.svm import one_vs_rest, svm_step, svm_step_reused
from mmdtl2_dist.core.threads import one_thread
from mmdtl2_dist.core.wstep import WStepResult, solve_wstep

EIG_RTOL = 1e-13  # eigenvalues of Kt below this fraction of the largest are numerical zeros


@contextmanager
def hinge_weights_named(params: Mapping):
    """Re-raise a :class:`QPSolveError` of the block with the hinge weights of ``params``.

    A QP that fails for weights inside the accepted range is most often one whose hinge
    weights are large for its data; the message says so and gives the weights' values.
    """
    try:
        yield
    except QPSolveError as e:
        named = {k: params[k] for k in ("c_s", "c_t") if k in params}
        if not named or getattr(e, "hinge_weights", None) is not None:
            raise
        values = ", ".join(f"{k} = {float(v):g}" for k, v in named.items())
        err = QPSolveError(
            f"{e} The hinge weights {values} bound these QPs, and the larger they are the "
            f"worse the QPs are conditioned: lower them ({WEIGHT_ADVICE})."
        )
        err.hinge_weights = named
        raise err from e


@dataclass(frozen=True)
class MMDTL2Params:
    """Parameters of the alternation (defaults: :data:`mmdtl2_dist.core.params.DEFAULTS`).

    Attributes
    ----------
    c_f : float
        Weight of ½‖W − W0‖² (the paper's 0.1; 1 with ``c_d = 0`` is MMDT).
    c_d : float
        Weight of the L2 pull between same-class source and transformed target samples.
    c_t : float
        Target hinge weight (both steps).
    c_s : float
        Source hinge weight (SVM-step).
    max_iter : int
        Maximum number of alternations (W-step + SVM-step).
    tol : float
        Stop when the objective decreases by less than ``tol`` relative.
    qp_solver : str
        Box-QP solver for both steps (:data:`mmdtl2_dist.core.qp.SOLVERS`).
    qp_tol : float
        Relative KKT tolerance of every QP.
    """

    c_f: float = DEFAULTS["mmdtl2"]["c_f"]
    c_d: float = DEFAULTS["mmdtl2"]["c_d"]
    c_t: float = DEFAULTS["mmdtl2"]["c_t"]
    c_s: float = DEFAULTS["mmdtl2"]["c_s"]
    max_iter: int = DEFAULTS["mmdtl2"]["max_iter"]
    tol: float = DEFAULTS["mmdtl2"]["tol"]
    qp_solver: str = DEFAULTS["mmdtl2"]["qp_solver"]
    qp_tol: float = DEFAULTS["mmdtl2"]["qp_tol"]

    def __post_init__(self) -> None:
        check_values(asdict(self))


@dataclass
class TransferOperators:
    """``G`` (M, M) and ``C`` restricted to the range of ``Kt`` (M, M), plus ``C Kt Cᵀ``."""

    G: np.ndarray
    C: np.ndarray
    CKC: np.ndarray


def transfer_operators(Kt: np.ndarray, s_m: np.ndarray, c_f: float) -> TransferOperators:
    """Compute ``G = C Kt`` and ``C = (c_f I + Kt S_M)⁻¹`` in the stable factored form.

    Parameters
    ----------
    Kt : ndarray of shape (M, M)
        Target kernel matrix (augmented linear, RBF or polynomial).
    s_m : ndarray of shape (M,)
        ``s_m = Σ_n s_nm`` (diagonal of ``S_M``), non-negative.
    c_f : float
        Positive weight of the Frobenius regulariser.
    """
    w, Q = np.linalg.eigh(0.5 * (Kt + Kt.T))
    keep = w > EIG_RTOL * max(float(w[-1]) if w.size else 0.0, 0.0)
    if not np.any(keep):
        M = Kt.shape[0]
        z = np.zeros((M, M))
        return TransferOperators(z, z.copy(), z.copy())
    sw = np.sqrt(w[keep])
    R = Q[:, keep] * sw  # Kt = R Rᵀ
    Rpinv = Q[:, keep].T / sw[:, None]  # R⁺
    E = R.T @ (s_m[:, None] * R)
    e, V = np.linalg.eigh(0.5 * (E + E.T))
    e = np.maximum(e, 0.0)
    inv = 1.0 / (c_f + e)
    RV = R @ V
    G = (RV * inv) @ RV.T
    C = (RV * inv) @ (V.T @ Rpinv)
    CKC = (RV * inv**2) @ RV.T
    return TransferOperators(0.5 * (G + G.T), C, 0.5 * (CKC + CKC.T))


def similarity_weights(ys: np.ndarray, yt: np.ndarray, c_d: float) -> np.ndarray:
    """``S`` (N, M) with ``s_nm = c_d [y_n = y_m]`` (labels encoded 0..K-1)."""
    return c_d * (ys[:, None] == yt[None, :]).astype(np.float64)


def objective(
    Kz, beta, b, Gamma, Omega, ops, S, Ys, Yt, N, params: MMDTL2Params, KzGamma=None, KzO=None
) -> float:
    """The full MMDTL2 objective (paper Problem 3 with the prior), on Gram matrices.

    ``½ c_f ‖W − W0‖² + ½ (‖Θ‖² + ‖b‖²) + c_t Σ hinge_t + c_s Σ hinge_s
    + ½ Σ s_nm ‖W x̂_m − x_n‖²``, with ``‖W − W0‖² = tr(Γᵀ Kz Γ C Kt Cᵀ)``.
    ``KzGamma = Kz Γ`` and ``KzO = Kz Ω`` may be passed when already known.
    """
    KzB = Kz @ beta
    if Gamma is None:
        reg_w = 0.0
    else:
        KzGamma = Kz @ Gamma if KzGamma is None else KzGamma
        reg_w = float(np.sum((Gamma.T @ KzGamma) * ops.CKC))
    reg_theta = float(np.sum(beta * KzB) + b @ b)
    src_scores = KzB[:N, :] + b  # (N, K)
    tgt_scores = Omega.T @ KzB + b  # (M, K)
    hinge_s = float(np.sum(np.maximum(0.0, 1.0 - Ys.T * src_scores)))
    hinge_t = float(np.sum(np.maximum(0.0, 1.0 - Yt.T * tgt_scores)))
    KzO = Kz @ Omega if KzO is None else KzO
    sq_t = np.sum(Omega * KzO, axis=0)  # ‖W x̂_m‖²
    cross = KzO[:N, :]  # x_nᵀ W x̂_m
    sq_s = np.diag(Kz)[:N]
    l2 = float(np.sum(S * (sq_t[None, :] - 2.0 * cross + sq_s[:, None])))
    return (
        0.5 * params.c_f * reg_w
        + 0.5 * reg_theta
        + params.c_t * hinge_t
        + params.c_s * hinge_s
        + 0.5 * l2
    )


@dataclass
class MMDTL2Fit:
    """Result of :func:`fit_mmdtl2_gram` (all coefficients, no features).

    Attributes
    ----------
    beta : ndarray (N+M, K)
        Hyperplanes ``Θ = Z β``.
    b : ndarray (K,)
        Biases.
    Gamma : ndarray (N+M, M)
        ``Δ = Z Γ C X̂tᵀ`` (``W = W0 + Δ``).
    C : ndarray (M, M)
        ``C`` on the range of ``Kt``.
    P : ndarray (K, M)
        Prediction coefficients: ``scores = P k(x̂) + βᵀ Zᵀ u(x) + b``.
    Omega : ndarray (N+M, M)
        Transformed training targets ``W x̂_m = Z ω_m``.
    objective : list of float
        Objective after the initial SVM and after every alternation.
    info : dict
        QP statuses, residuals, iteration counts and timings.
    """

    beta: np.ndarray
    b: np.ndarray
    Gamma: np.ndarray
    C: np.ndarray
    P: np.ndarray
    Omega: np.ndarray
    objective: list
    info: dict = field(default_factory=dict)

    def decision_function(self, Kt_new: np.ndarray, Kz_new: np.ndarray | None = None) -> np.ndarray:
        """Scores (n_new, K) of new target samples.

        Parameters
        ----------
        Kt_new : ndarray (M, n_new)
            Target kernel values ``k(x̂_m, x̂)`` between training and new target samples.
        Kz_new : ndarray (N+M, n_new), optional
            ``Zᵀ u(x)`` (prior term); omit for the zero prior.
        """
        scores = (self.P @ Kt_new).T + self.b
        if Kz_new is not None:
            scores = scores + Kz_new.T @ self.beta
        return scores


@one_thread
def fit_mmdtl2_gram(
    Kz: np.ndarray,
    Kt: np.ndarray,
    ys: np.ndarray,
    yt: np.ndarray,
    n_classes: int,
    params: MMDTL2Params,
    *,
    init: str = "source",
    progress=None,
) -> MMDTL2Fit:
    """Fit MMDTL2 by alternation, on Gram matrices only (see the module docstring).

    Parameters
    ----------
    Kz : ndarray (N+M, N+M)
        Gram of ``Z = [Xs, U]`` in the source space; ``U = W0 X̂t`` are the prior-mapped
        training targets (all-zero blocks for the paper's zero prior).
    Kt : ndarray (M, M)
        Target kernel matrix of the labelled target samples.
    ys, yt : ndarray (N,), (M,)
        Labels encoded 0..K-1.
    n_classes : int
        K.
    params : MMDTL2Params
        Parameters.
    init : {"source", "source+prior"}
        Initial SVM: on the source samples only (the paper), or on the source samples and
        the prior-mapped targets ``u_m`` (Hoffman et al.'s code, with ``W0 = I``).
    progress : callable, optional
        Called as ``progress(iteration, objective)`` after every alternation.

    Raises
    ------
    ValueError
        If the source Gram's diagonal is out of :func:`~mmdtl2_dist.core.preprocessing.
        check_scale`'s range or ``Kt`` is not finite (features of extreme magnitude).
    QPSolveError
        If a QP fails; the message names the hinge weights (:func:`hinge_weights_named`).
    """
    check_scale(np.diag(Kz)[: ys.shape[0]], "Kz (the source samples' Gram)")
    if not np.all(np.isfinite(Kt)):
        raise ValueError(
            "Kt (the target kernel) has NaN or Inf entries: the target features' squared "
            f"norms overflow float64 (or the kernel's parameters do). {SCALE_FIX}"
        )
    with hinge_weights_named(asdict(params)):
        return _alternate(Kz, Kt, ys, yt, n_classes, params, init, progress)


def _initial_svm(Kz, Ys, Yt, params: MMDTL2Params, init: str):
    """The first SVM: on the sources (paper Problem 2), or sources + prior-mapped targets.

    Returns the :class:`SVMStepResult`, the rows of ``Kz`` it was trained on and their
    one-vs-rest labels.
    """
    N, M = Ys.shape[1], Yt.shape[1]
    if init == "source+prior":
        idx = np.arange(N + M)
        cost = np.r_[np.full(N, params.c_s), np.full(M, params.c_t)]
        Y0 = np.hstack([Ys, Yt])
    elif init == "source":
        idx, cost, Y0 = np.arange(N), np.full(N, params.c_s), Ys
    else:
        raise ValueError(f"init must be 'source' or 'source+prior', got {init!r}.")
    K0 = Kz[np.ix_(idx, idx)]
    svm = svm_step_reused(K0, Y0, cost, solver=params.qp_solver, tol=params.qp_tol)
    return svm, idx, Y0


def _training_gram(Kz: np.ndarray, ws: WStepResult, N: int) -> np.ndarray:
    """Gram ``Kv = Bᵀ Kz B`` of the SVM-step's training vectors, without the (N+M)³ product.

    The vectors as coefficients on ``Z``: ``B = [E_s, Ω]`` with ``E_s`` the first ``N``
    unit vectors (the sources) and ``Ω`` the transformed targets of the W-step ``ws``.
    """
    KzO = ws.KzOmega
    Kv = np.empty((KzO.shape[0], KzO.shape[0]))
    Kv[:N, :N] = Kz[:N, :N]
    Kv[:N, N:] = KzO[:N]
    Kv[N:, :N] = KzO[:N].T
    Kv[N:, N:] = ws.Omega.T @ KzO
    return Kv


def _alternate(Kz, Kt, ys, yt, n_classes, params, init, progress) -> MMDTL2Fit:
    """The alternation of :func:`fit_mmdtl2_gram` on checked Grams."""
    t_start = time.perf_counter()
    N, M, K = ys.shape[0], yt.shape[0], n_classes
    Ys, Yt = one_vs_rest(ys, K), one_vs_rest(yt, K)
    S = similarity_weights(ys, yt, params.c_d)
    s_m = S.sum(axis=0)
    R_c = np.vstack([S, -np.diag(s_m)])
    ops = transfer_operators(Kt, s_m, params.c_f)
    info = {"qp_status": [], "qp_kkt_residual": [], "qp_iterations": [], "svm_kkt_residual": []}
    t_w = t_svm = 0.0

    t0 = time.perf_counter()
    svm, idx, Y0 = _initial_svm(Kz, Ys, Yt, params, init)
    beta = np.zeros((N + M, K))
    beta[idx, :] = svm.coef
    b = svm.b
    t_svm += time.perf_counter() - t0
    info["svm_kkt_residual"].append(max(q.kkt_residual for q in svm.qps))
    E_u = np.zeros((N + M, M))
    E_u[N:, :] = np.eye(M)
    history = [objective(Kz, beta, b, None, E_u, ops, S, Ys, Yt, N, params)]

    Yall = np.hstack([Ys, Yt])
    cost = np.r_[np.full(N, params.c_s), np.full(M, params.c_t)]
    KzRc = Kz @ R_c  # constant over the alternation
    a = None
    # Warm start of the first SVM-step: the initial SVM's multipliers on its samples,
    # zero on the others (the sources' margins barely move when the targets join).
    alpha = np.zeros((K, N + M))
    alpha[:, idx] = (svm.coef * Y0.T).T
    n_iter = 0
    for it in range(1, params.max_iter + 1):
        n_iter = it
        t0 = time.perf_counter()
        ws = solve_wstep(Kz, beta, b, Yt, R_c, ops, N, params, a0=a, KzRc=KzRc)
        a = ws.a
        t_w += time.perf_counter() - t0
        info["qp_status"].append(ws.qp.status)
        info["qp_kkt_residual"].append(ws.qp.kkt_residual)
        info["qp_iterations"].append(ws.qp.iterations)

        t0 = time.perf_counter()
        Kv = _training_gram(Kz, ws, N)
        svm = svm_step(Kv, Yall, cost, solver=params.qp_solver, tol=params.qp_tol, alpha0=alpha)
        alpha = (svm.coef * Yall.T).T  # α_k = coef_k ⊙ y_k (y = ±1)
        beta = ws.Omega @ svm.coef[N:]  # B @ coef
        beta[:N] += svm.coef[:N]
        b = svm.b
        t_svm += time.perf_counter() - t0
        info["svm_kkt_residual"].append(max(q.kkt_residual for q in svm.qps))

        history.append(
            objective(
                Kz, beta, b, ws.Gamma, ws.Omega, ops, S, Ys, Yt, N, params,
                KzGamma=ws.KzGamma, KzO=ws.KzOmega,
            )
        )  # fmt: skip
        if progress is not None:
            progress(it, history[-1])
        if abs(history[-2] - history[-1]) <= params.tol * max(1.0, abs(history[-1])):
            break
    # The final (W, Θ̂) pair: Θ̂ from the last SVM-step, W from the W-step it was fitted to.
    P = (beta.T @ ws.KzGamma) @ ops.C
    info.update(
        n_iter=n_iter, time_wstep_s=t_w, time_svm_s=t_svm, converged=n_iter < params.max_iter
    )
    info["time_total_s"] = time.perf_counter() - t_start
    return MMDTL2Fit(beta, b, ws.Gamma, ops.C, P, ws.Omega, history, info)
