"""The coordinate sweeps of :mod:`mmdtl2_dist.core.dcd`, on a stored or an unbuilt Hessian.

One randomised cyclic sweep visits every variable in a shuffled order and minimises the
objective exactly in it (:func:`coordinate_step`), keeping the gradient ``g = Hx − f``
up to date with the variable's row of ``H``: read from the array (:func:`dense_sweeps`)
or made from the factors of ``diag(s)(A ⊗ B)diag(s)`` (:func:`kron_sweeps`,
:class:`~mmdtl2_dist.core.kron.ScaledKron`). Compiled with numba (``cache=True``).
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
def _sweeps(H, A, B, s, g, x, lb, ub, tol, max_epochs, seed):  # pragma: no cover - compiled
    """Randomised cyclic coordinate descent on ``½xᵀHx − fᵀx`` in place.

    ``H`` is the stored Hessian or, when it has no rows, ``diag(s) (A ⊗ B) diag(s)``
    (``A``, ``B`` symmetric), whose row ``i = k M + m`` is made from row ``k`` of ``A``
    and row ``m`` of ``B`` as it is used. ``g`` must hold ``Hx − f`` on entry and is kept
    exact. Stops after the first sweep whose largest projected gradient is ``<= tol``.
    Returns ``(sweeps, largest |pg|)``.
    """
    n = x.shape[0]
    built = H.shape[0] > 0
    K, M = A.shape[0], max(B.shape[0], 1)
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
            k, m = i // M, i % M
            xi = x[i]
            hii = H[i, i] if built else A[k, k] * B[m, m] * (s[i] * s[i])
            a, nx = coordinate_step(g[i], xi, lb[i], ub[i], hii)
            if a == 0.0:
                continue
            if a > viol:
                viol = a
            d = nx - xi
            if d == 0.0 or not np.isfinite(nx):
                continue
            x[i] = nx
            if built:
                row = H[i]
                for j in range(n):
                    g[j] += d * row[j]
                continue
            ds, Bm = d * s[i], B[m]
            for l in range(K):
                c = ds * A[k, l]
                if c == 0.0:
                    continue
                j0 = l * M
                for q in range(M):
                    g[j0 + q] += c * (Bm[q] * s[j0 + q])
        if viol <= tol:
            break
    return ep, viol


_NONE = np.zeros((0, 0))


def dense_sweeps(H, g, x, lb, ub, tol, max_epochs, seed):
    """The sweeps on a stored Hessian ``H`` (C-contiguous float64)."""
    return _sweeps(H, _NONE, _NONE, np.zeros(0), g, x, lb, ub, tol, max_epochs, seed)


def kron_sweeps(A, B, s, g, x, lb, ub, tol, max_epochs, seed):
    """The sweeps on ``diag(s) (A ⊗ B) diag(s)``, never built (``A``, ``B`` symmetric).

    The same randomised steps in the same order for the same seed as on the stored
    Hessian (the gradient's updates round differently).
    """
    return _sweeps(_NONE, A, B, s, g, x, lb, ub, tol, max_epochs, seed)
