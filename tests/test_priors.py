"""Transductive priors on Gram blocks against the same maps formed in feature space.

Tolerance: the Gram path and the feature path compute the same quantities with different
backward-stable factorizations (the eigendecomposition of a centred Gram against the SVD
of the centred features, or the eigendecomposition of an L x L covariance). They differ by
round-off amplified by the conditioning of the retained eigenspaces: about
``eps * ||K|| / gap`` for a top-``d`` subspace and ``eps * ||K|| / λ_min`` through
``Λ^{-1/2}``. The samples are drawn with a factor >= 2 gap after the ``d``-th eigenvalue
and a smallest retained eigenvalue above 1e-3 of the largest, so the differences are about
1e-13; ``rtol = 1e-9`` leaves room for BLAS variations, while any error in a formula (a
wrong centring, a missing factor, a transposed block) is of order one.
"""

from __future__ import annotations

import numpy as np
import pytest

from mmdtl2_dist.core.gram_pca import pca_basis
from mmdtl2_dist.core.methods import GramProblem, fit_predict
from mmdtl2_dist.core.pool import PoolMap, SamplePool
from mmdtl2_dist.core.priors import (
    coral_map,
    ot_map,
    shared_pca_map,
    subspace_alignment_map,
    transductive_prior,
    transport_plan,
)

RTOL = 1e-9  # see the module docstring
BLOCKS = ("Ksu", "Kuu", "Ksuq", "Kuuq")


def _device(rng, n, L, spectrum, shift):
    """``n`` samples with principal variances ``spectrum`` (decaying, with gaps) plus noise."""
    basis, _ = np.linalg.qr(rng.standard_normal((L, len(spectrum))))
    X = (rng.standard_normal((n, len(spectrum))) * np.sqrt(spectrum)) @ basis.T
    return X + 0.05 * rng.standard_normal((n, L)) + shift


def _split(seed=0, L=12, ns=30, nt=40, K=3):
    """A pool of both devices, its source/labelled/test rows and their labels."""
    rng = np.random.default_rng(seed)
    spec = np.array([16.0, 8.0, 4.0, 2.0, 1.0])
    Ys = _device(rng, ns, L, spec, 0.3 * rng.standard_normal(L))
    Yt = _device(rng, nt, L, spec * 1.5, 0.3 * rng.standard_normal(L))
    src = np.sort(rng.choice(ns, 18, replace=False))  # unlabelled source rows stay in the pool
    lab = np.arange(0, 3 * K)
    test = np.arange(3 * K, nt)
    ys, yt = np.arange(len(src)) % K, np.arange(3 * K) % K
    pool = SamplePool(Ys @ Ys.T, Yt @ Yt.T, Ys @ Yt.T, src, lab, test)
    return pool, Ys, Yt, ys, yt


def _pca_basis(X, d, center=True):
    """The top-``d`` principal axes from the SVD of the (centred) features."""
    Xc = X - X.mean(axis=0) if center else X
    return np.linalg.svd(Xc, full_matrices=False)[2][:d].T


def _sym_power(C, power):
    w, Q = np.linalg.eigh(C)
    return (Q * w**power) @ Q.T


def _reference(pool, Ys, Yt, ys, yt, W0):
    return GramProblem.from_features(
        Ys[pool.source_train], ys, Yt[pool.target_train], yt, Yt[pool.target_test], W0=W0
    )


def _assert_blocks_equal(got, ref):
    for name in BLOCKS:
        a, b = getattr(got, name), getattr(ref, name)
        assert a.shape == b.shape, name
        err = np.linalg.norm(a - b) / np.linalg.norm(b)
        assert err <= RTOL, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize("d", [1, 3])
def test_subspace_alignment_equals_feature_space(d, center):
    pool, Ys, Yt, ys, yt = _split()
    Ps, Pt = _pca_basis(Ys, d, center), _pca_basis(Yt, d, center)
    W0 = Ps @ Ps.T @ Pt @ Pt.T  # SA's similarity y_s Xs Xsᵀ Xt Xtᵀ y_t as a map
    got = pool.problem(ys, yt, subspace_alignment_map(pool, d, center=center).blocks(pool))
    _assert_blocks_equal(got, _reference(pool, Ys, Yt, ys, yt, W0))


def test_subspace_alignment_with_complement_equals_feature_space():
    pool, Ys, Yt, ys, yt = _split(seed=6)
    Ps, Pt = _pca_basis(Ys, 3), _pca_basis(Yt, 3)
    I = np.eye(Ys.shape[1])
    W0 = Ps @ Ps.T @ Pt @ Pt.T + (I - Ps @ Ps.T) @ (I - Pt @ Pt.T)
    got = pool.problem(ys, yt, subspace_alignment_map(pool, 3, complement=True).blocks(pool))
    _assert_blocks_equal(got, _reference(pool, Ys, Yt, ys, yt, W0))


