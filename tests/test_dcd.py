"""The coordinate-descent box-QP solver (core/dcd.py) against independent solvers.

References: Clarabel (interior point, :func:`mmdtl2_dist.core.reference.box_qp`) and OSQP on the
same box QP, and closed forms where the problem has one. Objective values are compared,
not ``x``: singular Hessians have many minimisers. The tolerances follow from the
references' own accuracy (interior point to a relative gap of 1e-12, OSQP polished).
"""

import numpy as np
import pytest

from mmdtl2_dist.core.dcd import _blocked_step, _free_block_step, _ratio, dcd_box_qp
from mmdtl2_dist.core.errors import QPSolveError
from mmdtl2_dist.core.qp import kkt_residual, solve_box_qp, solve_prescaled_box_qp
from mmdtl2_dist.core.reference import box_qp


def _problem(rng, n, rank, upper=1.0):
    A = rng.standard_normal((n, rank))
    H = A @ A.T + (1.0 if rank >= n else 0.0) * np.eye(n)
    f = rng.standard_normal(n) + 0.5
    lb = np.zeros(n)
    ub = np.full(n, upper)
    return H, f, lb, ub


def _objective(H, f, x):
    return 0.5 * x @ H @ x - f @ x


@pytest.mark.parametrize(
    "n,rank,upper",
    [(40, 40, 1.0), (120, 15, 0.3), (200, 201, np.inf), (300, 60, 2.0), (150, 3, 10.0)],
)
def test_dcd_matches_interior_point(n, rank, upper):
    rng = np.random.default_rng(n + rank)
    H, f, lb, ub = _problem(rng, n, rank, upper)
    x, sweeps, ok, _ = dcd_box_qp(H, f, lb, ub, None, 1e-10)
    assert ok and sweeps >= 1
    assert kkt_residual(H, f, x, lb, ub) <= 1e-10
    assert np.all(x >= lb) and np.all(x <= ub)
    xr = box_qp(H, f, lb, ub)
    # Clarabel's point is feasible (clipped) and optimal to ~1e-12 relative; the KKT point
    # of a convex QP is a global minimiser, so its objective is no worse than Clarabel's.
    ref = _objective(H, f, xr)
    assert _objective(H, f, x) <= ref + 1e-9 * max(1.0, abs(ref))
    assert _objective(H, f, x) >= ref - 1e-7 * max(1.0, abs(ref))


def test_dcd_closed_form_diagonal():
    """Diagonal H: the minimiser is clip(f / h, l, u) coordinate-wise."""
    rng = np.random.default_rng(3)
    h = rng.uniform(0.5, 2.0, 50)
    f = rng.standard_normal(50) * 3
    lb, ub = np.full(50, -0.5), np.full(50, 0.7)
    x, sweeps, ok, _ = dcd_box_qp(np.diag(h), f, lb, ub, None, 1e-12)
    assert ok and sweeps <= 2
    np.testing.assert_allclose(x, np.clip(f / h, lb, ub), rtol=0, atol=1e-14)


def test_dcd_warm_start_from_solution_takes_no_sweep():
    rng = np.random.default_rng(5)
    H, f, lb, ub = _problem(rng, 80, 20, 0.5)
    x, _, ok, _ = dcd_box_qp(H, f, lb, ub, None, 1e-11)
    x2, sweeps, ok2, _ = dcd_box_qp(H, f, lb, ub, x, 1e-11)
    assert ok and ok2 and sweeps == 0
    np.testing.assert_array_equal(x, x2)


def test_dcd_is_deterministic():
    rng = np.random.default_rng(8)
    H, f, lb, ub = _problem(rng, 150, 30, 0.2)
    a = dcd_box_qp(H, f, lb, ub, None, 1e-9)[0]
    b = dcd_box_qp(H, f, lb, ub, None, 1e-9)[0]
    np.testing.assert_array_equal(a, b)


