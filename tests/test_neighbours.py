"""Neighbour smoothing (``core/neighbours.py``) against a loop over explicit features."""

from __future__ import annotations

import numpy as np
import pytest
from neighbours_by_loop import smoothed_by_loop

from mmdtl2_dist.core.neighbours import cosines, smoothed_scores


def test_smoothing_equals_the_loop_over_features():
    rng = np.random.default_rng(0)
    Xu, Su = rng.standard_normal((40, 6)), rng.standard_normal((40, 3))
    Xq, Sq = rng.standard_normal((12, 6)), rng.standard_normal((12, 3))
    sq = np.einsum("ij,ij->i", Xq, Xq), np.einsum("ij,ij->i", Xu, Xu)
    got = smoothed_scores(Sq, cosines(Xq @ Xu.T, *sq), Su)
    np.testing.assert_allclose(got, smoothed_by_loop(Xq, Sq, Xu, Su), rtol=1e-12, atol=1e-12)


def test_a_scored_sample_among_the_unlabelled_is_smoothed_by_the_others_only():
    """Scored again as features (the adapter) or by its row (the Gram form), a sample of
    the unlabelled set is not its own neighbour; a scaled copy has cosine 1, so it counts
    as the sample itself too."""
    rng = np.random.default_rng(1)
    Xu, Su = rng.standard_normal((30, 5)), rng.standard_normal((30, 4))
    Xq, Sq = Xu[:8], Su[:8]
    sq = np.einsum("ij,ij->i", Xq, Xq), np.einsum("ij,ij->i", Xu, Xu)
    got = smoothed_scores(Sq, cosines(Xq @ Xu.T, *sq), Su)
    np.testing.assert_allclose(got, smoothed_by_loop(Xq, Sq, Xu, Su), rtol=1e-12, atol=1e-12)
    twice = np.vstack([Xu, 2 * Xu[:1]])  # the first sample, scaled: cosine 1
    sq2 = np.einsum("ij,ij->i", twice, twice)
    cos2 = cosines(Xq[:1] @ twice.T, sq[0][:1], sq2)
    got2 = smoothed_scores(Sq[:1], cos2, np.vstack([Su, Su[:1]]))
    np.testing.assert_allclose(got2, got[:1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n_unlabelled", [0, 1, 3])
def test_fewer_unlabelled_samples_than_neighbours(n_unlabelled):
    """With fewer than k others, the mean is over those there are; with none (the only
    unlabelled sample is the query itself, or none at all), the scores stay as they are."""
    rng = np.random.default_rng(2)
    Xu, Su = rng.standard_normal((n_unlabelled, 4)), rng.standard_normal((n_unlabelled, 2))
    Xq, Sq = rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    sq = np.einsum("ij,ij->i", Xq, Xq), np.einsum("ij,ij->i", Xu, Xu)
    got = smoothed_scores(Sq, cosines(Xq @ Xu.T, *sq), Su)
    want = smoothed_by_loop(Xq, Sq, Xu, Su) if n_unlabelled else Sq
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    if n_unlabelled == 1:  # the query is the only unlabelled sample: unchanged
        alone = smoothed_scores(Su, cosines(Xu @ Xu.T, sq[1], sq[1]), Su)
        np.testing.assert_array_equal(alone, Su)


def test_a_zero_vector_has_cosine_zero():
    K = np.array([[0.0, 0.0], [0.0, 2.0]])
    np.testing.assert_allclose(cosines(K, np.array([0.0, 2.0]), np.array([0.0, 2.0])),
                               [[0.0, 0.0], [0.0, 1.0]], rtol=0, atol=1e-15)  # fmt: skip


def test_blocks_of_scored_samples_give_the_whole_computation(monkeypatch):
    """Smoothed a few rows at a time (the block size lowered to 7), the scores are those of
    one block of every row."""
    from mmdtl2_dist.core import neighbours

    rng = np.random.default_rng(3)
    Xu, Su = rng.standard_normal((50, 6)), rng.standard_normal((50, 3))
    Xq, Sq = rng.standard_normal((30, 6)), rng.standard_normal((30, 3))
    sq, sq_u = np.einsum("ij,ij->i", Xq, Xq), np.einsum("ij,ij->i", Xu, Xu)
    whole = smoothed_scores(Sq, cosines(Xq @ Xu.T, sq, sq_u), Su)
    monkeypatch.setattr(neighbours, "BLOCK_ROWS", 7)
    blocks = neighbours.smoothed_in_blocks(Sq, lambda rows: Xq[rows] @ Xu.T, sq, sq_u, Su)
    np.testing.assert_array_equal(blocks, whole)
