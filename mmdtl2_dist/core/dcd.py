"""Dual coordinate descent for box QPs, finished by exact active-set steps.

The SVM-step dual ``min ½ αᵀ Q α − 1ᵀα``, ``0 ≤ α ≤ c``, with ``Q = Y (Kv + 1) Y``, is
singular in MMDTL2: the transformed targets ``W x̂_m`` lie in the span of the source
samples (zero prior), so ``Q`` has rank about ``N + 1`` of ``N + M``. Active-set methods
that solve the free block exactly cycle there, and interior-point or ADMM solvers on the
dense ``Q`` cost seconds to minutes at a few thousand variables.

Coordinate descent does not care about singularity (Hsieh et al., "A dual coordinate
descent method for large-scale linear SVM", ICML 2008, the algorithm behind liblinear;
linear convergence for box QPs: Luo & Tseng, 1992). Each step minimises the objective
exactly in one variable, ``x_i ← clip(x_i − g_i / Q_ii, l_i, u_i)``, and keeps the
gradient ``g = Qx − f`` up to date with one column of ``Q`` (O(n) per step), so a sweep
over all variables costs one matrix-vector product.

Coordinate descent identifies the active set quickly but converges slowly to high
accuracy. So the solve alternates: sweeps until the projected gradient is below a loose
threshold, then a *polish* — a Newton step on the free variables (``Q_FF d = −g_F``, a
pseudo-inverse when ``Q_FF`` is singular; every solution gives the same primal ``w``),
clipped to the box and repeated while it lowers the KKT residual. When the active set is
right the polish lands on the exact optimum (residuals ~1e-14); otherwise the sweeps
continue from the better point with a tighter threshold.

The sweep kernel is compiled with numba (``cache=True``: compiled once per machine).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.linalg as sla
from numba import njit

# Eigenvalues of a free block below this fraction of its largest are treated as zero.
SINGULAR_RTOL = 1e-8


@njit(cache=True, nogil=True)
def _sweeps(H, g, x, lb, ub, tol, max_epochs, seed):  # pragma: no cover - compiled
    """Randomised cyclic coordinate descent on ``½xᵀHx − fᵀx`` in place.

    ``g`` must hold ``Hx − f`` on entry and is kept exact. Stops after the first sweep
    whose largest projected gradient is ``<= tol``. Returns ``(sweeps, largest |pg|)``.
    """
    n = x.shape[0]
    # numba's own generator (separate from NumPy's global state); Generator objects are
    # not supported inside compiled code.
    np.random.seed(seed)  # noqa: NPY002
    perm = np.arange(n)
    viol = np.inf
    ep = 0
    while ep < max_epochs:
        ep += 1
        np.random.shuffle(perm)  # noqa: NPY002
        viol = 0.0
        for t in range(n):
            i = perm[t]
            gi = g[i]
            xi = x[i]
            if xi <= lb[i]:
                pg = gi if gi < 0.0 else 0.0
            elif xi >= ub[i]:
                pg = gi if gi > 0.0 else 0.0
            else:
                pg = gi
            if pg == 0.0:
                continue
            a = -pg if pg < 0.0 else pg
            if a > viol:
                viol = a
            hii = H[i, i]
            if hii > 0.0:
                nx = xi - gi / hii
            elif gi > 0.0:  # linear in x_i: go to the bound the gradient points to
                nx = lb[i]
            else:
                nx = ub[i]
            if nx < lb[i]:
                nx = lb[i]
            elif nx > ub[i]:
                nx = ub[i]
            d = nx - xi
            if d != 0.0 and np.isfinite(nx):
                x[i] = nx
                row = H[i]
                for j in range(n):
                    g[j] += d * row[j]
        if viol <= tol:
            break
    return ep, viol


@njit(cache=True, nogil=True)
def svm_hessian(Kv, yd):  # pragma: no cover - compiled
    """``Hs = diag(yd) ((Kv + Kvᵀ)/2 + 1) diag(yd)`` in one pass.

    The Jacobi-scaled Hessian of the SVM-step dual (``yd = y ⊙ d``), symmetrised because
    assembled Grams are symmetric only up to rounding.
    """
    n = Kv.shape[0]
    H = np.empty((n, n))
    for i in range(n):
        for j in range(i, n):
            v = (0.5 * (Kv[i, j] + Kv[j, i]) + 1.0) * yd[i] * yd[j]
            H[i, j] = v
            H[j, i] = v
    return H


def _residual(x, g, lb, ub):
    return float(np.max(np.abs(x - np.clip(x - g, lb, ub)), initial=0.0))


def _null_space_rays(base, r, Z, lo, hi):
    """Follow the null space of the free block downhill, one bound at a time.

    Along ``Z`` (an orthonormal null-space basis) the objective is linear with slope
    ``−r`` and the gradient does not change. Move along the projection of ``r`` on the
    remaining null space to the first bound, fix that variable (a Householder reflection
    removes its row from the basis), and repeat until the slope vanishes or the null space
    is used up: one factorisation for all the variables a singular free set has too many.
    """
    pos = base.copy()
    Z = Z.copy()
    fixed = np.zeros(pos.shape[0], dtype=bool)
    for _ in range(Z.shape[1]):
        d = Z @ (Z.T @ r)
        d[fixed] = 0.0  # zero up to rounding already: do not let it block again
        if np.linalg.norm(d) <= 1e-12 * max(float(np.linalg.norm(r)), 1e-300):
            break
        with np.errstate(divide="ignore", invalid="ignore"):
            t_up = np.where(d > 0, (hi - pos) / d, np.inf)
            t_lo = np.where(d < 0, (lo - pos) / d, np.inf)
        t_all = np.maximum(np.minimum(t_up, t_lo), 0.0)
        i = int(np.argmin(t_all))
        t = float(t_all[i])
        if not np.isfinite(t):
            break  # unbounded along d: leave it to the sweeps and the caller's checks
        pos += t * d
        pos[i] = hi[i] if d[i] > 0 else lo[i]
        fixed[i] = True
        z = Z[i].copy()  # restrict the basis to {Z t : (Z t)_i = 0}
        nz = float(np.linalg.norm(z))
        if Z.shape[1] == 1:
            break
        if nz > 0:
            u = z.copy()
            u[0] += np.copysign(nz, z[0]) if z[0] != 0 else nz
            u /= np.linalg.norm(u)
            Z = (Z - 2.0 * np.outer(Z @ u, u))[:, 1:]
            Z[i] = 0.0
    return pos


def _ratio(pos, d, lo, hi):
    """Largest ``t`` in [0, 1] with ``lo ≤ pos + t d ≤ hi``, and the blocking index."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t_up = np.where(d > 0, (hi - pos) / d, np.inf)
        t_lo = np.where(d < 0, (lo - pos) / d, np.inf)
    t_all = np.maximum(np.minimum(t_up, t_lo), 0.0)
    i = int(np.argmin(t_all)) if t_all.size else 0
    return (min(1.0, float(t_all[i])) if t_all.size else 1.0), i


