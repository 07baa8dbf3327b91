"""scikit-learn estimators: MMDTL2, MMDT (paper and reference-code forms), source/target SVM.

How domains are passed
----------------------
Two ways:

1. ``fit(X, y, sample_domain=...)`` — skada's convention: one array ``X`` whose rows are
   source samples where ``sample_domain > 0`` and labelled target samples where
   ``sample_domain < 0`` (keyword only, as in skada's adapters). This needs one feature
   dimension for both devices. The methods adapt **one** source domain to **one** target
   domain: several positive (or several negative) ids are refused, naming the ids
   found. A target row labelled ``-1`` is skada's mark for an unlabelled target sample
   (skada's pipelines put it on every target row unless ``mask_target_labels=False``):
   :class:`MMDTL2` takes such rows as unlabelled target samples (``Xt_unlabelled``
   below); the other methods cannot use them and refuse them, naming the fix. ``-1`` is
   never read as a class there.
2. ``fit_domains(Xs, ys, Xt, yt)`` — separate labelled arrays, so the source and target
   feature dimensions may differ (conv3 64,896-d source, conv5 43,264-d target). Every
   label is a class here, ``-1`` included. :class:`MMDTL2` also takes
   ``Xt_unlabelled``, target samples without labels.

Without ``sample_domain``, ``fit(X, y)`` of an adaptation method (:class:`MMDTL2`,
:class:`MMDT`, :class:`MMDTHoffman`) is refused with a message showing both calls:
nothing says which rows come from which device, and using every row as both source and
target would quietly fit a model with no device shift to adapt to. The single-domain
baselines are plain classifiers there: :class:`SourceSVM` reads every row as a source
sample (skada infers the same for labels other than ``-1``) and :class:`TargetSVM` every
row as a labelled target sample; both read ``-1`` as a class, as scikit-learn does.

``predict``, ``decision_function``, ``score`` and ``transform`` take **target-device**
samples (the device being adapted to). With ``sample_domain`` (keyword only), rows with
a positive domain are scored by the source classifier instead (same feature space only).
The ``sample_domain`` of every method is requested for scikit-learn's metadata routing by
default, as skada's estimators request it, so skada pipelines pass it on.

Preprocessing (``preprocessing=``) is fitted per device on the samples given to ``fit``
(source rows and target rows separately; the target statistics over the labelled and the
unlabelled target samples) and frozen; see
:mod:`mmdtl2_dist.core.preprocessing` for why per-device statistics are used. The
preprocessed features of each device must have squared norms that float64 can hold beside
the bias constant 1 (:func:`~mmdtl2_dist.core.preprocessing.check_scale`); ``"l2"`` and
``"l2_zscore"`` are scale-free, ``"none"`` is not.

``fit``, ``fit_domains``, ``predict``, ``decision_function``, ``score`` and ``transform``
run with one BLAS/OpenMP thread (:mod:`mmdtl2_dist.core.threads`).
"""

from __future__ import annotations

import warnings
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, TransformerMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from mmdtl2_dist.core.adapter import AdapterState, check_features
from mmdtl2_dist.core.auto import LowRankMap
from mmdtl2_dist.core.kernels import KernelSpec
from mmdtl2_dist.core.methods import GramProblem, default_params
from mmdtl2_dist.core.mmdtl2 import MMDTL2Params, fit_mmdtl2_gram, hinge_weights_named
from mmdtl2_dist.core.params import DEFAULTS, Param, check_params, method_params
from mmdtl2_dist.core.preprocessing import PREPROCESSING, check_scale, fit_preprocessing
from mmdtl2_dist.core.threads import one_thread

MAX_EXPLICIT_W = 50_000_000  # entries of an explicit W (400 MB of doubles)
# The core's defaults, the estimators' __init__ defaults (mmdtl2_dist.core.params).
_SOURCE_SVM, _TARGET_SVM, _MMDT = DEFAULTS["source_svm"], DEFAULTS["target_svm"], DEFAULTS["mmdt"]
_MMDTL2, _HOFFMAN = DEFAULTS["mmdtl2"], DEFAULTS["mmdt_hoffman"]
#: scikit-learn constraints of the estimator parameters that are not method parameters.
_ESTIMATOR_CONSTRAINTS = {
    "preprocessing": [StrOptions(set(PREPROCESSING))],
    "W0": ["array-like", None],
    "select": [str, list, None],
    "allow_target_only_classes": ["boolean"],
}


def _sklearn_constraint(param: Param) -> list:
    """scikit-learn's ``_parameter_constraints`` entry for a core :class:`Param`."""
    if param.kind == "choice":
        bools = all(isinstance(c, bool) for c in param.choices)
        out = ["boolean"] if bools else [StrOptions(set(param.choices))]
    else:
        low = None if param.low == -np.inf else param.low
        high = None if param.high == np.inf else param.high
        left = low is not None and not param.low_open
        right = high is not None and not param.high_open
        closed = {(True, True): "both", (True, False): "left", (False, True): "right"}
        kind = Integral if param.kind == "int" else Real
        out = [Interval(kind, low, high, closed=closed.get((left, right), "neither"))]
    return out + ([None] if param.none_word is not None else [])


def parameter_constraints(method: str, names: list[str]) -> dict[str, list]:
    """``_parameter_constraints`` of an estimator of ``method`` with parameters ``names``.

    Derived from :mod:`mmdtl2_dist.core.params`, the one description of the method's
    parameters, so scikit-learn's tools see the ranges the core checks.
    """
    specs = method_params(method)
    return {n: _sklearn_constraint(specs[n]) if n in specs else _ESTIMATOR_CONSTRAINTS[n]
            for n in names}  # fmt: skip


