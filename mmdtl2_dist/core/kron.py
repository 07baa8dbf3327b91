"""The W-step's Hessian ``diag(s) (Ā ⊗ B̄) diag(s)``, built, or applied without being built.

The W-step dual (:mod:`mmdtl2_dist.core.wstep`) has one variable per class and labelled
target sample, ``K M`` in all, and its Hessian ``Y ((ΘᵀΘ) ⊗ G) Y`` has ``(K M)²`` entries:
11.6 GB with 65 classes and 585 targets (self-trained). Every entry is a product of a
``K × K`` entry, an ``M × M`` entry and two scale factors, so coordinate descent never
needs the array:

- a coordinate step on variable ``i = k M + m`` changes the gradient by ``δ`` times row
  ``i``, whose entry ``j = l M + n`` is ``s_i Ā_kl B̄_mn s_j``. The sweeps
  (:func:`~mmdtl2_dist.core.sweeps.kron_sweeps`) take the ``K`` steps of one target
  ``m`` and then add their rows together, ``s_ln (Ā w)_l B̄_mn``: ``O(K² + K M)`` a target,
  ``O(K M (K + M))`` a sweep, against ``(K M)²`` for a sweep over the stored rows;
- a product with a vector is ``s ⊙ vec(Ā (s ⊙ x)_{K×M} B̄)``, ``O(K² M + K M²)``;
- the polish's free block is ``(Ā_{k_F k_F} ∘ B̄_{m_F m_F}) ∘ s_F s_Fᵀ`` (:meth:`block`),
  entry for entry the stored Hessian's. It is the one array of the unbuilt path that is
  quadratic in a count of variables: the free ones, ``|F|²``.

:class:`ScaledKron` holds the three factors (linear memory) and is what
:func:`~mmdtl2_dist.core.dcd.dcd_box_qp` takes in place of the array. ``Ā``, ``B̄`` are
the symmetric parts (the assembled ``ΘᵀΘ`` and ``G`` are symmetric up to rounding).
"""

from __future__ import annotations

import numpy as np
from numba import njit


def symmetric_part(A: np.ndarray) -> np.ndarray:
    """``(A + Aᵀ) / 2`` in float64, exactly symmetric."""
    A = np.asarray(A, dtype=np.float64)
    return np.ascontiguousarray(0.5 * (A + A.T))


@njit(cache=True, nogil=True)
def kron_hessian(A, B, s):  # pragma: no cover - compiled
    """``Hs = diag(s) (Ā ⊗ B̄) diag(s)`` in one pass, ``Ā``, ``B̄`` the symmetric parts.

    The Jacobi-scaled Hessian of the W-step dual (``A = ΘᵀΘ``, ``B = G``, ``s = y ⊙ d``,
    class-major: row ``k M + m``). One ``(KM)²`` array and nothing else of that size:
    ``np.kron``, the sign and scale products and the symmetrisation would each make
    another. Exactly symmetric, as ``Ā_kl B̄_mn`` and ``s_i s_j`` are computed once per
    pair.
    """
    K, M = A.shape[0], B.shape[0]
    H = np.empty((K * M, K * M))
    for k in range(K):
        for l in range(k, K):
            a = 0.5 * (A[k, l] + A[l, k])
            for m in range(M):
                i = k * M + m
                n0 = m if l == k else 0
                for n in range(n0, M):
                    j = l * M + n
                    v = a * (0.5 * (B[m, n] + B[n, m])) * (s[i] * s[j])
                    H[i, j] = v
                    H[j, i] = v
    return H


@njit(cache=True, nogil=True)
def kron_block(A, B, s, k, m):  # pragma: no cover - compiled
    """``(Ā_{k_i k_j} B̄_{m_i m_j}) (s_i s_j)`` for the variables ``i = k_i M + m_i``.

    The free block of a polish, entry for entry :func:`kron_hessian`'s (the same products
    in the same order), row by row. Exactly symmetric: ``Ā`` and ``B̄`` are, and each
    factor of an entry is a product of two numbers, which IEEE rounding makes commutative.
    """
    n = s.shape[0]
    out = np.empty((n, n))
    for i in range(n):
        Ai, Bi, si = A[k[i]], B[m[i]], s[i]
        row = out[i]
        for j in range(n):
            row[j] = (Ai[k[j]] * Bi[m[j]]) * (si * s[j])
    return out


class ScaledKron:
    """``H = diag(s) (Ā ⊗ B̄) diag(s)``, never formed (``A``: ``K × K``, ``B``: ``M × M``)."""

    def __init__(self, A: np.ndarray, B: np.ndarray, s: np.ndarray):
        self.A, self.B = symmetric_part(A), symmetric_part(B)
        self.s = np.ascontiguousarray(s, dtype=np.float64)
        self.K, self.M = self.A.shape[0], self.B.shape[0]
        if self.s.shape != (self.K * self.M,):
            raise ValueError(f"s must have {self.K * self.M} entries, got {self.s.shape}.")
        self.shape = (self.K * self.M, self.K * self.M)

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        """``H x`` for a vector ``x``."""
        X = (self.s * x).reshape(self.K, self.M)
        return self.s * (self.A @ X @ self.B).ravel()

    def diagonal(self) -> np.ndarray:
        return np.kron(np.diag(self.A), np.diag(self.B)) * (self.s * self.s)

    def block(self, idx: np.ndarray) -> np.ndarray:
        """``H[np.ix_(idx, idx)]``: the stored Hessian's entries, to the bit."""
        k, m = np.divmod(np.asarray(idx, dtype=np.int64), self.M)
        return kron_block(self.A, self.B, np.ascontiguousarray(self.s[idx]), k, m)

    def dense(self) -> np.ndarray:
        """The Hessian as an array (``(K M)²`` float64: small problems and tests)."""
        return kron_hessian(self.A, self.B, self.s)
