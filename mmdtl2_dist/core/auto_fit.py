"""``select="auto"`` on Grams, end to end: the rule's choice, its final fit, smoothed scores.

:func:`~mmdtl2_dist.core.auto.select_auto` chooses the configuration and builds the final
fit's problem, which scores the samples asked for and the unlabelled targets it smooths over;
:func:`fit_predict_auto` fits it and, on a hard shift, smooths the scores of the samples
asked for over their nearest unlabelled targets (:mod:`mmdtl2_dist.core.neighbours`), as
the estimator's adapter does on features.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from mmdtl2_dist.core.auto import AutoChoice, select_auto
from mmdtl2_dist.core.methods import MethodResult, fit_predict
from mmdtl2_dist.core.neighbours import smoothed_in_blocks
from mmdtl2_dist.core.pool import SamplePool
from mmdtl2_dist.core.self_training import final_scored_rows


def fit_predict_auto(
    pool: SamplePool, ys, yt, params: Mapping | None = None, *, learn: np.ndarray | None = None
) -> tuple[MethodResult, AutoChoice]:
    """:func:`select_auto`, then the pick fitted on the labelled targets.

    With the pseudo-labelled ones too where the rule self-trains (the check on its folds
    kept self-training).

    Scores the pool's ``target_test`` rows, smoothed over the unlabelled targets on a
    hard shift (``choice.neighbours``);
    ``info["auto"]`` holds :meth:`AutoChoice.record`, ``info["select_s"]`` the wall time
    of the selection and ``info["n_fits"]`` the number of fits.
    """
    t0 = time.perf_counter()
    choice = select_auto(pool, ys, yt, params, learn=learn)
    t1 = time.perf_counter()
    res = fit_predict(choice.method, choice.params, choice.problem)
    res.info.update(auto=choice.record(), select_s=t1 - t0, n_fits=choice.n_fits)
    return smoothed_result(res, pool, choice.neighbours), choice


def smoothed_result(res: MethodResult, pool: SamplePool, unl: np.ndarray) -> MethodResult:
    """``res``'s scores of the pool's ``target_test`` rows, smoothed over the rows ``unl``.

    ``res`` scored :func:`final_scored_rows` of ``unl``.
    """
    test, scores = pool.target_test, res.scores
    if len(unl):
        at = {int(r): i for i, r in enumerate(final_scored_rows(pool, unl))}
        K, sq = pool.Ktt, np.diag(pool.Ktt)
        scores = smoothed_in_blocks(
            scores[: len(test)], lambda rows: K[np.ix_(test[rows], unl)], sq[test], sq[unl],
            scores[[at[int(r)] for r in unl]],
        )  # fmt: skip
    return MethodResult(res.classes[np.argmax(scores, axis=1)], scores, res.classes, res.info)
