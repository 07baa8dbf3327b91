"""Hyperparameter selection without peeking: cross-validation on the labelled targets.

Test labels must never choose a parameter, and Tamaki et al. tune nothing by validation
(they name it future work). :func:`select_by_cv` therefore scores every configuration of
a grid by cross-validation **on the labelled target training samples only**: the source
samples stay in every fold's training set, and the test samples are never seen. Every
fold is a :class:`~mmdtl2_dist.core.methods.GramProblem` cut from the split's Gram blocks
(:func:`sub_problem`), so no kernel value is recomputed. It returns the chosen
configuration and a table with every configuration's CV scores.

Folds (``folds``)
-----------------
- ``"per_class"`` (default): fold ``j`` holds out the ``j``-th sample of every class
  (``n`` folds with ``n`` samples in the smallest class, at most ``max_folds``), so
  every fold holds out one sample of every class.
- ``"loo"``: leave one labelled target sample out (``M`` folds). Each fold trains on all
  the target data but one sample, at ``M / n`` times the fits of the per-class folds; a
  sample that is the only one of its class is never held out.
- ``"auto"``: ``"loo"`` up to ``loo_max`` labelled target samples, ``"per_class"`` above.

The per-class scheme is the default: on Office-Caltech10 it selected at least as well as
leave-one-out, at a fraction of the fits (BENCHMARKS.md, "CV selection of the prior").

Which samples share a per-class fold is fixed by :func:`canonical_order`, a key computed
from the labelled targets' Gram, so one split gives the same folds, and the same choice,
however its samples are listed (by the estimator's caller, by the study runner by index,
or in Hoffman's file order). Listed-order folds and repeated rounds of folds were
measured and not kept (``benchmarks/bench_selection.py --orders``; BENCHMARKS.md).

The criterion
-------------
- ``"hinge"``: the lowest mean held-out multiclass hinge loss
  ``max(0, 1 + max_{j≠y} s_j − s_y)`` (Crammer and Singer's loss). It is continuous, so it
  separates configurations that a few dozen held-out predictions score alike, but it
  compares scores on one scale only when the configurations share the hinge weights and
  the kernel (:data:`SCALE_KEYS`). It is the criterion when the grid varies none of them;
- ``"accuracy"``, ties to the first listed, otherwise.

:func:`choose` applies either to a CV table (and ``"accuracy"`` with ties to the lower
hinge loss, which the skada baselines' selection uses).

The prior's weight
------------------
For the prior transform ``W0`` of :mod:`mmdtl2_dist.core.mmdtl2` the grid to use is
:data:`PRIOR_WEIGHT_GRID` (named ``"prior_weight"`` in :data:`NAMED_GRIDS`): the mixing
weight ``λ`` of ``W0 = λI`` in steps of 0.25, ``λ = 0`` being the paper's zero prior. It
is the one parameter worth selecting there: with ``W = W0 + Δ`` the correction ``Δ``
lives in the span of the labelled targets, where the data terms outweigh ``½ c_f ‖Δ‖²``,
so ``c_f`` and ``c_d`` barely move the result and the prior alone decides every other
direction. The measurements behind these defaults, and how the rule was fixed on one
split set before it was run on two others, are in BENCHMARKS.md ("CV selection of the
prior").

With a single labelled sample in some class no fold can be formed: the first
configuration is returned, and the table says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from mmdtl2_dist.core.methods import GramProblem, fit_predict
from mmdtl2_dist.core.threads import one_thread

FOLD_SCHEMES = ("auto", "loo", "per_class")
# The mixing weight λ of the identity prior W0 = λI; λ = 0 is exactly the paper's zero
# prior (the prior's Gram blocks vanish). The other parameters are the caller's (c_f
# hardly matters with a prior, see the module docstring). The dicts are shared: copy one
# to change an entry.
PRIOR_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
PRIOR_WEIGHT_GRID: tuple[dict, ...] = tuple(
    {"prior": "identity", "prior_weight": w} for w in PRIOR_WEIGHTS
)
# Grids that can be named instead of listed (the estimator's ``select=``).
NAMED_GRIDS: dict[str, tuple[dict, ...]] = {"prior_weight": PRIOR_WEIGHT_GRID}
# Parameters that change the scale of the scores (the hinge weights and the kernel): a
# grid over them is judged by accuracy, ties by order.
SCALE_KEYS = ("c_s", "c_t", "kernel", "gamma", "degree", "coef0")


def canonical_order(K: np.ndarray) -> np.ndarray:
    """A sample order that depends on the samples only, not on how they were listed.

    Sample ``i`` is keyed by its row of the (symmetrised) Gram matrix ``K`` sorted
    ascending: the multiset of its kernel values against all samples, which re-listing the
    samples leaves unchanged. Keys are compared lexicographically, after rounding to
    ``1e-9`` of the largest diagonal entry. Re-listing one Gram gives exactly the same
    order. Two Grams of the same samples computed along different paths (blockwise on Ray,
    or in one product) differ by round-off (about 1e-16 relative in float64 here), which
    could only swap two samples whose keys agree to that precision; symmetrising makes the
    commonest such case, two samples that are each other's least similar, an exact tie,
    settled by the next value. On Office-Caltech10 the study and ``mmdtl2 office`` form the
    same folds on all 240 splits. Samples with the same multiset of kernel values (e.g.
    identical samples), or whose values all round to 0, keep their listed relative order.
    """
    K = np.asarray(K, dtype=float)
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise ValueError(f"canonical_order needs a square Gram matrix, got shape {K.shape}.")
    if K.size == 0:
        return np.arange(len(K))
    if not np.all(np.isfinite(K)):
        raise ValueError(
            "canonical_order: the Gram matrix has NaN or Inf entries; check the features."
        )
    K = (K + K.T) / 2
    scale = max(float(np.max(np.abs(np.diag(K)))), np.finfo(float).tiny)
    keys = np.round(np.sort(K, axis=1) / (1e-9 * scale))
    return np.lexsort(keys.T[::-1])


def cv_folds(
    yt: np.ndarray,
    max_folds: int = 10,
    scheme: str = "per_class",
    loo_max: int = 60,
    *,
    order: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Held-out index sets of the fold ``scheme`` (see the module docstring).

    ``order`` (a permutation of the samples, e.g. :func:`canonical_order`) fixes which
    sample of a class is its ``j``-th for the ``"per_class"`` scheme, which holds out the
    first ``min(n, max_folds)`` samples of every class (``n`` the smallest class); by
    default the listed order. Leave-one-out needs no order.
    """
    if scheme not in FOLD_SCHEMES:
        raise ValueError(f"fold scheme must be one of {FOLD_SCHEMES}, got {scheme!r}.")
    yt = np.asarray(yt)
    if scheme == "auto":
        scheme = "loo" if len(yt) <= loo_max else "per_class"
    if scheme == "loo":  # every sample alone, in label order: no order needed
        per_class = [np.flatnonzero(yt == c) for c in np.unique(yt)]
        return [np.array([i]) for ix in per_class if len(ix) >= 2 for i in ix]
    if order is None:
        order = np.arange(len(yt))
    order = np.asarray(order)
    if order.dtype.kind not in "iu" or sorted(order.tolist()) != list(range(len(yt))):
        raise ValueError(
            f"order must be a permutation of the labelled target samples' indices 0..{len(yt) - 1}."
        )
    per_class = [order[yt[order] == c] for c in np.unique(yt)]
    n = min(len(ix) for ix in per_class) if per_class else 0
    if n < 2:
        return []
    return [np.array([ix[j] for ix in per_class]) for j in range(min(n, max_folds))]


