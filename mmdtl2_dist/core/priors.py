r"""Transductive prior transforms ``W0`` learned from unlabelled samples, on Gram matrices.

Every prior here is a :class:`~mmdtl2_dist.core.pool.PoolMap` ``W0 = a I + Yᵀ L T Y`` over
the pool ``Y`` of both devices' samples (:class:`~mmdtl2_dist.core.pool.SamplePool`; the
form and its Gram blocks are derived in :mod:`mmdtl2_dist.core.pool`), so it runs through
MMDTL2's alternation unchanged as ``prior="matrix"``, with its weight ``prior_weight``.

PCA bases from Gram blocks
--------------------------
Priors 1-3 below use PCA bases of the pool's samples computed from their Grams alone
(:mod:`mmdtl2_dist.core.gram_pca`), centred by default; prior 4 uses a transport plan.

1. Subspace alignment (Fernando et al., ICCV 2013)
---------------------------------------------------
``Ps`` (L, d) and ``Pt`` (L, d) are the PCA bases of the source and of the target samples
(each centred by its own mean). SA aligns the source basis to the target one with
``M = argmin ‖Ps M − Pt‖_F = PsᵀPt`` and compares a source sample ``y_s`` with a target
sample ``y_t`` by ``Sim(y_s, y_t) = y_sᵀ Ps M Ptᵀ y_t`` (the paper's similarity
``y_s X_S X_Sᵀ X_T X_Tᵀ y_tᵀ``): source coordinates ``Psᵀ y_s`` aligned by ``Mᵀ`` against
target coordinates ``Ptᵀ y_t``. As a map of target features into the source space,
the one whose source-space inner products are SA's similarities is therefore

.. math::

    W_0 = P_s M P_t^\top = P_s P_s^\top P_t P_t^\top, \qquad
    u(x) = P_s\, M\, (P_t^\top x),

the target coordinates carried into source coordinates by ``M`` and embedded with the
source basis. It is the product of the two orthogonal projectors, so it does not depend
on the signs or the rotation within a repeated eigenvalue of the PCA bases. The simpler
``Ps Ptᵀ`` (target coordinates read as source coordinates) does: flipping the sign of one
target axis flips part of the map, so it is not a well-defined map at all, and ``M`` is
exactly what removes that ambiguity. In pool form (``A_s``, ``A_t`` from the centred
``Kss``, ``Ktt``):

.. math::

    M = A_s^\top K_{st} A_t, \quad a = 0, \quad L = [A_s; 0], \quad T = [0,\ M A_t^\top].

(``M`` is SA's alignment matrix, not the number of labelled targets.) Here
``G = A_sᵀ Kss A_s = I_d`` (centred or not, since ``A_s`` is built from the Gram it is
applied to). Cost: two top-``d`` eigendecompositions, ``O(ns³ + nt³)`` with LAPACK's
subset solver (it still tridiagonalises), then ``O(p² d)`` products; a device's basis
depends only on its pool, so it is computed once for every split and ``d``
(:class:`PCABasis`). ``d ≤ min(ns, nt) − 1`` (the rank of a centred Gram).

1b. Subspace alignment with the identity outside the subspaces
---------------------------------------------------------------
SA's ``W0`` has rank ``d``: every direction outside the two subspaces is dropped, which
is the wrong prior for two devices that differ little, where the identity is right.
``complement=True`` (a variant of this product, not in the SA paper) keeps SA inside the
subspaces and the identity between their complements, with ``Πs = Ps Psᵀ``,
``Πt = Pt Ptᵀ``:

.. math::

    W_0 = Π_s Π_t + (I - Π_s)(I - Π_t) = I - Π_s - Π_t + 2\, Π_s Π_t,

which is ``I`` when the subspaces coincide. In pool form
``a = 1``, ``L = [[A_s, 0], [0, A_t]]``, ``T = [[−A_sᵀ, 2 M A_tᵀ], [0, −A_tᵀ]]``.

2. Shared PCA (Hoffman et al.'s code)
-------------------------------------
One PCA over the whole pool, centred by the pool mean (what the reference code's
``princomp`` over the source, target training and target test samples does), basis
``P = Yᵀ A`` with ``A`` from the centred ``Kyy``. As a prior map in one feature space,
``W0 = P Pᵀ`` (the orthogonal projection on the shared subspace; Hoffman's code instead
replaces the features by the coordinates ``Pᵀ x`` and uses ``W0 = I`` there, which also
changes the source SVM's space):

.. math::

    a = 0, \quad L = A, \quad T = A^\top .

Cost ``O(p³)`` for the eigendecomposition of the pool Gram, ``O(p² d)`` products;
``d ≤ p − 1``.

3. CORAL (Sun et al., AAAI 2016) as a map
-----------------------------------------
CORAL whitens the source with ``Cs^{-1/2}`` and re-colours it with ``Ct^{1/2}``, where
``C = cov + λI`` (the paper's ``cov(D) + eye``, ``λ = 1``; ``cov`` normalised by ``n − 1``
as MATLAB's). Mapping the target into the source space is the reverse,
``W0 = Cs^{1/2} Ct^{-1/2}`` (both symmetric).

Gram form without any L × L matrix. With ``A = H V Λ^{-1/2}`` over *all* non-zero
eigenpairs of the centred Gram (rank ``r ≤ n − 1``), ``U = Xᵀ A`` is an orthonormal basis
of the centred samples' span and ``cov = U Σ Uᵀ``, ``Σ = Λ / (n − 1)`` (the thin SVD of
the centred samples). A spectral function of ``C = λI + U Σ Uᵀ`` is then
``f(C) = f(λ)(I − UUᵀ) + U f(λ + Σ) Uᵀ``, so

.. math::

    C_s^{1/2} = \sqrt{λ}\,(I + U_s E_s U_s^\top),\quad E_s = \sqrt{1 + Σ_s/λ} - 1, \qquad
    C_t^{-1/2} = \tfrac{1}{\sqrt{λ}}(I + U_t D_t U_t^\top),\quad D_t = (1 + Σ_t/λ)^{-1/2} - 1,

and the ``√λ`` cancel in the product:

.. math::

    W_0 = I + U_t D_t U_t^\top + U_s E_s U_s^\top + U_s E_s (U_s^\top U_t) D_t U_t^\top,

that is, with ``M = A_sᵀ Kst A_t = U_sᵀ U_t``,

.. math::

    a = 1, \quad L = \begin{bmatrix} A_s & 0 \\ 0 & A_t \end{bmatrix}, \quad
    T = \begin{bmatrix} E_s A_s^\top & E_s M D_t A_t^\top \\ 0 & D_t A_t^\top \end{bmatrix}.

Outside the two sample spans ``W0`` is the identity. Cost: the Grams (``O(p² L)``, done
once by the engine), two full eigendecompositions ``O(ns³ + nt³)`` and ``O(p² r)``
products, ``O(p²)`` memory, against ``O(L³)`` time and ``O(L²)`` memory for the
covariances at the feature dimension (34 GB per matrix at 64,896-d). The limit is the
pool size: with ``n ≳ L`` the feature form is the cheaper one, and a pool of ~10⁴⁺
unlabelled samples needs a subsample or a truncated (top-``r``) decomposition, which
turns the map into CORAL on the retained directions (an approximation not offered here).
Eigenvalues below ``EIG_RTOL`` of the largest are dropped: their ``E``, ``D`` are
``O(σ/λ)``, so the map changes by that much at most.

4. An optimal-transport map (Courty et al., TPAMI 2017; Perrot et al., NIPS 2016)
----------------------------------------------------------------------------------
The optimal coupling ``γ`` (nt, ns) between the target and the source samples of the pool,
with uniform weights and the squared Euclidean cost, which the Grams give without any
feature: ``c_ji = ‖y_tj − y_si‖² = (K_tt)_jj + (K_ss)_ii − 2 (K_st)_ij``. It is the exact
optimum of the linear programme (the network simplex of POT's ``ot.emd``; no entropic
smoothing, so no extra parameter). Courty et al. carry a target sample into the source
domain by its barycentric image ``b_j = Σ_i Γ_ji y_si`` with ``Γ = nt γ`` (rows summing
to 1), that is ``B = Γ Ys``. That image exists for pool samples only; a linear map extends
it to every target sample. Perrot et al. learn such a map jointly with the coupling; here
the coupling is the plain OT plan (their starting point) and the map is its ridge
regression pulled towards the identity (MMDTL2's identity prior):

.. math::

    W_0 = \arg\min_W \sum_j \|W y_{tj} - b_j\|^2 + η \|W - I\|_F^2 .

The gradient vanishes where ``W (Ytᵀ Yt + ηI) = Bᵀ Yt + ηI``, so
``W0 = I + (B − Yt)ᵀ Yt (YtᵀYt + ηI)^{-1} = I + (B − Yt)ᵀ (K_tt + ηI)^{-1} Yt``
(``Yt (YtᵀYt + ηI)^{-1} = (Yt Ytᵀ + ηI)^{-1} Yt``). With ``B − Yt = [Γ, −I] Y``:

.. math::

    a = 1, \quad L = \begin{bmatrix} Γ^\top \\ -I_{nt} \end{bmatrix}, \quad
    T = \begin{bmatrix} 0 & (K_{tt} + ηI)^{-1} \end{bmatrix}.

``η = reg · tr(K_tt) / nt`` (``reg`` times the target samples' mean squared norm, so that
``reg`` does not depend on the features' scale). ``reg → ∞`` gives ``W0 → I``; ``reg → 0``
with linearly independent target samples interpolates, ``W0 y_tj = b_j`` on the pool.
Outside the span of the target samples ``W0`` is the identity. The map has no bias term:
the z-scoring preprocessings (``zscore``, ``l2_zscore``) centre every device; with
``none`` or ``l2`` the devices' means stay, and a map through the origin absorbs their
difference only as far as a linear map fits it. No label is read (a
class-aware coupling as in Courty et al.'s group-lasso variant would need the source
labels; not offered).
Cost: the ``nt × ns`` cost and plan (``O(ns nt)`` memory; the network simplex took 0.03 s
at 1,123 × 200 and 3 s at 3,000 × 3,000 here), one ``O(nt³)`` solve and ``O(p² nt)``
products; a pool of ~10⁴⁺ samples of each device needs a subsample (not offered).

Every prior is checked against the same computation done with explicit bases and
matrices in feature space (``tests/test_priors.py``).
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.linalg as sla

from mmdtl2_dist.core.gram_pca import PCABasis, basis_coefficients, complete_basis, pca_basis
from mmdtl2_dist.core.pool import PoolMap, PriorBlocks, SamplePool

#: Pivots the network simplex may take for an OT plan (POT's default, 1e5, stopped short
#: of the optimum at 2,000 × 2,000 random samples here; 1,000 × 1,000 finished).
SIMPLEX_MAX_ITER = 10**8
#: The OT map's default ridge ``reg``: chosen among 0.1, 1 and 10 on the Office-Caltech10
#: dev splits (seed 2027) and confirmed on another draw (seed 2052), where it was above
#: ``reg = 1`` on SURF, GoogLeNet-1024 and DeCAF6 alike (BENCHMARKS.md, "An
#: optimal-transport prior map on the dev splits"). Smaller ridges follow the plan's
#: class mixing further from the identity.
OT_RIDGE = 10.0


def subspace_alignment_map(
    pool: SamplePool,
    d: int,
    *,
    center: bool = True,
    source_basis: PCABasis | None = None,
    target_basis: PCABasis | None = None,
    complement: bool = False,
) -> PoolMap:
    """Subspace alignment's ``W0 = Ps (PsᵀPt) Ptᵀ`` on ``d``-dim PCA bases (module docstring).

    ``source_basis``, ``target_basis``: bases of the pool's source and target samples
    (:func:`pca_basis` of ``Kss``, ``Ktt``) with at least ``d`` axes, computed once and
    reused; by default computed here. ``complement=True`` adds the identity outside the
    subspaces, ``W0 = Πs Πt + (I − Πs)(I − Πt)`` (module docstring, 1b).
    """
    pool.validate()
    A_s = basis_coefficients(source_basis, pool.Kss, d, center, "source samples")
    A_t = basis_coefficients(target_basis, pool.Ktt, d, center, "target samples")
    ns, nt = A_s.shape[0], A_t.shape[0]
    M = A_s.T @ pool.Kst @ A_t
    if complement:  # I − Πs − Πt + 2 Πs Πt
        T = np.block([[-A_s.T, 2.0 * M @ A_t.T], [np.zeros((d, ns)), -A_t.T]])
        return PoolMap(1.0, sla.block_diag(A_s, A_t), T)
    L = np.vstack([A_s, np.zeros((nt, d))])
    T = np.hstack([np.zeros((d, ns)), M @ A_t.T])
    return PoolMap(0.0, L, T)


def shared_pca_map(
    pool: SamplePool,
    d: int,
    *,
    center: bool = True,
    basis: PCABasis | None = None,
    learn: np.ndarray | None = None,
    up_to: bool = False,
) -> PoolMap:
    """The projection ``W0 = P Pᵀ`` on the ``d``-dim PCA subspace of the pool.

    ``learn``: a boolean mask of ``pool.Kyy``'s rows to learn the subspace from (all by
    default); the other rows (samples scored but not learnt from) get zero coefficients, so
    the map is the projection on the learnt subspace for every sample. ``basis``:
    :func:`pca_basis` of the learnt rows' Gram with at least ``d`` axes, if known (then
    ``d`` is taken from it as asked, and ``up_to`` does not apply). ``up_to``: lower ``d``
    to the rank of the centred learnt rows when they span fewer dimensions, instead of
    raising.
    """
    pool.validate()
    p = pool.Kyy.shape[0]
    learn = np.ones(p, bool) if learn is None else np.asarray(learn)
    if learn.shape != (p,) or learn.dtype != bool:
        raise ValueError(
            f"learn must be a boolean mask of the pool's {p} rows (source rows first), got "
            f"{learn.dtype} of shape {learn.shape}; build it as np.zeros({p}, bool) with True "
            "at the rows to learn from."
        )
    Kyy = pool.Kyy if learn.all() else pool.Kyy[np.ix_(learn, learn)]
    if basis is None:
        coef = pca_basis(Kyy, d, center=center, what="pool samples", up_to=up_to).A
    else:
        coef = basis_coefficients(basis, Kyy, d, center, "pool samples")
    if learn.all():
        return PoolMap(0.0, coef, coef.T)
    A = np.zeros((p, coef.shape[1]))
    A[learn] = coef
    return PoolMap(0.0, A, A.T)


def learnt_pca_map(pool: SamplePool, d: int | None, learn: np.ndarray) -> PoolMap | None:
    """The rule's shared-PCA map, None for a candidate without one (``d`` None).

    :func:`shared_pca_map` over the rows ``learn``, ``d`` lowered to their rank (features
    of fewer than ``d`` dimensions; never on the dev data).
    """
    return None if d is None else shared_pca_map(pool, d, learn=learn, up_to=True)


def coral_map(
    pool: SamplePool,
    reg: float = 1.0,
    *,
    source_basis: PCABasis | None = None,
    target_basis: PCABasis | None = None,
) -> PoolMap:
    """CORAL's ``W0 = Cs^{1/2} Ct^{-1/2}``, ``C = cov + reg·I`` (module docstring).

    ``source_basis``, ``target_basis``: complete centred bases of ``Kss``, ``Ktt``
    (``pca_basis(K)``), if known.
    """
    pool.validate()
    if not (np.isfinite(reg) and reg > 0):
        raise ValueError(f"reg must be a positive finite number (CORAL uses 1), got {reg!r}.")
    ns, nt = pool.Kss.shape[0], pool.Ktt.shape[0]
    if min(ns, nt) < 2:
        raise ValueError(
            f"CORAL needs at least 2 samples of each device for a covariance; the pool has "
            f"{ns} source and {nt} target samples. Add unlabelled samples to the pool."
        )
    A_s, lam_s = complete_basis(source_basis, pool.Kss, "source samples")
    A_t, lam_t = complete_basis(target_basis, pool.Ktt, "target samples")
    E_s = np.sqrt(1.0 + lam_s / ((ns - 1) * reg)) - 1.0
    D_t = 1.0 / np.sqrt(1.0 + lam_t / ((nt - 1) * reg)) - 1.0
    M = A_s.T @ pool.Kst @ A_t
    L = sla.block_diag(A_s, A_t)
    top = [E_s[:, None] * A_s.T, (E_s[:, None] * M * D_t) @ A_t.T]
    T = np.block([top, [np.zeros((len(lam_t), ns)), D_t[:, None] * A_t.T]])
    return PoolMap(1.0, L, T)


def transport_plan(pool: SamplePool, max_iter: int = SIMPLEX_MAX_ITER) -> np.ndarray:
    """The exact OT plan ``γ`` (nt, ns) between the pool's target and source samples.

    Uniform weights, squared Euclidean cost from the Grams (module docstring, 4).
    """
    import ot  # POT; imported here, where a transport prior is asked for

    pool.validate()
    ns, nt = pool.Kss.shape[0], pool.Ktt.shape[0]
    cost = np.diag(pool.Ktt)[:, None] + np.diag(pool.Kss)[None, :] - 2.0 * pool.Kst.T
    cost = np.maximum(cost, 0.0)  # round-off below zero for (near) coincident samples
    scale = cost.max()  # the plan does not depend on it; the simplex's tolerances do
    weights_t, weights_s = np.full(nt, 1.0 / nt), np.full(ns, 1.0 / ns)
    with warnings.catch_warnings():  # an unsolved plan raises below, naming the fix
        warnings.filterwarnings("ignore", "numItermax reached", UserWarning)
        plan, log = ot.emd(
            weights_t, weights_s, cost / scale if scale > 0 else cost, numItermax=max_iter, log=True
        )
    if log["result_code"] != 1:
        raise RuntimeError(
            f"the transport plan between {nt} target and {ns} source samples was not solved "
            f"({log['warning']}); raise max_iter or subsample the pool."
        )
    return plan


def ot_map(pool: SamplePool, reg: float = OT_RIDGE, *, max_iter: int = SIMPLEX_MAX_ITER) -> PoolMap:
    """The OT map ``W0 = I + (B − Yt)ᵀ (Ktt + ηI)⁻¹ Yt``, ``η = reg·tr(Ktt)/nt`` (docstring, 4).

    ``B = Γ Ys``, ``Γ = nt γ``, holds the barycentric images of the target samples under
    the exact OT plan ``γ`` (:func:`transport_plan`); ``max_iter`` bounds the network
    simplex.
    """
    pool.validate()
    if not (np.isfinite(reg) and reg > 0):
        raise ValueError(
            f"reg must be a positive finite number ({OT_RIDGE:g} by default), got {reg!r}."
        )
    ns, nt = pool.Kss.shape[0], pool.Ktt.shape[0]
    eta = reg * np.trace(pool.Ktt) / nt
    if not eta > 0:
        raise ValueError("the target samples are all zero; the OT map needs non-zero features.")
    barycentric = nt * transport_plan(pool, max_iter)  # Γ: rows sum to 1
    ridge = sla.solve(pool.Ktt + eta * np.eye(nt), np.eye(nt), assume_a="pos")
    L = np.vstack([barycentric.T, -np.eye(nt)])
    T = np.hstack([np.zeros((nt, ns)), ridge])
    return PoolMap(1.0, L, T)


PRIOR_MAPS = {
    "sa": subspace_alignment_map,
    "shared_pca": shared_pca_map,
    "coral": coral_map,
    "ot": ot_map,
}


def transductive_prior(pool: SamplePool, name: str, **params) -> PriorBlocks:
    """The ``prior="matrix"`` blocks of the prior ``name`` learned from ``pool``.

    ``name`` is ``"sa"``, ``"shared_pca"``, ``"coral"`` or ``"ot"``; ``params`` go to the
    map's function (:func:`subspace_alignment_map`: ``d``, ``center``, the bases;
    :func:`shared_pca_map`: ``d``, ``center``, ``basis``, ``learn``, ``up_to``;
    :func:`coral_map`: ``reg``, the bases; :func:`ot_map`: ``reg``, ``max_iter``).
    """
    if name not in PRIOR_MAPS:
        raise ValueError(f"unknown transductive prior {name!r}; choose one of {list(PRIOR_MAPS)}.")
    return PRIOR_MAPS[name](pool, **params).blocks(pool)
