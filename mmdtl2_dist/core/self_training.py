"""Self-training for ``select="auto"``: confident pseudo-labels, and their check on folds.

The rule (:mod:`mmdtl2_dist.core.auto`) grows its labelled targets with the unlabelled
targets its pick predicts with the largest margins (:func:`confident_pseudo_labels`,
:func:`self_training_pool`), after checking on the pick's folds that doing the same there
does not raise the held-out loss by more than its standard error
(:func:`self_trained_fold_hinge`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from mmdtl2_dist.core.methods import fit_predict
from mmdtl2_dist.core.pool import SamplePool, pool_problem
from mmdtl2_dist.core.selection import multiclass_hinge


def unlabelled_rows(pool: SamplePool, learn: np.ndarray) -> np.ndarray:
    """Target pool rows the rule may learn from that are not labelled (self-training's)."""
    mask = np.asarray(learn, bool)[pool.Kss.shape[0] :].copy()
    mask[pool.target_train] = False
    return np.flatnonzero(mask)


def final_scored_rows(pool: SamplePool, unl: np.ndarray) -> np.ndarray:
    """The target pool rows the rule's final fit scores.

    The pool's ``target_test`` rows, then the unlabelled rows ``unl`` not among them
    (their scores smooth those of the others: :mod:`mmdtl2_dist.core.neighbours`).
    """
    return np.r_[pool.target_test, np.setdiff1d(unl, pool.target_test)]


def self_training_pool(pool: SamplePool, yt, unl: np.ndarray, scores, classes, times: int):
    """The pool and labels grown by confidently pseudo-labelled unlabelled rows.

    Per class ``times`` × as many rows as the class has labelled targets
    (:func:`confident_pseudo_labels`); also returns the rows added (target pool rows) and
    their labels.
    """
    per_class = {c: times * n for c, n in zip(*np.unique(yt, return_counts=True), strict=True)}
    rows, labels = confident_pseudo_labels(scores, classes, per_class)
    grown = pool.with_rows(target_train=np.r_[pool.target_train, unl[rows]])
    return grown, np.r_[yt, labels], unl[rows], labels


def confident_pseudo_labels(
    scores: np.ndarray, classes: np.ndarray, per_class: Mapping
) -> tuple[np.ndarray, np.ndarray]:
    """The most confident predictions of each class: ``(rows, labels)``.

    A row's prediction is its highest-scoring class and its confidence the margin of that
    score over the second highest. For each class ``c`` of ``per_class`` the (at most)
    ``per_class[c]`` rows predicted as ``c`` with the largest margins are kept (ties to the
    lower row), so a self-training step adds to each class as many pseudo-labelled samples
    as asked, never samples predicted as another class. Rows are returned in ascending order.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2 or scores.shape[1] != len(classes) or len(classes) < 2:
        raise ValueError(
            f"scores must be (samples, classes) with one column per class of {len(classes)} "
            f"(at least 2), got shape {scores.shape}; pass the multiclass decision scores."
        )
    top2 = np.sort(scores, axis=1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    pred = scores.argmax(axis=1)
    rows = []
    for c, k in per_class.items():
        (cand,) = np.nonzero(pred == np.searchsorted(classes, c))
        rows.append(cand[np.argsort(-margin[cand], kind="stable")[: int(k)]])
    rows = np.sort(np.concatenate(rows)) if rows else np.zeros(0, int)
    return rows, np.asarray(classes)[pred[rows]]


def self_trained_fold_hinge(
    method: str, params, pool: SamplePool, ys, yt, pmap, unl, folds, fold_scores, classes, times
) -> np.ndarray:
    """Held-out hinge losses of a candidate's fold fits, each self-trained.

    The candidate is the core's ``method`` with ``params`` and the prior map ``pmap``
    (:class:`~mmdtl2_dist.core.pool.PoolMap` or ``None``).

    Fold ``j``'s fit (``fold_scores[j]``: its scores on the unlabelled targets) pseudo-labels
    as the final fit would (:func:`self_training_pool`, ``times`` per labelled target of
    the fold), is fitted again on its labelled and pseudo-labelled targets, and scores its
    held-out targets: one loss per held-out sample, folds in order, as the rule's fold fits
    (:func:`mmdtl2_dist.core.auto_folds.fold_fits`).
    ``unl`` are the unlabelled target rows the fold scores are of.
    """
    lab, idx, losses = pool.target_train, np.arange(len(yt)), []
    for held, scores in zip(folds, fold_scores, strict=True):
        train = np.setdiff1d(idx, held)
        fold_pool = pool.with_rows(target_train=lab[train], target_test=lab[held])
        grown, grown_y, _, _ = self_training_pool(fold_pool, yt[train], unl, scores, classes, times)
        res = fit_predict(method, params, pool_problem(grown, ys, grown_y, pmap, test_gram=False))
        losses.append(multiclass_hinge(res.scores, res.classes, yt[held]))
    return np.concatenate(losses)
