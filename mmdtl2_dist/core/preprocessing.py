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


def _check_method(method: str) -> None:
    if method not in PREPROCESSING:
        raise ValueError(
            f"preprocessing must be one of {PREPROCESSING}, got {method!r}; "
            "pass e.g. preprocessing='l2_zscore'."
        )


def l2_normalize(X: np.ndarray) -> np.ndarray:
    """Divide each row by its Euclidean norm; zero rows are left at zero."""
    X = np.asarray(X, dtype=np.float64)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.where(norms > 0, norms, 1.0)


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
