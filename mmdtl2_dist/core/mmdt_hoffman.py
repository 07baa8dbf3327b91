r"""MMDT in the form of Hoffman et al.'s reference code, entirely on Gram matrices.

This is the ``mmdt_hoffman`` baseline of :mod:`mmdtl2_dist.core.methods`: what the MATLAB
code ``jhoffman/MaxMarginDomainTransforms`` (``TrainMmdt.m``, ``learnAsymmTransformWithSVM.m``
and Saenko's ``asymmetricFrob_slack_kernel.m``) computes, which departs from the paper's
Problem 2. Notation: ``N`` source training samples, ``M`` labelled target samples, ``Q``
test samples, ``K`` classes; ``x̂ = [x; 1]`` is a sample with a constant 1 appended (the
bias feature, regularised and transformed like any other); ``θ_k`` is the augmented
hyperplane of class ``k``; ``W`` maps augmented targets to the augmented source space.

The algorithm (one shared feature space):

0. Optional transductive PCA to ``pca_dim`` dimensions, fitted on the *centred* source
   training, target training and target test samples together and applied to the
   *uncentred* samples (as the reference's ``princomp`` step does).
1. Start from ``W = I``. Repeat ``n_iter`` times:

   a. **SVM-step** (liblinear ``-s 1``, no liblinear bias, one-vs-rest for every class):

      .. math::

          \min_{θ_k} \tfrac12 \|θ_k\|^2
          + \sum_{i} C_i \max(0, 1 - y_{ik} θ_k^\top z_i)^2,
          \qquad z = [\hat x^s_1, …, \hat x^s_N, W\hat x^t_1, …, W\hat x^t_M],

      with ``C_i = c_s`` on source and ``c_t`` on target samples, ``y_ik = ±1``.
   b. **W-step** (learned afresh from ``I``; ``c_t`` is not used):

      .. math::

          \min_{W, ξ} \tfrac12 \|W - I\|_F^2 + \tfrac{γ}{2} \sum_{k,m} ξ_{km}^2
          \quad \text{s.t.} \quad
          s_{km}\,(\tilde θ_k^\top W \tilde x^t_m - b_{km}) \le ξ_{km},

      where ``~`` denotes unit-norm vectors (the cosine kernel), ``s_km = -1, b_km = 1``
      when ``y^t_m = k`` (``θ̃ᵀWx̃ ≥ 1 - ξ``) and ``s_km = 1, b_km = -1`` otherwise
      (``θ̃ᵀWx̃ ≤ -1 + ξ``). The reference solves it by Bregman (Hildreth) projections on
      the cosine Gram ``K0`` of ``[θ_1..θ_K; x̂^t_1..x̂^t_M]``, giving
      ``W = I + Σ_km S_km θ_k x̂^t_mᵀ`` (see :func:`bregman_wstep` for the as-coded quirks).
2. Predict ``argmax_k θ_kᵀ W x̂`` with the *last* SVM and the *last* W (so the final W
   never trained the SVM it is composed with, as in the reference).

Gram form. Every vector lives in the span of the augmented training vectors
``V = [x̂^s_1..x̂^s_N, x̂^t_1..x̂^t_M]`` (rows of a (N+M, L+1) matrix), so each is a
coefficient vector ``a`` with ``v = Vᵀa``, inner products are ``a₁ᵀ Ĝ a₂`` with
``Ĝ = V Vᵀ = G + 11ᵀ``, and ``W`` acts on coefficients as
``Wc = I + A_θ S Ĝ_{T,·}`` (``A_θ`` (N+M, K) the hyperplane coefficients). Nothing needs
the features or their dimension.

Deviations from the reference that are not reproduced (see :func:`fit_predict_mmdt_hoffman`):
the SVM duals are solved exactly instead of liblinear's dual coordinate descent with
tolerance 0.1 and a random order; ``K = 2`` trains two hyperplanes (the reference breaks);
labels need not be ``1..K``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import scipy.linalg as sla
from numba import njit

from mmdtl2_dist.core.params import DEFAULTS, check_params
from mmdtl2_dist.core.qp import solve_box_qp

if TYPE_CHECKING:
    from mmdtl2_dist.core.methods import GramProblem


# --------------------------------------------------------------------------- Grams


def gram_rows(prob: GramProblem, with_test_rows: bool) -> np.ndarray:
    """Linear Gram ``G`` of ``[source train; target train]`` × ``[... ; target test]``.

    Shape (N+M, N+M+Q), or the full (N+M+Q, N+M+Q) with ``with_test_rows`` (needs
    ``Kqq``; only the PCA uses the test × test block).
    """
    rows = [[prob.Kss, prob.Kst, prob.Ksq], [prob.Kst.T, prob.Ktt, prob.Ktq]]
    if with_test_rows:
        rows.append([prob.Ksq.T, prob.Ktq.T, prob.Kqq])
    return np.block(rows)


def pca_gram(G: np.ndarray, d: int) -> np.ndarray:
    r"""Gram of the uncentred samples projected on the top ``d`` centred principal axes.

    With ``Z`` (n, L) the samples, ``H = I - 11ᵀ/n`` and ``H G H = U Λ Uᵀ`` (top ``d``
    eigenpairs), the principal axes are ``P = Zᵀ H U Λ^{-1/2}`` (the right singular
    vectors of ``HZ``), so the projections of the *uncentred* samples are
    ``Z P = G U Λ^{-1/2}`` (``HU = U`` because ``H G H 1 = 0``) and their Gram is

    .. math::

        F F^\top = (G U) Λ^{-1} (G U)^\top .

    Component signs, and the choice of basis inside a repeated eigenvalue, do not matter.

    Raises
    ------
    ValueError
        If the centred samples span fewer than ``d`` dimensions.
    """
    n = G.shape[0]
    if not 1 <= d <= n - 1:
        raise ValueError(
            f"pca_dim={d} needs 1 <= pca_dim <= n - 1 = {n - 1} (n = source train + target "
            "train + target test samples); lower pca_dim or set pca_dim=None."
        )
    Gc = G - G.mean(axis=0, keepdims=True)
    Gc = Gc - Gc.mean(axis=1, keepdims=True)
    Gc = 0.5 * (Gc + Gc.T)
    lam, U = top_eigenpairs(Gc, d)
    if lam[0] <= 1e-10 * max(lam[-1], np.finfo(float).tiny):
        raise ValueError(
            f"pca_dim={d} exceeds the rank of the centred samples (eigenvalues {lam[0]:.3g} "
            f"to {lam[-1]:.3g}); lower pca_dim or set pca_dim=None."
        )
    GU = G @ U
    return (GU / lam) @ GU.T


# From this many samples on, Lanczos: 2-3x faster than the dense solver at the Office
# study's 1,000-1,300 samples, the same eigenspace to rounding (BENCHMARKS.md).
LANCZOS_MIN_N = 500


def top_eigenpairs(A: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``d`` largest eigenvalues of the symmetric ``A`` (ascending) and eigenvectors.

    Implicitly restarted Lanczos (ARPACK's ``eigsh`` to machine precision, from a fixed
    start that is not the null vector 1 of a centred Gram) when ``A`` is large and ``d``
    small next to it; the dense solver otherwise and wherever Lanczos does not converge.
    """
    n = A.shape[0]
    if n >= LANCZOS_MIN_N and 4 * d < n:
        from scipy.sparse.linalg import ArpackNoConvergence, eigsh

        v0 = np.random.default_rng(0).standard_normal(n)
        try:
            lam, U = eigsh(A, k=d, which="LA", v0=v0, tol=0.0)
            return lam[np.argsort(lam)], U[:, np.argsort(lam)]
        except ArpackNoConvergence:
            pass
    return sla.eigh(A, subset_by_index=[n - d, n - 1])