def _check_labels(y, n: int, name: str) -> np.ndarray:
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


def _check_label_types(ys, yt) -> None:
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


def _preprocessed(X, pre, name: str):
    """``X`` through the fitted preprocessing ``pre``, its scale checked (None stays None)."""
    if X is None:
        return None
    Xp = pre.transform(X)
    with np.errstate(over="ignore"):  # an overflow is what check_scale reports
        check_scale(np.einsum("ij,ij->i", Xp, Xp), name)
    return Xp


def _n_rows(X) -> int:
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


def _refuse_unlabelled_targets(unlabelled: np.ndarray, owner: str) -> None:
    """Refuse target rows labelled ``-1`` for a method that cannot use unlabelled samples.

    Reading ``-1`` as a class would silently train on unknown labels (a skada pipeline
    masks every target label with ``-1`` unless told not to).
    """
    rows = np.flatnonzero(unlabelled)
    if rows.size:
        shown = ", ".join(map(str, rows[:10])) + (" ..." if rows.size > 10 else "")
        raise ValueError(
            f"{rows.size} target row(s) (sample_domain < 0) are labelled -1, skada's mark "
            f"for an unlabelled target sample (rows {shown}); {owner} learns from labelled "
            "target samples only (MMDTL2 accepts unlabelled ones). Drop those rows "
            "(keep = ~((sample_domain < 0) & (y == -1))); in a skada pipeline, keep the "
            "target labels: make_da_pipeline(..., mask_target_labels=False). If -1 is a "
            "real class, relabel it, or pass the arrays to fit_domains(Xs, ys, Xt, yt), "
            "which reads every label as a class."
        )


def split_domains(X, y, sample_domain, owner: str = "the model", *, unlabelled: bool = False):
    """``(Xs, ys, Xt, yt, Xu)`` from skada's ``X``, ``y`` and ``sample_domain``.

    Rows with ``sample_domain > 0`` are source samples, rows with ``sample_domain < 0``
    target samples (:func:`domain_masks`): the labelled ones in ``Xt``, ``yt``, those
    labelled ``-1`` (skada's unlabelled mark) in ``Xu`` if ``unlabelled``, else refused
    (:func:`_refuse_unlabelled_targets`).
    """
    X = check_features(X, None)
    y = _check_labels(y, X.shape[0], "y")
    src, tgt = domain_masks(sample_domain, X.shape[0], owner)
    unl = unlabelled_target_rows(y, tgt)
    if not unlabelled:
        _refuse_unlabelled_targets(unl, owner)
    lab = tgt & ~unl
    if unl.any() and not lab.any():
        raise ValueError(
            f"every target row (sample_domain < 0) is labelled -1 (unlabelled, {int(unl.sum())} "
            f"rows); {owner} needs at least one labelled target sample. In a skada pipeline "
            "keep the target labels: make_da_pipeline(..., mask_target_labels=False)."
        )
    return X[src], y[src], X[lab], y[lab], X[unl]


