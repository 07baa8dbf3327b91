"""Core mathematics against independent references.

Tolerances: the primal references are solved by an interior-point method (Clarabel) to
gaps of 1e-11 and the duals by an active-set method to KKT residuals of 1e-10, so two
exact solutions of the same strictly convex problem agree to ~1e-8 relative; the
assertions use 1e-5 (the issue's bound) or 1e-6, leaving two orders of magnitude for
conditioning.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from mmdtl2_dist.core.kernels import KernelSpec, kernel_from_gram
from mmdtl2_dist.core.mmdtl2 import (
    MMDTL2Params,
    fit_mmdtl2_gram,
    similarity_weights,
    transfer_operators,
)
from mmdtl2_dist.core.qp import QPSolveError, solve_box_qp
from mmdtl2_dist.core.reference import augment, fit_mmdtl2_features, wstep_primal
from mmdtl2_dist.core.svm import one_vs_rest
from mmdtl2_dist.core.wstep import solve_wstep


def _problem(seed, K, N, M, Ls, Lt):
    rng = np.random.default_rng(seed)
    ys = np.r_[np.arange(K), rng.integers(0, K, N - K)]
    yt = np.r_[np.arange(K), rng.integers(0, K, M - K)]
    mu_s = rng.standard_normal((K, Ls)) * 1.5
    mu_t = rng.standard_normal((K, Lt)) * 1.5
    Xs = mu_s[ys] + rng.standard_normal((N, Ls))
    Xt = mu_t[yt] + rng.standard_normal((M, Lt))
    return rng, ys, yt, Xs, Xt


def _rel(a, b):
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


# ---------------------------------------------------------------- box QP solvers


@pytest.mark.parametrize("n,rank", [(30, 30), (120, 20), (300, 300)])
def test_box_qp_solvers_agree_and_meet_kkt(n, rank):
    rng = np.random.default_rng(n + rank)
    A = rng.standard_normal((n, rank))
    H = A @ A.T
    f = rng.standard_normal(n) * 2
    ub = rng.uniform(0.1, 2.0, n)
    a = solve_box_qp(H, f, 0.0, ub, solver="dcd", tol=1e-9)
    b = solve_box_qp(H, f, 0.0, ub, solver="osqp", tol=1e-7)
    assert a.kkt_residual <= 1e-9
    assert np.all(a.x >= 0) and np.all(a.x <= ub)
    # Both minimise the same convex quadratic: objectives agree even where x is not unique.
    assert abs(a.objective - b.objective) <= 1e-6 * max(1.0, abs(b.objective))


def test_box_qp_unbounded_above_and_bad_input():
    H = np.diag([1.0, 2.0])
    res = solve_box_qp(H, np.array([3.0, -1.0]), 0.0, np.inf)
    np.testing.assert_allclose(res.x, [3.0, 0.0], atol=1e-12)
    with pytest.raises(ValueError, match="NaN or Inf"):
        solve_box_qp(np.array([[np.nan]]), np.ones(1), 0, 1)
    with pytest.raises(ValueError, match="shape"):
        solve_box_qp(np.eye(3), np.ones(2), 0, 1)
    with pytest.raises(ValueError, match="solver"):
        solve_box_qp(np.eye(2), np.ones(2), 0, 1, solver="cvx")
    assert issubclass(QPSolveError, RuntimeError)


# ---------------------------------------------------------------- W-step: dual == primal


CASES = [
    # (K, M, Ls, Lt, c_f, c_d)
    (2, 6, 4, 3, 1.0, 0.0),
    (3, 9, 4, 3, 1e-4, 0.0),
    (3, 9, 5, 2, 10.0, 0.0),
    (4, 12, 3, 5, 1e-2, 0.0),
    (3, 9, 4, 3, 1e-6, 0.1),
    (3, 12, 6, 3, 0.1, 0.1),
    (5, 15, 3, 4, 1e-3, 1.0),
    (2, 10, 2, 6, 10.0, 5.0),
]


@pytest.mark.parametrize("K,M,Ls,Lt,c_f,c_d", CASES)
@pytest.mark.parametrize("prior", ["zero", "matrix"])
def test_wstep_dual_equals_primal(K, M, Ls, Lt, c_f, c_d, prior):
    N = 5 * K
    rng, ys, yt, Xs, Xt = _problem(K * 100 + M, K, N, M, Ls, Lt)
    p = MMDTL2Params(c_f=c_f, c_d=c_d, c_t=0.7, c_s=0.3, qp_tol=1e-10)
    W0 = rng.standard_normal((Ls, Lt + 1)) * 0.5 if prior == "matrix" else np.zeros((Ls, Lt + 1))
    U = augment(Xt) @ W0.T
    Z = np.vstack([Xs, U])
    beta = rng.standard_normal((N + M, K)) * 0.3
    b = rng.standard_normal(K)
    S = similarity_weights(ys, yt, c_d)
    s_m = S.sum(axis=0)
    ops = transfer_operators(augment(Xt) @ augment(Xt).T, s_m, c_f)
    R_c = np.vstack([S, -np.diag(s_m)])
    ws = solve_wstep(Z @ Z.T, beta, b, one_vs_rest(yt, K), R_c, ops, N, p)
    W_dual = W0 + Z.T @ ws.Gamma @ ops.C @ augment(Xt)
    W_primal = wstep_primal(Xs, ys, Xt, yt, Z.T @ beta, b, p, W0=W0)
    assert ws.qp.kkt_residual <= 1e-8
    assert _rel(W_dual, W_primal) <= 1e-5
    # Transformed training targets through the Gram-only route (Ω on Z) too.
    assert _rel((Z.T @ ws.Omega).T, augment(Xt) @ W_primal.T) <= 1e-5


def test_wstep_tiny_cf_without_l2_pull_is_close_to_primal():
    """c_d = 0 with c_f = 1e-6: the known weak spot (documented in the README).

    Without an L2 pull, G = Kt / c_f: W grows like 1/c_f, the dual Hessian is singular
    (rank K·rank(Kt) < K·M) and its box is 1/c_f wide in scaled units, so the dual's
    rounding is amplified a million times in W. We get W x̂ to a few 1e-2 relative
    instead of 1e-5 (c_f >= 1e-4 meets 1e-5, see the cases above).
    """
    K, M, Ls, Lt = 3, 9, 4, 3
    rng, ys, yt, Xs, Xt = _problem(1, K, 15, M, Ls, Lt)
    p = MMDTL2Params(c_f=1e-6, c_d=0.0, c_t=0.5, c_s=0.5, qp_tol=1e-10)
    Z = np.vstack([Xs, np.zeros((M, Ls))])
    beta = np.vstack([rng.standard_normal((15, K)), np.zeros((M, K))])
    b = rng.standard_normal(K)
    ops = transfer_operators(augment(Xt) @ augment(Xt).T, np.zeros(M), p.c_f)
    R_c = np.zeros((15 + M, M))
    ws = solve_wstep(Z @ Z.T, beta, b, one_vs_rest(yt, K), R_c, ops, 15, p)
    W_dual = Z.T @ ws.Gamma @ ops.C @ augment(Xt)
    W_primal = wstep_primal(Xs, ys, Xt, yt, Z.T @ beta, b, p)
    assert _rel(W_dual @ augment(Xt).T, W_primal @ augment(Xt).T) <= 3e-2


# ---------------------------------------------------------------- stable C and G


def test_transfer_operators_match_paper_forms_and_stay_finite():
    rng = np.random.default_rng(3)
    Xh = augment(rng.standard_normal((8, 3)))  # M = 8 > Lt + 1: Kt singular
    Kt = Xh @ Xh.T
    s_m = rng.uniform(0.5, 2.0, 8)
    for c_f in (1e-3, 0.1, 10.0):
        ops = transfer_operators(Kt, s_m, c_f)
        A = c_f * np.eye(4) + Xh.T @ (s_m[:, None] * Xh)
        G_feature = Xh @ np.linalg.solve(A, Xh.T)  # paper: G = X̂tᵀ A⁻¹ X̂t
        np.testing.assert_allclose(ops.G, G_feature, rtol=1e-9, atol=1e-11)
        # C acts as (c_f I + Kt S_M)⁻¹ on the range of Kt.
        C_direct = np.linalg.inv(c_f * np.eye(8) + Kt * s_m[None, :])
        np.testing.assert_allclose(ops.C @ Kt, C_direct @ Kt, rtol=1e-8, atol=1e-10)
    # c_f -> 0 with an L2 pull: G tends to a finite limit (no 1/c_f blow-up).
    g12 = transfer_operators(Kt, s_m, 1e-12).G
    g9 = transfer_operators(Kt, s_m, 1e-9).G
    assert np.all(np.isfinite(g12))
    np.testing.assert_allclose(g12, g9, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize(
    "c_f,dtype,naive_err", [(1e-7, np.float32, 0.5), (1e-12, np.float64, 1e-4)]
)
def test_paper_form_of_G_loses_digits_where_ours_does_not(c_f, dtype, naive_err):
    """The paper's G = K/c_f − K (S_M⁻¹ + K/c_f)⁻¹ K / c_f² cancels catastrophically.

    In single precision it is already wrong at c_f = 1e-7 (the paper's observed collapse);
    in double precision at 1e-12. The factored form stays at machine precision.
    """
    rng = np.random.default_rng(4)
    Xh = augment(rng.standard_normal((6, 8)))
    Kt = Xh @ Xh.T
    s_m = np.full(6, 0.3)
    G_ref = np.linalg.inv(c_f * np.linalg.inv(Kt) + np.diag(s_m))  # Kt invertible here
    K, c = Kt.astype(dtype), dtype(c_f)
    naive = K / c - K @ np.linalg.solve(np.diag(1 / s_m).astype(dtype) + K / c, K) / c**2
    assert _rel(naive.astype(np.float64), G_ref) > naive_err
    assert _rel(transfer_operators(Kt, s_m, c_f).G, G_ref) < 1e-12


# ---------------------------------------------------------------- alternation


@pytest.mark.parametrize("prior", ["zero", "identity", "half"])
def test_gram_form_equals_feature_form(prior):
    K, N, M, L = 3, 18, 9, 4
    rng, ys, yt, Xs, Xt = _problem(7, K, N, M, L, L)
    mu = {"zero": 0.0, "identity": 1.0, "half": 0.5}[prior]
    p = MMDTL2Params(c_f=0.1, c_d=0.1, c_t=0.5, c_s=0.5, max_iter=3, tol=0.0, qp_tol=1e-10)
    Z = np.vstack([Xs, mu * Xt])
    fit = fit_mmdtl2_gram(Z @ Z.T, Xt @ Xt.T + 1, ys, yt, K, p)
    assert fit.info["n_iter"] == 3
    W0 = np.hstack([mu * np.eye(L), np.zeros((L, 1))])
    W, Theta, b = fit_mmdtl2_features(Xs, ys, Xt, yt, K, p, W0=W0, n_iter=3)
    Xq = rng.standard_normal((11, L))
    ref = augment(Xq) @ W.T @ Theta + b
    got = fit.decision_function(Xt @ Xq.T + 1, Z @ (mu * Xq).T)
    assert _rel(got, ref) <= 1e-5
    np.testing.assert_allclose(Z.T @ fit.beta, Theta, rtol=1e-4, atol=1e-6)


def test_objective_is_monotone_and_stall_stops():
    K, N, M, L = 4, 40, 12, 6
    _, ys, yt, Xs, Xt = _problem(9, K, N, M, L, L)
    p = MMDTL2Params(max_iter=30, tol=1e-7)
    fit = fit_mmdtl2_gram(np.pad(Xs @ Xs.T, (0, M)), Xt @ Xt.T + 1, ys, yt, K, p)
    obj = np.asarray(fit.objective)
    assert np.all(np.diff(obj) <= 1e-7 * np.abs(obj[:-1]) + 1e-9)
    assert fit.info["n_iter"] < 30 and fit.info["converged"]


def test_poly_kernel_equals_linear_on_explicit_features():
    """(γ x·x' + 1)² = φ(x)·φ(x') + 1 with φ(x) = (γ x⊗x, √(2γ) x): same model."""
    K, N, M, L = 3, 15, 9, 3
    rng, ys, yt, Xs, Xt = _problem(11, K, N, M, 4, L)
    gamma = 0.3

    def phi(X):
        quad = gamma * np.einsum("ni,nj->nij", X, X).reshape(len(X), -1)
        return np.hstack([quad, np.sqrt(2 * gamma) * X])

    p = MMDTL2Params(max_iter=4, tol=0.0, qp_tol=1e-10)
    Kz = np.pad(Xs @ Xs.T, (0, M))
    spec = KernelSpec("poly", gamma=gamma, degree=2, coef0=1.0)
    fit_k = fit_mmdtl2_gram(Kz, spec(Xt @ Xt.T), ys, yt, K, p)
    fit_f = fit_mmdtl2_gram(Kz, phi(Xt) @ phi(Xt).T + 1, ys, yt, K, p)
    Xq = rng.standard_normal((7, L))
    s_k = fit_k.decision_function(spec(Xt @ Xq.T))
    s_f = fit_f.decision_function(phi(Xt) @ phi(Xq).T + 1)
    assert _rel(s_k, s_f) <= 1e-6


def test_rbf_kernel_from_gram_matches_distances():
    rng = np.random.default_rng(2)
    A, B = rng.standard_normal((5, 7)), rng.standard_normal((4, 7))
    spec = KernelSpec("rbf", gamma=0.2)
    got = kernel_from_gram(A @ B.T, spec, (A * A).sum(1), (B * B).sum(1))
    d2 = ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1)
    np.testing.assert_allclose(got, np.exp(-0.2 * d2), rtol=1e-12)
    resolved = KernelSpec("rbf").resolve(A @ A.T)
    assert resolved.gamma > 0
    with pytest.raises(ValueError, match="kernel"):
        KernelSpec("sigmoid")


@pytest.mark.parametrize("c_f,c_d", [(1e-12, 0.1), (1e-10, 0.1), (0.1, 1e3), (1e-12, 1e3)])
def test_extreme_parameters_stay_finite_and_sensible(c_f, c_d):
    """The paper's results collapsed for c_f <= 1e-7 (single precision, 1/c_f); ours do not."""
    K, N, M, L = 3, 60, 15, 8
    rng = np.random.default_rng(13)
    mu_s, mu_t = rng.standard_normal((K, L)) * 1.5, rng.standard_normal((K, L)) * 1.5
    ys, yt, yq = rng.integers(0, K, N), np.tile(np.arange(K), M // K), rng.integers(0, K, 90)
    Xs = mu_s[ys] + rng.standard_normal((N, L))
    Xt, Xq = mu_t[yt] + rng.standard_normal((M, L)), mu_t[yq] + rng.standard_normal((90, L))
    Kz, Kt, Kq = np.pad(Xs @ Xs.T, (0, M)), Xt @ Xt.T + 1, Xt @ Xq.T + 1

    def accuracy_and_scores(params):
        fit = fit_mmdtl2_gram(Kz, Kt, ys, yt, K, params)
        assert np.all(np.isfinite(fit.objective))
        scores = fit.decision_function(Kq)
        return np.mean(np.argmax(scores, 1) == yq), scores

    acc, scores = accuracy_and_scores(MMDTL2Params(c_f=c_f, c_d=c_d))
    acc_default, _ = accuracy_and_scores(MMDTL2Params())
    assert np.all(np.isfinite(scores))
    assert acc >= acc_default - 0.1  # sensible: no collapse relative to the paper defaults
    if c_f < 1e-9:
        # Continuity in c_f: W has a finite limit as c_f -> 0 when every target has a pull.
        _, near = accuracy_and_scores(MMDTL2Params(c_f=c_f * 100, c_d=c_d))
        np.testing.assert_allclose(scores, near, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------- purity of the core


def test_core_imports_no_distributed_or_tracking_library():
    code = (
        "import sys, mmdtl2_dist.core.methods, mmdtl2_dist.core.selection, "
        "mmdtl2_dist.core.adapter, mmdtl2_dist.core.reference, mmdtl2_dist.core.mmdt_hoffman\n"
        "bad = [m for m in ('ray', 'zarr', 'mlflow') if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_svm_step_singular_gram_equals_primal():
    """Fewer features than samples (Hessian of rank L + 1 = 7 of 300): the default SVM-step
    (coordinate descent + polish) == the primal SVM solved by an interior-point method on
    the features. θ and b are unique even though α is not; the interior point stops at a
    relative gap of 1e-10, so 1e-6 relative on θ leaves two orders of magnitude."""
    from mmdtl2_dist.core.reference import svm_primal
    from mmdtl2_dist.core.svm import svm_step

    rng = np.random.default_rng(21)
    n, L, K = 300, 6, 3
    y = rng.integers(0, K, n)
    X = rng.standard_normal((n, L)) + 2 * np.eye(K, L)[y]
    Y = one_vs_rest(y, K)
    cost = rng.uniform(0.1, 1.0, n)
    res = svm_step(X @ X.T, Y, cost)
    assert {q.solver for q in res.qps} == {"dcd"}
    assert max(q.kkt_residual for q in res.qps) <= 1e-8
    Theta_ref, b_ref = svm_primal(X, y, K, cost)
    Theta = X.T @ res.coef
    scale = np.abs(Theta_ref).max()
    assert np.max(np.abs(Theta - Theta_ref)) <= 1e-6 * scale
    assert np.max(np.abs(res.b - b_ref)) <= 1e-6 * max(1.0, np.abs(b_ref).max())


@pytest.mark.parametrize(
    ("n", "L", "primal"),
    [(200, 12, True), (200, 31, True), (200, 32, False), (200, 40, False), (30, 60, False)],
)
def test_linear_svm_route_solves_the_same_svm(monkeypatch, n, L, primal):
    """``linear_svm`` solves the primal only with few columns (``L + 1 <= 32``) and more
    samples, or where the dual's two n x n arrays would not fit; otherwise the dual (its
    primal took minutes at 2,048 features). Either route
    equals the primal solved by the interior point (1e-6 relative: its gap is 1e-10)."""
    import mmdtl2_dist.core.reference as ref
    from mmdtl2_dist.core.svm import linear_svm

    rng = np.random.default_rng(n + L)
    K = 3
    y = rng.integers(0, K, n)
    X = rng.standard_normal((n, L)) + 2 * np.eye(K, L)[y]
    cost = rng.uniform(0.1, 1.0, n)
    Theta_ref, b_ref = ref.svm_primal(X, y, K, cost)
    scale = np.abs(Theta_ref).max()
    calls = []
    real = ref.svm_primal
    monkeypatch.setattr(ref, "svm_primal", lambda *a: (calls.append(1), real(*a))[1])
    Theta, b = linear_svm(X, y, K, cost)
    assert bool(calls) == primal
    if not primal and L + 1 < n:  # where the dual's n x n arrays do not fit: the primal
        import mmdtl2_dist.core.memory as memory

        monkeypatch.setattr(memory, "available_bytes", lambda: 16 * n * n - 1)
        assert np.allclose(linear_svm(X, y, K, cost)[0], Theta_ref, atol=1e-6 * scale)
        assert len(calls) == 1
    assert np.max(np.abs(Theta - Theta_ref)) <= 1e-6 * scale
    assert np.max(np.abs(b - b_ref)) <= 1e-6 * max(1.0, np.abs(b_ref).max())


def test_cv_fold_schemes():
    """LOO holds out every sample whose class keeps one in training, once; per-class holds
    out one of each class per fold; "auto" switches at loo_max; test samples never enter."""
    from mmdtl2_dist.core.selection import cv_folds

    yt = np.array([0, 0, 0, 1, 1, 1, 2])  # class 2 has a single sample
    loo = cv_folds(yt, scheme="loo")
    assert [f.tolist() for f in loo] == [[0], [1], [2], [3], [4], [5]]
    per = cv_folds(np.array([0, 0, 0, 1, 1, 1]), scheme="per_class")
    assert [sorted(f.tolist()) for f in per] == [[0, 3], [1, 4], [2, 5]]
    assert cv_folds(yt, scheme="per_class") == []  # class 2 cannot be held out
    assert len(cv_folds(np.repeat(np.arange(10), 3), scheme="auto")) == 30
    assert len(cv_folds(np.repeat(np.arange(10), 7), scheme="auto", loo_max=60)) == 7
    with pytest.raises(ValueError, match="fold scheme"):
        cv_folds(yt, scheme="kfold")


def test_cv_folds_order():
    """``order`` decides which sample of a class is its j-th; the per-class folds hold out
    each sample once, one of every class per fold; leave-one-out ignores the order; a bad
    order is refused."""
    from mmdtl2_dist.core.selection import cv_folds

    yt = np.array([0, 1, 0, 1, 0, 1])
    order = np.array([4, 5, 2, 3, 0, 1])
    per = cv_folds(yt, scheme="per_class", order=order)
    assert [sorted(f.tolist()) for f in per] == [[4, 5], [2, 3], [0, 1]]
    assert sorted(np.concatenate(per).tolist()) == list(range(6))  # each sample once
    # leave-one-out: label order, then index order, whatever the order argument says
    y2 = np.array([1, 0, 1, 0, 2, 2])
    for o in (None, np.array([5, 4, 3, 2, 1, 0])):
        assert [f.tolist() for f in cv_folds(y2, scheme="loo", order=o)] == [
            [1], [3], [0], [2], [4], [5]
        ]  # fmt: skip
    for bad in ([0, 0, 1, 2, 3, 4], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]):
        with pytest.raises(ValueError, match="permutation"):
            cv_folds(yt, order=np.array(bad))


def test_canonical_order_is_independent_of_the_listing_and_of_round_off():
    """The canonical order names the same samples however they are listed, and a Gram with
    round-off of another computation path (1e-13 relative, a thousand times what float64
    blockwise accumulation leaves, and still below the 1e-9 rounding step) or with a
    slightly asymmetric round-off gives the same order. Non-finite Grams are refused."""
    from mmdtl2_dist.core.selection import canonical_order

    rng = np.random.default_rng(2)
    X = rng.standard_normal((15, 7))
    X /= np.linalg.norm(X, axis=1, keepdims=True)  # unit diagonal: the diagonal ties
    K = X @ X.T
    ref = canonical_order(K)
    for _ in range(5):
        p = rng.permutation(15)
        np.testing.assert_array_equal(p[canonical_order(K[np.ix_(p, p)])], ref)
    noise = 1e-13 * rng.standard_normal(K.shape)
    np.testing.assert_array_equal(canonical_order(K + (noise + noise.T) / 2), ref)
    np.testing.assert_array_equal(canonical_order(K + noise), ref)  # not symmetric
    X[3] = X[8]  # two identical samples are interchangeable: both orders are valid
    K = X @ X.T
    got = canonical_order(K)
    assert sorted(got.tolist()) == list(range(15))
    assert abs(got.tolist().index(3) - got.tolist().index(8)) == 1
    K[2, 5] = np.nan
    with pytest.raises(ValueError, match="NaN or Inf"):
        canonical_order(K)
    with pytest.raises(ValueError, match="square"):
        canonical_order(np.ones((2, 3)))


def test_selection_with_canonical_order_ignores_how_targets_are_listed():
    """Listing the labelled targets in another order leaves the canonical-order CV table
    unchanged and with it the choice; the listed-order table changes. The data overlap
    (class means 0.7 apart in units of the noise), so the CV tables are not trivial: every
    configuration misclassifies some held-out samples and the hinge losses differ. The
    fits of the two listings solve the same QPs in another variable order, to a relative
    KKT residual of 1e-8, so their held-out hinge losses agree to 1e-6 relative."""
    from mmdtl2_dist.core.methods import GramProblem
    from mmdtl2_dist.core.selection import cv_folds, cv_table, select_by_cv

    rng = np.random.default_rng(5)
    N, M, L, K = 24, 15, 6, 3
    ys, yt = np.arange(N) % K, np.arange(M) % K
    means = 0.7 * rng.standard_normal((K, L))
    Xs = means[ys] + rng.standard_normal((N, L))
    Xt = means[yt] + 0.5 + rng.standard_normal((M, L))
    grid = [{"prior": "identity", "prior_weight": w} for w in (0.0, 0.5, 1.0)]
    prob = GramProblem.from_features(Xs, ys, Xt, yt, Xt[:0], test_gram=False)
    p = rng.permutation(M)
    shuffled = GramProblem.from_features(Xs, ys, Xt[p], yt[p], Xt[:0], test_gram=False)
    a = select_by_cv("mmdtl2", grid, prob)
    b = select_by_cv("mmdtl2", grid, shuffled)
    hinge = [r["cv_hinge"] for r in a[1]]
    assert all(r["cv_accuracy"] < 1.0 for r in a[1])
    assert min(hinge) > 0.05 and max(hinge) - min(hinge) > 1e-3
    assert a[0] == b[0]
    for ra, rb in zip(a[1], b[1], strict=True):
        assert ra["cv_accuracy"] == rb["cv_accuracy"]
        assert ra["cv_hinge"] == pytest.approx(rb["cv_hinge"], rel=1e-6)
    # folds in the listed order: the table depends on the listing
    listed = [cv_table("mmdtl2", grid, q, cv_folds(q.yt)) for q in (prob, shuffled)]
    assert not np.allclose(
        [r["cv_hinge"] for r in listed[0]], [r["cv_hinge"] for r in listed[1]], rtol=1e-4
    )
    loo = select_by_cv("mmdtl2", grid, prob, folds="loo")[1]
    assert {r["folds"] for r in loo} == {"loo"} and {r["n_folds"] for r in loo} == {M}


def test_multiclass_hinge_and_selection_criteria():
    """The held-out hinge loss by hand, and every selection rule on a real CV table."""
    from mmdtl2_dist.core.methods import GramProblem
    from mmdtl2_dist.core.selection import (
        canonical_order,
        choose,
        cv_folds,
        cv_table,
        multiclass_hinge,
        select_by_cv,
    )

    scores = np.array([[2.0, 0.5, -1.0], [0.2, 0.4, 0.0], [0.0, 0.0, 3.0]])
    classes = np.array([10, 20, 30])
    # true 10: 1 + 0.5 - 2 < 0 -> 0; true 10: 1 + 0.4 - 0.2 = 1.2; true 30: 1 + 0 - 3 -> 0
    np.testing.assert_allclose(
        multiclass_hinge(scores, classes, np.array([10, 10, 30])), [0.0, 1.2, 0.0]
    )
    rng = np.random.default_rng(4)
    N, M, Q, L, K = 30, 12, 20, 6, 3
    ys, yt = np.arange(N) % K, np.arange(M) % K
    means = 2 * rng.standard_normal((K, L))
    Xs = means[ys] + rng.standard_normal((N, L))
    Xt = means[yt] + 1.0 + rng.standard_normal((M, L))
    Xq = means[np.arange(Q) % K] + 1.0 + rng.standard_normal((Q, L))
    prob = GramProblem.from_features(Xs, ys, Xt, yt, Xq, test_gram=False)
    grid = [{"c_f": c} for c in (0.01, 0.1, 1.0, 10.0)]
    table = cv_table("mmdtl2", grid, prob, cv_folds(prob.yt, order=canonical_order(prob.Ktt)))
    assert table == [
        {k: r[k] for k in table[0]} for r in select_by_cv("mmdtl2", grid, prob)[1]
    ]  # select_by_cv scores the same folds
    for crit, tb in (("hinge", "order"), ("accuracy", "hinge"), ("accuracy", "order")):
        best = grid[choose(table, crit, tb)]
        if crit == "hinge":
            rank = [(-r["cv_hinge"], r["cv_accuracy"], -i) for i, r in enumerate(table)]
        else:
            rank = [
                (r["cv_accuracy"], -r["cv_hinge"] if tb == "hinge" else 0.0, -i)
                for i, r in enumerate(table)
            ]
        assert best == grid[max(range(len(grid)), key=rank.__getitem__)]
        assert all(r["cv_hinge"] >= 0 for r in table)
    # choose() on a hand-made table: the three rules pick three different rows.
    hand = [
        {"cv_accuracy": 0.8, "cv_hinge": 0.9},
        {"cv_accuracy": 0.8, "cv_hinge": 0.7},
        {"cv_accuracy": 0.7, "cv_hinge": 0.5},
    ]
    assert choose(hand, "accuracy", "order") == 0
    assert choose(hand, "accuracy", "hinge") == 1
    assert choose(hand, "hinge") == 2
    with pytest.raises(ValueError, match="tie_break"):
        choose(hand, "accuracy", "random")
    # The hinge criterion for a grid over c_f; accuracy, ties to the first listed, for a
    # grid over c_t (the scores' scale changes with c_t).
    rows = select_by_cv("mmdtl2", grid, prob)[1]
    assert {(r["criterion"], r["tie_break"]) for r in rows} == {("hinge", "hinge")}
    grid_ct = [{"c_t": 0.1}, {"c_t": 1.0}]
    rows = select_by_cv("mmdtl2", grid_ct, prob)[1]
    assert {(r["criterion"], r["tie_break"]) for r in rows} == {("accuracy", "order")}


def test_sub_problem_equals_the_split_built_from_features():
    """Every block of a CV fold (matrix-prior blocks included) equals the one built from
    the fold's own features: the fold sees exactly its training targets, and its held-out
    targets as test samples."""
    from mmdtl2_dist.core.methods import GramProblem
    from mmdtl2_dist.core.selection import sub_problem

    rng = np.random.default_rng(9)
    Xs, Xt = rng.standard_normal((8, 5)), rng.standard_normal((6, 5))
    ys, yt = np.arange(8) % 2, np.arange(6) % 2
    W0 = rng.standard_normal((5, 6))
    full = GramProblem.from_features(Xs, ys, Xt, yt, Xt[:0], W0=W0)
    train, held = np.array([0, 2, 3, 5]), np.array([1, 4])
    sub = sub_problem(full, train, held)
    ref = GramProblem.from_features(Xs, ys, Xt[train], yt[train], Xt[held], W0=W0)
    for name in ("Kss", "Ktt", "Ktq", "sq_q", "Kst", "Ksq", "Kqq", "Ksu", "Kuu", "Ksuq", "Kuuq"):
        np.testing.assert_allclose(getattr(sub, name), getattr(ref, name), atol=1e-12)
    np.testing.assert_array_equal(sub.yt, yt[train])


# ------------------------------------------- scale, weights and threads at the entry points


def _gram_problem(scale=1.0, seed=0):
    from mmdtl2_dist.core.methods import GramProblem

    _, ys, yt, Xs, Xt = _problem(seed, 3, 30, 9, 5, 5)
    return GramProblem.from_features(Xs * scale, ys, Xt * scale, yt, Xt[:4] * scale)


@pytest.mark.parametrize(
    ("scale", "problem"),
    [(1e200, "overflow float64"), (1e10, "squared norms up to"), (1e-10, "vanish beside")],
)
@pytest.mark.parametrize("method", ["mmdtl2", "target_svm", "source_svm"])
def test_gram_problem_of_extreme_scale_is_refused(scale, problem, method):
    """A study trial's Grams of features ~1e200 / ~1e-10 get the scale named, not a
    LinAlgError or one predicted class."""
    from mmdtl2_dist.core.methods import fit_predict

    with np.errstate(over="ignore", invalid="ignore"):  # the Grams of 1e200 features
        prob = _gram_problem(scale)
    with pytest.raises(ValueError, match=problem) as e:
        fit_predict(method, {}, prob)
    assert "Use preprocessing='l2' or 'l2_zscore'" in str(e.value)


def test_fit_mmdtl2_gram_refuses_overflowed_grams():
    _, ys, yt, Xs, Xt = _problem(1, 3, 20, 6, 4, 4)
    Kz = np.zeros((26, 26))
    Kz[:20, :20] = Xs @ Xs.T
    Kt = Xt @ Xt.T + 1.0
    p = MMDTL2Params()
    with pytest.raises(ValueError, match="Kt .the target kernel. has NaN or Inf"):
        fit_mmdtl2_gram(Kz, np.full_like(Kt, np.inf), ys, yt, 3, p)
    Kz_inf = Kz.copy()
    Kz_inf[0, 0] = np.inf
    with pytest.raises(ValueError, match="source samples' Gram.: squared norms overflow"):
        fit_mmdtl2_gram(Kz_inf, Kt, ys, yt, 3, p)


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        (
            "target_svm",
            {"c_t": 1e12},
            r"c_t must be a positive number of at most 1e\+06, got 1e\+12",
        ),
        ("source_svm", {"c_s": -1.0}, "c_s must be a positive number"),
        ("mmdt_hoffman", {"c_s": np.inf}, "c_s must be a positive number"),
        ("mmdtl2", {"c_d": -0.5}, "c_d must be a non-negative finite number"),
    ],
)
def test_fit_predict_checks_the_weights_naming_them(method, params, message):
    from mmdtl2_dist.core.methods import fit_predict

    with pytest.raises(ValueError, match=message):
        fit_predict(method, params, _gram_problem())


def test_hinge_weights_named_in_qp_failures_once():
    from mmdtl2_dist.core.mmdtl2 import hinge_weights_named

    with pytest.raises(QPSolveError) as e:
        with hinge_weights_named({"c_s": 0.1, "c_t": 1e5, "c_f": 1.0}):
            with hinge_weights_named({"c_s": 0.1, "c_t": 1e5}):
                raise QPSolveError("box QP of size 3 not solved.")
    assert str(e.value).count("hinge weights c_s = 0.1, c_t = 100000") == 1


def test_osqp_setup_failure_is_a_qp_error_not_an_osqp_exception():
    """OSQP refuses a (numerically) indefinite Hessian at set-up; the chain reports it."""
    H = np.array([[1.0, 0.0], [0.0, -1.0]])
    with pytest.raises(QPSolveError, match="set-up failed"):
        solve_box_qp(H, np.ones(2), 0.0, 1.0, solver="osqp")


@pytest.mark.parametrize("scale", [1e-300, 1e-200, 1e-160, 1.0, 1e160, 1e200, 1e300])
def test_l2_normalize_gives_unit_rows_at_any_finite_scale(scale):
    from mmdtl2_dist.core.preprocessing import l2_normalize

    X = np.random.default_rng(0).normal(size=(6, 9))
    X[2] = 0.0
    Y = l2_normalize(X * scale)
    np.testing.assert_allclose(np.linalg.norm(Y[[0, 1, 3, 4, 5]], axis=1), 1.0, rtol=1e-15)
    np.testing.assert_allclose(Y, l2_normalize(X), rtol=1e-14, atol=1e-300)
    assert not np.any(Y[2])
    if scale == 1.0:  # rows of ordinary scale are divided exactly as before
        np.testing.assert_array_equal(
            Y[[0, 1]], X[[0, 1]] / np.linalg.norm(X[[0, 1]], axis=1)[:, None]
        )


def _blas_threads():
    from threadpoolctl import threadpool_info

    return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


@pytest.fixture
def qp_blas_threads(monkeypatch):
    """The BLAS thread counts seen inside every KKT check and kernel evaluation."""
    import mmdtl2_dist.core.kernels as kernels
    import mmdtl2_dist.core.qp as qp

    seen = []
    for module, name in ((qp, "kkt_residual"), (kernels, "kernel_from_gram")):
        orig = getattr(module, name)

        def wrapped(*a, _orig=orig, **k):
            seen.append(_blas_threads())
            return _orig(*a, **k)

        monkeypatch.setattr(module, name, wrapped)
    return seen


def _entry_points():
    from mmdtl2_dist.core.adapter import AdapterState
    from mmdtl2_dist.core.methods import fit_predict
    from mmdtl2_dist.core.preprocessing import PreprocessStats
    from mmdtl2_dist.core.selection import select_by_cv

    prob = _gram_problem(seed=3)
    _, ys, yt, Xs, Xt = _problem(3, 3, 30, 9, 5, 5)
    adapter = AdapterState(
        np.arange(3), Xt, np.ones((3, 9)), np.zeros(3), None,
        KernelSpec("rbf", 0.5), PreprocessStats("none"),
    )  # fmt: skip
    return {
        "fit_predict": lambda: fit_predict("mmdtl2", {"kernel": "rbf"}, prob),
        "fit_predict svm": lambda: fit_predict("target_svm", {}, prob),
        "select_by_cv": lambda: select_by_cv("mmdtl2", [{"c_f": 0.1}, {"c_f": 1.0}], prob),
        "fit_mmdtl2_gram": lambda: fit_mmdtl2_gram(
            np.pad(prob.Kss, (0, 9)), prob.Ktt + 1.0, ys, yt, 3, MMDTL2Params()
        ),
        "adapter": lambda: adapter.decision_function(Xt),
    }


@pytest.mark.parametrize("entry", list(_entry_points()))
def test_core_entry_points_run_with_one_blas_thread(entry, qp_blas_threads):
    from threadpoolctl import threadpool_limits

    run = _entry_points()[entry]
    with threadpool_limits(2, user_api="blas"):
        run()
        assert _blas_threads() == {2}  # the user's setting is back
    assert qp_blas_threads and all(s == {1} for s in qp_blas_threads), qp_blas_threads


def test_thread_limit_can_be_removed_for_the_unlimited_baseline(qp_blas_threads, monkeypatch):
    """With the limit replaced by a no-op (what benchmarks/bench_threads.py does for its
    unlimited baseline), the user's setting stays in force inside the fit."""
    import contextlib

    from threadpoolctl import threadpool_limits

    import mmdtl2_dist.core.threads as threads
    from mmdtl2_dist.core.methods import fit_predict

    monkeypatch.setattr(threads, "_limited", contextlib.nullcontext)
    with threadpool_limits(2, user_api="blas"):
        fit_predict("mmdtl2", {}, _gram_problem(seed=4))
    assert qp_blas_threads and all(s == {2} for s in qp_blas_threads)


THREADS_SCRIPT = """
import json
import threading
from concurrent.futures import ThreadPoolExecutor
import numpy as np
from threadpoolctl import threadpool_info
import mmdtl2_dist.core.qp as qp
from mmdtl2_dist.core.methods import GramProblem, fit_predict

def blas():
    return sorted({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})

rng = np.random.default_rng(0)
Xs, Xt = rng.normal(size=(30, 5)), rng.normal(size=(9, 5))
prob = GramProblem.from_features(Xs, np.arange(30) % 3, Xt, np.arange(9) % 3, Xt[:4])
orig, seen = qp.kkt_residual, []
qp.kkt_residual = lambda *a, **k: (seen.append(blas()), orig(*a, **k))[1]
before = blas()
with ThreadPoolExecutor(4) as pool:  # concurrent fits in worker threads
    list(pool.map(lambda _: fit_predict("mmdtl2", {}, prob), range(8)))
after, during = blas(), list(seen)
seen.clear()
t = threading.Thread(target=fit_predict, args=("mmdtl2", {}, prob))  # a later fit
t.start(); t.join()
print(json.dumps({"before": before, "during": during, "after": after, "later": seen}))
"""


def test_thread_limit_held_across_concurrent_fits_and_released_after():
    """Fits in several Python threads at once all run with one BLAS thread, leave the
    process's setting as it was, and a later fit in yet another thread takes its limit
    again (no thread keeps control of OpenBLAS's process-wide pool)."""
    import os

    env = {**os.environ, "OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2"}
    out = subprocess.run(
        [sys.executable, "-c", THREADS_SCRIPT], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["after"] == res["before"] == [min(2, os.cpu_count() or 1)]
    assert res["during"] and all(s == [1] for s in res["during"]), res
    assert res["later"] and all(s == [1] for s in res["later"]), res


def test_a_w_step_too_large_for_memory_is_refused_with_its_size(monkeypatch):
    """(K M)² float64 entries beyond the available memory: a clear error naming the
    classes, the labelled targets and the gigabytes, not the kernel's kill mid-fit."""
    import mmdtl2_dist.core.memory as memory
    import mmdtl2_dist.core.wstep as mm
    from mmdtl2_dist.estimators import MMDTL2

    K, M = 3, 9
    _, ys, yt, Xs, Xt = _problem(5, K, 15, M, 4, 4)
    monkeypatch.setattr(mm, "SMALL_WSTEP_BYTES", 0)
    need = int(8 * (K * M) ** 2 * mm.SOLVER_COPIES["osqp"])  # OSQP copies it
    monkeypatch.setattr(memory, "available_bytes", lambda: need - 1)
    with pytest.raises(ValueError, match=r"3 classes x 9 labelled target samples = 27 dual") as e:
        MMDTL2(qp_solver="osqp").fit_domains(Xs, ys, Xt, yt)
    assert "solving it (osqp) needs" in str(e.value)
    assert "Instead, use qp_solver='dcd' (it never builds" in str(e.value)
    monkeypatch.setattr(memory, "available_bytes", lambda: need)
    MMDTL2(qp_solver="osqp").fit_domains(Xs, ys, Xt, yt)
    # coordinate descent builds it only up to SMALL_WSTEP_BYTES and never asks
    monkeypatch.setattr(memory, "available_bytes", lambda: 0)
    MMDTL2().fit_domains(Xs, ys, Xt, yt)
