"""What the estimators accept: labels, skada's ``sample_domain``, unlabelled target rows.

Validation shared by every estimator of :mod:`mmdtl2_dist.estimators`, with errors that
name the problem and the fix.
"""

from __future__ import annotations

import numpy as np

from mmdtl2_dist.core.adapter import check_features
from mmdtl2_dist.core.preprocessing import check_scale


def check_labels(y, n: int, name: str) -> np.ndarray:
    from sklearn.utils.multiclass import check_classification_targets
    from sklearn.utils.validation import column_or_1d

    if y is None:
        raise ValueError(f"requires y to be passed, but the target y is None ({name}).")
    y = column_or_1d(y, warn=True)
    if y.shape[0] != n:
        raise ValueError(
            f"{name} has {y.shape[0]} labels but there are {n} samples; pass one label per sample."
        )
    if y.dtype.kind == "f" and not np.all(np.isfinite(y)):
        raise ValueError(f"{name} contains NaN or Inf labels; drop unlabelled samples.")
    _label_kind(y, name)
    check_classification_targets(y)
    return y


def _label_kind(y: np.ndarray, name: str) -> str:
    """``"str"`` or ``"number"``: the one type of the labels ``y``; ValueError if mixed.

    Labels of mixed types (``"a"`` and ``0``) cannot be sorted into classes, and numpy
    would turn the numbers into strings beside string labels (``0`` → ``"0"``).
    """
    if y.dtype.kind in "US":
        return "str"
    if y.dtype.kind != "O":
        return "number"
    is_str = {isinstance(v, str | bytes) for v in y.ravel()}
    if len(is_str) > 1:
        raise ValueError(
            f"{name} mixes string and non-string labels (e.g. {_first(y, True)!r} and "
            f"{_first(y, False)!r}); labels must all be one type: convert them, e.g. "
            f"{name}.astype(str)."
        )
    return "str" if is_str == {True} else "number"


def _first(y: np.ndarray, want_str: bool):
    """The first label of ``y`` that is (or is not) a string, as a plain Python value."""
    v = next(v for v in y.ravel() if isinstance(v, str | bytes) == want_str)
    return v.item() if isinstance(v, np.generic) else v


def check_label_types(ys, yt) -> None:
    """Source and target labels must be of one type (``0`` and ``"0"`` are not one class)."""
    if ys is None or yt is None or len(ys) == 0 or len(yt) == 0:
        return
    ks, kt = _label_kind(ys, "ys"), _label_kind(yt, "yt")
    if ks != kt:
        raise ValueError(
            f"source labels are {'strings' if ks == 'str' else 'numbers'} but target labels "
            f"are {'strings' if kt == 'str' else 'numbers'} (e.g. {ys[:1].tolist()[0]!r} and "
            f"{yt[:1].tolist()[0]!r}); "
            "labels must be one type on both devices: convert one of them, e.g. "
            "yt.astype(ys.dtype) or both .astype(str)."
        )


def preprocessed(X, pre, name: str):
    """``X`` through the fitted preprocessing ``pre``, its scale checked (None stays None)."""
    if X is None:
        return None
    Xp = pre.transform(X)
    with np.errstate(over="ignore"):  # an overflow is what check_scale reports
        check_scale(np.einsum("ij,ij->i", Xp, Xp), name)
    return Xp


def n_rows(X) -> int:
    shape = getattr(X, "shape", None)
    if shape is not None and len(shape) >= 1:
        return int(shape[0])
    try:
        return len(X)
    except TypeError:
        return int(np.asarray(X).shape[0])


def domain_masks(sample_domain, n: int, owner: str) -> tuple[np.ndarray, np.ndarray]:
    """Source and target row masks of skada's ``sample_domain`` for ``n`` rows.

    skada's convention: one integer per row, ``> 0`` for a source domain, ``< 0`` for a
    target domain; a scalar applies to every row. ``owner`` adapts one source domain to
    one target domain, so every source row must carry one positive id and every target
    row one negative id: several of either are refused (pooling them silently would
    treat several devices as one).
    """
    sd = np.asarray(sample_domain)
    if sd.ndim == 0:
        sd = np.full(n, sd)
    sd = sd.reshape(-1)
    if sd.shape[0] != n:
        raise ValueError(
            f"sample_domain has {sd.shape[0]} entries but X has {n} rows; "
            "give one domain per sample (> 0 source, < 0 target)."
        )
    if sd.dtype.kind not in "iuf" or not np.all(np.isfinite(sd)):
        raise ValueError(
            f"sample_domain must be finite integers (> 0 source, < 0 target), got "
            f"{sd[:3].tolist()} ... of dtype {sd.dtype}; e.g. "
            "np.r_[np.ones(n_source, int), -np.ones(n_target, int)]."
        )
    if np.any(sd == 0):
        raise ValueError("sample_domain must be > 0 (source) or < 0 (target), never 0.")
    for side, ids in (("source", np.unique(sd[sd > 0])), ("target", np.unique(sd[sd < 0]))):
        if ids.size > 1:
            raise ValueError(
                f"sample_domain holds {ids.size} {side} domains {ids.tolist()}; {owner} "
                f"adapts one source domain to one target domain. Fit one model per {side} "
                f"domain, or, if the {side} domains are one device, give them one id "
                "(e.g. sample_domain = np.sign(sample_domain))."
            )
    return sd > 0, sd < 0


def unlabelled_target_rows(y: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Mask of the target rows labelled ``-1``, skada's mark for an unlabelled sample.

    Numeric labels only: a string label is always a class.
    """
    if _label_kind(y, "y") != "number":
        return np.zeros_like(target)
    return target & (y == -1)


def split_domains(X, y, sample_domain, owner: str = "the model"):
    """``(Xs, ys, Xt, yt, Xu)`` from skada's ``X``, ``y`` and ``sample_domain``.

    Rows with ``sample_domain > 0`` are source samples, rows with ``sample_domain < 0``
    target samples (:func:`domain_masks`): the labelled ones in ``Xt``, ``yt``, those
    labelled ``-1`` (skada's unlabelled mark, never a class) in ``Xu``.
    """
    X = check_features(X, None)
    y = check_labels(y, X.shape[0], "y")
    src, tgt = domain_masks(sample_domain, X.shape[0], owner)
    unl = unlabelled_target_rows(y, tgt)
    lab = tgt & ~unl
    return X[src], y[src], X[lab], y[lab], X[unl]


def refuse_only_unlabelled_targets(yt: np.ndarray, Xu: np.ndarray, owner: str) -> None:
    """Refuse target rows that are all unlabelled, for a method that needs labelled ones."""
    if len(Xu) and not len(yt):
        raise ValueError(
            f"every target row (sample_domain < 0) is labelled -1 (unlabelled, {len(Xu)} "
            f"rows); {owner} needs at least one labelled target sample. In a skada pipeline "
            "keep the target labels: make_da_pipeline(..., mask_target_labels=False)."
        )