def test_subspace_alignment_with_complement_is_the_identity_for_one_subspace():
    """Two devices with the same samples: W0 = I, the identity prior's blocks."""
    pool, Ys, _, ys, yt = _split(seed=7)
    same = SamplePool(
        pool.Kss, pool.Kss, pool.Kss, pool.source_train, np.arange(9), np.arange(9, 30)
    )
    got = subspace_alignment_map(same, 3, complement=True).blocks(same)
    prob = same.problem(ys, yt)
    for name, ref in zip(BLOCKS, (prob.Kst, prob.Ktt, prob.Ksq, prob.Ktq), strict=True):
        np.testing.assert_allclose(
            getattr(got, name), ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max()
        )


@pytest.mark.parametrize("center", [True, False])
def test_shared_pca_equals_feature_space(center):
    pool, Ys, Yt, ys, yt = _split(seed=1)
    P = _pca_basis(np.vstack([Ys, Yt]), 4, center)
    got = pool.problem(ys, yt, shared_pca_map(pool, 4, center=center).blocks(pool))
    _assert_blocks_equal(got, _reference(pool, Ys, Yt, ys, yt, P @ P.T))


def test_shared_pca_over_the_learnt_rows_equals_feature_space():
    """``learn``: the subspace is the PCA of the learnt rows only, and every sample (learnt
    or only scored) is projected on it."""
    pool, Ys, Yt, ys, yt = _split(seed=2)
    learn = np.ones(len(Ys) + len(Yt), bool)
    learn[len(Ys) + pool.target_test[::2]] = False  # half the scored targets not learnt
    P = _pca_basis(np.vstack([Ys, Yt])[learn], 4)
    got = pool.problem(ys, yt, shared_pca_map(pool, 4, learn=learn).blocks(pool))
    _assert_blocks_equal(got, _reference(pool, Ys, Yt, ys, yt, P @ P.T))


def test_shared_pca_leaves_a_given_basis_untouched_and_takes_a_read_only_one():
    pool, *_ = _split(seed=3)
    basis = pca_basis(pool.Kyy, 4)
    before = basis.A.copy()
    basis.A.setflags(write=False)
    got = shared_pca_map(pool, 4, basis=basis).blocks(pool)
    want = shared_pca_map(pool, 4).blocks(pool)
    for name in BLOCKS:
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(basis.A, before)


def test_a_learn_mask_of_the_wrong_shape_or_type_names_the_fix():
    pool, *_ = _split()
    p = pool.Kyy.shape[0]
    for bad in (np.ones(p - 1, bool), np.arange(p), np.ones((p, 1), bool)):
        with pytest.raises(ValueError, match=rf"learn must be a boolean mask of the pool's {p}"):
            shared_pca_map(pool, 2, learn=bad)


#: Shapes and ridges of the maps with the identity outside the samples' spans (CORAL, OT).
SPAN_MAP_CASES = pytest.mark.parametrize(
    ("L", "ns", "nt", "reg"),
    [(12, 30, 40, 1.0), (50, 20, 25, 1.0), (12, 30, 40, 0.1)],
    ids=["n>L", "n<L", "reg=0.1"],
)


@SPAN_MAP_CASES
def test_coral_equals_feature_space(L, ns, nt, reg):
    pool, Ys, Yt, ys, yt = _split(seed=2, L=L, ns=ns, nt=nt)
    Cs = np.cov(Ys, rowvar=False) + reg * np.eye(L)  # MATLAB cov: normalised by n - 1
    Ct = np.cov(Yt, rowvar=False) + reg * np.eye(L)
    W0 = _sym_power(Cs, 0.5) @ _sym_power(Ct, -0.5)
    got = pool.problem(ys, yt, coral_map(pool, reg).blocks(pool))
    _assert_blocks_equal(got, _reference(pool, Ys, Yt, ys, yt, W0))


def _ot_reference(Ys, Yt, reg):
    """The OT map in feature space: POT's plan on the features' squared distances, the
    barycentric images ``B``, and the ridge regression's normal equations (L x L)."""
    import ot

    nt, L = Yt.shape
    plan = ot.emd(np.full(nt, 1 / nt), np.full(len(Ys), 1 / len(Ys)), ot.dist(Yt, Ys))
    B = nt * plan @ Ys
    eta = reg * np.mean(np.sum(Yt**2, axis=1))
    W0 = np.linalg.solve(Yt.T @ Yt + eta * np.eye(L), Yt.T @ B + eta * np.eye(L)).T
    return plan, B, W0


