"""Evaluate one configuration of a method on a split: choose by CV, fit, score the test.

:func:`evaluate` is what a study's trial does on each (pair, split) unit and what every
caller that has a :class:`~mmdtl2_dist.core.methods.GramProblem` and a configuration
needs: the parameters named in ``select`` are chosen by cross-validation on the labelled
target samples (:func:`~mmdtl2_dist.core.selection.select_by_cv`; the test samples are
never seen), then the method is fitted with them on all the training samples and scores
the test samples (:func:`~mmdtl2_dist.core.methods.fit_predict`). :func:`expand_grid` is
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


def evaluate(
    method: str,
    params: Mapping,
    problem: GramProblem,
    select: Mapping[str, Sequence] | None = None,
) -> Evaluation:
    """Choose ``select``'s values by CV on the labelled targets, fit ``method``, score the test.

    ``params`` are the method's parameters (:mod:`mmdtl2_dist.core.params`), ``select``
    maps parameter names to candidate values (every combination is a candidate, over
    ``params``).
    """
    from mmdtl2_dist.core.selection import select_by_cv

    params, chosen, cv_acc = dict(params), {}, None
    t0 = time.perf_counter()
    if select:
        best, table = select_by_cv(method, expand_grid(params, select), problem)
        chosen = {k: best[k] for k in select}
        cv_acc = next(r for r in table if r["params"] == best)["cv_accuracy"]
        params = best
    cv_s = time.perf_counter() - t0 if select else 0.0
    return Evaluation(fit_predict(method, params, problem), params, chosen, cv_acc, cv_s)
