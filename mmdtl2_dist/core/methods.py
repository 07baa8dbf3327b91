"""Every method of the paper's comparison, as a function of Gram blocks only.

This is the trial-level API of the study runner: a trial slices the cached Grams of its
feature spaces into a :class:`GramProblem` and calls :func:`fit_predict`. Nothing here
reads features.

Methods (parameters and their defaults in :mod:`mmdtl2_dist.core.params`):

- ``source_svm``: one-vs-rest linear SVM on source and labelled target samples together
  (same feature space only; the paper's "source SVM").
- ``target_svm``: the same on the labelled target samples only.
- ``mmdt``: MMDT in the paper's form (Problem 2): MMDTL2 with ``c_f = 1``, ``c_d = 0``,
  the linear kernel and the zero prior fixed (:data:`~mmdtl2_dist.core.params.MMDT_FIXED`),
  and Hoffman et al.'s weights ``c_s = 0.05``, ``c_t = 1``.
- ``mmdt_hoffman``: MMDT as in Hoffman et al.'s reference MATLAB code, see
  :mod:`mmdtl2_dist.core.mmdt_hoffman`.
- ``mmdtl2``: MMDTL2 (linear, RBF or polynomial target kernel; prior ``zero`` (the paper),
  ``identity`` or a user-supplied ``matrix`` (its Gram blocks in the problem), each with a
  mixing weight ``prior_weight``, :mod:`mmdtl2_dist.core.priors`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import numpy as np

from mmdtl2_dist.core.kernels import KernelSpec
from mmdtl2_dist.core.low_rank import LowRankMap
from mmdtl2_dist.core.mmdtl2 import (
    MMDTL2Params,
    fit_mmdtl2_gram,
    hinge_weights_named,
)
from mmdtl2_dist.core.params import (  # DEFAULTS, METHODS: re-exported
    DEFAULTS,
    METHODS,  # noqa: F401
    check_method,
    check_params,
    mmdt_as_mmdtl2,
)
from mmdtl2_dist.core.preprocessing import check_scale
from mmdtl2_dist.core.svm import one_vs_rest, svm_step
from mmdtl2_dist.core.threads import one_thread

#: Methods that need source and target in one feature space (``Kst``, ``Ksq``).
NEEDS_SHARED_SPACE = {"source_svm", "mmdt_hoffman"}
#: Methods that need the test × test Gram ``Kqq`` (transductive steps).
NEEDS_TEST_GRAM = {"mmdt_hoffman"}


def default_params(method: str) -> dict:
    """A copy of the default parameters of ``method``."""
    check_method(method)
    return dict(DEFAULTS[method])


@dataclass
class GramProblem:
    """One train/test split of one source/target pair, as Gram blocks.

    All blocks are *linear* Grams of preprocessed features.

    Attributes
    ----------
    ys, yt : ndarray (N,), (M,)
        Labels of the source training and labelled target training samples.
    Kss : ndarray (N, N)
        Source × source (source space).
    Ktt : ndarray (M, M)
        Target train × target train (target space).
    Ktq : ndarray (M, Q)
        Target train × target test (target space).
    sq_q : ndarray (Q,)
        Squared norms of the test samples (target space), for RBF.
    Kst, Ksq : ndarray (N, M), (N, Q) or None
        Source × target train / test, only when both live in one feature space
        (``source_svm``, ``mmdt_hoffman`` and the identity prior need them).
    Kqq : ndarray (Q, Q) or None
        Target test × target test (``mmdt_hoffman``).
    Ksu, Kuu, Ksuq, Kuuq : ndarray (N, M), (M, M), (N, Q), (M, Q) or None
        For ``prior="matrix"``: Grams of the prior-mapped targets ``u = W0 x̂ + w0``
        (source space) with the source samples and each other — source × mapped train,
        mapped train × mapped train, source × mapped test, mapped train × mapped test.
        :meth:`from_features` forms them from ``W0``.
    """

    ys: np.ndarray
    yt: np.ndarray
    Kss: np.ndarray
    Ktt: np.ndarray
    Ktq: np.ndarray
    sq_q: np.ndarray
    Kst: np.ndarray | None = None
    Ksq: np.ndarray | None = None
    Kqq: np.ndarray | None = None
    Ksu: np.ndarray | None = None
    Kuu: np.ndarray | None = None
    Ksuq: np.ndarray | None = None
    Kuuq: np.ndarray | None = None

    @classmethod
    def from_features(
        cls, Xs, ys, Xt, yt, Xq, *, test_gram: bool = True, W0: np.ndarray | None = None
    ) -> GramProblem:
        """The linear Gram blocks of preprocessed features, for one split in memory.

        ``Xs`` (N, Ls) source training, ``Xt`` (M, Lt) labelled target training and
        ``Xq`` (Q, Lt) target test features. The source × target blocks are formed when
        ``Ls == Lt`` (one feature space), the test × test Gram ``Kqq`` when ``test_gram``,
        and the blocks of ``prior="matrix"`` when the prior map ``W0`` is given, of shape
        (Ls, Lt) or (Ls, Lt + 1) with a bias column.
        """
        shared = Xs.shape[1] == Xt.shape[1]
        mapped = {}
        if W0 is not None:
            M, w0 = prior_map(W0, Xs.shape[1], Xt.shape[1])
            U = Xt @ M.T + w0
            Uq = Xq @ M.T + w0
            mapped = {"Ksu": Xs @ U.T, "Kuu": U @ U.T, "Ksuq": Xs @ Uq.T, "Kuuq": U @ Uq.T}
        return cls(
            ys=ys,
            yt=yt,
            Kss=Xs @ Xs.T,
            Ktt=Xt @ Xt.T,
            Ktq=Xt @ Xq.T,
            sq_q=np.einsum("ij,ij->i", Xq, Xq),
            Kst=Xs @ Xt.T if shared else None,
            Ksq=Xs @ Xq.T if shared else None,
            Kqq=Xq @ Xq.T if test_gram else None,
            **mapped,
        )

    @property
    def shared_space(self) -> bool:
        return self.Kst is not None and self.Ksq is not None

    def validate(self) -> None:
        """Check shapes, finiteness and scale; raise ValueError naming the fix.

        The diagonals of ``Kss`` and ``Ktt`` are the squared norms of the two devices'
        features, checked by :func:`~mmdtl2_dist.core.preprocessing.check_scale`.
        """
        N, M, Q = len(self.ys), len(self.yt), self.Ktq.shape[1] if self.Ktq.ndim == 2 else -1
        expect = {"Kss": (N, N), "Ktt": (M, M), "Ktq": (M, Q)}
        if self.Kst is not None:
            expect["Kst"] = (N, M)
        if self.Ksq is not None:
            expect["Ksq"] = (N, Q)
        mapped = {"Ksu": (N, M), "Kuu": (M, M), "Ksuq": (N, Q), "Kuuq": (M, Q)}
        present = [k for k in mapped if getattr(self, k) is not None]
        if present and len(present) != len(mapped):
            raise ValueError(
                f"GramProblem has the matrix-prior blocks {present} but not all of "
                f"{list(mapped)}; give all four (GramProblem.from_features(..., W0=...))."
            )
        expect.update({k: mapped[k] for k in present})
        for name, shape in expect.items():
            arr = getattr(self, name)
            if arr.shape != shape:
                raise ValueError(f"GramProblem.{name} has shape {arr.shape}, expected {shape}.")
        check_scale(np.diag(self.Kss), "GramProblem.Kss (source features)")
        check_scale(np.diag(self.Ktt), "GramProblem.Ktt (target features)")
        for name in expect:
            arr = getattr(self, name)
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"GramProblem.{name} contains NaN or Inf; recompute the Gram.")
        if self.sq_q.shape != (Q,):
            raise ValueError(f"GramProblem.sq_q has shape {self.sq_q.shape}, expected ({Q},).")


def prior_map(W0, Ls: int, Lt: int):
    """``(M, w0)`` of a prior map ``W0 = [M | w0]`` of shape (Ls, Lt) or (Ls, Lt + 1), checked.

    ``w0`` (Ls,) is zeros without a bias column. A
    :class:`~mmdtl2_dist.core.low_rank.LowRankMap` (shape (Ls, Lt), no bias) stays factored.
    """
    if W0 is None:
        raise ValueError("prior='matrix' needs W0 of shape (Ls, Lt) or (Ls, Lt + 1).")
    if isinstance(W0, LowRankMap) and W0.shape == (Ls, Lt):
        return W0, np.zeros(Ls)
    W0 = np.asarray(W0, dtype=np.float64)
    if W0.shape not in ((Ls, Lt), (Ls, Lt + 1)):
        raise ValueError(
            f"W0 must have shape (Ls, Lt) = ({Ls}, {Lt}) or, with a bias column, "
            f"(Ls, Lt + 1) = ({Ls}, {Lt + 1}); got {W0.shape}."
        )
    if not np.all(np.isfinite(W0)):
        raise ValueError("W0 contains NaN or Inf.")
    return W0[:, :Lt], (W0[:, Lt] if W0.shape[1] > Lt else np.zeros(Ls))


@dataclass
class MethodResult:
    """Predictions of one method on the test samples of a :class:`GramProblem`."""

    y_pred: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    info: dict = field(default_factory=dict)


def _merge(method: str, params: Mapping | None) -> dict:
    """The defaults of ``method`` updated by ``params`` (names checked by the caller)."""
    return {**default_params(method), **(params or {})}


def _encode(ys, yt, classes=None):
    classes = np.unique(np.r_[ys, yt]) if classes is None else classes
    return classes, np.searchsorted(classes, ys), np.searchsorted(classes, yt)


def _svm_predict(Kv, y_enc, K, cost, Kq, p):
    Y = one_vs_rest(y_enc, K)
    res = svm_step(Kv, Y, cost, solver=p["qp_solver"], tol=p["qp_tol"])
    scores = Kq.T @ res.coef + res.b
    info = {
        "qp_status": [q.status for q in res.qps],
        "qp_kkt_residual": [q.kkt_residual for q in res.qps],
    }
    return scores, info


def kernel_blocks(p: Mapping, prob: GramProblem):
    """Target kernel matrices ``Kt`` (M, M) and ``Kt_new`` (M, Q) for the method's kernel."""
    spec = KernelSpec(p["kernel"], p["gamma"], p["degree"], p["coef0"]).resolve(prob.Ktt)
    sq_t = np.diag(prob.Ktt)
    return spec, spec(prob.Ktt, sq_t, sq_t), spec(prob.Ktq, sq_t, prob.sq_q)


