"""Established shallow adaptation methods (skada) evaluated beside the core's, on the same splits.

- ``coral_svm``: CORAL (Sun et al., AAAI 2016) then a linear SVM.
- ``sa_svm``: subspace alignment (Fernando et al., ICCV 2013) then a linear SVM.
- ``kmm_svm``: kernel mean matching (Huang et al., NIPS 2007) reweighting of the source
  samples, then a linear SVM trained with those sample weights.

Each is configured as its paper evaluates it, with the data every method of the study
gets, so that it is a fair baseline:

- **Adaptation step on the unlabelled target samples.** The adapter (CORAL's
  covariances, SA's two PCA subspaces, KMM's weights) is fitted on the source training
  samples and every target feature vector it is given (``Xpool``: the labelled targets
  and the unlabelled ones), without labels. Which target samples those are is the
  caller's protocol: a study's ``unlabelled`` pool (``"all"``, the test samples'
  features included, is the transductive protocol of Fernando et al. and Huang et al.,
  who fit on the whole unlabelled target domain; the bundled Office study uses it). The
  test samples ``Xq`` are only predicted. No target label other than the labelled
  samples' reaches this module (no argument of :func:`skada_predict` can carry one).
- **Semi-supervised classifier.** The SVM is trained on the adapted source samples *and*
  the labelled target samples, in the target's representation (SA's target subspace,
  CORAL's and KMM's unchanged target space), as the semi-supervised protocol of Hoffman
  et al. (ICLR 2013) gives every method those labels. KMM's weights are for source
  samples; a labelled target sample has weight 1.
- **Parameters chosen as the product chooses its own**: by per-class cross-validation
  on the labelled targets (:func:`mmdtl2_dist.core.selection.cv_folds` in the canonical
  order, at most :data:`CV_MAX_FOLDS` folds; the highest held-out accuracy, ties to the
  lower multiclass hinge loss, then to the first listed). The grid is the SVM's ``C``
  over :data:`SVM_C_GRID` for every method and, for SA, the subspace dimension ``d``
  over :data:`SA_DIMENSIONS` (Fernando et al.'s range on Office-Caltech10, where their
  bound picks ``d`` between 10 and 80), below the split's rank bound. SA's coordinates
  are PCA scores, whose scale grows with the variance kept, so ``C`` is chosen with
  ``d``, not fixed. The source samples stay in every fold's training set; the adapter,
  learnt without labels, is fitted once per ``d``. A parameter given in ``params``
  (``n_components``, ``c``) is fixed instead. With fewer than 2 labelled samples in some
  class no fold exists: ``d`` is then :data:`SA_FALLBACK_DIMENSION` and ``C`` is
  :data:`SVM_C_FALLBACK`.

The skada methods need *features*, not Grams: a trial reads the rows it needs from
the feature store and applies the device's frozen preprocessing (the statistics stored
with the Gram), so they see the same preprocessed features as the Gram methods. They are
limited to moderate dimensions: CORAL forms an L x L covariance (it refuses
``L > MAX_CORAL_FEATURES``) and all hold the split's features in memory.
"""

from __future__ import annotations

import time

import numpy as np

MAX_CORAL_FEATURES = 8192
#: Candidate subspace dimensions of SA (Fernando et al.'s range on Office-Caltech10).
SA_DIMENSIONS = (10, 20, 40, 80)
#: SA's dimension when no cross-validation fold can be formed (1 labelled sample in a class).
SA_FALLBACK_DIMENSION = 20
#: Candidate SVM ``C`` of every baseline, and the one used when no fold can be formed.
SVM_C_GRID = (0.001, 0.01, 0.1, 1.0)
SVM_C_FALLBACK = 1.0
#: Per-class folds of the labelled targets (3 with 3 labels per class).
CV_MAX_FOLDS = 3
METHODS = ("coral_svm", "sa_svm", "kmm_svm")