@SPAN_MAP_CASES
def test_ot_map_equals_feature_space(L, ns, nt, reg):
    pool, Ys, Yt, ys, yt = _split(seed=8, L=L, ns=ns, nt=nt)
    plan, _, W0 = _ot_reference(Ys, Yt, reg)
    # The costs from the Grams equal the features' ones to round-off, and a generic cost
    # matrix has one optimal vertex: the same plan, entry by entry to round-off.
    np.testing.assert_allclose(transport_plan(pool), plan, rtol=0, atol=1e-15)
    got = pool.problem(ys, yt, ot_map(pool, reg).blocks(pool))
    _assert_blocks_equal(got, _reference(pool, Ys, Yt, ys, yt, W0))


def test_transport_plan_is_the_linear_programmes_optimum():
    """Against scipy's HiGHS on the transport LP: same optimal cost, exact marginals."""
    from scipy.optimize import linprog

    pool, Ys, Yt, *_ = _split(seed=9, L=12, ns=20, nt=24)
    cost = ((Yt[:, None, :] - Ys[None, :, :]) ** 2).sum(axis=2)
    nt, ns = cost.shape
    rows = np.kron(np.eye(nt), np.ones(ns))  # Σ_i γ_ji = 1/nt
    cols = np.kron(np.ones(nt), np.eye(ns))  # Σ_j γ_ji = 1/ns
    lp = linprog(
        cost.ravel(),
        A_eq=np.vstack([rows, cols]),
        b_eq=np.concatenate([np.full(nt, 1 / nt), np.full(ns, 1 / ns)]),
        bounds=(0, None),
        method="highs",
    )
    plan = transport_plan(pool)
    np.testing.assert_allclose(plan.sum(axis=1), 1 / nt, rtol=1e-12)
    np.testing.assert_allclose(plan.sum(axis=0), 1 / ns, rtol=1e-12)
    assert np.all(plan >= 0)
    # HiGHS's optimality tolerance is about 1e-7 relative; a wrong cost is off by far more.
    np.testing.assert_allclose(np.sum(plan * cost), lp.fun, rtol=1e-7)
    # A generic cost has one optimal vertex, which both solvers end on.
    np.testing.assert_allclose(plan, lp.x.reshape(nt, ns), rtol=0, atol=1e-9)


def test_ot_map_interpolates_without_ridge_and_is_the_identity_with_a_large_one():
    """Closed forms: ``reg → 0`` with independent targets maps each target pool sample to
    its barycentric image ``b_j``; ``reg → ∞`` gives the identity prior's blocks."""
    pool, Ys, Yt, ys, yt = _split(seed=10, L=50, ns=20, nt=25)  # nt < L: independent
    _, B, _ = _ot_reference(Ys, Yt, 1.0)
    src, lab, q = pool.source_train, pool.target_train, pool.target_test
    tight = ot_map(pool, 1e-10).blocks(pool)
    # The ridge leaves about η / λ_min(Ktt) of the interpolation, 3e-7 here; a wrong map
    # (another plan, a missing term) is off by order one.
    for got, ref in ((tight.Ksu, Ys[src] @ B[lab].T), (tight.Kuuq, B[lab] @ B[q].T)):
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6 * np.abs(ref).max())
    loose = ot_map(pool, 1e12).blocks(pool)  # W0 − I = O(1/reg) of the blocks' scale
    prob = pool.problem(ys, yt)
    for name, ref in zip(BLOCKS, (prob.Kst, prob.Ktt, prob.Ksq, prob.Ktq), strict=True):
        atol = 1e-9 * np.abs(ref).max()
        np.testing.assert_allclose(getattr(loose, name), ref, rtol=0, atol=atol)


def test_pca_basis_is_the_orthonormal_principal_axes():
    _, Ys, _, _, _ = _split()
    basis = pca_basis(Ys @ Ys.T, 3)
    P, lam = Ys.T @ basis.A, basis.lam
    np.testing.assert_allclose(P.T @ P, np.eye(3), atol=1e-12)
    np.testing.assert_allclose(np.abs(P.T @ _pca_basis(Ys, 3)), np.eye(3), atol=1e-9)
    assert np.all(np.diff(lam) < 0)