def sub_problem(prob: GramProblem, train: np.ndarray, held: np.ndarray) -> GramProblem:
    """The problem whose labelled targets are ``train`` and whose test set is ``held``."""
    Ktt = prob.Ktt
    return GramProblem(
        ys=prob.ys,
        yt=prob.yt[train],
        Kss=prob.Kss,
        Ktt=Ktt[np.ix_(train, train)],
        Ktq=Ktt[np.ix_(train, held)],
        sq_q=np.diag(Ktt)[held],
        Kst=None if prob.Kst is None else prob.Kst[:, train],
        Ksq=None if prob.Kst is None else prob.Kst[:, held],
        Kqq=None if prob.Kqq is None else Ktt[np.ix_(held, held)],
        Ksu=None if prob.Ksu is None else prob.Ksu[:, train],
        Kuu=None if prob.Kuu is None else prob.Kuu[np.ix_(train, train)],
        Ksuq=None if prob.Ksu is None else prob.Ksu[:, held],
        Kuuq=None if prob.Kuu is None else prob.Kuu[np.ix_(train, held)],
    )


@one_thread
def select_by_cv(
    method: str,
    grid: Sequence[Mapping],
    problem: GramProblem,
    *,
    max_folds: int = 10,
    folds: str = "per_class",
    loo_max: int = 60,
) -> tuple[dict, list[dict]]:
    """Choose the configuration of ``grid`` that cross-validates best.

    Parameters
    ----------
    method : str
        A method of :data:`mmdtl2_dist.core.methods.METHODS`.
    grid : sequence of dict
        Candidate parameter sets (each passed to :func:`fit_predict`).
    problem : GramProblem
        The split; only its source and labelled target training blocks are used.
    max_folds : int
        Cap on the number of folds of the ``"per_class"`` scheme.
    folds : {"auto", "loo", "per_class"}
        Fold scheme (module docstring).
    loo_max : int
        ``"auto"`` leaves one out up to this many labelled target samples.

    Returns
    -------
    best : dict
        The chosen parameters.
    table : list of dict
        One row per configuration (:func:`cv_table`), with the fold ``scheme`` and the
        ``criterion`` and ``tie_break`` the grid was judged by (module docstring).
    """
    grid = [dict(g) for g in grid]
    if not grid:
        raise ValueError("the selection grid is empty; give at least one configuration.")
    varied = {k for k in SCALE_KEYS if len({repr(g.get(k)) for g in grid}) > 1}
    criterion, tie_break = ("accuracy", "order") if varied else ("hinge", "hinge")
    scheme = folds
    if scheme == "auto":
        scheme = "loo" if len(problem.yt) <= loo_max else "per_class"
    perm = canonical_order(problem.Ktt) if scheme == "per_class" else None
    held_sets = cv_folds(problem.yt, max_folds, scheme, order=perm)
    table = cv_table(method, grid, problem, held_sets)
    for row in table:
        row.update(folds=scheme, criterion=criterion, tie_break=tie_break)
    if not held_sets:
        table[0]["note"] = "too few labelled target samples per class: no CV possible"
        return grid[0], table
    return grid[choose(table, criterion, tie_break)], table