def test_dcd_zero_diagonal_moves_to_the_bound():
    """A variable with H_ii = 0 is linear: it goes to the bound its gradient points to."""
    H = np.diag([1.0, 0.0])
    f = np.array([0.5, 2.0])
    x, _, ok, _ = dcd_box_qp(H, f, np.zeros(2), np.array([1.0, 3.0]), None, 1e-12)
    assert ok
    np.testing.assert_allclose(x, [0.5, 3.0])


def test_dcd_unbounded_direction_reports_failure_and_front_end_raises():
    """min −x on x ≥ 0 with H = 0 is unbounded: not 'ok', and the front end says so."""
    H = np.zeros((1, 1))
    x, _, ok, _ = dcd_box_qp(H, np.array([1.0]), np.zeros(1), np.array([np.inf]), None, 1e-9)
    assert not ok
    with pytest.raises(QPSolveError, match="not solved"):
        solve_box_qp(H, np.array([1.0]), 0.0, np.inf, solver="dcd")


def test_front_end_dcd_matches_osqp_on_svm_dual():
    """The SVM-step's dual through the front end: "dcd" and "osqp" reach the same optimum."""
    rng = np.random.default_rng(11)
    n, L = 250, 20
    X = rng.standard_normal((n, L))
    y = np.where(X[:, 0] + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    H = (X @ X.T + 1.0) * np.outer(y, y)
    cost = np.full(n, 0.5)
    a = solve_box_qp(H, np.ones(n), 0.0, cost, solver="dcd", tol=1e-10)
    o = solve_box_qp(H, np.ones(n), 0.0, cost, solver="osqp", tol=1e-8)
    assert a.solver == "dcd" and a.kkt_residual <= 1e-10
    assert a.objective <= o.objective + 1e-9 * abs(o.objective)
    assert abs(a.objective - o.objective) <= 1e-6 * abs(o.objective)
    # θ is unique: compare it, not α.
    np.testing.assert_allclose(X.T @ (a.x * y), X.T @ (o.x * y), atol=1e-4)


def test_front_end_falls_back_when_coordinate_descent_stalls():
    """Condition number ~1e10 (a squared-hinge dual of features on scales 1..1e5):
    coordinate descent stalls far from tol; the front end then runs OSQP from its point
    and keeps the better one (an interior-point solver makes no progress here)."""
    rng = np.random.default_rng(0)
    n, r = 60, 20
    A = rng.standard_normal((n, r)) * np.logspace(0, 5, r)[None, :]
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    H = (A @ A.T) * np.outer(y, y) + 0.5 * np.eye(n)
    d = 1 / np.sqrt(np.diag(H))
    raw = dcd_box_qp(H * np.outer(d, d), d, np.zeros(n), np.full(n, np.inf), None, 1e-8)
    assert not raw.ok  # the situation under test
    a = solve_box_qp(H, np.ones(n), 0.0, np.inf, solver="dcd", tol=1e-8)
    assert a.solver == "dcd+osqp" and a.status == "solved inaccurate"
    # Closer to the optimum than where coordinate descent stopped (1.4e-4) and than the
    # active-set chain with an interior-point rescue reached here (7.5e-6).
    assert a.kkt_residual < 5e-6 < raw.residual
    x_raw = d * raw.x
    assert a.objective <= _objective(H, np.ones(n), x_raw)


def test_free_block_step_closed_form():
    """One pivoted Cholesky factorisation per free block: on a singular block the step
    solves a consistent Newton system exactly and Z is an orthonormal basis of the null
    space; on a regular block the step is the Newton step and there is no null space."""
    rng = np.random.default_rng(21)
    A = rng.standard_normal((12, 7))
    Hff = A @ A.T
    g = Hff @ rng.standard_normal(12)  # in the range: the system is consistent
    step, Z = _free_block_step(Hff, g)
    np.testing.assert_allclose(Hff @ step, -g, atol=1e-10 * np.abs(g).max())
    assert Z.shape == (12, 5)
    np.testing.assert_allclose(Z.T @ Z, np.eye(5), atol=1e-12)
    np.testing.assert_allclose(Hff @ Z, 0.0, atol=1e-12 * np.abs(Hff).max())
    Hreg = Hff + np.eye(12)
    step, Z = _free_block_step(Hreg, g)
    assert Z is None
    np.testing.assert_allclose(step, -np.linalg.solve(Hreg, g), rtol=1e-10)


def test_blocked_newton_step_drops_every_clipped_variable_when_that_is_lower():
    """A Newton step blocked by the box goes to the lower of the ratio point (one variable
    fixed) and the projected full step (every clipped variable fixed at once)."""
    n = 6
    Hff = np.eye(n) + 0.01  # nearly separable: the projected step is the better one
    pos = np.full(n, 0.5)
    gF = np.array([-5.0, -5.0, -5.0, 0.3, -0.3, 0.2])
    step = -np.linalg.solve(Hff, gF)
    lo, hi = np.zeros(n), np.ones(n)
    t, i = _ratio(pos, step, lo, hi)
    assert t < 1.0
    new, fixed = _blocked_step(pos, step, t, i, gF, Hff, lo, hi)

    def change(y):
        delta = y - pos
        return gF @ delta + 0.5 * delta @ Hff @ delta

    ratio = np.clip(pos + t * step, lo, hi)
    assert change(new) <= change(ratio) < 0.0
    np.testing.assert_array_equal(fixed, [True, True, True, False, False, False])
    np.testing.assert_array_equal(new[:3], 1.0)


def test_warm_start_within_tol_is_polished_to_the_optimum():
    """A start that meets tol only approximately (a free variable off by half the
    tolerance) is made exact by a polish, without sweeps: where the optimum is not
    unique, points anywhere within tol would give predictions that differ in their last
    digits from run to run."""
    rng = np.random.default_rng(13)
    H, f, lb, ub = _problem(rng, 80, 20, 0.5)
    x, _, ok, _ = dcd_box_qp(H, f, lb, ub, None, 1e-13)
    assert ok
    j = int(np.flatnonzero((x > lb + 1e-6) & (x < ub - 1e-6))[0])
    near = x.copy()
    near[j] += 0.5e-8 / np.abs(H[:, j]).max()
    res_near = np.abs(near - np.clip(near - (H @ near - f), lb, ub)).max()
    assert 1e-10 < res_near <= 1e-8  # meets tol, but is not the optimum
    got, sweeps, ok, res = dcd_box_qp(H, f, lb, ub, near, 1e-8)
    assert ok and sweeps == 0
    assert res <= 1e-10
    # Hx is the same at every minimiser (θ is unique): the polished point is one.
    np.testing.assert_allclose(H @ got, H @ x, rtol=0, atol=1e-10)


def test_office_rbf_wstep_solved_exactly_by_coordinate_descent(monkeypatch):
    """The first W-step of an RBF MMDTL2 fit on Office-Caltech10 (webcam → dslr, split 0),
    on which a primal-dual active-set method cycles: coordinate descent with polishing
    solves it at the interior-point optimum, exactly."""
    import mmdtl2_dist.core.wstep as mm
    from mmdtl2_dist.core.methods import GramProblem, fit_predict
    from mmdtl2_dist.core.preprocessing import fit_preprocessing
    from mmdtl2_dist.datasets.office_caltech import load_domain, load_hoffman_splits

    def split_problem(source, target, k):
        (s, t), sp = map(load_domain, (source, target)), load_hoffman_splits(source, target)[k]
        Xs, Xt = (fit_preprocessing(d.X, "l2_zscore").transform(d.X) for d in (s, t))
        prob = GramProblem.from_features(
            Xs[sp.source_train], s.y[sp.source_train], Xt[sp.target_train],
            t.y[sp.target_train], Xt[sp.target_test],
        )  # fmt: skip
        return prob, t.y[sp.target_test]

    seen = []

    def recording(Hs, f, d, lb, ub, **kw):
        res = solve_prescaled_box_qp(Hs, f, d, lb, ub, **kw)
        seen.append((Hs, f * d, lb / d, ub / d, res))  # the scaled QP: the same objective
        return res

    monkeypatch.setattr(mm, "solve_prescaled_box_qp", recording)
    prob, _ = split_problem("webcam", "dslr", 0)
    params = {"kernel": "rbf", "c_f": 0.1, "c_d": 0.1, "c_t": 0.1, "c_s": 0.1, "max_iter": 1}
    fit_predict("mmdtl2", params, prob)
    H, f, lb, ub, res = seen[0]
    assert res.solver == "dcd"
    assert res.kkt_residual <= 1e-12
    lbv, ubv = np.broadcast_to(lb, f.shape), np.broadcast_to(ub, f.shape)
    xr = box_qp(H, f, np.array(lbv), np.array(ubv))
    ref = _objective(H, f, xr)
    assert res.objective <= ref + 1e-12 * abs(ref)


def test_kron_hessian_is_the_scaled_w_step_hessian_and_exactly_symmetric():
    """The compiled assembly equals ``D Y (Ā ⊗ B̄) Y D`` built with numpy.

    ``Ā``, ``B̄`` are the symmetric parts (an assembled ``ΘᵀΘ`` and ``G`` are symmetric only
    up to rounding; the symmetrised ``Y (A ⊗ B) Y`` differs from this by a product of the
    two asymmetries, rounding squared). The two constructions round differently in the
    last bits only (1e-14 relative); the compiled one is exactly symmetric.
    """
    from mmdtl2_dist.core.kron import kron_hessian

    rng = np.random.default_rng(4)
    K, M = 4, 7
    A, B = (x @ x.T + 1e-3 * rng.standard_normal(x.shape[:1] * 2)
            for x in (rng.standard_normal((K, K)), rng.standard_normal((M, M))))  # fmt: skip
    y = np.where(rng.random(K * M) < 0.3, 1.0, -1.0)
    d = rng.random(K * M) + 0.5
    s = y * d
    ref = np.kron(0.5 * (A + A.T), 0.5 * (B + B.T)) * np.outer(s, s)
    got = kron_hessian(A, B, s)
    np.testing.assert_allclose(got, ref, rtol=1e-14, atol=1e-15 * np.abs(ref).max())
    assert np.array_equal(got, got.T)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_svm_step_in_signed_variables_equals_the_per_class_dual_to_the_bit(seed):
    """The SVM step solves every class's dual in the signed variables β = y ⊙ α, with one
    scaled Hessian for all classes; that problem mirrors the per-class dual
    ``Y (Kv + 1) Y`` exactly (y = ±1 flips signs, which rounding preserves), so the
    multipliers, KKT residuals and objectives are the same to the bit, from a warm start
    too. Costs as in MMDTL2: c_s on the sources, c_t on the targets."""
    from mmdtl2_dist.core.dcd import svm_hessian
    from mmdtl2_dist.core.qp import jacobi_scale, solve_prescaled_box_qp
    from mmdtl2_dist.core.svm import one_vs_rest, svm_step

    rng = np.random.default_rng(seed)
    n, K = 60, 4
    X = rng.standard_normal((n, 7)) + np.repeat(rng.standard_normal((K, 7)), n // K, axis=0)
    Kv = X @ X.T
    Y = one_vs_rest(np.repeat(np.arange(K), n // K), K)
    cost = np.r_[np.full(40, 0.3), np.full(20, 2.0)]
    d = jacobi_scale(np.diag(Kv) + 1.0)
    for alpha0 in (None, rng.random((K, n)) * cost):
        got = svm_step(Kv, Y, cost, alpha0=alpha0)
        for k in range(K):
            ref = solve_prescaled_box_qp(
                svm_hessian(Kv, Y[k] * d), np.ones(n), d, 0.0, cost,
                x0=None if alpha0 is None else alpha0[k],
            )  # fmt: skip
            q = got.qps[k]
            assert np.array_equal(q.x, ref.x) and np.array_equal(got.coef[:, k], ref.x * Y[k])
            assert (q.kkt_residual, q.objective) == (ref.kkt_residual, ref.objective)


def test_a_reused_first_svm_is_a_fresh_solve_to_the_bit_and_the_callers_own():
    """``svm_step_reused`` (MMDTL2's first SVM, shared by the fits of a selection): the
    same result as solving again, a hit only for identical inputs, a copy per caller."""
    from mmdtl2_dist.core import svm as svm_mod
    from mmdtl2_dist.core.svm import one_vs_rest, svm_step, svm_step_reused

    rng = np.random.default_rng(7)
    X, y = rng.normal(size=(60, 5)), rng.integers(0, 3, 60)
    K, Y, cost = X @ X.T, one_vs_rest(y, 3), np.full(60, 0.1)
    svm_mod._reused.clear()
    fresh = svm_step(K, Y, cost)
    first = svm_step_reused(K, Y, cost)
    again = svm_step_reused(K, Y, cost)
    assert len(svm_mod._reused) == 1  # the second call was a hit
    for r in (first, again):
        np.testing.assert_array_equal(r.coef, fresh.coef)
        np.testing.assert_array_equal(r.b, fresh.b)
    again.coef[:] = 0.0  # a caller's copy: the kept result is untouched
    np.testing.assert_array_equal(svm_step_reused(K, Y, cost).coef, fresh.coef)
    other = svm_step_reused(K, Y, np.full(60, 0.2))  # another c_s: solved, not reused
    assert len(svm_mod._reused) == 2 and not np.array_equal(other.coef, fresh.coef)
    svm_step_reused(K, Y, cost, tol=1e-6)  # another tolerance: another entry
    assert len(svm_mod._reused) == 3


def _kron_problem(seed, K=5, M=11, rank=None):
    """A W-step-like box QP: ``diag(s) (A ⊗ B) diag(s)`` with PSD ``A``, ``B`` (``A`` of
    ``rank`` below ``K`` when given: singular, as MMDTL2's W-step Hessians are), unit
    Jacobi-scaled diagonal, signs ``y = ±1``, bounds ``[0, c_t]``."""
    from mmdtl2_dist.core.kron import ScaledKron
    from mmdtl2_dist.core.qp import jacobi_scale

    rng = np.random.default_rng(seed)
    P = rng.standard_normal((K, rank or K))
    Q = rng.standard_normal((M, 3))
    A = P @ P.T + 1e-15 * rng.standard_normal((K, K))  # symmetric up to rounding
    B = Q @ Q.T + 0.1 * np.eye(M)
    y = np.where(rng.random(K * M) < 0.3, 1.0, -1.0)
    d = jacobi_scale(np.kron(np.diag(A), np.diag(B)))
    f = d * (1.0 + rng.standard_normal(K * M))
    return ScaledKron(A, B, y * d), f, d


@pytest.mark.parametrize("seed", [0, 1])
def test_unbuilt_kron_hessian_gives_the_built_ones_entries_and_products(seed):
    """The matrix-free W-step Hessian against the built one: its diagonal and the polish's
    free blocks are the same entries to the bit (the same three products per entry); a
    product with a vector is ``Ā X B̄`` instead of a row sum, equal to rounding (1e-13)."""
    H, _, _ = _kron_problem(seed)
    dense = H.dense()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(H.shape[0])
    np.testing.assert_allclose(H @ x, dense @ x, rtol=1e-13, atol=1e-13 * np.abs(dense @ x).max())
    assert np.array_equal(H.diagonal(), np.diag(dense))
    idx = np.sort(rng.choice(H.shape[0], 17, replace=False))
    assert np.array_equal(H.block(idx), dense[np.ix_(idx, idx)])


@pytest.mark.parametrize(("seed", "rank"), [(0, None), (1, 2), (2, 3)])
def test_dcd_on_the_unbuilt_kron_hessian_reaches_the_built_ones_optimum(seed, rank):
    """Coordinate descent and its polish on the unbuilt Hessian solve the same box QP:
    the same objective (to 1e-12 relative: both polish to the exact optimum), a KKT
    residual within tolerance, and, where the Hessian is regular, the same minimiser
    (1e-8); with a singular ``A`` the minimiser is not unique, so only the objective and
    ``H x`` (the primal the W-step uses, 1e-7) are compared."""
    H, f, _ = _kron_problem(seed, rank=rank)
    dense = H.dense()
    lb, ub = np.zeros(f.size), np.full(f.size, 2.0)
    a = dcd_box_qp(H, f, lb, ub, None, 1e-10)
    b = dcd_box_qp(dense, f, lb, ub, None, 1e-10)
    assert a.ok and b.ok
    assert kkt_residual(dense, f, a.x, lb, ub) <= 1e-10
    obj_a, obj_b = _objective(dense, f, a.x), _objective(dense, f, b.x)
    assert abs(obj_a - obj_b) <= 1e-12 * max(1.0, abs(obj_b))
    np.testing.assert_allclose(dense @ a.x, dense @ b.x, atol=1e-7)
    if rank is None:
        np.testing.assert_allclose(a.x, b.x, atol=1e-8)


def test_a_large_w_step_is_solved_unbuilt_with_the_built_ones_fit(monkeypatch):
    """Above ``MATRIX_FREE_ABOVE_BYTES`` the W-step's Hessian is never built: a whole
    MMDTL2 fit with the threshold at 0 (every W-step unbuilt) predicts what the built
    path does, with decision values equal to 1e-6 (both solves are exact to the QP
    tolerance; the alternation amplifies their rounding a little); OSQP still builds it."""
    import mmdtl2_dist.core.wstep as ws
    from mmdtl2_dist.core.kron import ScaledKron
    from mmdtl2_dist.estimators import MMDTL2

    rng = np.random.default_rng(3)
    K, d = 4, 9
    means = 3 * rng.standard_normal((K, d))
    ys, yt = np.repeat(np.arange(K), 12), np.repeat(np.arange(K), 3)
    Xs = means[ys] + rng.standard_normal((ys.size, d))
    Xt = means[yt] + rng.standard_normal((yt.size, d)) + 1.0
    Xq = means[np.arange(K).repeat(5)] + rng.standard_normal((5 * K, d)) + 1.0
    built = MMDTL2().fit_domains(Xs, ys, Xt, yt)
    seen = []
    real = ws.solve_prescaled_box_qp
    monkeypatch.setattr(ws, "MATRIX_FREE_ABOVE_BYTES", 0)
    monkeypatch.setattr(
        ws, "solve_prescaled_box_qp", lambda H, *a, **k: (seen.append(type(H)), real(H, *a, **k))[1]
    )
    unbuilt = MMDTL2().fit_domains(Xs, ys, Xt, yt)
    assert seen and set(seen) == {ScaledKron}
    np.testing.assert_allclose(
        unbuilt.decision_function(Xq), built.decision_function(Xq), atol=1e-6
    )
    assert np.array_equal(unbuilt.predict(Xq), built.predict(Xq))
    seen.clear()
    MMDTL2(qp_solver="osqp").fit_domains(Xs, ys, Xt, yt)
    assert seen and set(seen) == {np.ndarray}


@pytest.mark.parametrize(
    ("K", "M", "rank", "upper"),
    [(4, 9, None, 1.5), (4, 9, 2, 1.5), (1, 7, None, np.inf), (6, 1, None, np.inf)],
)
def test_block_sweeps_descend_keep_the_gradient_and_reach_the_dense_optimum(K, M, rank, upper):
    """The unbuilt Hessian's sweeps (one target's ``K`` variables after another, their
    steps carried to the other targets together) against the stored Hessian's:

    - each sweep lowers the objective or leaves it (exact coordinate steps cannot raise
      it; 1e-12 for rounding), and the gradient they carry stays ``H x − f`` (1e-12: the
      updates are summed in another order), so a wrong carried update fails here even
      though the solver recomputes ``g`` after every round;
    - run to a projected gradient of 1e-9, they reach the objective of the stored sweeps
      run alike (1e-10 relative: both within ``tol`` of the optimum of a problem whose
      objective has curvature ~1) and, where ``H`` is regular, the same point (1e-6);
    - with one class or one target (a block of one variable, or one block), and with no
      upper bound.
    """
    from mmdtl2_dist.core.sweeps import dense_sweeps, kron_sweeps

    H, f, _ = _kron_problem(5, K=K, M=M, rank=rank)
    dense = H.dense()
    lb, ub = np.zeros(f.size), np.full(f.size, upper)
    x, g = np.zeros(f.size), -f.copy()
    last = 0.0
    for seed in range(6):
        ep, _ = kron_sweeps(H.A, H.B, H.s, g, x, lb, ub, 0.0, 1, seed)
        assert ep == 1
        obj = _objective(dense, f, x)
        assert obj <= last + 1e-12
        last = obj
        np.testing.assert_allclose(g, dense @ x - f, rtol=0, atol=1e-12)
    ends = []
    for sweeps, args in ((kron_sweeps, (H.A, H.B, H.s)), (dense_sweeps, (dense,))):
        x, g = np.zeros(f.size), -f.copy()
        ep, viol = sweeps(*args, g, x, lb, ub, 1e-9, 100_000, 7)
        assert viol <= 1e-9 and kkt_residual(dense, f, x, lb, ub) <= 1e-8
        ends.append(x)
    obj_k, obj_d = (_objective(dense, f, x) for x in ends)
    assert abs(obj_k - obj_d) <= 1e-10 * max(1.0, abs(obj_d))
    if rank is None:
        np.testing.assert_allclose(ends[0], ends[1], atol=1e-6)


def test_block_sweeps_refuse_a_scale_with_a_zero():
    """The sweeps carry the gradient over ``s``; a zero in ``s`` is refused, not divided by."""
    from mmdtl2_dist.core.sweeps import kron_sweeps

    H, f, _ = _kron_problem(0)
    s = H.s.copy()
    s[3] = 0.0
    with pytest.raises(ValueError, match="without zeros"):
        kron_sweeps(H.A, H.B, s, -f, np.zeros(f.size), np.zeros(f.size), np.ones(f.size),
                    0.0, 1, 0)  # fmt: skip


def test_a_polish_whose_free_block_would_not_fit_is_refused_with_its_size(monkeypatch):
    """An unbuilt W-step Hessian's polish builds its free block (``8 |F|²`` bytes, twice
    that with the factor). Where that is more than the memory available, the solver
    refuses with the size and the fixes (the L2 pull, fewer labels) instead of being
    killed; with the memory there, the same problem is solved. The threshold below which
    nothing is asked is set to 0 so that this small problem asks."""
    import mmdtl2_dist.core.dcd as dcd
    from mmdtl2_dist.core import memory

    H, f, _ = _kron_problem(2, K=4, M=9)
    lb, ub = np.zeros(f.size), np.full(f.size, 1.5)
    monkeypatch.setattr(dcd, "SMALL_FREE_BLOCK_BYTES", 0)
    monkeypatch.setattr(memory, "available_bytes", lambda: 100)
    with pytest.raises(ValueError, match=r"free dual variables.*c_d > 0"):
        dcd.dcd_box_qp(H, f, lb, ub, None, 1e-10)
    monkeypatch.setattr(memory, "available_bytes", lambda: 1 << 30)
    res = dcd.dcd_box_qp(H, f, lb, ub, None, 1e-10)
    assert res.ok and kkt_residual(H.dense(), f, res.x, lb, ub) <= 1e-10