class _AdaptationBase(ClassifierMixin, BaseEstimator):
    """Shared validation, preprocessing and scoring.

    The ``__metadata_request__*`` attributes request ``sample_domain`` by default, as
    skada's own estimators do, so that scikit-learn's metadata routing (which skada's
    pipelines and cross-validation use) passes it to ``fit``, ``predict``,
    ``decision_function`` and ``score`` without a ``set_*_request`` call.
    """

    __metadata_request__fit = {"sample_domain": True}
    __metadata_request__predict = {"sample_domain": True}
    __metadata_request__decision_function = {"sample_domain": True}
    __metadata_request__score = {"sample_domain": True}

    _needs_source = True
    _needs_target = True
    _uses_unlabelled = False  # accepts unlabelled target samples (fit_domains' Xt_unlabelled)
    _method = ""  # the core method (mmdtl2_dist.core.params.DEFAULTS) of a concrete class

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls._method:
            cls._parameter_constraints = parameter_constraints(cls._method, cls._get_param_names())

    @one_thread
    def fit(self, X, y, *, sample_domain=None):
        """Fit on source and labelled target rows of ``X`` (skada's ``sample_domain``).

        ``sample_domain`` (keyword only): one integer per row, ``> 0`` for the source
        domain, ``< 0`` for the target domain (:func:`domain_masks`). Without it an
        adaptation method refuses, since nothing says which rows come from which device,
        and :class:`SourceSVM` / :class:`TargetSVM` read every row as their one domain.
        """
        if sample_domain is None:
            return self._fit_one_domain(X, y)
        name = type(self).__name__
        *parts, Xu = split_domains(X, y, sample_domain, name, unlabelled=self._uses_unlabelled)
        if self._uses_unlabelled:
            return self.fit_domains(*parts, Xt_unlabelled=Xu)
        return self.fit_domains(*parts)

    def _fit_one_domain(self, X, y):
        """``fit`` without ``sample_domain``: refused, naming both ways to give the domains."""
        name = type(self).__name__
        raise ValueError(
            f"{name}.fit needs sample_domain, one entry per row of X: > 0 for source "
            "rows, < 0 for labelled target rows (skada's convention), e.g. "
            f"{name}().fit(X, y, sample_domain=np.r_[np.ones(n_source), -np.ones(n_target)]); "
            f"or pass the two domains separately: {name}().fit_domains(Xs, ys, Xt, yt)."
        )

    def _check_params(self) -> None:
        """Check the method parameters with the core's rules (:mod:`mmdtl2_dist.core.params`)."""
        names = DEFAULTS[self._method]
        check_params(self._method, {k: v for k, v in self.get_params(deep=False).items()
                                    if k in names})  # fmt: skip

    def _validate_domains(self, Xs, ys, Xt, yt):
        self._check_params()
        if self._needs_source:
            if Xs is None or _n_rows(Xs) == 0:
                raise ValueError(
                    "no source samples (sample_domain > 0); this method needs a source device. "
                    "Use TargetSVM for target-only training."
                )
            Xs = check_features(Xs, None, "Xs")
            ys = _check_labels(ys, Xs.shape[0], "ys")
        if self._needs_target:
            if Xt is None or _n_rows(Xt) == 0:
                raise ValueError(
                    "no labelled target samples (sample_domain < 0); adaptation needs at least "
                    "one labelled sample of the target device. Use SourceSVM without them."
                )
            Xt = check_features(Xt, None, "Xt")
            yt = _check_labels(yt, Xt.shape[0], "yt")
        if self._needs_source and self._needs_target:
            _check_label_types(ys, yt)
        labels = [a for a in (ys if self._needs_source else None, yt) if a is not None]
        classes = np.unique(np.concatenate(labels)) if labels else np.array([])
        if classes.size < 2:
            raise ValueError(
                f"need at least 2 classes, got {classes.size} class ({classes.tolist()}); "
                "a classifier cannot be trained on a single class."
            )
        if self._needs_source and self._needs_target:
            missing = np.setdiff1d(np.unique(yt), np.unique(ys))
            if missing.size and not getattr(self, "allow_target_only_classes", False):
                raise ValueError(
                    f"target class(es) {missing.tolist()} have no source sample; the source "
                    "classifier cannot start from them. Add source samples of those classes, "
                    "drop them from the target, or pass allow_target_only_classes=True."
                )
        return Xs, ys, Xt, yt, classes

    def _fit_preprocessing(self, Xs, Xt, Xu=None):
        """Fit each device's preprocessing; return the preprocessed ``Xs``, ``Xt`` (or None).

        The target device's statistics are over all its given samples, the labelled ``Xt``
        and the unlabelled ``Xu``. Both outputs are checked for a scale float64 can fit on
        (:func:`~mmdtl2_dist.core.preprocessing.check_scale`).
        """
        method = getattr(self, "preprocessing", "none")
        Xt_all = Xt if Xu is None or len(Xu) == 0 else np.vstack([Xt, Xu])
        self.source_preprocessing_ = None if Xs is None else fit_preprocessing(Xs, method)
        self.target_preprocessing_ = None if Xt is None else fit_preprocessing(Xt_all, method)
        after = f"after preprocessing={method!r}"
        return (
            _preprocessed(Xs, self.source_preprocessing_, f"Xs (source features {after})"),
            _preprocessed(Xt, self.target_preprocessing_, f"Xt (target features {after})"),
        )

    @one_thread
    def decision_function(self, X, *, sample_domain=None):
        """Class scores of target samples (or source rows, see module docstring).

        Shape (n, K) one-vs-rest scores; for two classes sklearn's convention (n,):
        ``score(classes_[1]) − score(classes_[0])``, positive for ``classes_[1]``.
        """
        scores = self._scores(X, sample_domain)
        return scores[:, 1] - scores[:, 0] if scores.shape[1] == 2 else scores

    def _scores(self, X, sample_domain=None):
        """(n, K) scores: target rows by the adapted classifier, source rows by the source one."""
        check_is_fitted(self)
        X = check_features(X, None)
        if sample_domain is None:
            return self._target_scores(X)
        src, tgt = domain_masks(sample_domain, X.shape[0], type(self).__name__)
        if not np.any(src):
            return self._target_scores(X)
        out = np.empty((X.shape[0], len(self.classes_)))
        if np.any(tgt):
            out[tgt] = self._target_scores(X[tgt])
        out[src] = self._source_scores(X[src])
        return out

    @one_thread
    def predict(self, X, *, sample_domain=None):
        """Predicted class labels."""
        check_is_fitted(self)
        return self.classes_[np.argmax(self._scores(X, sample_domain), axis=1)]

    @one_thread
    def score(self, X, y, *, sample_domain=None, sample_weight=None):
        """Accuracy on target samples."""
        from sklearn.metrics import accuracy_score

        return accuracy_score(
            y, self.predict(X, sample_domain=sample_domain), sample_weight=sample_weight
        )

    def _source_scores(self, X):
        raise ValueError(f"{type(self).__name__} does not score source-device samples.")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        return tags


class _LinearSVMBase(_AdaptationBase):
    def _fit_svm(self, V, y_enc, cost):
        from mmdtl2_dist.core.mmdt import linear_svm

        with hinge_weights_named(self.get_params(deep=False)):
            Theta, b = linear_svm(V, y_enc, len(self.classes_), cost, self.qp_solver, self.qp_tol)
        self.coef_ = Theta.T  # (K, L)
        self.intercept_ = b
        return self


