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

``"pdas"``
    A primal-dual active-set (semismooth Newton) method written for this structure:
    guess which bounds are active from ``x - c (Hx - f)``, fix those variables, solve
    the remaining (free) block exactly with a Cholesky factorisation, repeat until the
    active sets stop changing. For these problems the free set is the set of margin
    support vectors, usually far smaller than ``n``, and the method terminates after a
    handful of iterations with an exact KKT point. Singular ``H`` (rank-deficient Grams)
    is handled by a few proximal-point refinements. If the sets cycle, the solve continues
    with coordinate descent and polishing (``"dcd"`` below; up to 1,500 variables), then
    OSQP or a monotone projected Newton method, and, for the rare singular and badly
    scaled problems where those stall, with an interior-point method (Clarabel).
``"dcd"``
    Dual coordinate descent finished by exact Newton steps on the free variables
    (:mod:`mmdtl2_dist.core.dcd`); indifferent to singular ``H``, which makes it the
    solver of the SVM-step. If it misses the tolerance within its budget, the ``"pdas"``
    chain continues from its point.
``"osqp"``
    OSQP (operator splitting) with tight tolerances and solution polishing; general and
    robust, but first-order and slower for tight tolerances.

Whichever solver runs, the result carries the KKT residual of the returned point,
computed here and not taken from the solver: the infinity norm of the projected
gradient ``y - clip(y - (H̃y - f̃), l̃, ũ)`` of the Jacobi-scaled problem (``x = d ⊙ y``,
``d = diag(H)^-½``), divided by ``max(1, ‖f̃‖∞)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg as sla

from mmdtl2_dist.core.errors import QPSolveError

SOLVERS = ("pdas", "dcd", "osqp")


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
        The solver that produced ``x``: ``"pdas"``, ``"dcd"``, ``"osqp"``, or the
        active-set method's rescuer after a ``+`` (``"pdas+dcd"``, ``"pdas+osqp"``, ...).
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


def _pdas(H, f, lb, ub, x0, tol, max_iter, rho_rel=1e-6):
    """Primal-dual active-set method with proximal refinement; returns (x, iters, ok)."""
    n = f.shape[0]
    diag = np.diag(H)
    scale = float(np.mean(diag)) if n else 1.0
    if not np.isfinite(scale) or scale <= 0:
        scale = max(float(np.max(np.abs(H), initial=0.0)), 1.0)
    c = 1.0 / scale
    # A relative ridge keeps the free block positive definite when H is singular; the
    # proximal iterations below remove its bias (x_{k+1} = argmin q(x) + rho/2 |x - x_k|^2).
    rho = rho_rel * scale
    x = np.clip(np.zeros(n) if x0 is None else np.asarray(x0, dtype=np.float64), lb, ub)
    total = 0
    for _prox in range(60):
        if total > 300:
            return x, total, False
        anchor = x.copy()
        ff = f + rho * anchor
        lam = H @ x + rho * x - ff
        seen: set[bytes] = set()
        prev_key = None
        converged = False
        for _ in range(max_iter):
            total += 1
            z = x - c * lam
            at_l = z < lb
            at_u = z > ub
            key = np.packbits(at_l).tobytes() + np.packbits(at_u).tobytes()
            if key == prev_key:
                converged = True
                break
            if key in seen:  # cycling: give up, the caller falls back
                return x, total, False
            seen.add(key)
            prev_key = key
            free = ~(at_l | at_u)
            x = np.where(at_l, lb, np.where(at_u, ub, x))
            fixed = ~free
            if np.any(free):
                rhs = ff[free] - H[np.ix_(free, fixed)] @ x[fixed]
                Hff = H[np.ix_(free, free)]
                Hff.flat[:: Hff.shape[0] + 1] += rho
                try:
                    x[free] = sla.cho_solve(sla.cho_factor(Hff, check_finite=False), rhs)
                except (sla.LinAlgError, ValueError):
                    x[free] = np.linalg.lstsq(Hff, rhs, rcond=None)[0]
            lam = H @ x + rho * x - ff
            lam[free] = 0.0
        if not converged:
            return x, total, False
        if np.max(np.abs(x - anchor), initial=0.0) <= 1e-14 * max(1.0, np.max(np.abs(x))):
            break
        if kkt_residual(H, f, x, lb, ub) <= 0.1 * tol:
            break
    return x, total, kkt_residual(H, f, x, lb, ub) <= tol