def cv_table(
    method: str, grid: Sequence[Mapping], problem: GramProblem, held_sets: list[np.ndarray]
) -> list[dict]:
    """Every configuration of ``grid`` scored on the folds ``held_sets``.

    One row per configuration: ``params``, ``cv_accuracy`` and ``cv_hinge`` (held-out
    accuracy and mean multiclass hinge loss over all folds; None without folds) and
    ``n_folds``.
    """
    if not held_sets:
        return [
            {"params": dict(g), "cv_accuracy": None, "cv_hinge": None, "n_folds": 0} for g in grid
        ]
    all_idx = np.arange(len(problem.yt))
    subs = [
        (sub_problem(problem, np.setdiff1d(all_idx, held), held), problem.yt[held])
        for held in held_sets
    ]
    n_held = sum(len(yh) for _, yh in subs)
    table = []
    for g in grid:
        hits, hinge = 0, 0.0
        for sp, yh in subs:
            res = fit_predict(method, g, sp)
            hits += int(np.sum(res.y_pred == yh))
            hinge += float(np.sum(multiclass_hinge(res.scores, res.classes, yh)))
        table.append(
            {
                "params": dict(g),
                "cv_accuracy": hits / n_held,
                "cv_hinge": hinge / n_held,
                "n_folds": len(subs),
            }
        )
    return table


def choose(table: Sequence[Mapping], criterion: str, tie_break: str = "order") -> int:
    """Index of the row of a CV ``table`` that ``criterion`` (and ``tie_break``) selects.

    ``"hinge"``: lowest ``cv_hinge``, then best ``cv_accuracy``, then first listed.
    ``"accuracy"``: best ``cv_accuracy``, then lowest ``cv_hinge`` (``tie_break="hinge"``)
    or first listed (``"order"``).
    """
    if criterion not in ("hinge", "accuracy") or tie_break not in ("hinge", "order"):
        raise ValueError(
            f"choose needs criterion 'hinge'/'accuracy' and tie_break 'hinge'/'order', "
            f"got {criterion!r}/{tie_break!r}."
        )
    if not table or any(r.get("cv_accuracy") is None for r in table):
        raise ValueError(
            "the CV table has no scores (too few labelled target samples per class to form "
            "a fold); select_by_cv returns its first configuration in that case."
        )

    def rank(i: int):
        acc, hin = table[i]["cv_accuracy"], table[i]["cv_hinge"]
        if criterion == "hinge":
            return (-hin, acc, -i)
        return (acc, -hin if tie_break == "hinge" else 0.0, -i)

    return max(range(len(table)), key=rank)


def multiclass_hinge(scores: np.ndarray, classes: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``max(0, 1 + max_{j≠y} s_j − s_y)`` per sample (Crammer & Singer's loss)."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim == 1:  # binary decision function: class 1 positive
        scores = np.c_[-scores, scores]
    iy = np.searchsorted(classes, y)
    rows = np.arange(len(y))
    s_y = scores[rows, iy]
    other = scores.copy()
    other[rows, iy] = -np.inf
    return np.maximum(0.0, 1.0 + other.max(axis=1) - s_y)