def _polish(H, f, x, lb, ub):
    """Newton steps on the free variables, kept in the box; returns (x, g).

    The free set is the one a primal-dual active-set method would guess: variables
    strictly inside the box and variables on a bound that the gradient pushes inward.
    Then a primal active-set loop: the Newton step of the free block is taken as far as
    the box allows; if a variable blocks it, that variable is fixed at its bound and the
    step is recomputed for the others (monotone in the objective, at most one
    factorisation per dropped variable). When the free block is singular and the
    Newton system has no solution, the least-squares residual ``r`` lies in its null
    space, where the objective is linear and decreasing along ``r``: the step then
    follows the null space to the bounds (:func:`_null_space_rays`).
    """
    g = H @ x - f
    span = np.where(np.isfinite(ub), ub - lb, np.abs(lb) + 1.0)
    eps = 1e-12 * np.maximum(span, 1e-300)
    free = np.flatnonzero(((x > lb + eps) | (g < 0.0)) & ((x < ub - eps) | (g > 0.0)))
    pos = x.copy()
    for _ in range(free.size):
        if free.size == 0:
            break
        Hff = H[np.ix_(free, free)]
        gF = H[free] @ pos - f[free]
        lo, hi = lb[free], ub[free]
        step, Z = None, None
        try:
            cf = sla.cho_factor(Hff, check_finite=False)
            piv = np.diag(cf[0]) ** 2
            # A factor with tiny pivots belongs to a numerically singular block
            # (assembled Grams carry rounding noise in their null space).
            if np.min(piv) > SINGULAR_RTOL * np.max(piv):
                step = sla.cho_solve(cf, -gF)
        except (sla.LinAlgError, ValueError):
            pass
        if step is None:
            w, V = np.linalg.eigh(Hff)
            keep = w > SINGULAR_RTOL * max(float(w[-1]), 1e-300)
            step = V[:, keep] @ ((V[:, keep].T @ -gF) / w[keep])
            Z = V[:, ~keep]  # orthonormal basis of the null space of the free block
        t, i = _ratio(pos[free], step, lo, hi)
        if t < 1.0:  # blocked: go as far as the box allows, fix the blocking variable
            pos[free] = np.clip(pos[free] + t * step, lo, hi)
            pos[free[i]] = hi[i] if step[i] > 0 else lo[i]
            free = np.delete(free, i)
            continue
        pos[free] = np.clip(pos[free] + step, lo, hi)
        if Z is None:
            break
        r = Z @ (Z.T @ -gF)  # descent direction in the null space: linear there
        if np.linalg.norm(r) <= 1e-10 * max(float(np.linalg.norm(gF)), 1e-300):
            break
        pos[free] = _null_space_rays(pos[free], r, Z, lo, hi)
        inside = (pos[free] > lo + eps[free]) & (pos[free] < hi - eps[free])
        if inside.all():
            break
        free = free[inside]  # the Newton step of the smaller set comes next
    return pos, H @ pos - f


