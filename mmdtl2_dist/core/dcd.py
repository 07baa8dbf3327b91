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
accuracy. So the solve alternates: sweeps until the projected gradient is below a
threshold, then a *polish* — a Newton step on the free variables (``Q_FF d = −g_F``;
every solution gives the same primal ``w`` when ``Q_FF`` is singular), kept in the box
and repeated while it lowers the KKT residual. When the active set is right the polish
lands on the exact optimum (residuals ~1e-14); otherwise the sweeps continue from the
better point with a tighter threshold.

Costs set the balance: a sweep is one matrix-vector product, a polish step one
factorisation of the free block (tens of sweeps at a few hundred variables), and every
variable that the polish must still move to a bound costs a step. The first polish
therefore waits for a projected gradient of 1e-5 (within a budget of sweeps), where the
active set is usually the final one, and each free block is factorised once by a
pivoted Cholesky factorisation that also reveals its rank and null space. A large
regular block keeps its factor while the polish fixes a few variables at a time: each
fixed variable drops a column of the factor, ``O(n²)`` instead of a new ``n³/3``
factorisation (:mod:`mmdtl2_dist.core.free_factor`).

The sweep kernel is compiled with numba (``cache=True``: compiled once per machine).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from scipy.linalg import lapack

from mmdtl2_dist.core import memory
from mmdtl2_dist.core.free_factor import KEEP_FACTOR_AT, RegularFactor
from mmdtl2_dist.core.kron import ScaledKron
from mmdtl2_dist.core.sweeps import dense_sweeps, kron_sweeps

# Pivots of a free block's Cholesky factorisation below this fraction of its largest
# diagonal entry are treated as zero (assembled Grams carry rounding noise in their null
# space).
SINGULAR_RTOL = 1e-8
# Projected-gradient threshold of the sweeps before the first polish, and their budget.
FIRST_POLISH_AT = 1e-5
FIRST_SWEEP_BUDGET = 200
# Sweeps of an unbuilt W-step Hessian (block by block, :func:`~mmdtl2_dist.core.sweeps.
# kron_sweeps`) take a fifth of the time of sweeps over the stored array or less
# (measured on a 20-class W-step with 8,000 variables: 1.0 against 5.2 ms when this
# factor was set; they have become cheaper since), while a polish costs
# the same: such sweeps get up to this many times the budgets, first sweeps and total,
# and no more than their operation count's ratio ``K M / (K + M)`` (about 2 with two
# classes, where a sweep is only that much cheaper).
UNBUILT_SWEEP_BUDGET_FACTOR = 5
# Free blocks of an unbuilt Hessian up to this size are built for a polish without asking
# the system for its memory (the size up to which the W-step builds its whole Hessian).
SMALL_FREE_BLOCK_BYTES = 1 << 28
# The polish goes on until the residual is below this fraction of the tolerance: the
# exact optimum wherever the active set is identified (polished residuals are 1e-17 to
# 1e-11 on the study's problems, the upper end being their rounding floor).
EXACT_FRACTION = 1e-2


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


def _factorise(Hff):
    """Pivoted Cholesky ``Pᵀ Hff P = Rᵀ R`` (LAPACK ``dpstrf``) to the numerical rank.

    ``(R, perm, rank)``: ``R[:rank, :rank]`` is the factor of the pivot block,
    ``perm`` the 0-based pivot order.
    """
    m = Hff.shape[0]
    top = float(np.max(np.diag(Hff), initial=0.0))
    if top <= 0.0:
        return None, np.arange(m), 0
    R, piv, rank, _ = lapack.dpstrf(Hff, tol=SINGULAR_RTOL * top, lower=0)
    return R, piv - 1, rank  # LAPACK's pivots are 1-based


def _free_block_step(Hff, gF, factor=None):
    """Newton step ``d`` of a free block (``Hff d = −gF``) and a basis of its null space.

    One pivoted Cholesky factorisation (:func:`_factorise`, or ``factor`` if given),
    stopped at the numerical rank ``r``: the step solves the ``r`` pivot equations with
    the other variables left where they are (a basic solution; any solution of a
    consistent system gives the same primal ``w``), and the columns of
    ``P [−R₁₁⁻¹ R₁₂; I]``, orthonormalised, span the null space (``None`` when ``Hff`` is
    regular). If the system is inconsistent, the remaining gradient has a component in
    that null space.
    """
    m = gF.shape[0]
    R, perm, rank = _factorise(Hff) if factor is None else factor
    step = np.zeros(m)
    if rank:  # LAPACK directly: these small solves are dominated by call overhead
        step[perm[:rank]] = lapack.dpotrs(R[:rank, :rank], -gF[perm[:rank]], lower=0)[0]
    if rank == m:
        return step, None
    basis = np.zeros((m, m - rank))
    if rank:
        basis[:rank] = -lapack.dtrtrs(R[:rank, :rank], R[:rank, rank:], lower=0)[0]
    basis[rank:] = np.eye(m - rank)
    Z = np.empty_like(basis)
    Z[perm] = np.linalg.qr(basis)[0]
    return step, Z


