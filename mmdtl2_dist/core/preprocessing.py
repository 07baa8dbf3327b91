"""Feature preprocessing the paper leaves open.

Methods (``method`` argument):

- ``"none"``: features as they are.
- ``"l2"``: each sample divided by its Euclidean norm (zero rows stay zero).
- ``"zscore"``: each feature centred and divided by its population standard deviation.
- ``"l2_zscore"``: ``"l2"`` then ``"zscore"`` (the preprocessing of Hoffman et al.'s MMDT
  code and of Gong et al.'s Office-Caltech10 release).

Which statistics, and why one Gram per device stays valid
----------------------------------------------------------
The z-score statistics (mean and standard deviation of every feature) are computed **per
device, over all samples of that device** — labelled and unlabelled, train and test — and
never from labels. This is the transductive convention of the benchmark (Gong et al. and
Hoffman et al. z-score each domain over all its images). It matters for scale: a z-score
is a per-feature affine map, which cannot be applied to a Gram matrix after the fact, so
statistics that changed with every random split would force a new Gram (an O(n² L) pass
over the features) for every trial. With per-device statistics the preprocessed features
of a device are fixed, so a study computes each device's Gram **once** and every split,
sample count and method slices it. Because no label is used, nothing about the test labels
leaks. Per-row L2 normalisation needs no statistics at all.

At prediction time a fitted estimator or deployed adapter applies the *stored* statistics
of the target device to new samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PREPROCESSING = ("none", "l2", "zscore", "l2_zscore")
#: A study's preprocessing when its spec names none, and ``mmdtl2 gram``'s (so that a
#: study finds the Gram that command computed).
DEFAULT_PREPROCESSING = "l2_zscore"


def _check_method(method: str) -> None:
    if method not in PREPROCESSING:
        raise ValueError(
            f"preprocessing must be one of {PREPROCESSING}, got {method!r}; "
            "pass e.g. preprocessing='l2_zscore'."
        )


#: Squared norms of feature vectors that float64 represents beside the problem's unit, the
#: constant 1 of the SVMs' bias feature and of the linear kernel ``x·x' + 1``: below the
#: lower end ``x·x' + 1 == 1`` (the features vanish), above the upper end ``x·x' + 1 ==
#: x·x'`` (the bias vanishes). Both ends make every prediction one class (measured on
#: Office-Caltech10 at norms 1e-10 and 1e10); the fit is not scale-invariant, so the
#: features are not silently rescaled.
SQ_NORM_RANGE = (float(np.finfo(np.float64).eps), 1.0 / float(np.finfo(np.float64).eps))
#: What to do about features outside :data:`SQ_NORM_RANGE` (every such message says it).
SCALE_FIX = (
    "Use preprocessing='l2' or 'l2_zscore' (both scale-free) or rescale the features to "
    "norms near 1."
)


def check_scale(sq_norms: np.ndarray, name: str) -> None:
    """Refuse features whose squared norms lie outside :data:`SQ_NORM_RANGE`.

    Parameters
    ----------
    sq_norms : ndarray (n,)
        Squared norms of the samples of one device (the diagonal of its linear Gram).
    name : str
        What the samples are, for the message (e.g. ``"Xs (source features)"``).

    NaN entries are left to the callers' finiteness checks (they are not a matter of scale).
    """
    sq_norms = np.asarray(sq_norms, dtype=np.float64)
    sq_norms = sq_norms[~np.isnan(sq_norms)]
    if sq_norms.size == 0:
        return
    if np.any(np.isinf(sq_norms)):
        raise ValueError(
            f"{name}: squared norms overflow float64 (features of magnitude around 1e154 "
            f"or more), so no Gram can be formed. {SCALE_FIX}"
        )
    lo, hi = SQ_NORM_RANGE
    top = float(np.max(sq_norms))
    if top > hi:
        raise ValueError(
            f"{name}: features have squared norms up to {top:.1e}; beside them the constant "
            f"1 of the SVMs' bias and of the linear kernel (x·x' + 1) is lost to float64 "
            f"rounding (squared norms must stay below {hi:.1e}) and every prediction would "
            f"be one class. {SCALE_FIX}"
        )
    if top < lo:
        raise ValueError(
            f"{name}: features have squared norms of at most {top:.1e}; they vanish beside "
            f"the constant 1 of the SVMs' bias and of the linear kernel (x·x' + 1 == 1 in "
            f"float64; squared norms must reach {lo:.1e}) and every prediction would be one "
            f"class. {SCALE_FIX}"
        )


def l2_normalize(X: np.ndarray) -> np.ndarray:
    """Divide each row by its Euclidean norm; zero rows are left at zero.

    Rows whose squared norm overflows or underflows float64 (magnitudes beyond about
    1e±150) are first scaled by a power of two, so every finite row gets a unit norm;
    other rows are divided exactly as ``X / ‖x‖``.
    """
    X = np.asarray(X, dtype=np.float64)
    with np.errstate(over="ignore", under="ignore"):
        norms = np.linalg.norm(X, axis=1, keepdims=True)
    out = X / np.where(norms > 0, norms, 1.0)
    extreme = np.isinf(norms[:, 0]) | (norms[:, 0] < 1e-140)
    extreme[extreme] = np.any(X[extreme] != 0, axis=1)  # zero rows stay zero
    if np.any(extreme):
        big = np.max(np.abs(X[extreme]), axis=1, keepdims=True)
        scaled = np.ldexp(X[extreme], -np.frexp(big)[1])  # largest entry in [0.5, 1)
        out[extreme] = scaled / np.linalg.norm(scaled, axis=1, keepdims=True)
    return out


@dataclass(frozen=True)
class PreprocessStats:
    """Per-device preprocessing with its frozen statistics.

    Attributes
    ----------
    method : str
        One of :data:`PREPROCESSING`.
    mean, scale : ndarray of shape (L,) or None
        Z-score statistics (after L2 normalisation for ``"l2_zscore"``); ``None`` for
        methods without a z-score. Features with zero variance get ``scale = 1``.
    """

    method: str
    mean: np.ndarray | None = None
    scale: np.ndarray | None = None

    @property
    def n_features(self) -> int | None:
        return None if self.mean is None else int(self.mean.shape[0])

    @classmethod
    def from_moments(cls, method: str, n: int, s1: np.ndarray, s2: np.ndarray) -> PreprocessStats:
        """Statistics from streamed moments (for out-of-core stores).

        Parameters
        ----------
        method : str
            Preprocessing method.
        n : int
            Number of samples accumulated.
        s1, s2 : ndarray of shape (L,)
            Sums of the (L2-normalised, for ``"l2_zscore"``) features and of their squares,
            accumulated in float64.
        """
        _check_method(method)
        if method in ("none", "l2"):
            return cls(method)
        if n < 1:
            raise ValueError("cannot compute z-score statistics from zero samples.")
        mean = np.asarray(s1, dtype=np.float64) / n
        var = np.maximum(np.asarray(s2, dtype=np.float64) / n - mean**2, 0.0)
        std = np.sqrt(var)
        # Features that never vary carry no information; leave them centred, unscaled.
        scale = np.where(std > 1e-12 * max(1.0, float(np.max(np.abs(mean)))), std, 1.0)
        return cls(method, mean, scale)

    def to_dict(self) -> dict:
        """Plain form: the method and the statistics as lists (or None)."""
        return {
            "method": self.method,
            "mean": None if self.mean is None else self.mean.tolist(),
            "scale": None if self.scale is None else self.scale.tolist(),
        }

    def transform(self, X: np.ndarray) -> np.ndarray:
        """Apply the preprocessing to samples (rows) of this device."""
        X = np.asarray(X, dtype=np.float64)
        if self.method in ("l2", "l2_zscore"):
            X = l2_normalize(X)
        if self.mean is not None:
            if X.shape[1] != self.mean.shape[0]:
                raise ValueError(
                    f"samples have {X.shape[1]} features but the preprocessing statistics "
                    f"were computed on {self.mean.shape[0]}; use features of the same device "
                    "and feature space as at fit time."
                )
            X = (X - self.mean) / self.scale
        return X


def fit_preprocessing(X: np.ndarray, method: str = "none") -> PreprocessStats:
    """Compute per-device statistics over all samples ``X`` of one device.

    Parameters
    ----------
    X : ndarray of shape (n_samples, L)
        All samples of the device (labels are never used).
    method : str
        One of :data:`PREPROCESSING`.
    """
    _check_method(method)
    X = np.asarray(X, dtype=np.float64)
    if method in ("none", "l2"):
        return PreprocessStats(method)
    if method == "l2_zscore":
        X = l2_normalize(X)
    return PreprocessStats.from_moments(method, X.shape[0], X.sum(axis=0), (X * X).sum(axis=0))