class DCDResult(NamedTuple):
    """Result of :func:`dcd_box_qp`.

    ``x``; ``sweeps`` over all variables; ``ok``: projected gradient ``<= tol``;
    ``residual``: its infinity norm at ``x``.
    """

    x: np.ndarray
    sweeps: int
    ok: bool
    residual: float


def dcd_box_qp(H, f, lb, ub, x0, tol, max_epochs=5_000, seed=0) -> DCDResult:
    """Minimise ``½xᵀHx − fᵀx`` on ``lb ≤ x ≤ ub`` by coordinate descent and polishing.

    Parameters
    ----------
    H : ndarray (n, n)
        Symmetric positive semi-definite, C-contiguous, non-negative diagonal.
    f, lb, ub : ndarray (n,)
        Linear term and bounds (``lb`` finite, ``ub`` may be ``inf``).
    x0 : ndarray (n,) or None
        Warm start (clipped to the box).
    tol : float
        Absolute projected-gradient tolerance.
    max_epochs : int
        Budget of sweeps over all variables, polish rounds included.
    seed : int
        Seed of the sweep order (results are deterministic for a given seed).

    Returns
    -------
    DCDResult
    """
    H = np.ascontiguousarray(H, dtype=np.float64)
    n = f.shape[0]
    x = np.clip(np.zeros(n) if x0 is None else np.array(x0, dtype=np.float64), lb, ub)
    g = H @ x - f
    res = _residual(x, g, lb, ub)
    threshold = max(1e-3, tol)
    total = 0
    for rnd in range(50):
        if res <= tol:
            return DCDResult(x, total, True, res)
        if total >= max_epochs:
            break
        # Sweep budgets grow geometrically: polishing early pays when the active set is
        # found long before the sweeps converge (singular H: slow along its null space).
        budget = min(10 * 2**rnd, max_epochs - total)
        ep, viol = _sweeps(H, g, x, lb, ub, max(threshold, tol), budget, seed + rnd)
        total += ep
        g = H @ x - f  # drop the rounding accumulated by the sweeps
        res = _residual(x, g, lb, ub)
        obj = 0.5 * x @ (g - f)  # ½xᵀHx − fᵀx with g = Hx − f
        for _ in range(20):  # polish while it helps (each step can change the active set)
            if res <= tol:
                break
            cand, cand_g = _polish(H, f, x, lb, ub)
            cand_res = _residual(cand, cand_g, lb, ub)
            cand_obj = 0.5 * cand @ (cand_g - f)
            if not (cand_res < res or cand_obj < obj - 1e-15 * max(1.0, abs(obj))):
                break
            x, g, res, obj = cand, cand_g, cand_res, cand_obj
        if viol <= threshold:
            threshold *= 0.1
    return DCDResult(x, total, res <= tol, res)