def _blocked_step(pos, step, t, i, gF, Hff, lo, hi):
    """Where a Newton step blocked at ``t < 1`` by variable ``i`` goes, and what it fixes.

    Two candidates, the one with the lower objective wins (both lower it): the ratio
    point ``pos + t·step`` (fixes ``i``) and the projected full step
    ``clip(pos + step)`` (fixes every variable it clips, so a free set with many
    variables bound for their bounds shrinks in one factorisation).
    """
    ratio = np.clip(pos + t * step, lo, hi)
    ratio[i] = hi[i] if step[i] > 0 else lo[i]
    fixed = np.zeros(pos.shape[0], dtype=bool)
    fixed[i] = True
    full = pos + step
    projected = np.clip(full, lo, hi)

    def change(new):  # objective change on the block: gᵀδ + ½ δᵀHδ
        delta = new - pos
        return float(gF @ delta + 0.5 * delta @ (Hff @ delta))

    if change(projected) < change(ratio):
        return projected, (full <= lo) | (full >= hi)
    return ratio, fixed


def _polish(H, f, x, lb, ub):
    """Newton steps on the free variables, kept in the box; returns (x, g).

    The free set is the one a primal-dual active-set method would guess: variables
    strictly inside the box and variables on a bound that the gradient pushes inward.
    Then a primal active-set loop: the Newton step of the free block
    (:func:`_free_block_step`) is taken as far as the box allows; if variables block
    it, they are fixed at their bounds (:func:`_blocked_step`) and the step is
    recomputed for the others (monotone in the objective), from the factor of the last
    block with their columns dropped where that block was large and regular
    (:func:`_newton_step`), else from a new factorisation. When the free block is
    singular and the Newton system has no solution, the remaining gradient lies in its
    null space, where the objective is linear and decreasing along it: the step then
    follows the null space to the bounds (:func:`_null_space_rays`).
    """
    g = H @ x - f
    span = np.where(np.isfinite(ub), ub - lb, np.abs(lb) + 1.0)
    eps = 1e-12 * np.maximum(span, 1e-300)
    free = np.flatnonzero(((x > lb + eps) | (g < 0.0)) & ((x < ub - eps) | (g > 0.0)))
    pos = x.copy()
    kept = None  # a large regular block's factor, carried through the fixed variables
    for _ in range(free.size):
        if free.size == 0:
            break
        lo, hi = lb[free], ub[free]
        if kept is None:
            Hff, gF = _free_block(H, free, pos, f)
            step, Z, kept = _newton_step(Hff, gF)
        else:
            Hff, gF, Z = kept, _free_gradient(H, free, pos, f), None  # kept @ v = H_FF v
            step = kept.step(gF)
        t, i = _ratio(pos[free], step, lo, hi)
        if t < 1.0:  # blocked: go as far as the box allows, fix the blocking variables
            pos[free], fixed = _blocked_step(pos[free], step, t, i, gF, Hff, lo, hi)
            free, Hff = free[~fixed], None  # the block goes before its factor is updated
            kept = kept.without(fixed) if kept is not None else None
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


def _newton_step(Hff, gF):
    """:func:`_free_block_step` on a new factorisation, and the factor kept for updates.

    The factor is kept (a :class:`~mmdtl2_dist.core.free_factor.RegularFactor`) when the
    block is regular and has at least :data:`~mmdtl2_dist.core.free_factor.KEEP_FACTOR_AT`
    variables; smaller blocks are refactorised after every blocked step.
    """
    factor = _factorise(Hff)
    step, Z = _free_block_step(Hff, gF, factor)
    R, perm, rank = factor
    regular = rank == gF.shape[0] and rank >= KEEP_FACTOR_AT
    return step, Z, RegularFactor(R, perm) if regular else None


def _free_gradient(H, free, x, f):
    """The gradient ``(H x − f)_F`` of the free variables ``F``, no rows of ``H`` copied."""
    return (H @ x)[free] - f[free]


def _free_block(H, free, x, f):
    """``H_FF`` and the gradient ``(H x − f)_F`` of the free variables ``F``."""
    if isinstance(H, ScaledKron):
        check_free_block_fits(H, free.size)
        return H.block(free), _free_gradient(H, free, x, f)
    return H[np.ix_(free, free)], H[free] @ x - f[free]


