"""The coordinate-descent box-QP solver (core/dcd.py) against independent solvers.

References: Clarabel (interior point, through the QP front end's fallback) and OSQP on the
same box QP, and closed forms where the problem has one. Objective values are compared,
not ``x``: singular Hessians have many minimisers. The tolerances follow from the
references' own accuracy (interior point to a relative gap of 1e-12, OSQP polished).
"""

import numpy as np
import pytest

from mmdtl2_dist.core.dcd import dcd_box_qp
from mmdtl2_dist.core.errors import QPSolveError
from mmdtl2_dist.core.qp import _clarabel, kkt_residual, solve_box_qp


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
    xr, _, status = _clarabel(H, f, lb, ub)
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
    coordinate descent stalls far from tol; the front end then runs the active-set
    chain from the caller's start and keeps the better point, no worse than "pdas"."""
    rng = np.random.default_rng(0)
    n, r = 60, 20
    A = rng.standard_normal((n, r)) * np.logspace(0, 5, r)[None, :]
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    H = (A @ A.T) * np.outer(y, y) + 0.5 * np.eye(n)
    d = 1 / np.sqrt(np.diag(H))
    raw = dcd_box_qp(H * np.outer(d, d), d, np.zeros(n), np.full(n, np.inf), None, 1e-8)
    assert not raw.ok  # the situation under test
    a = solve_box_qp(H, np.ones(n), 0.0, np.inf, solver="dcd", tol=1e-8)
    p = solve_box_qp(H, np.ones(n), 0.0, np.inf, solver="pdas", tol=1e-8)
    assert a.kkt_residual <= max(p.kkt_residual, 1e-8) * 1.01
    assert a.objective <= p.objective + 1e-9 * abs(p.objective)
