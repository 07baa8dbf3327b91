"""Kernels computed from a linear Gram matrix.

Everything MMDTL2 needs from the target features is inner products
(:mod:`mmdtl2_dist.core.mmdtl2`, "Everything on Gram matrices"), so
every kernel here is evaluated from a block of the *linear* Gram ``X_a @ X_b.T`` and the
squared norms of the rows involved; the features are never touched again.

Kernels on target samples ``x, x'`` (``g = x·x'``, ``n_x = ‖x‖²``):

- ``linear``: ``k = g + 1``. The 1 is the paper's augmented coordinate
  (x̂ = (x, 1)), so the linear kernel is exactly ``x̂ · x̂'``.
- ``rbf``: ``k = exp(-gamma (n_x + n_x' - 2 g))``. The augmented 1 cancels in the distance.
- ``poly``: ``k = (gamma g + coef0) ** degree``; with ``coef0 > 0`` it contains the
  constant that the augmented coordinate provides in the linear case.

Default parameters (resolved once, on the training target samples, and then frozen so
that training and prediction use the same kernel):

- ``gamma`` for ``rbf``: ``1 / mean squared pairwise distance`` of the training target
  samples (the "median heuristic" with the mean; invariant to feature scaling).
- ``gamma`` for ``poly``: ``1 / mean squared norm`` of the training target samples, so
  that ``gamma g`` is of order one whatever the feature scale.
- ``degree = 2``, ``coef0 = 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from mmdtl2_dist.core.params import KERNELS, check_values

__all__ = ["KERNELS", "KernelSpec"]


@dataclass(frozen=True)
class KernelSpec:
    """A target-side kernel with concrete parameters.

    Parameters
    ----------
    kernel : {"linear", "rbf", "poly"}
        Kernel family.
    gamma : float or None
        Scale; ``None`` means "resolve from the training Gram" (see :meth:`resolve`).
    degree : int
        Degree of the polynomial kernel.
    coef0 : float
        Constant of the polynomial kernel.
    """

    kernel: str = "linear"
    gamma: float | None = None
    degree: int = 2
    coef0: float = 1.0

    def __post_init__(self) -> None:
        check_values(
            {"kernel": self.kernel, "gamma": self.gamma, "degree": self.degree, "coef0": self.coef0}
        )

    def resolve(self, gram: np.ndarray) -> KernelSpec:
        """Return a copy whose ``gamma`` is concrete, computed from a training Gram.

        Parameters
        ----------
        gram : ndarray of shape (M, M)
            Linear Gram of the training target samples.
        """
        if self.kernel == "linear" or self.gamma is not None:
            return self
        sq = np.diag(gram)
        if self.kernel == "rbf":
            m = gram.shape[0]
            if m < 2:
                scale = float(np.mean(sq))
            else:
                d2 = sq[:, None] + sq[None, :] - 2.0 * gram
                scale = float(np.sum(np.maximum(d2, 0.0)) / (m * (m - 1)))
        else:
            scale = float(np.mean(sq))
        if not np.isfinite(scale) or scale <= 0:
            scale = 1.0  # all samples identical (or all zero): any positive scale is equivalent
        return replace(self, gamma=1.0 / scale)

    def to_dict(self) -> dict:
        """Plain-JSON form (for MLflow parameters and deployed adapters)."""
        return {
            "kernel": self.kernel,
            "gamma": self.gamma,
            "degree": int(self.degree),
            "coef0": float(self.coef0),
        }

    def __call__(
        self, gram: np.ndarray, sq_rows: np.ndarray | None = None, sq_cols: np.ndarray | None = None
    ) -> np.ndarray:
        """Kernel block from a linear Gram block; see :func:`kernel_from_gram`."""
        return kernel_from_gram(gram, self, sq_rows, sq_cols)


def kernel_from_gram(
    gram: np.ndarray,
    spec: KernelSpec,
    sq_rows: np.ndarray | None = None,
    sq_cols: np.ndarray | None = None,
) -> np.ndarray:
    """Evaluate a kernel block from the linear Gram block between two sample sets.

    Parameters
    ----------
    gram : ndarray of shape (n_a, n_b)
        Linear inner products ``X_a @ X_b.T``.
    spec : KernelSpec
        The kernel; ``gamma`` must already be resolved for ``rbf`` and ``poly``.
    sq_rows, sq_cols : ndarray of shape (n_a,) and (n_b,), optional
        Squared norms of the row and column samples. Needed for ``rbf`` only; when the
        block is square and symmetric they default to its diagonal.

    Returns
    -------
    ndarray of shape (n_a, n_b)
        The kernel block, float64.
    """
    gram = np.asarray(gram, dtype=np.float64)
    if gram.ndim != 2:
        raise ValueError(f"gram must be 2-D, got shape {gram.shape}.")
    if spec.kernel == "linear":
        return gram + 1.0
    if spec.gamma is None:
        raise ValueError("kernel gamma is unresolved; call KernelSpec.resolve(train_gram) first.")
    if spec.kernel == "poly":
        return (spec.gamma * gram + spec.coef0) ** int(spec.degree)
    if sq_rows is None or sq_cols is None:
        if gram.shape[0] != gram.shape[1]:
            raise ValueError(
                "rbf on a rectangular Gram block needs sq_rows and sq_cols (squared norms)."
            )
        d = np.diag(gram)
        sq_rows = d if sq_rows is None else sq_rows
        sq_cols = d if sq_cols is None else sq_cols
    sq_rows = np.asarray(sq_rows, dtype=np.float64).reshape(-1)
    sq_cols = np.asarray(sq_cols, dtype=np.float64).reshape(-1)
    if sq_rows.shape[0] != gram.shape[0] or sq_cols.shape[0] != gram.shape[1]:
        raise ValueError(
            f"squared norms of length {sq_rows.shape[0]} and {sq_cols.shape[0]} do not match "
            f"the Gram block of shape {gram.shape}."
        )
    d2 = sq_rows[:, None] + sq_cols[None, :] - 2.0 * gram
    # Rounding can make a distance slightly negative; it is zero.
    return np.exp(-spec.gamma * np.maximum(d2, 0.0))
