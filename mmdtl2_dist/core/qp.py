r"""Box-constrained convex quadratic programs.

Both sub-problems of MMDTL2 are, in the dual, QPs whose only constraints are bounds:

.. math::

    \min_x \; \tfrac12 x^\top H x - f^\top x
    \quad \text{s.t.} \quad l \le x \le u,

where:

- ``H`` (n, n) is symmetric positive semi-definite,
- ``f`` (n,) is the linear term (note the sign: the *maximised* dual is
  ``-½ xᵀHx + fᵀx``),
- ``l``, ``u`` (n,) are bounds; ``u`` may be ``+inf`` (squared-hinge SVMs).

Two solvers are offered behind one front end, :func:`solve_box_qp`:

``"dcd"`` (default)
    Dual coordinate descent finished by exact Newton steps on the free variables
    (:mod:`mmdtl2_dist.core.dcd`): exact (KKT ~1e-15), indifferent to singular ``H``, and
    the fastest of the solvers measured on the real W-step and SVM-step QPs from every
    warm start and from K·M = 1,000 cold (BENCHMARKS.md, "QP solvers against the dense
    solvers of qpsolvers"). If it misses the tolerance within its budget (very
    ill-conditioned Hessians, condition numbers ~1e10), OSQP continues from its point
    and the better of the two points is kept; not on a W-step Hessian too large to
    build (:class:`~mmdtl2_dist.core.kron.ScaledKron`), which OSQP cannot take.
``"osqp"``
    OSQP (operator splitting) with tight tolerances and solution polishing; general and
    robust (it met the tolerance on every measured QP it finished), but first-order and
    much slower for tight tolerances.

Whichever solver runs, the result carries the KKT residual of the returned point,
computed here and not taken from the solver: the infinity norm of the projected
gradient ``y - clip(y - (H̃y - f̃), l̃, ũ)`` of the Jacobi-scaled problem (``x = d ⊙ y``,
``d = diag(H)^-½``), divided by ``max(1, ‖f̃‖∞)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from mmdtl2_dist.core.errors import QPSolveError
from mmdtl2_dist.core.params import SOLVERS

__all__ = [
    "SOLVERS",
    "QPResult",
    "QPSolveError",
    "kkt_residual",
    "solve_box_qp",
    "solve_prescaled_box_qp",
    "solve_scaled_box_qp",
]


@dataclass
class QPResult:
    """Solution of a box QP.

    Attributes
    ----------
    x : ndarray of shape (n,)
        The minimiser.
    status : str
        ``"solved"`` or, for OSQP, its own status string when it is acceptable
        (``"solved inaccurate"`` is only accepted if the KKT residual meets the tolerance).
    solver : str
        The solver that produced ``x``: ``"dcd"``, ``"osqp"``, or ``"dcd+osqp"`` where
        OSQP finished what coordinate descent could not.
    kkt_residual : float
        Relative projected-gradient residual of ``x`` (see module docstring).
    iterations : int
        Iterations of the solver that produced ``x``.
    objective : float
        ``½ xᵀHx - fᵀx`` at ``x``.
    time_s : float
        Wall time of the solve.
    """

    x: np.ndarray
    status: str
    solver: str
    kkt_residual: float
    iterations: int
    objective: float
    time_s: float
    details: dict = field(default_factory=dict)


def kkt_residual(H: np.ndarray, f: np.ndarray, x: np.ndarray, lb: np.ndarray, ub: np.ndarray):
    """Relative projected-gradient residual of ``x`` for the box QP ``(H, f, lb, ub)``."""
    g = H @ x - f
    r = x - np.clip(x - g, lb, ub)
    return float(np.max(np.abs(r), initial=0.0) / max(1.0, float(np.max(np.abs(f), initial=0.0))))


def _check_problem(H, f, lb, ub):
    H = np.asarray(H, dtype=np.float64)
    f = np.asarray(f, dtype=np.float64).reshape(-1)
    n = f.shape[0]
    if H.shape != (n, n):
        raise ValueError(f"H must have shape ({n}, {n}) to match f, got {H.shape}.")
    lb = np.broadcast_to(np.asarray(lb, dtype=np.float64), (n,)).copy()
    ub = np.broadcast_to(np.asarray(ub, dtype=np.float64), (n,)).copy()
    if not (np.all(np.isfinite(H)) and np.all(np.isfinite(f))):
        raise ValueError("the QP has NaN or Inf coefficients; check the input features and Grams.")
    if np.any(lb > ub) or np.any(~np.isfinite(lb)):
        raise ValueError("QP bounds must satisfy -inf < l <= u.")
    # OSQP does not check symmetry and rounding makes assembled Hessians slightly
    # asymmetric; both solvers work on the symmetric part.
    H = 0.5 * (H + H.T)
    return H, f, lb, ub


# OSQP's infeasibility tolerances, small enough that its tests never fire (it needs them > 0).
OSQP_NO_INFEASIBILITY_TEST = 1e-30


def _osqp(H, f, lb, ub, x0, tol, max_iter):
    """OSQP from ``x0``; ``(x, iterations, status)``, ``x`` None when OSQP gave none.

    A failed set-up (OSQP's factorisation of a numerically indefinite Hessian) is such a
    case: the callers go on with their other solvers or name the failure.

    OSQP's infeasibility tests are off (:data:`OSQP_NO_INFEASIBILITY_TEST`): a box QP with
    ``lb ≤ ub`` is feasible, and the product's are bounded (finite upper bounds, or a
    positive definite ``H``), but on ill-conditioned ones the tests misfire. A squared-hinge
    dual of condition about 1e10 was declared dual infeasible after 11,250 iterations on
    one machine (AMD EPYC), not on the Intel Xeon of earlier runs. Without them OSQP runs
    to its tolerance or ``max_iter``, and the caller's KKT check decides.
    """
    import osqp  # local: keeps import of the core cheap
    import scipy.sparse as sp

    n = f.shape[0]
    model = osqp.OSQP()
    try:
        model.setup(
            sp.triu(sp.csc_matrix(H), format="csc"),
            -f,
            sp.identity(n, format="csc"),
            lb,
            ub,
            verbose=False,
            eps_abs=min(1e-6, tol),
            eps_rel=min(1e-6, tol),
            max_iter=max_iter,
            polishing=True,
            polish_refine_iter=10,
            eps_prim_inf=OSQP_NO_INFEASIBILITY_TEST,
            eps_dual_inf=OSQP_NO_INFEASIBILITY_TEST,
        )
    except osqp.OSQPException as e:
        return None, 0, f"set-up failed ({e})"
    if x0 is not None:
        model.warm_start(x=np.clip(np.asarray(x0, dtype=np.float64), lb, ub))
    res = model.solve(raise_error=False)
    x = None if res.x is None else np.clip(np.asarray(res.x, dtype=np.float64), lb, ub)
    return x, int(res.info.iter), str(res.info.status)


def solve_box_qp(
    H: np.ndarray,
    f: np.ndarray,
    lb: np.ndarray | float,
    ub: np.ndarray | float,
    *,
    solver: str = "dcd",
    tol: float = 1e-8,
    max_iter: int | None = None,
    x0: np.ndarray | None = None,
) -> QPResult:
    """Minimise ``½ xᵀHx - fᵀx`` subject to ``lb <= x <= ub``.

    Parameters
    ----------
    H : ndarray of shape (n, n)
        Symmetric positive semi-definite Hessian (symmetrised here).
    f : ndarray of shape (n,)
        Linear term.
    lb, ub : float or ndarray of shape (n,)
        Bounds; ``ub`` may be ``np.inf``.
    solver : {"dcd", "osqp"}
        Algorithm (see module docstring).
    tol : float
        Required relative KKT residual of the returned point.
    max_iter : int, optional
        Iteration cap of OSQP (default 200,000), alone or after coordinate descent.
    x0 : ndarray of shape (n,), optional
        Warm start.

    Returns
    -------
    QPResult

    Raises
    ------
    QPSolveError
        If no solver reaches ``tol``.
    """
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}.")
    if not (np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be positive, got {tol!r}.")
    H, f, lb, ub = _check_problem(H, f, lb, ub)
    n = f.shape[0]
    t0 = time.perf_counter()
    if n == 0:
        return QPResult(np.zeros(0), "solved", solver, 0.0, 0, 0.0, 0.0)
    # Jacobi scaling x = d ⊙ y with d = diag(H)^(-1/2): the dual Hessians here span many
    # orders of magnitude (G grows like 1/c_f), and a unit diagonal makes the coordinate
    # steps, the Newton polish and OSQP's step sizes scale-free. Residuals are measured
    # in the scaled variables, so they do not depend on the units of the problem.
    d = jacobi_scale(np.diag(H))
    r = solve_prescaled_box_qp(
        H * np.outer(d, d), f, d, lb, ub, solver=solver, tol=tol, max_iter=max_iter, x0=x0
    )
    r.objective = float(0.5 * r.x @ (H @ r.x) - f @ r.x)  # at the clipped point, unscaled
    r.time_s = time.perf_counter() - t0
    return r


def solve_prescaled_box_qp(
    Hs: np.ndarray,
    f: np.ndarray,
    d: np.ndarray,
    lb: np.ndarray | float,
    ub: np.ndarray | float,
    *,
    solver: str = "dcd",
    tol: float = 1e-8,
    max_iter: int | None = None,
    x0: np.ndarray | None = None,
) -> QPResult:
    """:func:`solve_box_qp` for a caller that assembled the scaled Hessian itself.

    ``Hs = D H D`` with ``d = jacobi_scale(diag(H))``, symmetric and finite; ``f``,
    ``lb``, ``ub`` and ``x0`` in the original variables, as is the result. The SVM-step
    builds ``Hs`` in one compiled pass (:func:`~mmdtl2_dist.core.dcd.svm_hessian`) instead
    of the several dense temporaries of ``H`` this front end would make; the W-step
    builds it so too (:func:`~mmdtl2_dist.core.kron.kron_hessian`) or passes it unbuilt
    (:class:`~mmdtl2_dist.core.kron.ScaledKron`).
    """
    t0 = time.perf_counter()
    r = solve_scaled_box_qp(
        Hs, f * d, lb / d, ub / d, solver=solver, tol=tol, max_iter=max_iter,
        y0=None if x0 is None else np.asarray(x0, dtype=np.float64) / d,
    )  # fmt: skip
    x = np.clip(r.x * d, lb, ub)
    return QPResult(
        x, r.status, r.solver, r.kkt_residual, r.iterations, r.objective,
        time.perf_counter() - t0,
    )  # fmt: skip


def jacobi_scale(diag: np.ndarray) -> np.ndarray:
    """``d = diag^(-1/2)`` where the diagonal is positive, 1 elsewhere (``x = d ⊙ y``)."""
    return np.where(diag > 0, 1.0 / np.sqrt(np.where(diag > 0, diag, 1.0)), 1.0)


def _dcd(Hs, fs, lbs, ubs, y0, tol, max_epochs=5_000):
    """Coordinate descent with polishing (:mod:`mmdtl2_dist.core.dcd`): ``(y, sweeps, ok)``.

    ``tol`` is relative, as everywhere in this module; the solver's is absolute.
    """
    from mmdtl2_dist.core.dcd import dcd_box_qp

    fscale = max(1.0, float(np.max(np.abs(fs), initial=0.0)))
    y, sweeps, ok, _ = dcd_box_qp(Hs, fs, lbs, ubs, y0, tol * fscale, max_epochs)
    return y, sweeps, ok


def _osqp_after_dcd(Hs, fs, lbs, ubs, y, tol, max_iter):
    """OSQP from the point where coordinate descent stopped short of ``tol``.

    Returns ``(y, iterations, provenance, status)`` of the better point by KKT residual:
    OSQP's (``"dcd+osqp"``) or, when OSQP gave none or a worse one, the first (``"dcd"``).
    """
    yo, iters, status = _osqp(Hs, fs, lbs, ubs, y, tol, max_iter or 200_000)
    if yo is not None and kkt_residual(Hs, fs, yo, lbs, ubs) < kkt_residual(Hs, fs, y, lbs, ubs):
        return yo, iters, "dcd+osqp", status
    return y, iters, "dcd", "maximum iterations reached"


def solve_scaled_box_qp(
    Hs: np.ndarray,
    fs: np.ndarray,
    lbs: np.ndarray,
    ubs: np.ndarray,
    *,
    solver: str = "dcd",
    tol: float = 1e-8,
    max_iter: int | None = None,
    y0: np.ndarray | None = None,
) -> QPResult:
    """The solvers of :func:`solve_box_qp` on a checked, Jacobi-scaled problem.

    ``Hs`` symmetric (C-contiguous) with a unit diagonal where ``H`` had a positive one,
    ``fs``, ``lbs``, ``ubs`` scaled alike (``f ⊙ d``, ``l / d``, ``u / d``). For callers
    that assemble the scaled Hessian themselves (the SVM-step builds it in one compiled
    pass). The result is in the scaled variables; its objective is invariant to scaling.
    ``Hs`` may be a :class:`~mmdtl2_dist.core.kron.ScaledKron` for ``solver="dcd"``
    (never built; no OSQP after coordinate descent then, as OSQP needs the array).
    """
    t0 = time.perf_counter()
    n = fs.shape[0]
    if n == 0:
        return QPResult(np.zeros(0), "solved", solver, 0.0, 0, 0.0, 0.0)
    lbs = np.array(np.broadcast_to(np.asarray(lbs, dtype=np.float64), (n,)))
    ubs = np.array(np.broadcast_to(np.asarray(ubs, dtype=np.float64), (n,)))
    if solver == "dcd":
        y, iters, ok = _dcd(Hs, fs, lbs, ubs, y0, tol)
        used, status = "dcd", "solved"
        if not ok and isinstance(Hs, np.ndarray):  # OSQP needs the Hessian as an array
            y, it2, used, status = _osqp_after_dcd(Hs, fs, lbs, ubs, y, tol, max_iter)
            iters += it2
    else:
        y, iters, status = _osqp(Hs, fs, lbs, ubs, y0, tol, max_iter or 200_000)
        used = "osqp"
        if y is None:
            raise QPSolveError(
                f"OSQP returned no solution (status {status!r}) for a box QP of size {n}."
            )
    res = kkt_residual(Hs, fs, y, lbs, ubs)
    if res > tol:
        # OSQP's own tolerances are on the ADMM residuals; check the KKT conditions here.
        if res > max(1e3 * tol, 1e-5):
            fix = (
                "Increase max_iter, loosen tol, or rescale the features."
                if isinstance(Hs, np.ndarray)
                else "Loosen qp_tol, or raise c_f (a better-conditioned W-step)."
            )
            raise QPSolveError(
                f"box QP of size {n} not solved: solver {used!r} stopped with status "
                f"{status!r} at relative KKT residual {res:.2e} > tol {tol:.1e}. {fix}"
            )
        status = "solved inaccurate"
    obj = float(0.5 * y @ (Hs @ y) - fs @ y)
    return QPResult(y, status, used, res, iters, obj, time.perf_counter() - t0)
