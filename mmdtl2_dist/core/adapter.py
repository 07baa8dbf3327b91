"""The deployable part of a fitted MMDTL2 model: target features in, class scores out.

A target sample ``x`` (device B) is scored as

    scores(x) = P k(x̂) + x̂ᵀ V + b,

where:

- ``k(x̂)`` (M,) are the kernel values between ``x`` and the M labelled target training
  samples (after the target device's frozen preprocessing),
- ``P`` (K, M) are the prediction coefficients ``βᵀ Kz Γ C``
  (:mod:`mmdtl2_dist.core.mmdtl2`, "Everything on Gram matrices"),
- ``V`` (Lt + 1, K) is the prior term ``W0ᵀ Θ`` (zero for the paper's zero prior),
- ``b`` (K,) are the biases.

An adapter of ``select="auto"`` on a hard shift also keeps the target device's
unlabelled samples it was fitted with (preprocessed) and their scores, and smooths the
scores of every sample over its nearest ones among them
(:mod:`mmdtl2_dist.core.neighbours`), so that a sample scored alone gets what it gets
in a batch.

Everything is plain arrays and JSON-able parameters, so an adapter can be stored without
pickling arbitrary objects (see :meth:`AdapterState.to_arrays`). Scoring needs numpy
alone: this module travels with every deployed model, whose requirements are ``mlflow``,
``numpy`` and ``pandas``, so its input checks (:func:`check_scoring_input`) are numpy code
and only the estimators' :func:`check_features` uses scikit-learn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np

from mmdtl2_dist.core.kernels import KernelSpec
from mmdtl2_dist.core.neighbours import smoothed_in_blocks
from mmdtl2_dist.core.preprocessing import PreprocessStats
from mmdtl2_dist.core.threads import one_thread

#: The stored format, by whether the adapter smooths over neighbours: a reader of /1 would
#: skip the smoothing without a word, so such adapters are /2, which it refuses.
ADAPTER_FORMATS = {False: "mmdtl2-adapter/1", True: "mmdtl2-adapter/2"}
NEIGHBOUR_ARRAYS = ("X_neighbours", "scores_neighbours")
_FLOAT_MAX = float(np.finfo(np.float64).max)  # a Python float: compared exactly with ints
#: The fix named when an integer does not fit in float64.
TOO_LARGE = "send values whose magnitude is below 1.8e308."


def check_features(
    X, n_features: int | None, name: str = "X", owner: str = "the model"
) -> np.ndarray:
    """Validate a 2-D finite feature matrix; name the offending rows and the fix.

    Conversion, dtype, sparse and shape checks are scikit-learn's ``check_array`` (so the
    messages are the ones sklearn users know); the feature count and NaN/Inf rows are
    checked by :func:`check_width_and_values`. The estimators use it; a deployed adapter
    scores with :func:`check_scoring_input`, which needs numpy alone.
    """
    from sklearn.utils import check_array

    try:
        X = check_array(
            X, accept_sparse=False, dtype=np.float64, ensure_all_finite=False, input_name=name
        )
    except OverflowError:  # a Python int beyond float64's range
        raise ValueError(f"{name} holds an integer too large for float64; {TOO_LARGE}") from None
    return check_width_and_values(X, n_features, name, owner)


def check_width_and_values(X: np.ndarray, n_features: int | None, name: str, owner: str):
    """The feature count of a 2-D float array, and its NaN/Inf rows (listed)."""
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(
            f"{name} has {X.shape[1]} features, but {owner} is expecting {n_features} features "
            "as input; pass features of the same device and feature space as at fit time."
        )
    bad = ~np.all(np.isfinite(X), axis=1)
    if np.any(bad):
        rows = np.flatnonzero(bad)
        shown = ", ".join(map(str, rows[:10])) + (" ..." if rows.size > 10 else "")
        raise ValueError(
            f"{name} contains NaN or Inf in {rows.size} row(s): {shown}; "
            "remove or impute those samples first."
        )
    return X


def _is_number(v) -> bool:
    """A JSON-like number: int or float (numpy's too), or None (a missing value, read as NaN).

    ``bool`` is excluded on purpose although Python counts it as an int.
    """
    return v is None or type(v) in (int, float) or isinstance(v, np.integer | np.floating)


_IS_NUMBER = np.frompyfunc(_is_number, 1, 1)
#: The types of the values of a parsed JSON array of numbers: checked in one pass.
_PLAIN_NUMBER_TYPES = frozenset({int, float, type(None)})


def _where(index: tuple[int, ...]) -> str:
    if not index:
        return "its only value"
    return f"row {index[0]}" + (f", column {index[1]}" if len(index) > 1 else "")


def _refuse_non_numbers(X: np.ndarray, name: str) -> None:
    """Raise naming the first value of an object array that is not a number, if any."""
    ok = np.asarray(_IS_NUMBER(X), dtype=bool)
    if ok.all():
        return  # numpy's own int and float scalars
    first = tuple(int(i) for i in np.argwhere(~ok)[0])
    value = X[first]
    if isinstance(value, list | tuple):
        raise ValueError(
            f"{name} has rows of different lengths (at {_where(first)}); send one list of "
            "numbers per sample, all of the same length."
        )
    raise ValueError(
        f"{name} holds {type(value).__name__} {value!r} at {_where(first)} "
        f"({np.count_nonzero(~ok)} non-numeric value(s) in all); send numbers only "
        "(no strings or booleans)."
    )


def as_numeric_array(X, name: str = "X") -> np.ndarray:
    """``X`` as a float64 array, refusing whatever is not a number (numpy only).

    Nested lists are read element by element (``np.asarray`` would turn a ``True`` or a
    ``"1.5"`` among floats into a float without a word); numeric arrays pass as they are.
    Booleans, strings, complex numbers, nested rows of unequal length and sparse matrices
    are refused with the position of the first offending value. ``None`` is a missing
    value and becomes NaN, which :func:`check_width_and_values` then reports by row.
    """
    if hasattr(X, "tocsr"):  # a scipy.sparse matrix, recognised without importing scipy
        raise ValueError(f"{name} is a sparse matrix; pass a dense array (X.toarray()).")
    if not isinstance(X, np.ndarray):
        X = np.asarray(X) if hasattr(X, "__array__") else np.array(X, dtype=object)
    kind = X.dtype.kind
    if kind in "fiu":
        return X.astype(np.float64, copy=False)
    if kind == "O":
        if not set(map(type, X.flat)) <= _PLAIN_NUMBER_TYPES:
            _refuse_non_numbers(X, name)
        try:
            return X.astype(np.float64)
        except OverflowError:  # a Python int beyond float64's range
            big = [i for i, v in enumerate(X.flat) if type(v) is int and abs(v) > _FLOAT_MAX]
            where = f" at {_where(np.unravel_index(big[0], X.shape))}" if big else ""
            raise ValueError(
                f"{name} holds an integer too large for float64{where}; {TOO_LARGE}"
            ) from None
    what = {"b": "booleans", "U": "strings", "S": "bytes", "c": "complex numbers"}
    raise ValueError(
        f"{name} holds {what.get(kind, f'{X.dtype} values')}"
        + (
            f", e.g. {X.flat[0].item()!r} at {_where(np.unravel_index(0, X.shape))}"
            if X.size
            else ""
        )
        + "; send numbers only (no strings or booleans)."
    )


def check_scoring_input(
    X, n_features: int | None, name: str = "X", owner: str = "the adapter"
) -> np.ndarray:
    """A 2-D float64 matrix of finite numbers with ``n_features`` columns (numpy only).

    What a deployed adapter checks before it scores (:meth:`AdapterState.decision_function`):
    the model ships numpy-only code, so no scikit-learn here.
    """
    X = as_numeric_array(X, name)
    if X.ndim != 2:
        raise ValueError(
            f"{name} must be 2-D (n_samples, n_features), got shape {X.shape}; "
            "a single sample is one row: X.reshape(1, -1)."
        )
    if X.shape[0] == 0:
        raise ValueError(f"{name} has no samples (shape {X.shape}); pass at least one row.")
    return check_width_and_values(X, n_features, name, owner)


@dataclass
class AdapterState:
    """Self-contained scoring state of a fitted adapter.

    Attributes
    ----------
    classes : ndarray (K,)
        Class labels (ints or strings).
    X_train : ndarray (M, Lt)
        Preprocessed labelled target training samples (the kernel's anchors).
    P : ndarray (K, M)
        Prediction coefficients.
    b : ndarray (K,)
        Biases.
    V : ndarray (Lt + 1, K) or None
        Prior term ``W0ᵀ Θ`` (None for the zero prior).
    kernel : KernelSpec
        Target kernel with resolved parameters.
    preprocessing : PreprocessStats
        Frozen preprocessing of the target device.
    feature_space : str
        Name of the target feature space (informational; checked by the registry).
    X_neighbours : ndarray (U, Lt) or None
        Preprocessed unlabelled target samples the scores are smoothed over (None: no
        smoothing); ``scores_neighbours`` (U, K) their scores before smoothing.
    """

    classes: np.ndarray
    X_train: np.ndarray
    P: np.ndarray
    b: np.ndarray
    V: np.ndarray | None
    kernel: KernelSpec
    preprocessing: PreprocessStats
    feature_space: str = "target"
    X_neighbours: np.ndarray | None = None
    scores_neighbours: np.ndarray | None = None

    @property
    def n_features(self) -> int:
        return int(self.X_train.shape[1])

    @one_thread
    def decision_function(self, X) -> np.ndarray:
        """Scores (n, K) of raw (not yet preprocessed) target samples.

        :meth:`fitted_scores`, smoothed over :attr:`X_neighbours` when the adapter keeps
        them (:mod:`mmdtl2_dist.core.neighbours`). The input is checked by
        :func:`check_scoring_input` and made C-ordered: the kernel block ``X_train @ Xp.T``
        of a column-major copy (what ``DataFrame.to_numpy`` gives) can differ from the
        estimator's in the last bit.
        """
        X = np.ascontiguousarray(check_scoring_input(X, self.n_features))
        Xp = self.preprocessing.transform(X)
        scores = self.fitted_scores(Xp)
        if self.X_neighbours is None:
            return scores
        Xn = self.X_neighbours
        sq, sq_n = np.einsum("ij,ij->i", Xp, Xp), np.einsum("ij,ij->i", Xn, Xn)
        gram_of = lambda rows: Xp[rows] @ Xn.T  # noqa: E731
        return smoothed_in_blocks(scores, gram_of, sq, sq_n, self.scores_neighbours)

    def fitted_scores(self, Xp: np.ndarray) -> np.ndarray:
        """The fitted classifier's scores (n, K) of preprocessed samples, not smoothed."""
        G = self.X_train @ Xp.T
        sq_tr = np.einsum("ij,ij->i", self.X_train, self.X_train)
        sq_new = np.einsum("ij,ij->i", Xp, Xp)
        scores = (self.P @ self.kernel(G, sq_tr, sq_new)).T + self.b
        if self.V is not None:
            scores = scores + Xp @ self.V[:-1] + self.V[-1]
        return scores

    def with_neighbours(self, Xu_p: np.ndarray) -> AdapterState:
        """A copy that smooths its scores over the preprocessed unlabelled samples ``Xu_p``."""
        Xu_p = np.ascontiguousarray(Xu_p, dtype=np.float64)
        return replace(self, X_neighbours=Xu_p, scores_neighbours=self.fitted_scores(Xu_p))

    def predict(self, X) -> np.ndarray:
        """Class labels of raw target samples."""
        return self.classes[np.argmax(self.decision_function(X), axis=1)]

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict]:
        """Plain arrays (for ``np.savez``) and JSON-able metadata; no pickling."""
        arrays = {"X_train": self.X_train, "P": self.P, "b": self.b}
        if self.V is not None:
            arrays["V"] = self.V
        if self.preprocessing.mean is not None:
            arrays["pre_mean"] = self.preprocessing.mean
            arrays["pre_scale"] = self.preprocessing.scale
        if self.X_neighbours is not None:
            arrays["X_neighbours"] = self.X_neighbours
            arrays["scores_neighbours"] = self.scores_neighbours
        classes = self.classes.tolist()
        meta = {
            "format": ADAPTER_FORMATS[self.X_neighbours is not None],
            "classes": classes,
            "classes_dtype": "str" if self.classes.dtype.kind in "US" else "int",
            "kernel": self.kernel.to_dict(),
            "preprocessing": self.preprocessing.method,
            "feature_space": self.feature_space,
            "n_features": self.n_features,
        }
        return arrays, meta

    @classmethod
    def from_arrays(cls, arrays: dict, meta: dict) -> AdapterState:
        """Inverse of :meth:`to_arrays`."""
        if meta.get("format") not in ADAPTER_FORMATS.values():
            raise ValueError(f"unknown adapter format {meta.get('format')!r}.")
        near = neighbour_arrays(arrays, meta)
        dtype = str if meta["classes_dtype"] == "str" else np.int64
        pre = PreprocessStats(
            meta["preprocessing"], arrays.get("pre_mean"), arrays.get("pre_scale")
        )
        return cls(
            classes=np.asarray(meta["classes"], dtype=dtype),
            X_train=np.asarray(arrays["X_train"], dtype=np.float64),
            P=np.asarray(arrays["P"], dtype=np.float64),
            b=np.asarray(arrays["b"], dtype=np.float64),
            V=None if "V" not in arrays else np.asarray(arrays["V"], dtype=np.float64),
            kernel=KernelSpec(**meta["kernel"]),
            preprocessing=pre,
            feature_space=meta["feature_space"],
            **near,
        )

    def save(self, path) -> None:
        """Write ``<path>.npz`` (arrays) and ``<path>.json`` (metadata)."""
        arrays, meta = self.to_arrays()
        np.savez(str(path) + ".npz", **arrays)
        with open(str(path) + ".json", "w") as fh:
            json.dump(meta, fh, indent=1)

    @classmethod
    def load(cls, path) -> AdapterState:
        """Read what :meth:`save` wrote (``allow_pickle=False``)."""
        with np.load(str(path) + ".npz", allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        with open(str(path) + ".json") as fh:
            meta = json.load(fh)
        return cls.from_arrays(arrays, meta)


def neighbour_arrays(arrays: dict, meta: dict) -> dict:
    """The stored neighbour arrays, checked against the adapter's format and metadata.

    Both or neither (as the format says), of the adapter's feature count and classes, and
    finite; a damaged file is refused rather than scored wrongly.
    """
    near = {k: np.asarray(arrays[k], dtype=np.float64) for k in NEIGHBOUR_ARRAYS if k in arrays}
    both = meta["format"] == ADAPTER_FORMATS[True]
    problem = None
    if len(near) != (len(NEIGHBOUR_ARRAYS) if both else 0):
        problem = (
            f"holds the neighbour arrays {sorted(near)} where its format has "
            f"{'both' if both else 'neither'} of {list(NEIGHBOUR_ARRAYS)}"
        )
    elif near:
        X, S = near["X_neighbours"], near["scores_neighbours"]
        shape_x, shape_s = (len(X), meta["n_features"]), (len(X), len(meta["classes"]))
        if X.shape != shape_x or S.shape != shape_s:
            problem = (
                f"has X_neighbours of shape {X.shape} and scores_neighbours of shape "
                f"{S.shape}, not {shape_x} and {shape_s}"
            )
        elif not (np.isfinite(X).all() and np.isfinite(S).all()):
            problem = "has NaN or Inf in its neighbour arrays"
    if problem:
        raise ValueError(
            f"the adapter (format {meta['format']!r}) {problem}; its files are incomplete or "
            "damaged: save or register the adapter again."
        )
    return near