# --------------------------------------------------------------------------- SVM-step


def svm_step_sqhinge(
    Kz: np.ndarray,
    y: np.ndarray,
    n_classes: int,
    cost: np.ndarray,
    *,
    solver: str = "dcd",
    tol: float = 1e-8,
) -> tuple[np.ndarray, list]:
    r"""One-vs-rest L2-regularised squared-hinge SVMs without bias (liblinear ``-s 1``).

    For each class ``k`` (``y_i = +1`` if sample ``i`` is in class ``k``, else ``-1``)
    this solves the dual of ``min ½‖θ‖² + Σ_i C_i max(0, 1 - y_i θᵀz_i)²``:

    .. math::

        \min_{α \ge 0} \; \tfrac12 α^\top \big(Y K_z Y + \operatorname{diag}(1/(2C_i))\big) α
        - \mathbf 1^\top α,
        \qquad θ = \sum_i α_i y_i z_i,

    where ``K_z`` is the Gram of the training vectors ``z_i`` and ``Y = diag(y)``. The QP is
    strictly convex, so ``θ`` is unique; it is solved to a KKT residual ``tol`` (liblinear's
    stopping tolerance 0.1 and random coordinate order are not reproduced).

    Parameters
    ----------
    Kz : ndarray of shape (n, n)
        Gram of the training vectors.
    y : ndarray of shape (n,)
        Labels encoded ``0..n_classes-1``.
    n_classes : int
        ``K``; one hyperplane per class, also for ``K = 2``.
    cost : ndarray of shape (n,)
        ``C_i`` per sample.
    solver, tol
        Passed to :func:`mmdtl2_dist.core.qp.solve_box_qp`.

    Returns
    -------
    beta : ndarray of shape (n, K)
        ``α_k ⊙ y_k``: hyperplane ``k`` is ``θ_k = Σ_i beta_ik z_i``.
    qps : list of QPResult
    """
    D = 1.0 / (2.0 * cost)
    beta = np.zeros((len(y), n_classes))
    qps = []
    for k in range(n_classes):
        yk = np.where(y == k, 1.0, -1.0)
        H = Kz * np.outer(yk, yk)
        H.flat[:: len(y) + 1] += D
        res = solve_box_qp(H, np.ones(len(y)), 0.0, np.inf, solver=solver, tol=tol)
        beta[:, k] = res.x * yk
        qps.append(res)
    return beta, qps