class TargetSVM(_LinearSVMBase):
    """One-vs-rest linear SVM (hinge, regularised bias) on the labelled target samples only.

    Parameters
    ----------
    c_t : float
        Hinge weight of the target samples.
    preprocessing : {"none", "l2", "zscore", "l2_zscore"}
        Per-device preprocessing.
    qp_solver, qp_tol : str, float
        Box-QP solver and KKT tolerance of the dual.
    """

    _needs_source = False
    _method = "target_svm"

    def __init__(self, c_t=_TARGET_SVM["c_t"], preprocessing="none",
                 qp_solver=_TARGET_SVM["qp_solver"], qp_tol=_TARGET_SVM["qp_tol"]):  # fmt: skip
        self.c_t = c_t
        self.preprocessing = preprocessing
        self.qp_solver = qp_solver
        self.qp_tol = qp_tol

    def _fit_one_domain(self, X, y):
        """Without ``sample_domain`` every row is a labelled target sample (a plain SVM)."""
        return self.fit_domains(None, None, X, y)

    @one_thread
    def fit_domains(self, Xs, ys, Xt, yt):
        """Fit on the labelled target samples (source arguments ignored)."""
        _, _, Xt, yt, classes = self._validate_domains(None, None, Xt, yt)
        self.classes_ = classes
        _, V = self._fit_preprocessing(None, Xt)
        self.n_features_in_ = Xt.shape[1]
        return self._fit_svm(V, np.searchsorted(classes, yt), np.full(len(yt), self.c_t))

    def _target_scores(self, X):
        X = check_features(X, self.n_features_in_, owner=type(self).__name__)
        return self.target_preprocessing_.transform(X) @ self.coef_.T + self.intercept_


class SourceSVM(_LinearSVMBase):
    """The paper's "source SVM": a linear SVM on source and labelled target samples together.

    Both devices must share one feature space. With no labelled target sample it is the
    source-only SVM. Parameters as :class:`TargetSVM`, plus ``c_s`` (source hinge weight).
    """

    _needs_target = False
    _method = "source_svm"

    def __init__(self, c_s=_SOURCE_SVM["c_s"], c_t=_SOURCE_SVM["c_t"], preprocessing="none",
                 qp_solver=_SOURCE_SVM["qp_solver"], qp_tol=_SOURCE_SVM["qp_tol"]):  # fmt: skip
        self.c_s = c_s
        self.c_t = c_t
        self.preprocessing = preprocessing
        self.qp_solver = qp_solver
        self.qp_tol = qp_tol

    def _fit_one_domain(self, X, y):
        """Without ``sample_domain`` every row is a source sample: the source-only SVM."""
        return self.fit_domains(X, y)

    @one_thread
    def fit_domains(self, Xs, ys, Xt=None, yt=None):
        """Fit on source samples and (optionally) labelled target samples."""
        has_t = Xt is not None and _n_rows(Xt) > 0
        Xs, ys, _, _, _ = self._validate_domains(Xs, ys, None, None)
        if has_t:
            Xt = check_features(Xt, Xs.shape[1], "Xt")
            yt = _check_labels(yt, Xt.shape[0], "yt")
            _check_label_types(ys, yt)
        else:
            Xt, yt = np.zeros((0, Xs.shape[1])), ys[:0]
        self.classes_ = np.unique(np.r_[ys, yt])
        V, Vt = self._fit_preprocessing(Xs, Xt if has_t else None)
        self.n_features_in_ = Xs.shape[1]
        if has_t:
            V = np.vstack([V, Vt])
        cost = np.r_[np.full(len(ys), self.c_s), np.full(len(yt), self.c_t)]
        return self._fit_svm(V, np.searchsorted(self.classes_, np.r_[ys, yt]), cost)

    def _target_scores(self, X):
        X = check_features(X, self.n_features_in_, owner=type(self).__name__)
        pre = self.target_preprocessing_ or self.source_preprocessing_
        return pre.transform(X) @ self.coef_.T + self.intercept_

    def _source_scores(self, X):
        X = check_features(X, self.n_features_in_, owner=type(self).__name__)
        return self.source_preprocessing_.transform(X) @ self.coef_.T + self.intercept_


