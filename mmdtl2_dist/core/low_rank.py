"""A linear map kept as two thin factors, for priors too large to form.

``select="auto"``'s shared-PCA prior ``W0 = P Pᵀ`` is ``L × L``: 34 GB at 64,896-d. The
fit, the adapter and :func:`~mmdtl2_dist.core.methods.fit_mmdtl2_blocks` use it only
through products, which the factors give at ``L·d`` cost.
"""

from __future__ import annotations

import numpy as np


class LowRankMap:
    """A linear map ``B Cᵀ`` kept as its factors ``B`` (Ls, r) and ``C`` (Lt, r).

    The shared-PCA prior ``W0 = P Pᵀ`` of a 64,896-d feature space would be a 34 GB
    matrix; as factors it costs ``L·d``. Supports what the estimator's prior needs:
    ``map @ M``, ``X @ map`` (numpy defers to :meth:`__rmatmul__`), ``.T``, scaling by a
    number and :meth:`dense` (only for small dimensions).
    """

    __array_ufunc__ = None  # make ``ndarray @ LowRankMap`` call __rmatmul__

    def __init__(self, B: np.ndarray, C: np.ndarray):
        self.B, self.C = B, C

    @property
    def shape(self) -> tuple[int, int]:
        return self.B.shape[0], self.C.shape[0]

    @property
    def T(self) -> LowRankMap:
        return LowRankMap(self.C, self.B)

    def __matmul__(self, M: np.ndarray) -> np.ndarray:
        return self.B @ (self.C.T @ M)

    def __rmatmul__(self, X: np.ndarray) -> np.ndarray:
        return (X @ self.B) @ self.C.T

    def __mul__(self, mu: float) -> LowRankMap:
        return LowRankMap(float(mu) * self.B, self.C)

    __rmul__ = __mul__

    def dense(self) -> np.ndarray:
        return self.B @ self.C.T
