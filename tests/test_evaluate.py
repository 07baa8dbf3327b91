"""core/evaluate.py: choose by CV then fit, and the one grid expansion."""

from __future__ import annotations

import numpy as np

from mmdtl2_dist.core.evaluate import evaluate, expand_grid
from mmdtl2_dist.core.methods import GramProblem, fit_predict
from mmdtl2_dist.core.selection import select_by_cv


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    Xs, Xt, Xq = rng.normal(size=(30, 5)), rng.normal(size=(9, 5)) + 0.3, rng.normal(size=(12, 5))
    ys, yt = np.repeat([0, 1, 2], 10), np.repeat([0, 1, 2], 3)
    return GramProblem.from_features(Xs, ys, Xt, yt, Xq)


def test_expand_grid_is_the_product_over_the_base_last_name_fastest():
    got = expand_grid({"a": 0, "b": 9}, {"b": [1, 2], "c": ["x", "y"]})
    assert got == [
        {"a": 0, "b": 1, "c": "x"},
        {"a": 0, "b": 1, "c": "y"},
        {"a": 0, "b": 2, "c": "x"},
        {"a": 0, "b": 2, "c": "y"},
    ]
    assert expand_grid({"a": 0}, {}) == [{"a": 0}]


def test_evaluate_chooses_by_cv_then_fits_with_the_choice():
    prob = _problem()
    params = {"prior": "identity", "c_f": 1.0}
    select = {"prior_weight": [0.0, 0.5, 1.0]}
    ev = evaluate("mmdtl2", params, prob, select)
    best, table = select_by_cv("mmdtl2", expand_grid(params, select), prob)
    assert ev.params == best and ev.chosen == {"prior_weight": best["prior_weight"]}
    assert ev.cv_accuracy == next(r for r in table if r["params"] == best)["cv_accuracy"]
    direct = fit_predict("mmdtl2", best, prob)
    np.testing.assert_array_equal(ev.result.scores, direct.scores)


def test_evaluate_without_select_is_one_fit():
    prob = _problem(1)
    ev = evaluate("target_svm", {"c_t": 0.5}, prob)
    assert ev.chosen == {} and ev.cv_accuracy is None and ev.cv_s == 0.0
    np.testing.assert_array_equal(
        ev.result.scores, fit_predict("target_svm", {"c_t": 0.5}, prob).scores
    )