class MMDTL2(TransformerMixin, _AdaptationBase):
    """Max-margin domain transfer with L2 constraints (Tamaki et al.), on Gram matrices.

    Unlabelled target samples are accepted (``Xt_unlabelled`` of :meth:`fit_domains`, or
    target rows labelled ``-1`` in :meth:`fit`).

    Learns one-vs-rest linear SVMs in the source space jointly with a transform ``W``
    from the target space (kernelised: linear, RBF or polynomial) into the source space,
    by alternating the W-step dual and the SVM-step (see :mod:`mmdtl2_dist.core.mmdtl2`).

    Parameters
    ----------
    c_f, c_d, c_t, c_s : float
        Paper parameters (defaults 0.1 each, the paper's).
    kernel : {"linear", "rbf", "poly"}
        Target-side kernel (:mod:`mmdtl2_dist.core.kernels` for the defaults of
        ``gamma``, ``degree``, ``coef0``).
    prior : {"zero", "identity", "matrix"}
        Prior transform ``W0`` of the regulariser ``½ c_f ‖W − W0‖²``: ``"zero"`` is the
        paper; ``"identity"`` (``Ls = Lt``) keeps the source classifier in force where the
        few target samples say nothing, scaled by ``prior_weight``; ``"matrix"`` uses the
        user's ``W0`` of shape (Ls, Lt) or (Ls, Lt + 1) (e.g. learned by an alignment
        method, for ``Ls ≠ Lt``).
    prior_weight : float
        ``μ`` scaling the prior: ``μ I`` for the identity prior (0 = paper, 1 = identity),
        ``μ W0`` for the matrix prior. ``select="prior_weight"`` cross-validates it.
    W0 : ndarray or None
        The prior matrix for ``prior="matrix"``.
    preprocessing : {"none", "l2", "zscore", "l2_zscore"}
        Per-device preprocessing.
    max_iter, tol : int, float
        Alternations and relative objective stall tolerance.
    qp_solver, qp_tol : str, float
        Box-QP solver and KKT tolerance of both steps.
    init : {"source", "source+prior"}
        Initial SVM on the source only (paper) or on source and prior-mapped targets.
    select : str, list of dict or None
        ``"auto"``: the selection rule frozen on development data
        (:mod:`mmdtl2_dist.core.auto`, version ``AUTO_RULE``): it chooses ``prior``,
        ``prior_weight`` and ``c_f`` (the estimator's values of those, and ``W0``, are not
        used) among a shared-PCA prior learned from the source samples and every target
        sample given (labelled and unlabelled), the zero prior and the identity prior;
        one feature space for both devices. Otherwise, if given, candidate parameter
        sets, or the name of a grid of
        :data:`mmdtl2_dist.core.selection.NAMED_GRIDS` (``"prior_weight"``: the prior's
        mixing weight 0, 0.25, …, 1, of the identity, or of ``W0`` with
        ``prior="matrix"``; the other parameters stay the estimator's). With fewer than 2
        labelled samples in some class no fold exists: a warning, and the estimator's
        own parameters are used. Otherwise the set that cross-validates best on the
        labelled target samples (one per class held out per fold; lowest held-out hinge
        loss when the grid keeps ``c_s``, ``c_t`` and the kernel fixed, else best
        accuracy; :func:`mmdtl2_dist.core.selection.select_by_cv`) is used.
    allow_target_only_classes : bool
        Accept target classes with no source sample (their hyperplane starts from an
        all-negative source SVM).

    Attributes
    ----------
    classes_ : ndarray (K,)
    adapter_ : AdapterState
        The deployable scoring state (target features in, scores out).
    coef_source_ : ndarray (K, Ls)
        Source-space hyperplanes ``Θᵀ``; ``intercept_`` (K,) their biases.
    objective_ : list of float
        Objective after the initial SVM and every alternation.
    n_iter_ : int
    fit_info_ : dict
        QP statuses and KKT residuals, timings.
    selection_ : list of dict or None
        CV table when ``select`` was given; ``selected_params_`` the chosen set.
    auto_ : dict or None
        With ``select="auto"``: the rule's version, pick, pool size and table
        (:meth:`mmdtl2_dist.core.auto.AutoChoice.record`).
    n_unlabelled_target_ : int
        Unlabelled target samples given to ``fit``.
    """

    _uses_unlabelled = True
    _method = "mmdtl2"

    def __init__(
        self,
        c_f=_MMDTL2["c_f"],
        c_d=_MMDTL2["c_d"],
        c_t=_MMDTL2["c_t"],
        c_s=_MMDTL2["c_s"],
        kernel=_MMDTL2["kernel"],
        gamma=_MMDTL2["gamma"],
        degree=_MMDTL2["degree"],
        coef0=_MMDTL2["coef0"],
        prior=_MMDTL2["prior"],
        prior_weight=_MMDTL2["prior_weight"],
        W0=None,
        preprocessing="none",
        max_iter=_MMDTL2["max_iter"],
        tol=_MMDTL2["tol"],
        qp_solver=_MMDTL2["qp_solver"],
        qp_tol=_MMDTL2["qp_tol"],
        init=_MMDTL2["init"],
        select=None,
        allow_target_only_classes=False,
    ):
        self.c_f = c_f
        self.c_d = c_d
        self.c_t = c_t
        self.c_s = c_s
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.prior = prior
        self.prior_weight = prior_weight
        self.W0 = W0
        self.preprocessing = preprocessing
        self.max_iter = max_iter
        self.tol = tol
        self.qp_solver = qp_solver
        self.qp_tol = qp_tol
        self.init = init
        self.select = select
        self.allow_target_only_classes = allow_target_only_classes

    @one_thread
    def fit_domains(self, Xs, ys, Xt, yt, Xt_unlabelled=None):
        """Fit on source, labelled target and (optionally) unlabelled target samples.

        ``(Xs, ys)`` source and ``(Xt, yt)`` labelled target samples. The unlabelled
        ``Xt_unlabelled`` enter the target device's preprocessing statistics and, with
        ``select="auto"``, the shared-PCA prior's pool. The feature dimensions of ``Xs``
        and ``Xt`` may differ (except for the identity prior and ``select="auto"``).
        """
        Xs, ys, Xt, yt, classes = self._validate_domains(Xs, ys, Xt, yt)
        Xu = None
        if Xt_unlabelled is not None and _n_rows(Xt_unlabelled) > 0:
            Xu = check_features(Xt_unlabelled, Xt.shape[1], "Xt_unlabelled", type(self).__name__)
        self.classes_ = classes
        Xs_p, Xt_p = self._fit_preprocessing(Xs, Xt, Xu)
        Xu_p = _preprocessed(Xu, self.target_preprocessing_, "Xt_unlabelled (preprocessed)")
        self.n_features_in_ = Xt.shape[1]
        self.n_source_features_ = Xs.shape[1]
        self.n_unlabelled_target_ = 0 if Xu is None else Xu.shape[0]
        self.selection_ = self.auto_ = None
        params = self.get_params(deep=False)
        if self.select == "auto":
            params = self._select_auto(Xs_p, ys, Xt_p, yt, Xu_p, params)
        elif self.select:
            params = self._select(Xs_p, ys, Xt_p, yt, params)
        self._fit_chosen(
            Xs_p, np.searchsorted(classes, ys), Xt_p, np.searchsorted(classes, yt), params
        )
        return self

    def _select_auto(self, Xs, ys, Xt, yt, Xu, base):
        """The frozen rule (:mod:`mmdtl2_dist.core.auto`) on the preprocessed features."""
        from mmdtl2_dist.core.auto import RULE_KEYS, select_auto_features

        if base["W0"] is not None:
            raise ValueError(
                "select='auto' chooses the prior itself and does not use W0; drop W0, or "
                "fit the map W0 with select=None and prior='matrix'."
            )
        keys = set(default_params("mmdtl2")) - set(RULE_KEYS)
        choice, W0 = select_auto_features(Xs, ys, Xt, yt, Xu, {k: base[k] for k in keys})
        self.auto_ = choice.record()
        self.selection_ = choice.table
        self.selected_params_ = {**self.auto_["params"], "pca_dim": choice.pca_dim}
        return {**base, **choice.params, "W0": W0}

    def _select(self, Xs, ys, Xt, yt, base):
        from mmdtl2_dist.core.selection import NAMED_GRIDS, select_by_cv

        select = self.select
        if isinstance(select, str):
            if select not in NAMED_GRIDS:
                raise ValueError(
                    f"unknown select grid {select!r}; name one of {sorted(NAMED_GRIDS)} "
                    "or pass a list of parameter dicts."
                )
            select = [dict(g) for g in NAMED_GRIDS[select]]
            if self.prior == "matrix":  # the weight of the user's map, not of the identity
                select = [{k: v for k, v in g.items() if k != "prior"} for g in select]
        keys = set(default_params("mmdtl2"))  # the core's MMDTL2 parameters
        dims = (Xs.shape[1], Xt.shape[1])
        grid = []
        for g in select:
            bad = set(g) - keys
            if bad:
                raise ValueError(
                    f"unknown parameter(s) {sorted(bad)} in select; valid: {sorted(keys)}."
                )
            grid.append({**{k: base[k] for k in keys}, **g})
        # CV uses the training blocks only: no test samples. A matrix prior enters through
        # the Grams of the mapped targets, at weight 1 (prior_weight scales them in the core).
        W0 = None
        if any(g["prior"] == "matrix" for g in grid):
            W0 = self._prior_matrix({**base, "prior": "matrix", "prior_weight": 1.0}, *dims)
        prob = GramProblem.from_features(Xs, ys, Xt, yt, Xt[:0], test_gram=False, W0=W0)
        best, table = select_by_cv("mmdtl2", grid, prob)
        self.selection_ = table
        if table[0]["n_folds"] == 0:
            warnings.warn(
                "select: too few labelled target samples per class to cross-validate (every "
                "class needs 2); fitted with the estimator's own parameters instead.",
                UserWarning,
                stacklevel=3,
            )
            self.selected_params_ = {}
            return base
        self.selected_params_ = {k: best[k] for k in best if any(k in g for g in select)}
        return {**base, **best}

    def _fit_chosen(self, Xs, ys, Xt, yt, p):
        K = len(self.classes_)
        Ls, Lt = Xs.shape[1], Xt.shape[1]
        U = self._prior_targets(Xt, p, Ls, Lt)  # W0 x̂_m, (M, Ls)
        Z = np.vstack([Xs, U])
        spec = KernelSpec(p["kernel"], p["gamma"], p["degree"], p["coef0"]).resolve(Xt @ Xt.T)
        Kt = spec(Xt @ Xt.T)
        mp = MMDTL2Params(
            c_f=p["c_f"], c_d=p["c_d"], c_t=p["c_t"], c_s=p["c_s"], max_iter=p["max_iter"],
            tol=p["tol"], qp_solver=p["qp_solver"], qp_tol=p["qp_tol"],
        )  # fmt: skip
        fit = fit_mmdtl2_gram(Z @ Z.T, Kt, ys, yt, K, mp, init=p["init"])
        Theta = Z.T @ fit.beta  # (Ls, K)
        prior = self._prior_map(p, Ls, Lt)
        V = None  # W0ᵀ Θ (Lt+1, K): the prior's share of the target scores
        if prior is not None:
            A, w = prior
            V = np.vstack([A * Theta if np.isscalar(A) else A.T @ Theta, w @ Theta])
        self._Z, self._fit, self._prior = Z, fit, prior
        self.adapter_ = AdapterState(
            classes=self.classes_, X_train=Xt, P=fit.P, b=fit.b, V=V, kernel=spec,
            preprocessing=self.target_preprocessing_,
        )  # fmt: skip
        self.coef_source_ = Theta.T
        self.intercept_ = fit.b
        self.objective_ = fit.objective
        self.n_iter_ = fit.info["n_iter"]
        self.fit_info_ = fit.info
        self.kernel_ = spec

    def _prior_map(self, p, Ls, Lt):
        """The prior as ``(A, w)`` with ``W0 x̂ = A x + w``, or None for the zero prior.

        ``A`` is the scalar ``μ`` for the identity prior and the factors of ``μ P Pᵀ``
        (:class:`~mmdtl2_dist.core.auto.LowRankMap`) for ``select="auto"``'s shared-PCA
        prior, so that no ``Ls × Ls`` matrix is formed (34 GB at 64,896-d), and the
        (Ls, Lt) matrix ``μ M`` of a user map ``[M | w]`` (``w`` scaled by ``μ`` too).
        """
        if p["prior"] == "zero":
            return None
        if p["prior"] == "identity":
            if Ls != Lt:
                raise ValueError(
                    f"the identity prior needs equal source and target dimensions, got {Ls} and "
                    f"{Lt}; use prior='matrix' with a W0 of shape ({Ls}, {Lt})."
                )
            return float(p["prior_weight"]), np.zeros(Ls)
        if isinstance(p["W0"], LowRankMap):  # select="auto"'s shared-PCA prior P Pᵀ
            return p["prior_weight"] * p["W0"], np.zeros(Ls)
        W0h = self._prior_matrix(p, Ls, Lt)
        return W0h[:, :-1], W0h[:, -1]

    def _prior_matrix(self, p, Ls, Lt):
        """A user map ``μ [M | w]`` (``prior="matrix"``) as an (Ls, Lt + 1) matrix."""
        if p["prior"] == "matrix":
            W0 = p["W0"]
            if W0 is None:
                raise ValueError("prior='matrix' needs W0 of shape (Ls, Lt) or (Ls, Lt + 1).")
            W0 = np.asarray(W0, dtype=np.float64)
            if W0.shape == (Ls, Lt):
                W0 = np.hstack([W0, np.zeros((Ls, 1))])
            if W0.shape != (Ls, Lt + 1):
                raise ValueError(
                    f"W0 must have shape ({Ls}, {Lt}) or ({Ls}, {Lt + 1}), got {W0.shape}."
                )
            if not np.all(np.isfinite(W0)):
                raise ValueError("W0 contains NaN or Inf.")
            return p["prior_weight"] * W0  # exact for the default weight 1
        raise ValueError(f"prior must be 'zero', 'identity' or 'matrix', got {p['prior']!r}.")

    def _prior_targets(self, Xt, p, Ls, Lt):
        return _apply_prior(self._prior_map(p, Ls, Lt), Xt, Ls)

    def _target_scores(self, X):
        return self.adapter_.decision_function(
            check_features(X, self.n_features_in_, owner=type(self).__name__)
        )

    def _source_scores(self, X):
        X = check_features(X, self.n_source_features_, owner=type(self).__name__)
        return self.source_preprocessing_.transform(X) @ self.coef_source_.T + self.intercept_

    @one_thread
    def transform(self, X):
        """Map target samples into the source space: ``W x̂`` (n, Ls).

        Needs the kernel's feature map only through ``k(x̂)``, so it works for every kernel.
        """
        check_is_fitted(self)
        X = check_features(X, self.n_features_in_, owner=type(self).__name__)
        Xp = self.target_preprocessing_.transform(X)
        Xt = self.adapter_.X_train
        k = self.kernel_(Xt @ Xp.T, np.einsum("ij,ij->i", Xt, Xt), np.einsum("ij,ij->i", Xp, Xp))
        WX = (self._Z.T @ (self._fit.Gamma @ (self._fit.C @ k))).T
        if self._prior is not None:
            WX += _apply_prior(self._prior, Xp, WX.shape[1])
        return WX

    @one_thread
    def transform_matrix(self) -> np.ndarray:
        """The explicit ``W`` (Ls, Lt + 1) for the linear kernel, when it is small enough."""
        check_is_fitted(self)
        if self.kernel_.kernel != "linear":
            raise ValueError("an explicit W exists only for the linear kernel; use transform().")
        Ls, Lt = self.n_source_features_, self.n_features_in_
        if Ls * (Lt + 1) > MAX_EXPLICIT_W:
            raise ValueError(
                f"W would have {Ls} x {Lt + 1} = {Ls * (Lt + 1):,} entries "
                f"({Ls * (Lt + 1) * 8 / 1e9:.1f} GB); use transform() or decision_function()."
            )
        Xh = np.hstack([self.adapter_.X_train, np.ones((self.adapter_.X_train.shape[0], 1))])
        W = self._Z.T @ self._fit.Gamma @ self._fit.C @ Xh
        if self._prior is not None:
            A, w = self._prior
            if np.isscalar(A):
                W[np.arange(Ls), np.arange(Lt)] += A
            else:
                W[:, :Lt] += A.dense() if isinstance(A, LowRankMap) else A
            W[:, Lt] += w
        return W


