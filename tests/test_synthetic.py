"""Synthetic paper-scale generator: seeded, shard by shard, with class and device structure."""

from __future__ import annotations

import argparse
import tracemalloc

import numpy as np
import pytest

from mmdtl2_dist.commands import synth as synth_cmd
from mmdtl2_dist.store import FeatureStore, SyntheticSpec, make_synthetic_store
from mmdtl2_dist.store.synthetic import CONV3_DIM, CONV5_DIM, synthetic_features

SMALL = dict(n_source=120, n_target=60, dim=600, seed=3)


def test_seeded_and_layout_independent(tmp_path):
    a = make_synthetic_store(tmp_path / "a", SyntheticSpec(**SMALL))
    b = make_synthetic_store(tmp_path / "b", SyntheticSpec(**SMALL), chunk_rows=16)
    c = make_synthetic_store(tmp_path / "c", SyntheticSpec(**{**SMALL, "seed": 4}))
    assert a.fingerprint == b.fingerprint != c.fingerprint
    assert np.array_equal(a.read("target", "conv3"), b.read("target", "conv3"))


def test_in_memory_features_are_the_stored_ones(tmp_path):
    spec = SyntheticSpec(**SMALL, target_dim=250)
    fs = make_synthetic_store(tmp_path / "s", spec)
    for index, device, space in ((0, "source", "conv3"), (1, "target", "conv5")):
        X, y = synthetic_features(spec, index, dtype=np.float64)
        assert X.dtype == np.float64 and np.array_equal(X, fs.read(device, space))
        md = fs.metadata[fs.metadata.device == device].sort_values("row")
        assert np.array_equal(y, md["label"].to_numpy())


def test_cnn_like_with_class_structure_and_groups(tmp_path):
    fs = make_synthetic_store(tmp_path / "s", SyntheticSpec(**SMALL))
    X = fs.read("source", "conv3").astype(np.float64)
    md = fs.metadata[fs.metadata.device == "source"]
    y = md["label"].to_numpy()
    assert X.min() >= 0 and 0.3 < np.mean(X == 0) < 0.9  # sparse, non-negative (post-ReLU)
    assert np.bincount(y).min() >= 120 // 3 - 1  # balanced classes
    # groups (patients) nest in classes
    assert (md.groupby("group")["label"].nunique() == 1).all()
    # classes are separable: nearest class mean (leave-in) beats chance by far
    means = np.stack([X[y == k].mean(0) for k in range(3)])
    pred = np.argmin(((X[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    assert np.mean(pred == y) > 0.8


def test_shift_controls_the_device_gap(tmp_path):
    gaps = []
    for shift in (0.0, 1.0, 3.0):
        fs = make_synthetic_store(tmp_path / f"s{shift}", SyntheticSpec(**SMALL, shift=shift))
        Xs, Xt = fs.read("source", "conv3"), fs.read("target", "conv3")
        gaps.append(np.linalg.norm(Xs.mean(0) - Xt.mean(0)) / np.linalg.norm(Xs.mean(0)))
    assert gaps[0] < 0.3 < gaps[1] < gaps[2]  # shift 0: sampling noise only


def test_heterogeneous_target_space(tmp_path):
    fs = make_synthetic_store(tmp_path / "h", SyntheticSpec(**SMALL, target_dim=250))
    assert fs.spaces == ["conv3", "conv5"]
    assert fs.shape("source", "conv3") == (120, 600) and fs.shape("target", "conv5") == (60, 250)


def test_written_shard_by_shard(tmp_path):
    spec = SyntheticSpec(n_source=6000, n_target=0, dim=5000, seed=1)  # 120 MB of float32
    tracemalloc.start()
    make_synthetic_store(tmp_path / "m", spec)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 0.4 * 6000 * 5000 * 4, f"peak {peak / 2**20:.0f} MB"


def test_paper_sizes(tmp_path):
    fs = make_synthetic_store(tmp_path / "p", SyntheticSpec(target_dim=CONV5_DIM))
    assert fs.shape("source", "conv3") == (734, CONV3_DIM)
    assert fs.shape("target", "conv5") == (279, CONV5_DIM)
    assert fs.array("source", "conv3").chunks == (256, 4056)


def test_cli_synth(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    synth_cmd.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "synth",
            str(tmp_path / "c"),
            "--n-source",
            "40",
            "--n-target",
            "20",
            "--dim",
            "50",
            "--shift",
            "0.5",
            "--seed",
            "7",
        ]
    )
    assert args.func(args) == 0
    assert "fingerprint" in capsys.readouterr().out
    assert FeatureStore.open(tmp_path / "c").shape("target", "conv3") == (20, 50)
    with pytest.raises(ValueError, match="n_source"):
        SyntheticSpec(n_source=0)
