"""mmdtl2-dist: MMDTL2 domain adaptation between imaging devices, on Gram matrices.

The pure mathematics lives in :mod:`mmdtl2_dist.core` (numpy, scipy and osqp only).
The sklearn-style estimators are in :mod:`mmdtl2_dist.estimators`.
"""

__version__ = "0.1.0"

from mmdtl2_dist.core.errors import QPSolveError  # noqa: E402

__all__ = ["QPSolveError", "__version__"]