def _apply_prior(prior, X: np.ndarray, Ls: int) -> np.ndarray:
    """``W0 x̂`` (n, Ls) for the rows of ``X``; ``prior`` as :meth:`MMDTL2._prior_map`.

    ``None`` (the zero prior) gives zeros.
    """
    if prior is None:
        return np.zeros((X.shape[0], Ls))
    A, w = prior
    return (A * X if np.isscalar(A) else X @ A.T) + w


class MMDT(TransformerMixin, _AdaptationBase):
    """MMDT in the paper's form (its Problem 2), with an explicit transform ``W``.

    ``min ½‖W‖² + ½‖Θ̂‖² + c_t Σ hinge_t + c_s Σ hinge_s`` by alternation from a
    source-only SVM (:mod:`mmdtl2_dist.core.mmdt`). Equal to ``MMDTL2(c_f=1, c_d=0)``;
    kept separate because it forms ``W`` explicitly (small dimensions only).

    Parameters
    ----------
    c_t, c_s : float
        Hoffman et al.'s weights 1 and 0.05 by default.
    preprocessing, max_iter, tol, qp_solver, qp_tol
        As :class:`MMDTL2` (``tol`` on the relative change of ``W``).
    """

    _method = "mmdt"

    def __init__(
        self,
        c_t=_MMDT["c_t"],
        c_s=_MMDT["c_s"],
        preprocessing="none",
        max_iter=_MMDT["max_iter"],
        tol=_MMDT["tol"],
        qp_solver=_MMDT["qp_solver"],
        qp_tol=_MMDT["qp_tol"],
    ):
        self.c_t = c_t
        self.c_s = c_s
        self.preprocessing = preprocessing
        self.max_iter = max_iter
        self.tol = tol
        self.qp_solver = qp_solver
        self.qp_tol = qp_tol

    @one_thread
    def fit_domains(self, Xs, ys, Xt, yt):
        """Fit on source and labelled target samples (dimensions may differ)."""
        from mmdtl2_dist.core.mmdt import fit_mmdt_explicit

        Xs, ys, Xt, yt, classes = self._validate_domains(Xs, ys, Xt, yt)
        if Xs.shape[1] * (Xt.shape[1] + 1) > MAX_EXPLICIT_W:
            raise ValueError(
                f"MMDT forms W explicitly: {Xs.shape[1]} x {Xt.shape[1] + 1} is too large; "
                "use MMDTL2(c_f=1, c_d=0), which never forms W."
            )
        self.classes_ = classes
        Xs_p, Xt_p = self._fit_preprocessing(Xs, Xt)
        self.n_features_in_ = Xt.shape[1]
        self.n_source_features_ = Xs.shape[1]
        with hinge_weights_named(self.get_params(deep=False)):
            W, Theta, b, n_iter = fit_mmdt_explicit(
                Xs_p, np.searchsorted(classes, ys), Xt_p, np.searchsorted(classes, yt),
                len(classes), c_t=self.c_t, c_s=self.c_s, max_iter=self.max_iter, tol=self.tol,
                qp_solver=self.qp_solver, qp_tol=self.qp_tol,
            )  # fmt: skip
        self.W_, self.coef_source_, self.intercept_, self.n_iter_ = W, Theta.T, b, n_iter
        return self

    @one_thread
    def transform(self, X):
        """``W x̂`` (n, Ls) of target samples."""
        check_is_fitted(self)
        Xp = self.target_preprocessing_.transform(
            check_features(X, self.n_features_in_, owner=type(self).__name__)
        )
        return Xp @ self.W_[:, :-1].T + self.W_[:, -1]

    def _target_scores(self, X):
        return self.transform(X) @ self.coef_source_.T + self.intercept_

    def _source_scores(self, X):
        X = check_features(X, self.n_source_features_, owner=type(self).__name__)
        return self.source_preprocessing_.transform(X) @ self.coef_source_.T + self.intercept_


