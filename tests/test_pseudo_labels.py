"""Confident pseudo-labels of ``select="auto"``'s self-training (``core/auto.py``)."""

import numpy as np
import pytest

from mmdtl2_dist.core.self_training import confident_pseudo_labels


def test_keeps_the_largest_margins_per_predicted_class():
    classes = np.array([3, 7])
    scores = np.array(
        [[2.0, 0.0], [0.5, 0.0], [0.0, 1.0], [0.0, 3.0], [1.0, 0.9], [0.0, 0.5]]
    )  # margins 2, .5, 1, 3, .1, .5; predicted 3, 3, 7, 7, 3, 7
    rows, labels = confident_pseudo_labels(scores, classes, {3: 2, 7: 1})
    assert rows.tolist() == [0, 1, 3]
    assert labels.tolist() == [3, 3, 7]


def test_a_class_with_fewer_predictions_than_asked_gives_what_it_has():
    scores = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.5, 0.0]])
    rows, labels = confident_pseudo_labels(scores, np.array([0, 1, 2]), {0: 3, 1: 1, 2: 2})
    assert rows.tolist() == [0, 1]
    assert labels.tolist() == [0, 1]


def test_ties_go_to_the_lower_row():
    scores = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    rows, _ = confident_pseudo_labels(scores, np.array([0, 1]), {0: 2})
    assert rows.tolist() == [0, 1]


def test_scores_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match="one column per class"):
        confident_pseudo_labels(np.zeros(4), np.array([0, 1]), {0: 1})
