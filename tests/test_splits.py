"""Splits: reproducible from the seed, stratified, nothing leaks between train and test."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdtl2_dist.study.splits import (
    check_disjoint,
    draw_splits,
    fixed_splits,
    group_half,
    labelled_subset,
    stratified_half,
)


def _labels(counts, seed=0):
    y = np.concatenate([np.full(c, k) for k, c in enumerate(counts, start=1)])
    return np.random.default_rng(seed).permutation(y)


def test_half_protocol_is_stratified_and_disjoint():
    ys, yt = _labels([289, 365, 80]), _labels([92, 187])
    splits = draw_splits(ys, yt, n_splits=10, seed=3, pair=("a", "b"))
    assert len(splits) == 10
    for s in splits:
        check_disjoint(s)
        assert np.union1d(s.target_pool, s.target_test).size == yt.size
        # Half of each class (the paper: 139 target training samples of 279).
        for k, c in ((1, 92), (2, 187)):
            assert abs(np.sum(yt[s.target_pool] == k) - c / 2) <= 0.5
        assert sorted(s.target_order) == sorted(s.target_pool)
    assert splits[0].target_pool.size == 140  # 46 + round(93.5) = 46 + 94


def test_splits_reproduce_from_seed_and_differ_across_seeds():
    ys, yt = _labels([50, 60]), _labels([30, 40])
    a = draw_splits(ys, yt, n_splits=4, seed=7, pair=("a", "b"))
    b = draw_splits(ys, yt, n_splits=4, seed=7, pair=("a", "b"))
    c = draw_splits(ys, yt, n_splits=4, seed=8, pair=("a", "b"))
    # A split does not depend on how many splits are drawn.
    d = draw_splits(ys, yt, n_splits=2, seed=7, pair=("a", "b"))
    for x, y, z in zip(a, b, d, strict=False):
        np.testing.assert_array_equal(x.target_order, y.target_order)
        np.testing.assert_array_equal(x.source_train, y.source_train)
        np.testing.assert_array_equal(x.target_order, z.target_order)
    assert not np.array_equal(a[0].target_pool, c[0].target_pool)
    assert not np.array_equal(a[0].target_pool, a[1].target_pool)


def test_labelled_subsets_are_nested_and_from_the_pool():
    yt = _labels([30, 40, 25])
    (s,) = draw_splits(_labels([10, 10, 10]), yt, n_splits=1, seed=0, pair=("a", "b"))
    prev = np.zeros(0, dtype=int)
    for n in (1, 2, 3, 5, 10):
        sub = labelled_subset(s, yt, n)
        assert np.isin(sub, s.target_pool).all()
        assert not np.isin(sub, s.target_test).any()
        assert np.isin(prev, sub).all()
        assert all(np.sum(yt[sub] == k) == n for k in (1, 2, 3))
        prev = sub
    with pytest.raises(ValueError, match="only 12 target training samples"):
        labelled_subset(s, yt, 13)


def test_source_per_class_caps_source_training():
    ys = _labels([40, 50])
    (s,) = draw_splits(ys, _labels([9, 9]), n_splits=1, seed=0, pair=("a", "b"), source_per_class=8)
    assert [np.sum(ys[s.source_train] == k) for k in (1, 2)] == [8, 8]


def test_group_protocol_keeps_groups_on_one_side():
    rng = np.random.default_rng(1)
    # 41 "videos" of target frames, each of one class, 3-12 frames each.
    sizes = rng.integers(3, 13, size=41)
    groups = np.repeat(np.arange(41), sizes)
    yt = np.repeat(rng.integers(1, 3, size=41), sizes)
    gs = np.arange(200)
    ys = _labels([100, 100])
    splits = draw_splits(
        ys,
        yt,
        n_splits=5,
        seed=0,
        pair=("a", "b"),
        protocol="group",
        groups_source=gs,
        groups_target=groups,
    )
    for s in splits:
        check_disjoint(s, groups)
        assert not np.intersect1d(groups[s.target_pool], groups[s.target_test]).size
        frac = s.target_pool.size / yt.size
        assert 0.3 < frac < 0.7
    with pytest.raises(ValueError, match="group identifiers"):
        draw_splits(ys, yt, n_splits=1, seed=0, pair=("a", "b"), protocol="group")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=2, max_size=30), st.integers(0, 2**31 - 1))
def test_group_half_never_leaks(group_sizes, seed):
    groups = np.repeat(np.arange(len(group_sizes)), group_sizes)
    y = np.repeat(np.arange(len(group_sizes)) % 2, group_sizes)
    train, test = group_half(y, groups, np.random.default_rng(seed))
    assert np.union1d(train, test).size == y.size
    assert not np.intersect1d(groups[train], groups[test]).size


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=6), st.integers(0, 2**31 - 1))
def test_stratified_half_partitions(counts, seed):
    y = _labels(counts)
    train, test = stratified_half(y, np.random.default_rng(seed))
    assert not np.intersect1d(train, test).size
    assert np.union1d(train, test).size == y.size


def test_fixed_splits_are_checked():
    entries = [{"source_train": [0, 1], "target_train": [0, 1], "target_test": [2, 3]}]
    (s,) = fixed_splits(entries, seed=0, pair=("a", "b"), n_source=5, n_target=4)
    assert sorted(s.target_order) == [0, 1]
    bad = [{"source_train": [0], "target_train": [0, 2], "target_test": [2, 3]}]
    with pytest.raises(ValueError, match="share samples"):
        fixed_splits(bad, seed=0, pair=("a", "b"), n_source=5, n_target=4)
    with pytest.raises(ValueError, match="0-based"):
        fixed_splits(
            [{"source_train": [9], "target_train": [0], "target_test": [1]}],
            seed=0,
            pair=("a", "b"),
            n_source=5,
            n_target=4,
        )
