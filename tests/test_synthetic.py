"""Synthetic paper-scale generator: seeded, shard by shard, with class and device structure."""

from __future__ import annotations

import argparse
import tracemalloc

import numpy as np
import pytest

from mmdtl2_dist.commands import synth as synth_cmd
from mmdtl2_dist.core.methods import GramProblem, fit_predict
from mmdtl2_dist.core.preprocessing import fit_preprocessing
from mmdtl2_dist.store import FeatureStore, SyntheticSpec, make_synthetic_store
from mmdtl2_dist.store.synthetic import CONV3_DIM, CONV5_DIM, synthetic_features
from mmdtl2_dist.study.splits import draw_splits, labelled_subset

# Well-separated classes, so that the structure tests below see it through the noise.
SMALL = dict(n_source=120, n_target=60, dim=600, class_sep=1.5, seed=3)


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


def test_cli_defaults_are_the_python_defaults(tmp_path):
    parser = argparse.ArgumentParser()
    synth_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["synth", str(tmp_path / "d")])
    d = SyntheticSpec()
    given = {
        "n_source": args.n_source,
        "n_target": args.n_target,
        "n_classes": args.classes,
        "dim": args.dim,
        "target_dim": args.target_dim,
        "shift": args.shift,
        "class_sep": args.class_sep,
        "n_groups": args.groups,
        "noise": args.noise,
        "seed": args.seed,
        "source_device": args.source_device,
        "target_device": args.target_device,
        "space": args.space,
        "target_space": args.target_space,
    }
    assert given == {k: getattr(d, k) for k in given}


def _device(fs, device):
    X = fs.read(device, "conv3").astype(np.float64)
    m = fs.metadata[fs.metadata.device == device].sort_values("row")
    return fit_preprocessing(X, "l2_zscore").transform(X), m["label"].to_numpy()


def test_default_problem_is_one_where_the_source_device_matters(tmp_path):
    """On the default store (`mmdtl2 synth` without options), no method is near 100 %, and
    the labelled source samples are worth more than a few labelled target samples."""
    fs = make_synthetic_store(tmp_path / "d")
    (Xs, ys), (Xt, yt) = _device(fs, "source"), _device(fs, "target")
    acc = {"source_svm": [], "target_svm": [], "mmdtl2": []}
    for sp in draw_splits(ys, yt, n_splits=3, seed=0, pair=("source", "target")):
        t = labelled_subset(sp, yt, 3)
        prob = GramProblem.from_features(
            Xs[sp.source_train], ys[sp.source_train], Xt[t], yt[t], Xt[sp.target_test],
            test_gram=False,
        )  # fmt: skip
        for method in acc:
            pred = fit_predict(method, {}, prob).y_pred
            acc[method].append(np.mean(pred == yt[sp.target_test]))
    mean = {m: float(np.mean(a)) for m, a in acc.items()}
    assert all(0.4 < a < 0.9 for a in mean.values()), mean
    assert mean["source_svm"] > mean["target_svm"] + 0.08, mean