# --------------------------------------------------------------------------- W-step


def bregman_wstep(
    K0_hh: np.ndarray,
    K0_ht: np.ndarray,
    K0_tt: np.ndarray,
    same: np.ndarray,
    gamma: float,
    *,
    tol: float = 0.01,
    check_every: int = 1000,
    max_steps: int = 1_000_000,
    faithful: bool = True,
) -> tuple[np.ndarray, dict]:
    r"""Bregman projections for the W-step, in the kernel form of Saenko's code.

    Solves (approximately, see ``faithful``)

    .. math::

        \min_{W, ξ} \tfrac12 \|W - I\|_F^2 + \tfrac{γ}{2} \sum_{k,m} ξ_{km}^2
        \quad \text{s.t.} \quad s_{km} (\tilde θ_k^\top W \tilde x_m - b_{km}) \le ξ_{km}

    with ``W = I + Σ_km S_km θ̃_k x̃_mᵀ`` on unit vectors, whose constraint kernel is
    ``K0 + K0 S K0``; ``s = -1, b = 1`` for ``same[k, m]`` and ``s = 1, b = -1`` otherwise.
    The dual is the box QP ``min_{λ≥0} ½ λᵀ(H + I/γ)λ - fᵀλ`` with
    ``H_{(km),(k'm')} = s_km s_k'm' K0_hh[k,k'] K0_tt[m',m]``, ``f_km = s_km (K0_ht[k,m] - b_km)``,
    ``ξ = λ/γ`` and ``S = -s ⊙ λ``; a projection on constraint ``c`` is a coordinate step
    ``λ_c ← max(0, λ_c + v_c / (1/γ + K0_ii K0_jj))`` on its violation
    ``v_c = s_c (θ̃ᵀWx̃ - b_c) - ξ_c``.

    ``faithful=True`` reproduces the reference (``asymmetricFrob_slack_kernel.m``) as coded:

    - **greedy order**: each step projects the constraint of largest tracked violation
      (first in class-major order on ties), also when that maximum is ≤ 0;
    - **stopping**: ``max v < tol`` is checked only every ``check_every`` steps (so at
      least ``check_every - 1`` steps run), capped at ``max_steps``;
    - **sign slip**: the step uses ``s(b - K) - ξ = -(v + 2ξ)`` instead of ``-v``, so a
      revisited constraint is over-projected;
    - the second step ``α₂ = min(λ₂, γξ)`` that keeps ``ξ ≥ 0``.

    ``faithful=False`` is a clean solver of the problem above: cyclic sweeps over all
    constraints with the corrected step ``-v`` (coordinate descent on the dual), stopped
    when the KKT residual ``max(max_{λ_c=0} v_c, max_{λ_c>0} |v_c|)`` is below ``tol``
    after a sweep (or after ``max_steps`` steps).

    Parameters
    ----------
    K0_hh, K0_ht, K0_tt : ndarray of shape (K, K), (K, M), (M, M)
        Blocks of the cosine kernel of ``[θ_1..θ_K; x̂_1..x̂_M]``.
    same : ndarray of bool, shape (K, M)
        ``same[k, m]``: target ``m`` belongs to class ``k``.
    gamma : float
        ``γ``, the slack weight.
    tol, check_every, max_steps, faithful
        See above.

    Returns
    -------
    S : ndarray of shape (K, M)
        Coefficients of ``W - I`` on the (unit) hyperplanes × (unit) targets.
    info : dict
        ``steps`` (projections made), ``max_viol`` (largest tracked violation at the end).
    """
    if not (np.isfinite(gamma) and gamma > 0):
        raise ValueError(f"gamma must be positive, got {gamma!r}.")
    Kc, M = K0_ht.shape
    s = np.where(same, -1.0, 1.0)
    S, steps, max_viol = _bregman_loop(
        np.ascontiguousarray(K0_hh, dtype=np.float64),
        np.ascontiguousarray(K0_ht, dtype=np.float64),
        np.ascontiguousarray(K0_tt, dtype=np.float64),
        s,
        float(gamma),
        float(tol),
        int(check_every),
        int(max_steps),
        bool(faithful),
    )
    return S, {"steps": int(steps), "max_viol": float(max_viol)}