def skada_predict(
    method: str,
    params: dict,
    Xs: np.ndarray,
    ys: np.ndarray,
    Xpool: np.ndarray,
    ypool_masked: np.ndarray,
    Xq: np.ndarray,
) -> tuple[np.ndarray, dict]:
    """A skada adapter (CORAL, subspace alignment or KMM) followed by a linear SVM.

    Parameters
    ----------
    method : {"coral_svm", "sa_svm", "kmm_svm"}
        Which adapter.
    params : dict
        ``reg`` (CORAL, default "auto"), ``n_components`` (SA's ``d``), ``kmm_gamma`` and
        ``kmm_B`` (KMM's RBF kernel width, default skada's, and weight bound, default
        1000), ``c`` (SVM C). ``d`` and ``C`` not given are chosen by cross-validation
        (module docstring).
    Xs, ys : ndarray
        Preprocessed source training features and labels.
    Xpool, ypool_masked : ndarray
        The target samples the adapter learns from: labels are -1 except for the
        labelled samples (with none, the SVM learns from the adapted source alone). With
        a transductive protocol the test samples' features are among them, labelled -1.
    Xq : ndarray
        Target test features, to predict.

    Returns
    -------
    (y_pred, info)
        Predicted labels of ``Xq``; ``info`` has ``time_total_s``, ``n_labelled_target``
        (the labelled target samples in the SVM's training set), ``chosen`` (the
        configuration used) and ``cv`` (the CV table, or None).
    """
    if method not in METHODS:
        raise ValueError(f"unknown skada baseline {method!r}; choose one of {METHODS}.")
    t0 = time.perf_counter()
    ypool_masked = np.asarray(ypool_masked)
    Xt_lab, yt, Xt = _target_rows(Xpool, ypool_masked)
    candidates = _adapted(method, params, Xs, Xt)
    cs = [float(params["c"])] if "c" in params else list(SVM_C_GRID)
    grid = [(i, c) for i in range(len(candidates)) for c in cs]
    pick, table = _choose_by_cv(candidates, grid, ys, yt, Xt_lab)
    (setting, (Zs, w, Zt), to_target), c = candidates[grid[pick][0]], grid[pick][1]
    svm = _fit_svm(np.vstack([Zs, Zt[: len(yt)]]), np.concatenate([ys, yt]), w, c)
    y_pred = svm.predict(to_target(Xq))
    return np.asarray(y_pred), {
        "time_total_s": time.perf_counter() - t0,
        "n_labelled_target": int(len(yt)),
        "chosen": {**setting, "c": c},
        "cv": table,
    }


def _target_rows(Xpool: np.ndarray, ypool_masked: np.ndarray):
    """The labelled target rows and labels, and every target row (labelled ones first).

    Both in an order set by the samples' content, not by how the caller listed them: the
    labelled rows in the canonical order of their Gram (the order of the CV folds,
    :func:`mmdtl2_dist.core.selection.canonical_order`), the unlabelled rows sorted by
    their features (rounded to 1e-9 of the largest magnitude). libsvm's solution and the
    CV's ties depend on the order of the training rows, so a split listed by index (a
    study) and the same split listed as its split file has it (the benchmarks) give the
    same predictions.
    """
    from mmdtl2_dist.core.selection import canonical_order

    labelled = ypool_masked != -1
    Xl, yl, Xu = Xpool[labelled], ypool_masked[labelled], Xpool[~labelled]
    order = canonical_order(Xl @ Xl.T)
    scale = max(float(np.max(np.abs(Xu))) if Xu.size else 0.0, np.finfo(float).tiny)
    keys = np.round(Xu / (1e-9 * scale))
    Xu = Xu[np.lexsort(keys.T[::-1])] if len(Xu) else Xu
    return Xl[order], yl[order], np.vstack([Xl[order], Xu])


def _domains(ns: int, nt: int) -> np.ndarray:
    """The ``sample_domain`` (skada's) of ``ns`` source rows followed by ``nt`` target rows."""
    return np.concatenate([np.ones(ns, dtype=int), -np.ones(nt, dtype=int)])


def _adapted(method: str, params: dict, Xs: np.ndarray, Xt: np.ndarray) -> list:
    """The adapter fitted on ``Xs`` and ``Xt`` (features only), once per setting.

    A list of ``(setting, (Zs, w, Zt), to_target)``: the setting's parameters (SA's
    ``d``), the source rows as the SVM sees them, the sample weights of the source rows
    followed by weight 1 for every target row (None: all 1), the target rows, and the map
    of other target samples (the test samples) into the SVM's representation.
    """
    from skada import CORALAdapter, KMMReweightAdapter, SubspaceAlignmentAdapter

    X, sd, ns = np.vstack([Xs, Xt]), _domains(len(Xs), len(Xt)), len(Xs)
    if method == "sa_svm":
        out = []
        for d in sa_dimensions(params, len(Xs), len(Xt), Xs.shape[1]):
            sa = SubspaceAlignmentAdapter(n_components=d, random_state=0)
            Z = sa.fit_transform(X, sample_domain=sd)
            out.append(({"n_components": d}, (Z[:ns], None, Z[ns:]), _target_map(sa)))
        return out
    if method == "coral_svm":
        if Xs.shape[1] > MAX_CORAL_FEATURES:
            raise ValueError(
                f"coral_svm forms a {Xs.shape[1]} x {Xs.shape[1]} covariance; it is limited "
                f"to {MAX_CORAL_FEATURES} features. Drop it from studies of this space."
            )
        Z = CORALAdapter(reg=params.get("reg", "auto")).fit_transform(X, sample_domain=sd)
        return [({}, (Z[:ns], None, Z[ns:]), _as_is)]
    kmm = KMMReweightAdapter(gamma=params.get("kmm_gamma"), B=float(params.get("kmm_B", 1000.0)))
    ws = np.asarray(kmm.fit(X, sample_domain=sd).source_weights_, dtype=np.float64)
    return [({}, (Xs, np.concatenate([ws, np.ones(len(Xt))]), Xt), _as_is)]