def prior_blocks(p: Mapping, prob: GramProblem):
    """``Kz`` (N+M, N+M) and ``Kz_new`` (N+M, Q) for the prior of ``p``.

    ``zero``: ``U = 0``. ``identity``: ``U = μ Xt`` (needs one shared feature space).
    ``matrix``: ``U = μ (W0 Xt + w0)``, from the problem's ``Ksu``/``Kuu``/``Ksuq``/``Kuuq``.
    """
    N, M = len(prob.ys), len(prob.yt)
    Kz = np.zeros((N + M, N + M))
    Kz[:N, :N] = prob.Kss
    if p["prior"] == "zero":
        return Kz, None
    if p["prior"] == "identity":
        if not prob.shared_space:
            raise ValueError(
                "the identity prior needs source and target in one feature space (Kst, Ksq); "
                "use prior='zero' for different spaces, or prior='matrix' with a map W0."
            )
        Ksu, Kuu, Ksuq, Kuuq = prob.Kst, prob.Ktt, prob.Ksq, prob.Ktq
    elif p["prior"] == "matrix":
        if prob.Ksu is None:
            raise ValueError(
                "prior='matrix' needs the Grams of the prior-mapped targets (Ksu, Kuu, Ksuq, "
                "Kuuq); build the problem with GramProblem.from_features(..., W0=...)."
            )
        Ksu, Kuu, Ksuq, Kuuq = prob.Ksu, prob.Kuu, prob.Ksuq, prob.Kuuq
    else:
        raise ValueError(f"prior must be 'zero', 'identity' or 'matrix', got {p['prior']!r}.")
    mu = float(p["prior_weight"])
    Kz[:N, N:] = mu * Ksu
    Kz[N:, :N] = mu * Ksu.T
    Kz[N:, N:] = mu * mu * Kuu
    Kz_new = np.vstack([mu * Ksuq, mu * mu * Kuuq])
    return Kz, Kz_new