def _projected_newton(H, f, lb, ub, x0, tol, max_iter):
    """Projected Newton method (Bertsekas, 1982) with an Armijo search along the projection arc.

    Monotone in the objective, so it cannot cycle; on the identified face it takes
    (ridged) Newton steps, so it ends with an exact KKT point. Directions in the null
    space of a singular free block get very long steps, which the projection cuts at the
    bounds: exactly where a linear descent direction of a bounded QP leads.
    """
    n = f.shape[0]
    diag = np.maximum(np.diag(H), 0.0)
    scale = float(np.mean(diag)) if n else 1.0
    scale = scale if np.isfinite(scale) and scale > 0 else 1.0
    delta = 1e-9 * scale
    x = np.clip(np.zeros(n) if x0 is None else np.asarray(x0, dtype=np.float64), lb, ub)
    Hx = H @ x
    q = 0.5 * x @ Hx - f @ x
    for it in range(1, max_iter + 1):
        g = Hx - f
        pg = x - np.clip(x - g, lb, ub)
        if np.max(np.abs(pg), initial=0.0) <= 0.1 * tol * max(1.0, np.max(np.abs(f))):
            return x, it, True
        eps = min(1e-3, float(np.linalg.norm(pg)))
        binding = ((x <= lb + eps) & (g > 0)) | ((x >= ub - eps) & (g < 0))
        free = ~binding
        d = np.zeros(n)
        d[binding] = g[binding] / np.where(diag[binding] > 0, diag[binding], scale)
        if np.any(free):
            Hff = H[np.ix_(free, free)]
            Hff.flat[:: Hff.shape[0] + 1] += delta
            try:
                d[free] = sla.cho_solve(sla.cho_factor(Hff, check_finite=False), g[free])
            except (sla.LinAlgError, ValueError):
                d[free] = np.linalg.lstsq(Hff, g[free], rcond=None)[0]
        alpha = 1.0
        for _ in range(60):
            xn = np.clip(x - alpha * d, lb, ub)
            Hxn = H @ xn
            qn = 0.5 * xn @ Hxn - f @ xn
            if qn <= q - 1e-4 * (g @ (x - xn)) or np.array_equal(xn, x):
                break
            alpha *= 0.5
        if np.array_equal(xn, x):
            return x, it, False  # no progress possible at machine precision
        x, Hx, q = xn, Hxn, qn
    return x, max_iter, False


def _clarabel(H, f, lb, ub):
    """Interior-point fallback (Clarabel) for the hard cases: singular and badly scaled."""
    import clarabel
    import scipy.sparse as sp

    n = f.shape[0]
    fin = np.isfinite(ub)
    A = sp.vstack([-sp.identity(n, format="csc"), sp.identity(n, format="csc")[fin]], format="csc")
    rhs = np.r_[-lb, ub[fin]]
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = settings.tol_gap_rel = 1e-12
    settings.tol_feas = 1e-12
    settings.max_iter = 400
    sol = clarabel.DefaultSolver(
        sp.triu(sp.csc_matrix(H), format="csc"),
        -f,
        A,
        rhs,
        [clarabel.NonnegativeConeT(A.shape[0])],
        settings,
    ).solve()
    x = np.clip(np.asarray(sol.x, dtype=np.float64), lb, ub)
    return x, int(sol.iterations), str(sol.status)