def check_free_block_fits(H: ScaledKron, n_free: int) -> None:
    """Refuse a polish of the unbuilt W-step Hessian whose free block would not fit.

    The block (``8 |F|²`` bytes) and its factor take twice that. With the L2 pull the
    W-step's free sets stay small; without it (``c_d = 0``) at tens of classes they reach
    tens of thousands of variables (a 65-class fit grew to 15 GB), and the kernel would
    kill the process (or the study's worker) mid-fit instead.
    """
    need = 16 * n_free**2
    if need <= SMALL_FREE_BLOCK_BYTES:
        return
    have = memory.available_bytes()
    if need > have:
        raise ValueError(
            f"the W-step QP of this fit ({H.K} classes x {H.M} labelled target samples) has "
            f"{n_free:,} free dual variables, and its Newton polish needs {need / 1e9:.1f} GB, "
            f"more than the {have / 1e9:.1f} GB available. Instead, fit with the L2 pull "
            "(c_d > 0: without it the free set grows with the classes), with fewer labelled "
            "target samples per class, or on a machine with more memory."
        )


def _run_sweeps(H, g, x, lb, ub, tol, max_epochs, seed):
    """The compiled sweeps on a stored Hessian or a :class:`~mmdtl2_dist.core.kron.ScaledKron`."""
    if isinstance(H, ScaledKron):
        return kron_sweeps(H.A, H.B, H.s, g, x, lb, ub, tol, max_epochs, seed)
    return dense_sweeps(H, g, x, lb, ub, tol, max_epochs, seed)


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
    H : ndarray (n, n) or ScaledKron
        Symmetric positive semi-definite, non-negative diagonal; a
        :class:`~mmdtl2_dist.core.kron.ScaledKron` is used without being built.
    f, lb, ub : ndarray (n,)
        Linear term and bounds (``lb`` finite, ``ub`` may be ``inf``).
    x0 : ndarray (n,) or None
        Warm start (clipped to the box).
    tol : float
        Absolute projected-gradient tolerance.
    max_epochs : int
        Budget of sweeps over all variables, polish rounds included
        (up to :data:`UNBUILT_SWEEP_BUDGET_FACTOR` times as many on an unbuilt Hessian).
    seed : int
        Seed of the sweep order (results are deterministic for a given seed).

    Returns
    -------
    DCDResult
    """
    if not isinstance(H, ScaledKron):
        H = np.ascontiguousarray(H, dtype=np.float64)
    n = f.shape[0]
    x = np.clip(np.zeros(n) if x0 is None else np.array(x0, dtype=np.float64), lb, ub)
    g = H @ x - f
    res = _residual(x, g, lb, ub)
    exact = EXACT_FRACTION * tol
    if res <= tol:  # a warm start that meets tol: still made exact where a polish can
        x, g, res = _polish_while_it_helps(H, f, x, g, res, lb, ub, exact)
    threshold = max(FIRST_POLISH_AT, tol)
    total = 0
    factor = _sweep_budget_factor(H)
    for rnd in range(50):
        if res <= tol or total >= factor * max_epochs:
            break
        # Sweep budgets grow geometrically: polishing early pays when the active set is
        # found long before the sweeps converge (singular H: slow along its null space).
        budget = min(factor * FIRST_SWEEP_BUDGET * 2**rnd, factor * max_epochs - total)
        ep, viol = _run_sweeps(H, g, x, lb, ub, max(threshold, tol), budget, seed + rnd)
        total += ep
        g = H @ x - f  # drop the rounding accumulated by the sweeps
        res = _residual(x, g, lb, ub)
        x, g, res = _polish_while_it_helps(H, f, x, g, res, lb, ub, exact)
        if viol <= threshold:
            threshold *= 0.1
    return DCDResult(x, total, res <= tol, res)


def _sweep_budget_factor(H) -> int:
    """How many times the sweep budgets ``H``'s sweeps get (1 on a stored Hessian)."""
    if not isinstance(H, ScaledKron):
        return 1
    return max(1, min(UNBUILT_SWEEP_BUDGET_FACTOR, (H.K * H.M) // (H.K + H.M)))


def _polish_while_it_helps(H, f, x, g, res, lb, ub, target):
    """Polish while it helps and the residual is above ``target``; ``(x, g, residual)``.

    Up to 20 polishes (each can change the active set), each kept if it lowers the
    residual or the objective. The target lies far below the caller's tolerance: a
    point that meets the tolerance only by sweeps is not the optimum, and where the
    optimum is not unique, different points within the tolerance give different
    predictions in their last digits.
    """
    obj = 0.5 * x @ (g - f)  # ½xᵀHx − fᵀx with g = Hx − f
    for _ in range(20):
        if res <= target:
            break
        cand, cand_g = _polish(H, f, x, lb, ub)
        cand_res = _residual(cand, cand_g, lb, ub)
        cand_obj = 0.5 * cand @ (cand_g - f)
        if not (cand_res < res or cand_obj < obj - 1e-15 * max(1.0, abs(obj))):
            break
        x, g, res, obj = cand, cand_g, cand_res, cand_obj
    return x, g, res
