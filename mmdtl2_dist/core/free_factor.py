"""A regular free block's Cholesky factor, carried through the polish's fixed variables.

The polish of :mod:`mmdtl2_dist.core.dcd` is a primal active-set loop: a Newton step on
the free variables, and when the box blocks it, the blocking variables are fixed at
their bounds and the step is taken again for the others. Refactorising the free block
each time costs ``n³/3`` operations; without the L2 pull (``c_d = 0``) the W-step's free
blocks hold thousands of variables and the loop fixes them one by one (a 20-class fit
with 20 labels a class factorised blocks of 2,830-2,920 variables 35 times, 0.45 s
each). Fixing variable ``q`` removes row and column ``q`` of the block; with
``Pᵀ H_FF P = Rᵀ R``, deleting column ``q`` of ``R`` leaves a matrix ``R̃`` with
``R̃ᵀ R̃`` the reduced block, upper triangular but for one subdiagonal from column ``q``
on. Givens rotations, which change no ``R̃ᵀ R̃``, restore the triangle
(:func:`drop_columns`): ``O((n − q)²)`` operations, and backward stable (Golub & Van Loan,
*Matrix Computations*, 4th ed., §6.5, updating matrix factorisations).
"""

from __future__ import annotations

import numpy as np
from numba import njit
from scipy.linalg import blas, lapack

#: Free blocks of at least this many variables keep their factor through fixed variables
#: (a factorisation costs ``n³/3``, dropping a column at most ``3 n²``: break-even near
#: ``n / 9`` fixed at once); smaller ones are refactorised, as before.
KEEP_FACTOR_AT = 512
#: A blocked step that fixes more than this fraction of the free variables refactorises.
MOST_DROPPED = 1 / 16


def drop_columns(R: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The upper triangular ``R'`` with ``R'ᵀR'`` = ``RᵀR`` without the rows and columns ``q``.

    ``R`` is upper triangular, C- or Fortran-ordered (its strictly lower triangle is never
    read), ``q`` the sorted positions to drop. The columns ``q`` are deleted; column ``j``
    of what is left, column ``c_j`` of ``R``, then has ``c_j − j`` entries below its
    diagonal, which Givens rotations of neighbouring rows zero from the bottom up
    (diagonal kept non-negative). Returns a C-ordered upper triangular array; it and ``R``
    are the only arrays of their size.
    """
    if q.size == 0:
        return np.array(R, order="C")
    if R.flags.f_contiguous:  # read R by columns: Rᵀ is C-ordered
        return _drop_columns(R.T, q, True)
    return _drop_columns(np.ascontiguousarray(R), q, False)


@njit(cache=True, nogil=True)
def _drop_columns(T, q, transposed):  # pragma: no cover - compiled
    """:func:`drop_columns` on ``T = R`` or, ``transposed``, on ``T = Rᵀ`` (C-ordered)."""
    n, k = T.shape[0], q.shape[0]
    cols = np.empty(n - k, np.int64)  # the columns kept
    t = p = 0
    for c in range(n):
        if p < k and q[p] == c:
            p += 1
        else:
            cols[t] = c
            t += 1
    S = np.zeros((n, n - k))
    if transposed:
        for j in range(n - k):
            Tc = T[cols[j]]  # column cols[j] of R
            for i in range(cols[j] + 1):
                S[i, j] = Tc[i]
    else:
        for i in range(n):
            for j in range(n - k):
                if cols[j] >= i:
                    S[i, j] = T[i, cols[j]]
    for j in range(q[0], n - k):
        for r in range(cols[j], j, -1):  # zero S[r, j] against row r − 1
            a, b = S[r - 1, j], S[r, j]
            if b == 0.0:
                continue
            h = np.hypot(a, b)
            c, s = a / h, b / h
            for col in range(j, n - k):
                x, y = S[r - 1, col], S[r, col]
                S[r - 1, col] = c * x + s * y
                S[r, col] = c * y - s * x
            S[r, j] = 0.0
    return S[: n - k]  # C-contiguous: the first rows of a C-ordered array


class RegularFactor:
    """``Pᵀ H_FF P = Rᵀ R`` of a regular free block, standing in for the block.

    ``R`` upper triangular, Fortran-ordered (as LAPACK factorises) or C-ordered (as
    :func:`drop_columns` updates), its strictly lower triangle not referenced; ``perm[p]``
    the free variable (its position in the block) at pivot ``p``. Its product with a
    vector is the block's, ``Pᵀ Rᵀ R P v``, in ``O(n²)``.
    """

    def __init__(self, R: np.ndarray, perm: np.ndarray):
        self.R, self.perm = R, perm

    def _lapack_factor(self) -> tuple[np.ndarray, int]:
        """A Fortran-ordered triangular factor and LAPACK's ``lower``: ``R``, or ``Rᵀ``."""
        return (self.R, 0) if self.R.flags.f_contiguous else (self.R.T, 1)

    def __matmul__(self, v: np.ndarray) -> np.ndarray:
        """``H_FF v``."""
        T, lower = self._lapack_factor()
        Rv = blas.dtrmv(T, v[self.perm], trans=lower, lower=lower)
        out = np.empty_like(v)
        out[self.perm] = blas.dtrmv(T, Rv, trans=1 - lower, lower=lower)
        return out

    def step(self, gF: np.ndarray) -> np.ndarray:
        """The Newton step ``d`` with ``H_FF d = −gF``."""
        T, lower = self._lapack_factor()
        d = np.empty_like(gF)
        d[self.perm] = lapack.dpotrs(T, -gF[self.perm], lower=lower)[0]
        return d

    def without(self, fixed: np.ndarray) -> RegularFactor | None:
        """The factor of the block without the variables ``fixed`` (a mask), or None.

        None when too many are fixed at once (:data:`MOST_DROPPED`) or all are: a new
        factorisation is then the cheaper way. Itself when none is.
        """
        n_fixed = int(fixed.sum())
        if n_fixed == 0:
            return self
        if n_fixed > MOST_DROPPED * fixed.size or n_fixed == fixed.size:
            return None
        at = np.flatnonzero(fixed[self.perm])  # their pivot positions, sorted
        keep = ~fixed
        perm = (np.cumsum(keep) - 1)[np.delete(self.perm, at)]
        return RegularFactor(drop_columns(self.R, at), perm)
