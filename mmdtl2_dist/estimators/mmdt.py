"""MMDT estimators: the paper's form (MMDTL2 with MMDT's settings), and Hoffman et al.'s code."""

from __future__ import annotations

import numpy as np

from mmdtl2_dist.core.adapter import check_features
from mmdtl2_dist.core.methods import GramProblem
from mmdtl2_dist.core.params import DEFAULTS, mmdt_as_mmdtl2
from mmdtl2_dist.core.threads import one_thread
from mmdtl2_dist.estimators.base import MAX_EXPLICIT_W, _AdaptationBase
from mmdtl2_dist.estimators.mmdtl2 import MMDTL2

# Defaults of the core methods (mmdtl2_dist.core.params), the __init__ defaults.
_MMDT, _HOFFMAN = DEFAULTS["mmdt"], DEFAULTS["mmdt_hoffman"]


class MMDT(MMDTL2):
    """MMDT in the paper's form (its Problem 2): :class:`MMDTL2` with MMDT's settings fixed.

    ``min ½‖W‖² + ½‖Θ̂‖² + c_t Σ hinge_t + c_s Σ hinge_s`` by alternation from a
    source-only SVM: ``MMDTL2`` with ``c_f = 1``, ``c_d = 0``, the linear kernel and the
    zero prior (:data:`mmdtl2_dist.core.params.MMDT_FIXED`), on Gram matrices, so ``W``
    is never formed. ``W_`` is the explicit ``W`` (Ls, Lt + 1) when it has at most
    ``MAX_EXPLICIT_W`` entries (else None; :meth:`transform` and
    :meth:`decision_function` never need it).

    Parameters
    ----------
    c_t, c_s : float
        Hoffman et al.'s weights 1 and 0.05 by default.
    preprocessing, max_iter, tol, qp_solver, qp_tol
        As :class:`MMDTL2`.
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

    def fit_domains(self, Xs, ys, Xt, yt, Xt_unlabelled=None):
        """Fit on source and labelled target samples (dimensions may differ).

        ``Xt_unlabelled`` (optional): target samples without labels, which enter the target
        device's preprocessing statistics only.
        """
        super().fit_domains(Xs, ys, Xt, yt, Xt_unlabelled)
        small = self.n_source_features_ * (self.n_features_in_ + 1) <= MAX_EXPLICIT_W
        self.W_ = self.transform_matrix() if small else None
        return self

    def __setstate__(self, state: dict) -> None:
        if "W_" in state and "adapter_" not in state:
            raise ValueError(
                "this MMDT was fitted by an earlier mmdtl2-dist, which kept only the explicit "
                "W; it cannot predict with this version: fit it again."
            )
        super().__setstate__(state)

    def _fit_params(self) -> dict:
        own = self.get_params(deep=False)
        return {**mmdt_as_mmdtl2({k: own[k] for k in _MMDT}), **own, "W0": None, "select": None}


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
    def fit_domains(self, Xs, ys, Xt, yt, Xt_unlabelled=None):
        """Store the preprocessed training data (the fit happens per predicted batch).

        ``Xt_unlabelled`` (optional): target samples without labels, which enter the target
        device's preprocessing statistics only (the PCA is fitted on the training samples
        and each predicted batch, as in the reference code).
        """
        Xs, ys, Xt, yt, classes = self._validate_domains(Xs, ys, Xt, yt)
        if Xs.shape[1] != Xt.shape[1]:
            raise ValueError("MMDTHoffman needs one feature space for source and target.")
        self.classes_ = classes
        Xu = self._unlabelled(Xt_unlabelled, Xt.shape[1])
        self._Xs, self._Xt = self._fit_preprocessing(Xs, Xt, Xu)
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
