"""The base of every estimator: parameter checks and constraints, preprocessing, scoring.

The method parameters of an estimator are those of its core method
(:mod:`mmdtl2_dist.core.params`): its ``__init__`` defaults and scikit-learn's
``_parameter_constraints`` are derived from that table (:func:`parameter_constraints`).
"""

from __future__ import annotations

import warnings
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from mmdtl2_dist.core.adapter import check_features
from mmdtl2_dist.core.mmdtl2 import hinge_weights_named
from mmdtl2_dist.core.params import DEFAULTS, Param, check_params, method_params
from mmdtl2_dist.core.preprocessing import PREPROCESSING, fit_preprocessing
from mmdtl2_dist.core.threads import one_thread
from mmdtl2_dist.estimators.inputs import (
    check_label_types,
    check_labels,
    domain_masks,
    n_rows,
    preprocessed,
    refuse_only_unlabelled_targets,
    split_domains,
)

MAX_EXPLICIT_W = 50_000_000  # entries of an explicit W (400 MB of doubles)
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
        Xs, ys, Xt, yt, Xu = split_domains(X, y, sample_domain, name)
        if self._needs_target:
            refuse_only_unlabelled_targets(yt, Xu, name)
        return self.fit_domains(Xs, ys, Xt, yt, Xt_unlabelled=Xu)

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
            Xs, ys = _domain_samples(Xs, ys, "s", NO_SOURCE)
        if self._needs_target:
            Xt, yt = _domain_samples(Xt, yt, "t", NO_TARGET)
        if self._needs_source and self._needs_target:
            check_label_types(ys, yt)
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
            _warn_if_unlabelled_classes(type(self).__name__, ys, yt)
        return Xs, ys, Xt, yt, classes

    def _unlabelled(self, Xt_unlabelled, n_features: int):
        """The unlabelled target samples, checked against the target width; None if none."""
        if Xt_unlabelled is None or n_rows(Xt_unlabelled) == 0:
            return None
        return check_features(Xt_unlabelled, n_features, "Xt_unlabelled", type(self).__name__)

    def _fit_preprocessing(self, Xs, Xt, Xu=None):
        """Fit each device's preprocessing; return the preprocessed ``Xs``, ``Xt`` (or None).

        The target device's statistics are over all its given samples, the labelled ``Xt``
        and the unlabelled ``Xu`` (a source-only fit with unlabelled target samples gets
        the target device's statistics from them alone). Both outputs are checked for a
        scale float64 can fit on (:func:`~mmdtl2_dist.core.preprocessing.check_scale`).
        """
        method = getattr(self, "preprocessing", "none")
        Xt_all = [a for a in (Xt, Xu) if a is not None and len(a)]
        self.source_preprocessing_ = None if Xs is None else fit_preprocessing(Xs, method)
        self.target_preprocessing_ = (
            fit_preprocessing(np.vstack(Xt_all), method) if Xt_all else None
        )
        self.n_unlabelled_target_ = 0 if Xu is None else len(Xu)
        after = f"after preprocessing={method!r}"
        return (
            preprocessed(Xs, self.source_preprocessing_, f"Xs (source features {after})"),
            preprocessed(Xt, self.target_preprocessing_, f"Xt (target features {after})"),
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
        from mmdtl2_dist.core.svm import linear_svm

        with hinge_weights_named(self.get_params(deep=False)):
            Theta, b = linear_svm(V, y_enc, len(self.classes_), cost, self.qp_solver, self.qp_tol)
        self.coef_ = Theta.T  # (K, L)
        self.intercept_ = b
        return self


def _warn_if_unlabelled_classes(owner: str, ys, yt) -> None:
    """Warn of source classes without a labelled target sample: they are seldom predicted.

    The transfer is learned from labelled target samples, so the target samples of such a
    class are not pulled towards its hyperplane (on Office-Caltech10 with two classes'
    target labels withheld, MMDTL2 predicted none of their 44 test samples as them).
    """
    unseen = np.setdiff1d(np.unique(ys), np.unique(yt))
    if unseen.size:
        warnings.warn(
            f"{owner}: source class(es) {unseen.tolist()} have no labelled target sample; the "
            "transfer is learned from labelled target samples, so target samples of these "
            "classes may never be predicted as them. Label at least one target sample of "
            "each class, or compare with SourceSVM.",
            UserWarning,
            stacklevel=5,  # the caller of fit_domains
        )


NO_SOURCE = (
    "no source samples (sample_domain > 0); this method needs a source device. "
    "Use TargetSVM for target-only training."
)
NO_TARGET = (
    "no labelled target samples (sample_domain < 0); adaptation needs at least "
    "one labelled sample of the target device. Use SourceSVM without them."
)


def _domain_samples(X, y, suffix: str, missing: str):
    """One domain's checked features and labels (``X{suffix}``, ``y{suffix}``)."""
    if X is None or n_rows(X) == 0:
        raise ValueError(missing)
    X = check_features(X, None, f"X{suffix}")
    return X, check_labels(y, X.shape[0], f"y{suffix}")
