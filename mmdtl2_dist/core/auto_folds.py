"""The folds of ``select="auto"`` and what its candidates' fold fits measure.

:mod:`mmdtl2_dist.core.auto` holds the rule; here are its two kinds of folds over the
labelled targets (per class, or leave-classes-out when some class has a single label),
the fold fits of one candidate (each held-out sample's multiclass hinge loss, and the
fits' scores on the unlabelled targets for self-training), the paired gain its guard
compares with its standard error, the guard, and the test that puts the source first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from mmdtl2_dist.core.methods import GramProblem, fit_predict
from mmdtl2_dist.core.pool import SamplePool, pool_problem
from mmdtl2_dist.core.selection import canonical_order, cv_folds, multiclass_hinge, sub_problem

MAX_FOLDS = 3  # per-class folds: at most this many, one held-out target a class each
CLASS_GROUPS = 3  # leave-classes-out folds at one labelled target a class
TIE_RTOL = 1e-9  # relative distance within which a gain equals its threshold (exceeds)


def class_group_folds(yt, ys) -> list[np.ndarray]:
    """Leave-classes-out folds: each holds out the labelled targets of one class group.

    The classes of the labelled targets that the labelled source also has (a fold fit
    must be able to predict the classes it holds out), sorted, in
    ``g = min(CLASS_GROUPS, their number)`` groups (group ``j``: every ``g``-th class from
    the ``j``-th); fold ``j`` holds out the labelled targets of group ``j``. No folds (an
    empty list) with fewer than two such classes.
    """
    yt = np.asarray(yt)
    classes = np.intersect1d(yt, ys)
    g = min(CLASS_GROUPS, len(classes))
    return [np.flatnonzero(np.isin(yt, classes[j::g])) for j in range(g)] if g > 1 else []


def rule_folds(pool: SamplePool, ys: np.ndarray, yt: np.ndarray) -> tuple[list, bool]:
    """The rule's folds and whether they are per class (else leave-classes-out).

    ``min(n, MAX_FOLDS)`` per-class folds in canonical order when every class has two
    labelled targets or more, else :func:`class_group_folds`.
    """
    lab = pool.target_train
    order = canonical_order(pool.Ktt[np.ix_(lab, lab)])
    folds = cv_folds(yt, MAX_FOLDS, "per_class", order=order)
    return (folds, True) if folds else (class_group_folds(yt, ys), False)


def fold_fits(method: str, params: Mapping, prob: GramProblem, unl: GramProblem, folds):
    """The CV's fits of one candidate: held-out hinge losses, fold-averaged scores.

    The candidate is fitted by the core's ``method`` with ``params``. Returns every
    held-out sample's multiclass hinge loss (folds in order), the fold fits' decision
    scores on ``unl``'s scored rows (the unlabelled targets) averaged over the folds
    (``None`` if there are none), the classes, and each fold's own scores. Each fold is
    one fit that scores its held-out rows and the unlabelled rows together.
    """
    idx, hinge, scores = np.arange(len(prob.yt)), [], []
    for held in folds:
        train = np.setdiff1d(idx, held)
        fold = also_scoring(sub_problem(prob, train, held), unl, train)
        res = fit_predict(method, params, fold)
        hinge.append(multiclass_hinge(res.scores[: len(held)], res.classes, prob.yt[held]))
        scores.append(res.scores[len(held) :])
    mean = np.mean(scores, axis=0) if len(unl.sq_q) else None
    return np.concatenate(hinge), mean, res.classes, scores


def also_scoring(fold: GramProblem, unl: GramProblem, train: np.ndarray) -> GramProblem:
    """``fold`` also scoring ``unl``'s scored rows, after its own held-out rows.

    ``fold`` has the split's labelled targets ``train``; ``unl`` is the same split and
    prior with every labelled target.
    """
    if not len(unl.sq_q):
        return fold
    cat = lambda a, b: None if a is None else np.hstack([a, b])  # noqa: E731
    return replace(
        fold, Ktq=np.hstack([fold.Ktq, unl.Ktq[train]]), sq_q=np.r_[fold.sq_q, unl.sq_q],
        Ksq=cat(fold.Ksq, unl.Ksq), Ksuq=cat(fold.Ksuq, unl.Ksuq),
        Kuuq=None if fold.Kuuq is None else np.hstack([fold.Kuuq, unl.Kuuq[train]]), Kqq=None,
    )  # fmt: skip


def paired_gain(h_default: np.ndarray, h_alt: np.ndarray) -> tuple[float, float]:
    """Mean and standard error of ``h_d − h_a`` over the held-out samples.

    ``h_d`` is the default's hinge loss, ``h_a`` the alternative's.
    """
    diff = np.asarray(h_default, float) - np.asarray(h_alt, float)
    if diff.size < 2:
        return 0.0, float("inf")
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(diff.size))


def exceeds(value: float, threshold: float) -> bool:
    """``value > threshold`` as in exact arithmetic: equal to rounding is not more.

    With one held-out sample whose loss differs by ``x`` among ``n``, the paired gain is
    ``x / n`` and its standard error ``|x| / n``: equal, but computed along two roundings,
    so a plain ``>`` decides by the last bit (which moves with the solver's path, the BLAS
    and the machine). Values within :data:`TIE_RTOL` of the threshold are equal to it.
    """
    return value > threshold + TIE_RTOL * max(abs(threshold), abs(value))


def guarded_pick(hinge: Mapping[str, np.ndarray], default: str, alternatives) -> tuple[str, dict]:
    """The rule's pick from the held-out hinge losses, and each alternative's ``(gain, se)``.

    The default unless an alternative's paired gain exceeds its standard error; then the
    larger gain, the first listed on a tie (:func:`exceeds` for both).
    """
    best, best_gain, gains = default, 0.0, {}
    for alt in alternatives:
        gain, se = gains[alt] = paired_gain(hinge[default], hinge[alt])
        if exceeds(gain, se) and exceeds(gain, best_gain):
            best, best_gain = alt, gain
    return best, gains


def source_alone_right(pool: SamplePool, ys: np.ndarray, yt: np.ndarray) -> bool:
    """Whether the source SVM on the labelled source alone predicts every labelled target.

    The core's ``source_svm`` with its default parameters, fitted without any target
    sample: none of the labelled targets it scores was fitted on, so this is the
    unadapted classifier tested on every label the caller has.
    """
    yt, labelled = np.asarray(yt), np.arange(len(yt))
    only_labelled = pool.with_rows(target_test=pool.target_train[:0])  # no other rows scored
    problem = pool_problem(only_labelled, ys, yt, None, test_gram=False)
    problem = sub_problem(problem, labelled[:0], labelled)
    return bool(np.array_equal(fit_predict("source_svm", {}, problem).y_pred, yt))
