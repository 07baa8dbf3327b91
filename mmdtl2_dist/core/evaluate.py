"""Evaluate one configuration of a method on a split: choose by CV, fit, score the test.

:func:`evaluate` is what a study's trial does on each (pair, split) unit and what every
caller that has a :class:`~mmdtl2_dist.core.methods.GramProblem` and a configuration
needs: the parameters named in ``select`` are chosen by cross-validation on the labelled
target samples (:func:`~mmdtl2_dist.core.selection.select_by_cv`; the test samples are
never seen), then the method is fitted with them on all the training samples and scores
the test samples (:func:`~mmdtl2_dist.core.methods.fit_predict`). :func:`choose` is the
selection alone, for callers that keep the fit (the estimator); :func:`expand_grid` is
the one expansion of a grid of parameter values into configurations.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mmdtl2_dist.core.methods import GramProblem, MethodResult, fit_predict


def expand_grid(base: Mapping, grid: Mapping[str, Sequence]) -> list[dict]:
    """Every combination of ``grid``'s values over ``base``; the last name varies fastest."""
    names = list(grid)
    return [
        {**base, **dict(zip(names, values, strict=True))}
        for values in itertools.product(*(grid[n] for n in names))
    ]


@dataclass
class Evaluation:
    """The outcome of :func:`evaluate`.

    ``result`` the fitted method's test scores; ``params`` the parameters it was fitted
    with; ``chosen`` the values cross-validation picked for the ``select`` names (empty
    without ``select``) and ``cv_accuracy`` their CV accuracy (None without, or when no
    fold exists); ``cv_s`` the seconds cross-validation took.
    """

    result: MethodResult
    params: dict
    chosen: dict
    cv_accuracy: float | None
    cv_s: float


@dataclass
class Choice:
    """The outcome of :func:`choose`.

    ``params`` the configuration to fit (``params`` as given when ``select`` is empty),
    ``chosen`` the selected names' values, ``cv_accuracy`` their CV accuracy, ``table``
    the CV table of :func:`~mmdtl2_dist.core.selection.select_by_cv` (empty without
    ``select``; its rows have ``n_folds == 0`` when no fold exists) and ``cv_s`` its
    seconds.
    """

    params: dict
    chosen: dict
    cv_accuracy: float | None
    table: list
    cv_s: float


def choose(
    method: str,
    params: Mapping,
    problem: GramProblem,
    select: Mapping[str, Sequence] | Sequence[Mapping] | None = None,
) -> Choice:
    """The configuration that cross-validates best on the labelled targets of ``problem``.

    ``select`` maps parameter names to candidate values (every combination over
    ``params`` is a candidate, :func:`expand_grid`) or lists candidate parameter sets
    (each over ``params``). The test samples are never seen.
    """
    from mmdtl2_dist.core.selection import select_by_cv

    if not select:
        return Choice(dict(params), {}, None, [], 0.0)
    t0 = time.perf_counter()
    if isinstance(select, Mapping):
        grid, names = expand_grid(params, select), list(select)
    else:
        grid = [{**params, **g} for g in select]
        names = [k for k in params if any(k in g for g in select)]
    best, table = select_by_cv(method, grid, problem)
    cv_acc = next(r for r in table if r["params"] == best)["cv_accuracy"]
    chosen = {k: best[k] for k in names}
    return Choice(best, chosen, cv_acc, table, time.perf_counter() - t0)


def evaluate(
    method: str,
    params: Mapping,
    problem: GramProblem,
    select: Mapping[str, Sequence] | None = None,
) -> Evaluation:
    """Choose ``select``'s values by CV on the labelled targets, fit ``method``, score the test.

    ``params`` are the method's parameters (:mod:`mmdtl2_dist.core.params`), ``select``
    maps parameter names to candidate values (:func:`choose`).
    """
    c = choose(method, params, problem, select)
    return Evaluation(
        fit_predict(method, c.params, problem), c.params, c.chosen, c.cv_accuracy, c.cv_s
    )
