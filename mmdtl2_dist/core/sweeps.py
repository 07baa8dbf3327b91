"""The coordinate sweeps of :mod:`mmdtl2_dist.core.dcd`, on a stored or an unbuilt Hessian.

One randomised cyclic sweep visits every variable and minimises the objective exactly in
it (:func:`coordinate_step`), keeping the gradient ``g = Hx − f`` up to date: with the
variable's row of a stored ``H`` (:func:`dense_sweeps`, a shuffled order), or, on the
W-step's unbuilt ``diag(s)(A ⊗ B)diag(s)`` (:func:`kron_sweeps`,
:class:`~mmdtl2_dist.core.kron.ScaledKron`), one target's ``K`` variables after another,
whose steps reach the other targets' gradients together, as one rank-one update of the
gradient over ``s``. Compiled with numba
(``cache=True``).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, inline="always")
def coordinate_step(gi, xi, lo, hi, hii):  # pragma: no cover - compiled
    """One variable's exact minimisation in its box: ``(|projected gradient|, new value)``.

    ``|pg| = 0`` means the variable is optimal (its value is then returned unchanged).
    """
    if xi <= lo:
        pg = gi if gi < 0.0 else 0.0
    elif xi >= hi:
        pg = gi if gi > 0.0 else 0.0
    else:
        pg = gi
    if pg == 0.0:
        return 0.0, xi
    if hii > 0.0:
        nx = xi - gi / hii
    elif gi > 0.0:  # linear in x_i: go to the bound the gradient points to
        nx = lo
    else:
        nx = hi
    if nx < lo:
        nx = lo
    elif nx > hi:
        nx = hi
    return abs(pg), nx


@njit(cache=True, nogil=True)
def _dense_sweeps(H, g, x, lb, ub, tol, max_epochs, seed):  # pragma: no cover - compiled
    """Randomised cyclic coordinate descent on ``½xᵀHx − fᵀx`` in place (``H`` stored).

    ``g`` must hold ``Hx − f`` on entry and is kept exact, one row of ``H`` a step.
    Stops after the first sweep whose largest projected gradient is ``<= tol``.
    Returns ``(sweeps, largest |pg|)``.
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
            xi = x[i]
            a, nx = coordinate_step(g[i], xi, lb[i], ub[i], H[i, i])
            if a == 0.0:
                continue
            if a > viol:
                viol = a
            d = nx - xi
            if d == 0.0 or not np.isfinite(nx):
                continue
            x[i] = nx
            row = H[i]
            for j in range(n):
                g[j] += d * row[j]
        if viol <= tol:
            break
    return ep, viol


@njit(cache=True, nogil=True)
def _target_block(A, B, s, h, x, lb, ub, m, w):  # pragma: no cover - compiled
    """One step on each of target ``m``'s ``K`` variables, ``i = k M + m`` in class order.

    ``h`` (``K × M``) is the gradient over ``s``: ``g_i = s_i h_i``. Keeps ``h`` of the
    block's own variables exact (their Hessian entries are ``s_i Ā_kl B̄_mm s_j``) and adds
    each step, times ``s_i``, to ``w[k]``; the caller carries the block's steps to the
    other targets. Returns the largest ``|pg|`` seen.
    """
    K, M = A.shape[0], B.shape[0]
    bmm = B[m, m]
    viol = 0.0
    for k in range(K):
        i = k * M + m
        xi = x[i]
        a, nx = coordinate_step(s[i] * h[k, m], xi, lb[i], ub[i], A[k, k] * bmm * (s[i] * s[i]))
        if a > viol:
            viol = a
        d = nx - xi
        if a == 0.0 or d == 0.0 or not np.isfinite(nx):
            continue
        x[i] = nx
        c = d * s[i]
        w[k] += c
        c *= bmm
        for l in range(K):
            h[l, m] += c * A[k, l]
    return viol


@njit(cache=True, nogil=True)
def _block_sweeps(A, B, s, h, x, lb, ub, tol, max_epochs, seed):  # pragma: no cover - compiled
    """Coordinate descent on ``diag(s) (Ā ⊗ B̄) diag(s)``, one target's block at a time.

    ``h = g / s`` (``K × M``, ``s`` without zeros) is the gradient the sweeps carry. A
    sweep visits the ``M`` targets in a shuffled order; at target ``m`` each of its
    ``K`` variables takes its exact coordinate step (:func:`_target_block`), and then
    the block's steps ``w`` reach every other target's gradient at once:
    ``h_{l·} += (Ā w)_l B̄_m·``, a rank-one update of ``h`` but for its column ``m``,
    ``O(K² + K M)`` for the block instead of ``O(K · K M)`` one variable at a time. Same
    stopping rule and return as :func:`_dense_sweeps`.
    """
    K, M = A.shape[0], B.shape[0]
    np.random.seed(seed)  # noqa: NPY002
    order = np.arange(M)
    w = np.zeros(K)
    viol = np.inf
    ep = 0
    while ep < max_epochs:
        ep += 1
        np.random.shuffle(order)  # noqa: NPY002
        viol = 0.0
        for t in range(M):
            m = order[t]
            w[:] = 0.0
            viol = max(viol, _target_block(A, B, s, h, x, lb, ub, m, w))
            Bm = B[m]
            for l in range(K):
                c = 0.0
                for k in range(K):
                    c += A[l, k] * w[k]
                if c == 0.0:
                    continue
                own = h[l, m]  # kept exact by the block's own steps
                hl = h[l]
                for q in range(M):  # branch-free, so it vectorises
                    hl[q] += c * Bm[q]
                hl[m] = own
        if viol <= tol:
            break
    return ep, viol


def dense_sweeps(H, g, x, lb, ub, tol, max_epochs, seed):
    """The sweeps on a stored Hessian ``H`` (C-contiguous float64)."""
    return _dense_sweeps(H, g, x, lb, ub, tol, max_epochs, seed)


def kron_sweeps(A, B, s, g, x, lb, ub, tol, max_epochs, seed):
    """The sweeps on ``diag(s) (A ⊗ B) diag(s)``, never built (``A``, ``B`` symmetric).

    Block by block (:func:`_block_sweeps`): each step is the stored Hessian's coordinate
    step, taken in another order, and a sweep costs ``K M (K + M)`` operations, about
    ``K M / (K + M)`` times fewer than over stored rows. ``s`` has no zero (a W-step's
    is signs times Jacobi scales); the sweeps carry ``g / s`` and leave ``g`` updated.
    """
    if not np.all(s != 0.0):
        raise ValueError("kron_sweeps needs a scale s without zeros.")
    K, M = A.shape[0], B.shape[0]
    h = (g / s).reshape(K, M)
    out = _block_sweeps(A, B, s, h, x, lb, ub, tol, max_epochs, seed)
    np.multiply(s, h.ravel(), out=g)
    return out
