"""The MMDTL2 estimator: features in, the core's Gram-form fit, a deployable adapter out."""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.base import TransformerMixin
from sklearn.utils.validation import check_is_fitted

from mmdtl2_dist.core.adapter import AdapterState, check_features
from mmdtl2_dist.core.low_rank import LowRankMap
from mmdtl2_dist.core.methods import GramProblem, default_params, fit_mmdtl2_blocks, prior_map
from mmdtl2_dist.core.params import DEFAULTS
from mmdtl2_dist.core.threads import one_thread
from mmdtl2_dist.estimators.base import MAX_EXPLICIT_W, _AdaptationBase
from mmdtl2_dist.estimators.inputs import preprocessed

_MMDTL2 = DEFAULTS["mmdtl2"]  # the core's defaults, the __init__ defaults
# Size of the unlabelled samples an adapter keeps to smooth over, above which fitting warns.
KEPT_NEIGHBOURS_WARN_BYTES = 1_000_000_000


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
        sample given (labelled and unlabelled), with or (up to 20 classes and 8,000
        labelled W-step variables) without the L2 pull, the identity prior (with
        ``c_f = 100`` too, at one labelled sample in some class) and the target SVM (no
        adaptation: the linear target SVM with ``c_t = 1`` whatever the estimator's
        ``c_t`` and kernel, ``transform`` then the identity); one feature space for both
        devices. With the pull, ``c_d`` is scaled by ``min(1, 20 / n̄)``, ``n̄`` the
        labelled source samples a class, so that the pull per labelled target does not
        grow with the source (``auto_["c_d"]``: the scaled weight, or 0 for a pick
        without the pull). Otherwise, if given, candidate parameter sets, or the name of
        a grid of
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
        The deployable scoring state (target features in, scores out); where
        ``select="auto"`` smooths (``auto_["neighbours"]``), it keeps the preprocessed
        unlabelled targets and their scores to smooth every score over.
    coef_source_ : ndarray (K, Ls)
        Source-space hyperplanes ``Θᵀ``; ``intercept_`` (K,) their biases.
    objective_ : list of float
        Objective after the initial SVM and every alternation (empty when
        ``select="auto"`` picked the target SVM).
    n_iter_ : int
    fit_info_ : dict
        QP statuses and KKT residuals, timings (for a target-SVM pick only its method).
    selection_ : list of dict or None
        CV table when ``select`` was given; ``selected_params_`` the chosen set (None
        without ``select``).
    auto_ : dict or None
        With ``select="auto"``: the rule's version, pick, pool size, the number of
        unlabelled targets and of those self-trained into the fit (``pseudo_labelled``),
        the check of self-training on its folds (``self_training_check``: gain and
        standard error, or None), the neighbour smoothing (``neighbours``: ``[k, α]`` on
        a hard shift, else None), whether the source SVM alone was right on every labelled
        target (``source_alone_right``: then the pick is N, fitted without folds; None
        where it was not tested) and its table
        (:meth:`mmdtl2_dist.core.auto.AutoChoice.record`).
    n_unlabelled_target_ : int
        Unlabelled target samples given to ``fit``.
    """

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
        ``select="auto"``, the shared-PCA prior's pool, the self-training step (some
        join the final fit with pseudo-labels) and, on a hard shift, the neighbour
        smoothing of every score (the adapter then keeps them). The feature dimensions of ``Xs``
        and ``Xt`` may differ (except for the identity prior and ``select="auto"``).
        """
        Xs, ys, Xt, yt, classes = self._validate_domains(Xs, ys, Xt, yt)
        Xu = self._unlabelled(Xt_unlabelled, Xt.shape[1])
        self.classes_ = classes
        Xs_p, Xt_p = self._fit_preprocessing(Xs, Xt, Xu)
        Xu_p = preprocessed(Xu, self.target_preprocessing_, "Xt_unlabelled (preprocessed)")
        self.n_features_in_ = Xt.shape[1]
        self.n_source_features_ = Xs.shape[1]
        self.selection_ = self.auto_ = self.selected_params_ = None
        params = self._fit_params()
        if params["select"] == "auto":
            params, Xt_p, yt = self._select_auto(Xs_p, ys, Xt_p, yt, Xu_p, params)
        elif params["select"]:
            params = self._select(Xs_p, ys, Xt_p, yt, params)
        self._fit_chosen(Xs_p, ys, Xt_p, yt, params)
        if self.auto_ is not None and self.auto_["neighbours"] and Xu_p is not None:
            self.adapter_ = self.adapter_.with_neighbours(Xu_p)  # a hard shift: smoothing
            _warn_if_large(self.adapter_.X_neighbours)
        return self

    def _fit_params(self) -> dict:
        """Every parameter of the fit: the estimator's (a subclass fixes some)."""
        return self.get_params(deep=False)

    def _select_auto(self, Xs, ys, Xt, yt, Xu, base):
        """The frozen rule (:mod:`mmdtl2_dist.core.auto`) on the preprocessed features.

        Returns the parameters and the targets to fit: the labelled ones, then those the
        rule pseudo-labelled.
        """
        from mmdtl2_dist.core.auto import RULE_KEYS, check_auto_request
        from mmdtl2_dist.core.auto_features import select_auto_features

        if base["W0"] is not None:
            raise ValueError(
                "select='auto' chooses the prior itself and does not use W0; drop W0, or "
                "fit the map W0 with select=None and prior='matrix'."
            )
        # A rule key at its default cannot be told from one left unset: only changed ones
        # are refused.
        defaults = default_params("mmdtl2")
        check_auto_request("mmdtl2", {k: base[k] for k in RULE_KEYS if base[k] != defaults[k]})
        keys = set(defaults) - set(RULE_KEYS)
        choice, W0, added = select_auto_features(Xs, ys, Xt, yt, Xu, {k: base[k] for k in keys})
        self.auto_ = choice.record()
        self.selection_ = choice.table
        self.selected_params_ = {**self.auto_["params"], "pca_dim": choice.pca_dim}
        Xt_fit = np.vstack([Xt, Xu[added]]) if len(added) else Xt
        return {**base, **choice.params, "W0": W0}, Xt_fit, np.r_[yt, choice.pseudo_labels]

    def _select(self, Xs, ys, Xt, yt, base):
        """The candidate of ``select`` that cross-validates best (:func:`core.evaluate.choose`)."""
        from mmdtl2_dist.core.evaluate import choose
        from mmdtl2_dist.core.params import check_names
        from mmdtl2_dist.core.selection import NAMED_GRIDS

        select = self.select
        if isinstance(select, str):
            if select not in NAMED_GRIDS:
                raise ValueError(
                    f"unknown select {select!r}: select='auto' is the recommended "
                    f"configuration; a named grid is one of {sorted(NAMED_GRIDS)}, or pass a "
                    "list of parameter dicts."
                )
            select = [dict(g) for g in NAMED_GRIDS[select]]
            if self.prior == "matrix":  # the weight of the user's map, not of the identity
                select = [{k: v for k, v in g.items() if k != "prior"} for g in select]
        for g in select:
            check_names("mmdtl2", g)
        core = {k: base[k] for k in default_params("mmdtl2")}
        matrix = any(g.get("prior", core["prior"]) == "matrix" for g in select)
        # CV uses the training blocks only: no test samples.
        prob = self._problem(Xs, ys, Xt, yt, {**base, "prior": "matrix"} if matrix else base)
        c = choose("mmdtl2", core, prob, select)
        self.selection_ = c.table
        if c.table[0]["n_folds"] == 0:
            warnings.warn(
                "select: too few labelled target samples per class to cross-validate (every "
                "class needs 2); fitted with the estimator's own parameters instead.",
                UserWarning,
                stacklevel=3,
            )
            self.selected_params_ = {}
            return base
        self.selected_params_ = c.chosen
        return {**base, **c.params}

    def _problem(self, Xs, ys, Xt, yt, p):
        """The training blocks of the fit (no test samples), with the prior map of ``p``.

        The map enters at weight 1: the core scales the mapped targets' Grams by
        ``prior_weight`` (:func:`~mmdtl2_dist.core.methods.prior_blocks`).
        """
        W0 = None
        if p["prior"] == "matrix":
            W0 = p["W0"]
            prior_map(W0, Xs.shape[1], Xt.shape[1])  # checked: given, its shape, finite
        return GramProblem.from_features(Xs, ys, Xt, yt, Xt[:0], test_gram=False, W0=W0)

    def _fit_chosen(self, Xs, ys, Xt, yt, p):
        """Fit ``p`` through the core's Gram form; keep what the adapter and transform need."""
        if self.auto_ is not None and self.auto_["method"] == "target_svm":
            return self._fit_target_only(Xt, yt, p)
        Ls, Lt = Xs.shape[1], Xt.shape[1]
        prior = self._prior_map(p, Ls, Lt)
        prob = self._problem(Xs, ys, Xt, yt, p)
        _, spec, fit, _, _ = fit_mmdtl2_blocks({k: p[k] for k in default_params("mmdtl2")}, prob)
        Z = np.vstack([Xs, _apply_prior(prior, Xt, Ls)])  # the source-space samples of the fit
        Theta = Z.T @ fit.beta  # (Ls, K)
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

    def _fit_target_only(self, Xt, yt, p):
        """``select="auto"``'s target SVM (pick O): linear SVMs on the target samples alone.

        Its hyperplanes ``Θ`` are the adapter's prior term (``V = [Θ; 0]``, no kernel
        anchors), so scoring, the registry and serving are those of every other
        pick; ``W`` is the identity (one feature space for both devices under
        ``select="auto"``), so source samples are scored by the same hyperplanes.
        """
        from mmdtl2_dist.core.kernels import KernelSpec
        from mmdtl2_dist.core.svm import linear_svm

        K, cost = len(self.classes_), np.full(len(yt), float(p["c_t"]))
        y_enc = np.searchsorted(self.classes_, yt)
        Theta, b = linear_svm(Xt, y_enc, K, cost, p["qp_solver"], p["qp_tol"])
        spec = KernelSpec("linear")
        self._Z, self._fit, self._prior = None, None, (1.0, np.zeros(Xt.shape[1]))
        self.adapter_ = AdapterState(
            classes=self.classes_, X_train=Xt[:0], P=np.zeros((K, 0)), b=b,
            V=np.vstack([Theta, np.zeros((1, K))]), kernel=spec,
            preprocessing=self.target_preprocessing_,
        )  # fmt: skip
        self.coef_source_ = Theta.T
        self.intercept_ = b
        self.objective_, self.n_iter_ = [], 0
        self.fit_info_ = {"method": "target_svm", "n_iter": 0}
        self.kernel_ = spec

    def _prior_map(self, p, Ls, Lt):
        """The prior as ``(A, w)`` with ``W0 x̂ = A x + w``, or None for the zero prior.

        ``A`` is the scalar ``μ`` for the identity prior and the factors of ``μ P Pᵀ``
        (:class:`~mmdtl2_dist.core.low_rank.LowRankMap`) for ``select="auto"``'s shared-PCA
        prior, so that no ``Ls × Ls`` matrix is formed (34 GB at 64,896-d), and the
        (Ls, Lt) matrix ``μ M`` of a user map ``[M | w]`` (``w`` scaled by ``μ`` too).
        It maps new target samples in :meth:`transform` and gives the adapter's share of
        the prior in the scores.
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
        M, w = prior_map(p["W0"], Ls, Lt)  # a user's map, or select="auto"'s P Pᵀ
        mu = p["prior_weight"]
        return mu * M, mu * w  # exact for the default weight 1

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
        WX = _apply_prior(self._prior, Xp, self.n_source_features_)
        if self._fit is not None:  # None: select="auto"'s target SVM, W = I
            Xt = self.adapter_.X_train
            sq = np.einsum("ij,ij->i", Xt, Xt), np.einsum("ij,ij->i", Xp, Xp)
            k = self.kernel_(Xt @ Xp.T, *sq)
            WX += (self._Z.T @ (self._fit.Gamma @ (self._fit.C @ k))).T
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
        W = np.zeros((Ls, Lt + 1))
        if self._fit is not None:  # None: select="auto"'s target SVM, W = I
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


def _warn_if_large(X_neighbours: np.ndarray) -> None:
    """Warn when the unlabelled samples an adapter keeps exceed ``KEPT_NEIGHBOURS_WARN_BYTES``."""
    if X_neighbours.nbytes > KEPT_NEIGHBOURS_WARN_BYTES:
        warnings.warn(
            f"select='auto' found this shift hard and smooths every score over the "
            f"{len(X_neighbours)} unlabelled target samples, so the model and a registered "
            f"adapter keep them: {X_neighbours.nbytes / 1e6:,.0f} MB. Pass a random subsample "
            "of Xt_unlabelled (a few thousand samples) to keep it smaller.",
            UserWarning,
            stacklevel=3,
        )