@njit(cache=True, nogil=True)
def _bregman_loop(K0_hh, K0_ht, K0_tt, s, gamma, tol, check_every, max_steps, faithful):
    """The projections of :func:`bregman_wstep`, compiled (a projection is O(K·M))."""
    Kc, M = K0_ht.shape
    b = -s
    S = np.zeros((Kc, M))
    slack = np.zeros((Kc, M))
    lam = np.zeros((Kc, M))
    lam2 = np.zeros((Kc, M))
    viol = s * (K0_ht - b)  # ξ = 0 at the start
    n_con = Kc * M
    steps = 0
    while steps < max_steps:
        if faithful:
            flat = 0  # argmax, first in class-major order on ties
            best = viol[0, 0]
            for c in range(1, n_con):
                v = viol[c // M, c % M]
                if v > best:
                    best, flat = v, c
            if (steps + 1) % check_every == 0 and best < tol:
                break
            first, last = flat, flat + 1
        else:
            first, last = 0, min(n_con, max_steps - steps)
        for c in range(first, last):
            k, m = c // M, c % M
            sc = s[k, m]
            K_cur = K0_ht[k, m]
            for i in range(Kc):
                acc = 0.0
                for j in range(M):
                    acc += S[i, j] * K0_tt[j, m]
                K_cur += K0_hh[k, i] * acc
            # The reference's numerator; the corrected one adds ξ instead of subtracting it.
            num = sc * (b[k, m] - K_cur) + (-slack[k, m] if faithful else slack[k, m])
            alpha = min(lam[k, m], num / (1.0 / gamma + K0_hh[k, k] * K0_tt[m, m]))
            lam[k, m] -= alpha
            S[k, m] += sc * alpha
            slack[k, m] -= alpha / gamma
            alpha2 = min(lam2[k, m], gamma * slack[k, m])
            slack[k, m] -= alpha2 / gamma
            lam2[k, m] -= alpha2
            a = sc * alpha
            for i in range(Kc):
                hk = a * K0_hh[i, k]
                for j in range(M):
                    viol[i, j] += hk * s[i, j] * K0_tt[m, j]
            viol[k, m] += (alpha + alpha2) / gamma
            steps += 1
        if not faithful:
            worst = 0.0
            for i in range(Kc):
                for j in range(M):
                    v = viol[i, j]
                    r = abs(v) if lam[i, j] > 0 else max(v, 0.0)
                    worst = max(worst, r)
            if worst < tol:
                break
    max_viol = -np.inf
    for i in range(Kc):
        for j in range(M):
            max_viol = max(max_viol, viol[i, j])
    return S, steps, max_viol


# --------------------------------------------------------------------------- driver


def _check_inputs(p: Mapping, prob: GramProblem) -> None:
    if not prob.shared_space:
        raise ValueError(
            "mmdt_hoffman needs source and target in one feature space (GramProblem.Kst "
            "(N, M) and Ksq (N, Q)); the reference's different-dimension variant is not "
            "offered. Drop mmdt_hoffman for pairs with different feature spaces."
        )
    if p["pca_dim"] is not None:
        Q = prob.Ktq.shape[1]
        if prob.Kqq is None:
            raise ValueError(
                f"mmdt_hoffman with pca_dim={p['pca_dim']} fits the PCA on source train, "
                "target train and target test together and needs the test × test Gram; "
                "the study must supply GramProblem.Kqq (Q, Q), or set pca_dim=None."
            )
        if prob.Kqq.shape != (Q, Q) or not np.all(np.isfinite(prob.Kqq)):
            raise ValueError(
                f"GramProblem.Kqq has shape {prob.Kqq.shape}, expected finite ({Q}, {Q})."
            )
    check_params("mmdt_hoffman", p)


def fit_predict_mmdt_hoffman(p: Mapping, prob: GramProblem) -> tuple[np.ndarray, np.ndarray, dict]:
    """Fit MMDT as in Hoffman et al.'s reference code and score the test samples.

    See the module docstring for the problem. The alternation is
    ``SVM(I) → W₁ → SVM(W₁) → W₂ → …`` for ``n_iter`` W-steps, each W learned from ``I``
    with the *original* augmented targets; the scores are ``θ_kᵀ W x̂_q`` with the last SVM
    and the last W.

    Parameters
    ----------
    p : mapping
        ``c_s``, ``c_t`` (SVM sample weights), ``gamma`` (W-step slack weight ``γ``),
        ``n_iter``, ``pca_dim`` (int or None), ``bregman_tol``, ``check_every``,
        ``max_steps``, ``faithful`` (see :func:`bregman_wstep`), ``qp_solver``, ``qp_tol``
        (SVM duals). Missing optional keys take the defaults of
        ``params.DEFAULTS["mmdt_hoffman"]``.
    prob : GramProblem
        Linear Grams of preprocessed features in one shared space (``Kst``, ``Ksq``;
        ``Kqq`` when ``pca_dim`` is set).

    Returns
    -------
    classes : ndarray of shape (K,)
        Sorted union of the training labels.
    scores : ndarray of shape (Q, K)
        ``θ_kᵀ W x̂_q``.
    info : dict
        ``n_iter``, ``bregman_steps`` and ``bregman_max_viol`` (per W-step),
        ``w_dev_fro`` (``‖W - I‖_F`` per W-step), ``time_wstep_s``, ``time_svm_s``,
        ``time_pca_s``, ``qp_status`` and ``qp_kkt_residual`` (per SVM-step, per class).

    Notes
    -----
    ``faithful=True`` (default) keeps the reference's quirks: the greedy, sign-slipped
    projections of :func:`bregman_wstep` and ``W = I + Σ S_km θ_k x̂_mᵀ`` built from the
    *raw* hyperplanes and targets, although ``S`` was computed for unit vectors.
    ``faithful=False`` fixes all three: cyclic corrected projections and
    ``W = I + Σ S_km θ_k x̂_mᵀ / (‖θ_k‖ ‖x̂_m‖)``, the W the projections actually solved for.

    Not reproduced: liblinear's inexact dual coordinate descent (tolerance 0.1, random
    order); the SVM duals are solved exactly. ``K = 2`` gets two hyperplanes (the
    reference indexes a single one and fails), and labels need not be ``1..K``.
    """
    p = {**DEFAULTS["mmdt_hoffman"], **p}
    _check_inputs(p, prob)
    faithful = bool(p.get("faithful", True))
    classes, y_all = np.unique(np.r_[prob.ys, prob.yt], return_inverse=True)
    n_cls = len(classes)
    N, M = len(prob.ys), len(prob.yt)
    V = N + M
    t0 = time.perf_counter()
    Gh = _augmented_gram(prob, p["pca_dim"])
    Gh_VV, Gh_TV, Gh_VQ = Gh[:, :V], Gh[N:V, :V], Gh[:, V:]
    time_pca = time.perf_counter() - t0

    cost = np.r_[np.full(N, float(p["c_s"])), np.full(M, float(p["c_t"]))]
    same = y_all[None, N:] == np.arange(n_cls)[:, None]
    info: dict = {"n_iter": int(p["n_iter"]), "bregman_steps": [], "bregman_max_viol": []}
    info.update(w_dev_fro=[], qp_status=[], qp_kkt_residual=[], time_pca_s=time_pca)
    t_svm = t_w = 0.0
    Wc_T = np.eye(V)[:, N:]  # coefficients of W x̂^t_m (columns); W = I at the start
    for _ in range(int(p["n_iter"])):
        t1 = time.perf_counter()
        Z = np.hstack([np.eye(V)[:, :N], Wc_T])  # coefficients of the SVM training vectors
        beta, qps = svm_step_sqhinge(
            Z.T @ Gh_VV @ Z, y_all, n_cls, cost, solver=p["qp_solver"], tol=p["qp_tol"]
        )
        A_th = Z @ beta  # θ_k = Vᵀ A_th[:, k]
        info["qp_status"].append([q.status for q in qps])
        info["qp_kkt_residual"].append([q.kkt_residual for q in qps])
        t2 = time.perf_counter()
        S, A_th_G = _wstep(A_th, Gh_VV, N, same, p, faithful, info)
        Wc_T = np.eye(V)[:, N:] + A_th @ S @ Gh_TV[:, N:]
        t_svm += t2 - t1
        t_w += time.perf_counter() - t2
    # θ_kᵀ W x̂_q = θ_kᵀ x̂_q + Σ_m (θ_kᵀ θ_·) S x̂_mᵀ x̂_q
    scores = A_th.T @ Gh_VQ + (A_th_G @ A_th) @ S @ Gh[N:V, V:]
    info.update(time_svm_s=t_svm, time_wstep_s=t_w)
    return classes, scores.T, info


def _augmented_gram(prob: GramProblem, pca_dim: int | None) -> np.ndarray:
    """``x̂ᵀx̂' = xᵀx' + 1`` of the training rows against all (after the PCA, if any)."""
    G = gram_rows(prob, with_test_rows=pca_dim is not None)
    if pca_dim is not None:
        G = pca_gram(G, int(pca_dim))
    return G[: len(prob.ys) + len(prob.yt), :] + 1.0


def _wstep(A_th, Gh_VV, N, same, p, faithful, info):
    """Cosine kernel, Bregman projections and the applied ``S`` (raw or normalised).

    The raw Gram of ``[θ_1..θ_K; x̂^t_1..x̂^t_M]`` is ``[[A_θᵀĜA_θ, A_θᵀĜ_{·,T}], [·, Ĝ_TT]]``.
    """
    A_th_G = A_th.T @ Gh_VV  # (K, V): θ_kᵀ x̂_v
    Khh, Kht, Ktt = A_th_G @ A_th, A_th_G[:, N:], Gh_VV[N:, N:]
    nh, nt = np.sqrt(np.diag(Khh)), np.sqrt(np.diag(Ktt))
    S, b_info = bregman_wstep(
        Khh / np.outer(nh, nh),
        Kht / np.outer(nh, nt),
        Ktt / np.outer(nt, nt),
        same,
        float(p["gamma"]),
        tol=float(p["bregman_tol"]),
        check_every=int(p["check_every"]),
        max_steps=int(p["max_steps"]),
        faithful=faithful,
    )
    if not faithful:
        S = S / np.outer(nh, nt)  # the W the projections solved for, on raw vectors
    info["bregman_steps"].append(b_info["steps"])
    info["bregman_max_viol"].append(b_info["max_viol"])
    info["w_dev_fro"].append(float(np.sqrt(max(np.sum((S.T @ Khh @ S) * Ktt.T), 0.0))))
    return S, A_th_G