def _as_is(X: np.ndarray) -> np.ndarray:
    """Target samples as CORAL and KMM leave them (both adapt the source side only)."""
    return X


def _target_map(sa):
    """Target samples onto a fitted SA adapter's target subspace."""
    return lambda X: sa.transform(X, sample_domain=-np.ones(len(X), dtype=int))


def _fit_svm(Z: np.ndarray, y: np.ndarray, w: np.ndarray | None, c: float):
    """A linear SVM on the rows ``Z`` (weights ``w`` cut to ``len(Z)`` rows, or none)."""
    from sklearn.svm import SVC

    return SVC(kernel="linear", C=c).fit(Z, y, sample_weight=None if w is None else w[: len(Z)])


def sa_dimensions(params: dict, ns: int, nt: int, n_features: int) -> list[int]:
    """SA's candidate dimensions: ``n_components``, else those of :data:`SA_DIMENSIONS` allowed.

    The bound is ``min(ns - 1, nt - 1, n_features)``.

    A subspace of ``d`` axes needs ``d`` below both domains' sample counts (a centred
    sample of ``n`` rows has rank ``n - 1`` at most) and at most the feature count.
    """
    cap = min(ns - 1, nt - 1, n_features)
    if "n_components" in params:
        d = int(params["n_components"])
        if not 1 <= d <= cap:
            raise ValueError(
                f"sa_svm: n_components={d} is more than this split allows ({cap}: "
                f"{ns} source and {nt} target samples, {n_features} features); set "
                f"n_components to at most {cap}, or leave it out to choose it by "
                "cross-validation on the labelled targets."
            )
        return [d]
    return [d for d in SA_DIMENSIONS if d <= cap] or [cap]


def _choose_by_cv(candidates: list, grid: list, ys, yt, Xt_lab) -> tuple[int, list | None]:
    """The index into ``grid`` chosen by per-class CV on the labelled targets, and the table.

    ``grid`` holds pairs ``(candidate index, C)``; the table is None when there was
    nothing to choose or no fold could be formed.

    ``candidates[i]`` is ``(setting, (Zs, w, Zt), _)`` with the labelled targets the first
    rows of ``Zt``, in the order of ``yt`` and ``Xt_lab``.
    """
    from mmdtl2_dist.core.selection import canonical_order, choose, cv_folds, multiclass_hinge

    if len(grid) == 1:
        return 0, None
    folds = cv_folds(yt, CV_MAX_FOLDS, "per_class", order=canonical_order(Xt_lab @ Xt_lab.T))
    if not folds:
        return min(range(len(grid)), key=lambda j: _fallback_distance(candidates, grid[j])), None
    table = []
    for i, c in grid:
        setting, (Zs, w, Zt), _ = candidates[i]
        hits = hinge = 0.0
        for held in folds:
            train = np.setdiff1d(np.arange(len(yt)), held)
            svm = _fit_svm(np.vstack([Zs, Zt[train]]), np.concatenate([ys, yt[train]]), w, c)
            hits += float(np.sum(svm.predict(Zt[held]) == yt[held]))
            scores = svm.decision_function(Zt[held])
            hinge += float(multiclass_hinge(scores, svm.classes_, yt[held]).sum())
        n = sum(len(h) for h in folds)
        table.append({**setting, "c": c, "cv_accuracy": hits / n, "cv_hinge": hinge / n})
    return choose(table, "accuracy", "hinge"), table


def _fallback_distance(candidates: list, pair: tuple) -> tuple[float, float]:
    """How far a grid entry is from the no-fold fallback (``d`` and ``C``)."""
    setting, c = candidates[pair[0]][0], pair[1]
    d = setting.get("n_components", SA_FALLBACK_DIMENSION)
    return abs(d - SA_FALLBACK_DIMENSION), abs(np.log(c / SVM_C_FALLBACK))