@pytest.mark.parametrize("kernel", ["linear", "rbf"])
@pytest.mark.parametrize("name", ["sa", "shared_pca", "coral", "ot"])
def test_fit_through_matrix_prior_agrees_with_explicit_w0(name, kernel):
    """The alternation (with its L2 pull, ``c_d`` at its default, and either target kernel)
    gives the same scores from the Gram path and from W0 itself."""
    pool, Ys, Yt, ys, yt = _split(seed=3)
    if name == "ot":
        W0, params = _ot_reference(Ys, Yt, 1.0)[2], {"reg": 1.0}
    elif name == "coral":
        W0 = _sym_power(np.cov(Ys, rowvar=False) + np.eye(12), 0.5) @ _sym_power(
            np.cov(Yt, rowvar=False) + np.eye(12), -0.5
        )
        params = {"reg": 1.0}
    elif name == "sa":
        Ps, Pt = _pca_basis(Ys, 3), _pca_basis(Yt, 3)
        W0, params = Ps @ Ps.T @ Pt @ Pt.T, {"d": 3}
    else:
        P = _pca_basis(np.vstack([Ys, Yt]), 3)
        W0, params = P @ P.T, {"d": 3}
    got = pool.problem(ys, yt, transductive_prior(pool, name, **params))
    ref = _reference(pool, Ys, Yt, ys, yt, W0)
    p = {"prior": "matrix", "prior_weight": 0.7, "c_f": 1.0, "qp_tol": 1e-10, "kernel": kernel}
    a, b = fit_predict("mmdtl2", p, got), fit_predict("mmdtl2", p, ref)
    # Inputs agree to ~1e-13; the QPs are solved to a relative KKT residual of 1e-10.
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6, atol=1e-6)


def test_identity_pool_map_is_the_identity_prior():
    """``a = 1, L = T = 0`` gives exactly the blocks of ``prior="identity"``."""
    pool, _, _, ys, yt = _split(seed=4)
    p = pool.Kyy.shape[0]
    got = PoolMap(1.0, np.zeros((p, 1)), np.zeros((1, p))).blocks(pool)
    prob = pool.problem(ys, yt)
    for name, ref in zip(BLOCKS, (prob.Kst, prob.Ktt, prob.Ksq, prob.Ktq), strict=True):
        np.testing.assert_array_equal(getattr(got, name), ref)


def test_bad_inputs_name_the_fix():
    pool, *_ = _split()
    with pytest.raises(ValueError, match=r"d=30 needs 1 <= d <= 29 \(30 source samples"):
        subspace_alignment_map(pool, 30)
    with pytest.raises(ValueError, match="one feature space"):
        coral_map(SamplePool(pool.Kss, pool.Ktt, None, *([np.arange(2)] * 3)))
    with pytest.raises(ValueError, match="reg must be a positive"):
        coral_map(pool, 0.0)
    with pytest.raises(ValueError, match="unknown transductive prior 'emd'"):
        transductive_prior(pool, "emd")
    with pytest.raises(ValueError, match=r"reg must be a positive finite number \(10 by default"):
        ot_map(pool, -1.0)
    with pytest.raises(RuntimeError, match="raise max_iter or subsample the pool"):
        ot_map(pool, max_iter=1)
    bad = SamplePool(pool.Kss, pool.Ktt, pool.Kst, pool.source_train, pool.target_train, [99])
    with pytest.raises(ValueError, match=r"target_test must be a 1-d array of row indices"):
        shared_pca_map(bad, 2)
    low = np.ones((5, 5))  # rank 1, centred rank 0
    with pytest.raises(ValueError, match="exceeds the rank of the samples"):
        pca_basis(low, 1)
    small = pca_basis(pool.Ktt, 2)
    with pytest.raises(ValueError, match="d=3 exceeds the 2 axes of the target samples' PCA"):
        subspace_alignment_map(pool, 3, target_basis=small)
    with pytest.raises(ValueError, match="has 40 rows but the pool has 30 source samples"):
        subspace_alignment_map(pool, 2, source_basis=small)
    with pytest.raises(ValueError, match="computed with center=True, the prior asks for center"):
        shared_pca_map(pool, 2, center=False, basis=pca_basis(pool.Kyy, 2))
    with pytest.raises(ValueError, match="CORAL needs the complete centred PCA basis"):
        coral_map(pool, target_basis=small)


def test_precomputed_bases_give_the_same_prior():
    """A basis computed once for the largest d serves every smaller d (nested eigenpairs)."""
    pool, *_ = _split(seed=5)
    src, tgt, shared = pca_basis(pool.Kss, 6), pca_basis(pool.Ktt, 6), pca_basis(pool.Kyy, 6)
    for d in (2, 4):
        pairs = [
            (
                subspace_alignment_map(pool, d),
                subspace_alignment_map(pool, d, source_basis=src, target_basis=tgt),
            ),
            (shared_pca_map(pool, d), shared_pca_map(pool, d, basis=shared)),
        ]
        for fresh, reused in pairs:
            a, b = fresh.blocks(pool), reused.blocks(pool)
            for name in BLOCKS:
                np.testing.assert_allclose(
                    getattr(a, name), getattr(b, name), rtol=1e-12, atol=1e-12
                )
    full_s, full_t = pca_basis(pool.Kss), pca_basis(pool.Ktt)
    a = coral_map(pool).blocks(pool)
    b = coral_map(pool, source_basis=full_s, target_basis=full_t).blocks(pool)
    for name in BLOCKS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