def _osqp(H, f, lb, ub, x0, tol, max_iter):
    """OSQP from ``x0``; ``(x, iterations, status)``, ``x`` None when OSQP gave none.

    A failed set-up (OSQP's factorisation of a numerically indefinite Hessian) is such a
    case: the callers go on with their other solvers or name the failure.
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
    solver: str = "pdas",
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
    solver : {"pdas", "dcd", "osqp"}
        Algorithm (see module docstring).
    tol : float
        Required relative KKT residual of the returned point.
    max_iter : int, optional
        Iteration cap (default 100 active-set iterations for ``pdas``, 200,000 for ``osqp``).
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
    # orders of magnitude (G grows like 1/c_f), and a unit diagonal makes the active-set
    # guesses, the Newton ridge and OSQP's step sizes scale-free. Residuals are measured
    # in the scaled variables, so they do not depend on the units of the problem.
    d = jacobi_scale(np.diag(H))
    y0 = None if x0 is None else np.asarray(x0, dtype=np.float64) / d
    r = solve_scaled_box_qp(
        H * np.outer(d, d), f * d, lb / d, ub / d, solver=solver, tol=tol, max_iter=max_iter, y0=y0
    )
    x = np.clip(r.x * d, lb, ub)
    obj = float(0.5 * x @ (H @ x) - f @ x)
    return QPResult(
        x, r.status, r.solver, r.kkt_residual, r.iterations, obj, time.perf_counter() - t0
    )


def jacobi_scale(diag: np.ndarray) -> np.ndarray:
    """``d = diag^(-1/2)`` where the diagonal is positive, 1 elsewhere (``x = d ⊙ y``)."""
    return np.where(diag > 0, 1.0 / np.sqrt(np.where(diag > 0, diag, 1.0)), 1.0)


# Sweep budget of coordinate descent when it rescues a cycling active-set solve.
RESCUE_SWEEPS = 500


def _dcd(Hs, fs, lbs, ubs, y0, tol, max_epochs=5_000):
    """Coordinate descent with polishing (:mod:`mmdtl2_dist.core.dcd`): ``(y, sweeps, ok)``.

    ``tol`` is relative, as everywhere in this module; the solver's is absolute.
    """
    from mmdtl2_dist.core.dcd import dcd_box_qp

    fscale = max(1.0, float(np.max(np.abs(fs), initial=0.0)))
    y, sweeps, ok, _ = dcd_box_qp(Hs, fs, lbs, ubs, y0, tol * fscale, max_epochs)
    return y, sweeps, ok


def _rescue(Hs, fs, lbs, ubs, cands, tol, max_iter, try_dcd):
    """Other solvers after the active-set method cycled; appends to ``cands``.

    ``cands`` holds ``(residual, y, provenance, status)`` tuples, the active-set point
    first; every further point is added and the caller keeps the best. Cheapest first:
    coordinate descent with polishing (``try_dcd``: not tried yet; exact and a few
    milliseconds on the well-conditioned W-steps where the active sets cycle), then for
    the size OSQP (warm-started, polished; fast for a few hundred variables but it
    factorises the dense Hessian, which a projected Newton method does not). Returns the
    iterations spent.
    """
    n = fs.shape[0]
    order = ("osqp", "newton") if n <= 1500 else ("newton", "osqp")
    if try_dcd and n <= 1500:
        order = ("dcd", *order)
    iters = 0
    for alt in order:
        if alt == "dcd":
            ya, it2, okd = _dcd(Hs, fs, lbs, ubs, cands[0][1], tol, RESCUE_SWEEPS)
            st = "solved" if okd else "maximum iterations reached"
        elif alt == "osqp":
            # Capped: on very singular problems OSQP can crawl; Newton comes next.
            ya, it2, st = _osqp(Hs, fs, lbs, ubs, cands[0][1], tol, max_iter or 2_000)
        else:
            ya, it2, okn = _projected_newton(Hs, fs, lbs, ubs, cands[0][1], tol, 500)
            st = "solved" if okn else "maximum iterations reached"
        iters += it2
        if ya is not None:
            cands.append((kkt_residual(Hs, fs, ya, lbs, ubs), ya, "pdas+" + alt, st))
        if min(c[0] for c in cands) <= tol:
            return iters
    if min(c[0] for c in cands) > tol:
        # Singular and badly scaled (e.g. c_d = 0 with tiny c_f): interior point.
        yc, it3, st3 = _clarabel(Hs, fs, lbs, ubs)
        iters += it3
        cands.append((kkt_residual(Hs, fs, yc, lbs, ubs), yc, "pdas+clarabel", st3))
        if cands[-1][0] > tol:
            # Interior points stop short of the bounds on very ill-conditioned
            # problems; active-set steps from there identify the face.
            yp, it4, _ = _pdas(Hs, fs, lbs, ubs, yc, tol, max_iter or 100)
            iters += it4
            cands.append((kkt_residual(Hs, fs, yp, lbs, ubs), yp, "pdas+clarabel", st3))
    if min(c[0] for c in cands) > max(1e3 * tol, 1e-5):
        # Last resort: OSQP with its full budget from the best point so far (only
        # when no point is acceptable: on Hessians with condition numbers ~1e12
        # it can take 200,000 iterations, tens of seconds, for the last digits).
        best = min(cands, key=lambda c: c[0])[1]
        yo, it5, st5 = _osqp(Hs, fs, lbs, ubs, best, tol, max_iter or 200_000)
        iters += it5
        if yo is not None:
            cands.append((kkt_residual(Hs, fs, yo, lbs, ubs), yo, "pdas+osqp", st5))
    return iters


def solve_scaled_box_qp(
    Hs: np.ndarray,
    fs: np.ndarray,
    lbs: np.ndarray,
    ubs: np.ndarray,
    *,
    solver: str = "pdas",
    tol: float = 1e-8,
    max_iter: int | None = None,
    y0: np.ndarray | None = None,
) -> QPResult:
    """The solver chain of :func:`solve_box_qp` on a checked, Jacobi-scaled problem.

    ``Hs`` symmetric (C-contiguous) with a unit diagonal where ``H`` had a positive one,
    ``fs``, ``lbs``, ``ubs`` scaled alike (``f ⊙ d``, ``l / d``, ``u / d``). For callers
    that assemble the scaled Hessian themselves (the SVM-step builds it in one compiled
    pass). The result is in the scaled variables; its objective is invariant to scaling.
    """
    t0 = time.perf_counter()
    n = fs.shape[0]
    if n == 0:
        return QPResult(np.zeros(0), "solved", solver, 0.0, 0, 0.0, 0.0)
    lbs = np.array(np.broadcast_to(np.asarray(lbs, dtype=np.float64), (n,)))
    ubs = np.array(np.broadcast_to(np.asarray(ubs, dtype=np.float64), (n,)))
    used, iters, status, y = solver, 0, "solved", None
    dcd_point = dcd_res = None
    if solver == "dcd":
        y, iters, ok = _dcd(Hs, fs, lbs, ubs, y0, tol)
        if not ok:
            # The active-set chain, from where the caller asked (coordinate descent can
            # stall on very ill-conditioned Hessians in a corner the chain would not
            # choose); the better of the two points is kept below.
            dcd_point, solver, used = y, "pdas", "dcd+pdas"
            dcd_res = kkt_residual(Hs, fs, dcd_point, lbs, ubs)
            y = None
    if solver == "pdas":
        # A larger proximal weight makes the active-set iteration more stable on
        # singular Hessians (SVM-steps whose transformed targets lie in the span of the
        # source samples), at the price of more proximal refinements.
        for rho_rel in (1e-6, 1e-3):
            y, it1, ok = _pdas(Hs, fs, lbs, ubs, y0, tol, max_iter or 100, rho_rel)
            iters += it1
            if ok:
                break
        if not ok:
            cands = [(kkt_residual(Hs, fs, y, lbs, ubs), y, "pdas", "solved")]
            if dcd_point is not None:
                cands.append((dcd_res, dcd_point, "dcd", "solved"))
            iters += _rescue(Hs, fs, lbs, ubs, cands, tol, max_iter, dcd_point is None)
            _, y, used, status = min(cands, key=lambda c: c[0])
    if y is None:
        y, it2, status = _osqp(Hs, fs, lbs, ubs, y0, tol, max_iter or 200_000)
        iters += it2
        if y is None:
            raise QPSolveError(
                f"OSQP returned no solution (status {status!r}) for a box QP of size {n}."
            )
    res = kkt_residual(Hs, fs, y, lbs, ubs)
    if dcd_point is not None and dcd_res < res:
        y, res, used, status = dcd_point, dcd_res, "dcd", "solved"
    if res > tol:
        # OSQP's own tolerances are on the ADMM residuals; check the KKT conditions here.
        if res > max(1e3 * tol, 1e-5):
            raise QPSolveError(
                f"box QP of size {n} not solved: solver {used!r} stopped with status "
                f"{status!r} at relative KKT residual {res:.2e} > tol {tol:.1e}. "
                "Increase max_iter, loosen tol, or rescale the features."
            )
        status = "solved inaccurate"
    obj = float(0.5 * y @ (Hs @ y) - fs @ y)
    return QPResult(y, status, used, res, iters, obj, time.perf_counter() - t0)