class MMDTHoffman(_AdaptationBase):
    """MMDT as in Hoffman et al.'s reference MATLAB code, on Gram matrices.

    Like the reference code it is **transductive**: the PCA to ``pca_dim`` dimensions is
    fitted on the training *and* the test samples, so ``fit`` stores the training data
    and every ``predict`` call runs the whole procedure with its batch as the test set.
    Use ``pca_dim=None`` to disable the PCA. Source and target must share one feature
    space. See :mod:`mmdtl2_dist.core.mmdt_hoffman` for the algorithm and ``faithful``.
    """

    _method = "mmdt_hoffman"

    def __init__(self, c_s=_HOFFMAN["c_s"], c_t=_HOFFMAN["c_t"], gamma=_HOFFMAN["gamma"],
                 n_iter=_HOFFMAN["n_iter"], pca_dim=_HOFFMAN["pca_dim"],
                 faithful=_HOFFMAN["faithful"], preprocessing="none"):  # fmt: skip
        self.c_s = c_s
        self.c_t = c_t
        self.gamma = gamma
        self.n_iter = n_iter
        self.pca_dim = pca_dim
        self.faithful = faithful
        self.preprocessing = preprocessing

    @one_thread
    def fit_domains(self, Xs, ys, Xt, yt):
        """Store the preprocessed training data (the fit happens per predicted batch)."""
        Xs, ys, Xt, yt, classes = self._validate_domains(Xs, ys, Xt, yt)
        if Xs.shape[1] != Xt.shape[1]:
            raise ValueError("MMDTHoffman needs one feature space for source and target.")
        self.classes_ = classes
        self._Xs, self._Xt = self._fit_preprocessing(Xs, Xt)
        self.n_features_in_ = Xt.shape[1]
        self._ys, self._yt = ys, yt
        return self

    def _target_scores(self, X):
        from mmdtl2_dist.core.methods import fit_predict

        Xq = self.target_preprocessing_.transform(
            check_features(X, self.n_features_in_, owner=type(self).__name__)
        )
        prob = GramProblem.from_features(self._Xs, self._ys, self._Xt, self._yt, Xq)
        params = {
            k: getattr(self, k) for k in ("c_s", "c_t", "gamma", "n_iter", "pca_dim", "faithful")
        }
        res = fit_predict("mmdt_hoffman", params, prob)
        order = np.searchsorted(res.classes, self.classes_)
        if not np.array_equal(res.classes[order], self.classes_):
            raise ValueError("internal error: class sets differ")
        return res.scores[:, order]
