"""The single-domain baselines: :class:`TargetSVM` and the paper's :class:`SourceSVM`."""

from __future__ import annotations

import numpy as np

from mmdtl2_dist.core.adapter import check_features
from mmdtl2_dist.core.params import DEFAULTS
from mmdtl2_dist.core.threads import one_thread
from mmdtl2_dist.estimators.base import _LinearSVMBase
from mmdtl2_dist.estimators.inputs import check_label_types, check_labels, n_rows

# Defaults of the core methods (mmdtl2_dist.core.params), the __init__ defaults.
_SOURCE_SVM, _TARGET_SVM = DEFAULTS["source_svm"], DEFAULTS["target_svm"]


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

    Attributes
    ----------
    coef_ : ndarray (K, L)
        Hyperplanes; ``intercept_`` (K,) their biases.
    target_preprocessing_ : PreprocessStats or None
        The target device's statistics, over its labelled and unlabelled samples.
    n_unlabelled_target_ : int
        Unlabelled target samples given to ``fit`` (their statistics only).
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
    def fit_domains(self, Xs, ys, Xt, yt, Xt_unlabelled=None):
        """Fit on the labelled target samples (source arguments ignored).

        ``Xt_unlabelled`` (optional): target samples without labels, which enter the target
        device's preprocessing statistics only.
        """
        _, _, Xt, yt, classes = self._validate_domains(None, None, Xt, yt)
        self.classes_ = classes
        Xu = self._unlabelled(Xt_unlabelled, Xt.shape[1])
        _, V = self._fit_preprocessing(None, Xt, Xu)
        self.n_features_in_ = Xt.shape[1]
        return self._fit_svm(V, np.searchsorted(classes, yt), np.full(len(yt), self.c_t))

    def _target_scores(self, X):
        X = check_features(X, self.n_features_in_, owner=type(self).__name__)
        return self.target_preprocessing_.transform(X) @ self.coef_.T + self.intercept_


class SourceSVM(_LinearSVMBase):
    """The paper's "source SVM": a linear SVM on source and labelled target samples together.

    Both devices must share one feature space. With no labelled target sample it is the
    source-only SVM. Parameters and attributes as :class:`TargetSVM`, plus ``c_s`` (source
    hinge weight) and ``source_preprocessing_`` (the source device's statistics).
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
    def fit_domains(self, Xs, ys, Xt=None, yt=None, Xt_unlabelled=None):
        """Fit on source samples and (optionally) labelled target samples.

        ``Xt_unlabelled`` (optional): target samples without labels, which enter the target
        device's preprocessing statistics only (without labelled target samples, the
        statistics are theirs alone).
        """
        has_t = Xt is not None and n_rows(Xt) > 0
        Xs, ys, _, _, _ = self._validate_domains(Xs, ys, None, None)
        if has_t:
            Xt = check_features(Xt, Xs.shape[1], "Xt")
            yt = check_labels(yt, Xt.shape[0], "yt")
            check_label_types(ys, yt)
        else:
            Xt, yt = np.zeros((0, Xs.shape[1])), ys[:0]
        self.classes_ = np.unique(np.r_[ys, yt])
        Xu = self._unlabelled(Xt_unlabelled, Xs.shape[1])
        V, Vt = self._fit_preprocessing(Xs, Xt if has_t else None, Xu)
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