def fit_mmdtl2_blocks(p: Mapping, prob: GramProblem):
    """The MMDTL2 alternation on the training blocks of ``prob``, with checked parameters ``p``.

    Returns ``(classes, spec, fit, Kt_new, Kz_new)``: the sorted training labels, the
    resolved target kernel, the :func:`~mmdtl2_dist.core.mmdtl2.fit_mmdtl2_gram` result
    and the test blocks that score with it (``fit.decision_function(Kt_new, Kz_new)``).
    :func:`fit_predict` scores with them; the estimator keeps the fit for its adapter.
    """
    classes, ys, yt = _encode(prob.ys, prob.yt)
    mp = MMDTL2Params(**{f.name: p[f.name] for f in fields(MMDTL2Params)})
    spec, Kt, Kt_new = kernel_blocks(p, prob)
    Kz, Kz_new = prior_blocks(p, prob)
    fit = fit_mmdtl2_gram(Kz, Kt, ys, yt, len(classes), mp, init=p["init"])
    return classes, spec, fit, Kt_new, Kz_new


@one_thread
def fit_predict(method: str, params: Mapping | None, prob: GramProblem) -> MethodResult:
    """Fit ``method`` on the training blocks of ``prob`` and score its test samples.

    Parameters
    ----------
    method : str
        One of :data:`METHODS`.
    params : mapping
        Parameters overriding :data:`DEFAULTS` of the method.
    prob : GramProblem
        The split.

    Returns
    -------
    MethodResult
        ``scores`` (Q, K) for ``classes`` (sorted union of the training labels), the
        predicted labels and an ``info`` dict (objective per alternation, QP statuses and
        KKT residuals, timings).
    """
    p = _merge(method, params)
    check_params(method, p)
    prob.validate()
    with hinge_weights_named(p):
        return _fit_predict(method, p, prob)


