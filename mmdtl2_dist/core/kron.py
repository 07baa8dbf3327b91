"""The W-step's Hessian ``diag(s) (Ā ⊗ B̄) diag(s)``, built, or applied without being built.

The W-step dual (:mod:`mmdtl2_dist.core.wstep`) has one variable per class and labelled
target sample, ``K M`` in all, and its Hessian ``Y ((ΘᵀΘ) ⊗ G) Y`` has ``(K M)²`` entries:
11.6 GB with 65 classes and 585 targets (self-trained). Every entry is a product of a
``K × K`` entry, an ``M × M`` entry and two scale factors, so coordinate descent never
needs the array:

- a coordinate step on variable ``i = k M + m`` changes the gradient by ``δ`` times row
  ``i``, whose entry ``j = l M + n`` is ``s_i Ā_kl B̄_mn s_j``: ``K M`` products from
  row ``k`` of ``Ā`` and row ``m`` of ``B̄`` (:func:`kron_sweeps`), as many operations
  as reading a stored row, from memory that stays in cache;
- a product with a vector is ``s ⊙ vec(Ā (s ⊙ x)_{K×M} B̄)``, ``O(K² M + K M²)``;
- the polish's free block is ``(Ā_{k_F k_F} ∘ B̄_{m_F m_F}) ∘ s_F s_Fᵀ`` (:meth:`block`),
  entry for entry the stored Hessian's.

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
        k, m = np.divmod(idx, self.M)
        s = self.s[idx]
        return self.A[np.ix_(k, k)] * self.B[np.ix_(m, m)] * np.multiply.outer(s, s)

    def dense(self) -> np.ndarray:
        """The Hessian as an array (``(K M)²`` float64: small problems and tests)."""
        return kron_hessian(self.A, self.B, self.s)


@njit(cache=True, nogil=True)
def kron_sweeps(A, B, s, g, x, lb, ub, tol, max_epochs, seed):  # pragma: no cover - compiled
    """The coordinate sweeps of :mod:`~mmdtl2_dist.core.dcd` on ``diag(s) (A ⊗ B) diag(s)``.

    ``A``, ``B`` symmetric. The same randomised steps in the same order for the same seed
    as on the stored Hessian (the gradient's updates round differently); each row is
    made from row ``k`` of ``A`` and row ``m`` of ``B`` as it is used. Returns
    ``(sweeps, largest |pg|)``.
    """
    K, M = A.shape[0], B.shape[0]
    n = x.shape[0]
    np.random.seed(seed)  # noqa: NPY002 - numba's own generator
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
            gi, xi, si = g[i], x[i], s[i]
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
            hii = A[k, k] * B[m, m] * (si * si)
            if hii > 0.0:
                nx = xi - gi / hii
            elif gi > 0.0:  # linear in x_i: go to the bound the gradient points to
                nx = lb[i]
            else:
                nx = ub[i]
            nx = min(max(nx, lb[i]), ub[i])
            d = nx - xi
            if d != 0.0 and np.isfinite(nx):
                x[i] = nx
                ds = d * si
                Bm = B[m]
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