def _fit_predict(method: str, p: dict, prob: GramProblem) -> MethodResult:
    """:func:`fit_predict` on checked parameters and blocks."""
    t0 = time.perf_counter()
    if method in NEEDS_SHARED_SPACE and not prob.shared_space:
        raise ValueError(
            f"{method} needs source and target in one feature space (Kst and Ksq); "
            "drop it for pairs with different feature spaces, as the paper does."
        )
    if len(prob.yt) == 0 and method != "source_svm":
        raise ValueError(f"{method} needs labelled target samples; got none.")
    if method == "target_svm":
        classes, _, yt = _encode(prob.yt, prob.yt)
        cost = np.full(len(yt), p["c_t"])
        scores, info = _svm_predict(prob.Ktt, yt, len(classes), cost, prob.Ktq, p)
    elif method == "source_svm":
        classes, ys, yt = _encode(prob.ys, prob.yt)
        Kv = np.block([[prob.Kss, prob.Kst], [prob.Kst.T, prob.Ktt]])
        Kq = np.vstack([prob.Ksq, prob.Ktq])
        cost = np.r_[np.full(len(ys), p["c_s"]), np.full(len(yt), p["c_t"])]
        scores, info = _svm_predict(Kv, np.r_[ys, yt], len(classes), cost, Kq, p)
    elif method == "mmdt_hoffman":
        from mmdtl2_dist.core.mmdt_hoffman import fit_predict_mmdt_hoffman

        classes, scores, info = fit_predict_mmdt_hoffman(p, prob)
    else:
        if method == "mmdt":
            p = mmdt_as_mmdtl2(p)
        classes, spec, fit, Kt_new, Kz_new = fit_mmdtl2_blocks(p, prob)
        scores = fit.decision_function(Kt_new, Kz_new)
        info = dict(fit.info)
        info["objective"] = fit.objective
        info["kernel"] = spec.to_dict()
    info["time_total_s"] = time.perf_counter() - t0
    return MethodResult(classes[np.argmax(scores, axis=1)], scores, classes, info)
