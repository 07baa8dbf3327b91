"""Studies on stores with unlabelled samples (label -1): splits, pools, refusals, results.

The stores are real Zarr stores: :func:`make_store`'s labelled samples (the same
features, labels and groups, in the same order) with unlabelled samples inserted among
them, some in the labelled samples' groups and some in groups of their own
(``session_<k>``).
"""

from __future__ import annotations

import hashlib
import json
import re
import textwrap

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from test_study import _raw

from mmdtl2_dist.store.feature_store import StoreWriter
from mmdtl2_dist.study.plan import PairPlan, PlanError, StudyPlan, load_plan, save_plan
from mmdtl2_dist.study.pools import unlabelled_pool
from mmdtl2_dist.study.preparation import check_data
from mmdtl2_dist.study.spec import SpecError, load_spec, parse_spec
from mmdtl2_dist.study.splits import draw_splits, labelled_subset

SPLIT_FIELDS = ("source_train", "target_pool", "target_test", "target_order")


def make_store(path, n=(60, 45), unlabelled=(0, 0), dim=20, seed=0, shift=1.0):
    """Two devices, three classes; ``unlabelled[d]`` samples labelled -1 added to device d."""
    rng, extra = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    mu = rng.normal(size=(3, dim)) * 0.8
    with StoreWriter(path, overwrite=True) as w:
        for d, (dev, m, u) in enumerate(zip(("cam_a", "cam_b"), n, unlabelled, strict=True)):
            y = np.arange(m) % 3 + 1
            offset = d * shift * rng.normal(size=dim)
            X = mu[y - 1] + rng.normal(size=(m, dim)) + offset
            groups = np.array([f"{dev}-g{i // 3}" for i in range(m)], dtype=object)
            Xu = mu[np.arange(u) % 3] + extra.normal(size=(u, dim)) + offset
            gu = [
                f"{dev}-g{k % max(m // 3, 1)}" if k % 2 else f"session_{k // 2 % 4}"
                for k in range(u)
            ]
            at = np.sort(extra.integers(0, m + 1, size=u))
            a = w.create_array(dev, "f", m + u, dim, dtype=np.float64)
            a.append(np.insert(X, at, Xu, axis=0))
            a.set_metadata(
                label=np.insert(y, at, -1),
                group=np.insert(groups, at, np.asarray(gu, object)).tolist(),
            )
    return path


SPEC = """
[study]
name = "unl"
seed = 2
[data]
store = "{store}"
space = "f"
pairs = {pairs}
preprocessing = "l2"
[splits]
protocol = "{protocol}"
n_splits = 3
samples_per_class = [3]
{splits}
[[methods]]
label = "targetSVM"
method = "target_svm"
[[methods]]
label = "sourceSVM"
method = "source_svm"
"""
PAIR = '[["cam_a", "cam_b"]]'


def write_spec(folder, store, protocol="half", splits="", methods="", pairs=PAIR):
    folder.mkdir(exist_ok=True)
    p = folder / "spec.toml"
    text = SPEC.format(store=store, protocol=protocol, splits=splits, pairs=pairs)
    p.write_text(text + textwrap.dedent(methods))
    return p


def _split_file(path, store):
    """Half splits of the labelled samples of ``store`` as a split file (protocol fixed)."""
    from mmdtl2_dist.store.feature_store import FeatureStore

    meta = FeatureStore.open(store).metadata.sort_values("row")
    ys, yt = (meta[meta.device == d]["label"].to_numpy() for d in ("cam_a", "cam_b"))
    entries = [
        {
            "source_train": s.source_train.tolist(),
            "target_train": s.target_pool.tolist(),
            "target_test": s.target_test.tolist(),
        }
        for s in draw_splits(ys, yt, n_splits=3, seed=5, pair=("cam_a", "cam_b"))
    ]
    path.write_text(json.dumps({"pairs": {"cam_a->cam_b": entries}}))
    return path


@pytest.mark.parametrize("protocol", ["half", "group", "fixed"])
def test_unlabelled_rows_leave_the_labelled_splits_unchanged(tmp_path, protocol):
    """The same splits as the store without its unlabelled rows, at the new positions;
    the unlabelled target rows are on the training side (group: outside test groups)."""
    a = make_store(tmp_path / "a.zarr")
    b = make_store(tmp_path / "b.zarr", unlabelled=(7, 40))
    split_file = _split_file(tmp_path / "splits.json", a) if protocol == "fixed" else None
    extra = 'file = "../splits.json"' if split_file else ""
    specs = [load_spec(write_spec(tmp_path / s, f"../{s}.zarr", protocol, extra)) for s in "ab"]
    pa, pb = (check_data(sp, st, split_file)[0] for sp, st in zip(specs, (a, b), strict=True))
    ls, lt = np.flatnonzero(pb.y_source >= 0), np.flatnonzero(pb.y_target >= 0)
    np.testing.assert_array_equal(pb.y_target[lt], pa.y_target)
    unl = np.flatnonzero(pb.y_target < 0)
    assert (pb.n_unlabelled_source, unl.size, pa.n_unlabelled_source) == (7, 40, 0)
    for sa, sb in zip(pa.splits, pb.splits, strict=True):
        for f in SPLIT_FIELDS:
            where = ls if f == "source_train" else lt
            np.testing.assert_array_equal(getattr(sb, f), where[getattr(sa, f)])
        expected = unl
        if protocol == "group":
            test_groups = pb.target_groups[sb.target_test]
            expected = unl[~np.isin(pb.target_groups[unl], test_groups)]
            assert 0 < expected.size < unl.size
        np.testing.assert_array_equal(sb.target_unlabelled, expected)
        assert sa.target_unlabelled.size == 0


def test_named_pool_holds_the_named_groups_only(tmp_path):
    """{groups}: the mode's samples of the named groups with the labelled ones; a labelled
    test sample of a named group only under "all"."""
    store = make_store(tmp_path / "b.zarr", unlabelled=(0, 40))
    pair = check_data(load_spec(write_spec(tmp_path / "s", "../b.zarr")), store, None)[0]
    split = pair.splits[0]
    labelled = split.target_order[:3]
    named = sorted({str(pair.target_groups[split.target_test[0]]), "session_2"})
    in_named = np.isin(pair.target_groups, named)
    unl = pair.y_target < 0
    for mode in ("non-test", "all"):
        pool = unlabelled_pool(pair, split, labelled, {"groups": named, "mode": mode})
        others = np.setdiff1d(pool, labelled)
        assert in_named[others].all() and np.isin(labelled, pool).all()
        assert np.isin(np.flatnonzero(unl & in_named), pool).all()
        test_named = split.target_test[in_named[split.target_test]]
        seen = np.isin(test_named, pool)
        assert test_named.size and (seen.all() if mode == "all" else not seen.any())
    non_test = np.union1d(split.target_pool, np.flatnonzero(unl))
    np.testing.assert_array_equal(unlabelled_pool(pair, split, labelled, "non-test"), non_test)
    every = np.union1d(non_test, split.target_test)
    np.testing.assert_array_equal(unlabelled_pool(pair, split, labelled, "all"), every)
    np.testing.assert_array_equal(unlabelled_pool(pair, split, labelled, "none"), np.sort(labelled))


def test_spec_named_pool_reaches_the_trials_and_its_errors_name_the_fix():
    methods = [
        {"label": "auto", "method": "mmdtl2", "select": "auto"},
        {
            "label": "s7",
            "method": "mmdtl2",
            "select": "auto",
            "unlabelled": {"groups": ["s8", "s7"]},
        },
    ]
    spec = parse_spec(_raw(methods=methods, splits={"samples_per_class": [3]}))
    pools = [t.unlabelled for t in spec.trials()]
    assert pools == ["non-test", {"groups": ["s7", "s8"], "mode": "non-test"}]
    assert len({t.key for t in spec.trials()}) == 2
    raw = _raw(splits={"samples_per_class": [3], "unlabelled": {"groups": ["s7"], "mode": "all"}})
    assert parse_spec(raw).trials()[0].unlabelled == {"groups": ["s7"], "mode": "all"}
    for bad in ({"groups": []}, {"groups": ["s7"], "mode": "none"}, {"group": ["s7"]}):
        with pytest.raises(SpecError, match=r"\[splits\] unlabelled must be one of .* named pool"):
            parse_spec(_raw(splits={"samples_per_class": [3], "unlabelled": bad}))


NAMED = """
[[methods]]
label = "auto named"
method = "mmdtl2"
select = "auto"
unlabelled = {{ groups = [{groups}] }}
"""
REFUSALS = [
    pytest.param(
        {"unlabelled": (0, 10), "n": (60, 0)},
        "",
        PAIR,
        r"cam_a->cam_b: target device 'cam_b' has no labelled sample \(10 samples, all "
        r"labelled -1\)",
        id="no_labelled_target",
    ),
    pytest.param(
        {"unlabelled": (0, 300), "n": (60, 9)},
        "",
        PAIR,
        r"target device 'cam_b' has too few labelled samples: class 1 has 3, class 2 has 3, "
        r"class 3 has 3; the study asks 3 labelled per class plus 1 to test \(4\)",
        id="few_labelled_target",
    ),
    pytest.param(
        {"unlabelled": (0, 40)},
        NAMED.format(groups='"session_1", "session_9"'),
        PAIR,
        r"method 'auto named': unlabelled names groups \['session_9'\] that no target device "
        r"of the study has",
        id="unknown_group",
    ),
    pytest.param(
        {"unlabelled": (0, 40)},
        NAMED.format(groups='"cam_b-g1"'),
        '[["cam_a", "cam_b"], ["cam_b", "cam_a"]]',
        r"none of the unlabelled groups \['cam_b-g1'\] is a group of target device 'cam_a'",
        id="group_not_on_a_target",
    ),
]


@pytest.mark.parametrize(("store_kw", "methods", "pairs", "match"), REFUSALS)
def test_validate_refuses_what_unlabelled_data_cannot_serve(
    tmp_path, capsys, store_kw, methods, pairs, match
):
    from mmdtl2_dist.cli import main

    make_store(tmp_path / "b.zarr", **store_kw)
    spec = write_spec(tmp_path / "s", "../b.zarr", methods=methods, pairs=pairs)
    assert main(["study", "validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert re.search(match, err), err


def test_validate_notes_the_unlabelled_source_samples_left_out(tmp_path, capsys):
    from mmdtl2_dist.cli import main

    make_store(tmp_path / "b.zarr", unlabelled=(7, 40))
    spec = write_spec(tmp_path / "s", "../b.zarr", methods=NAMED.format(groups='"session_1"'))
    assert main(["study", "validate", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "7 unlabelled samples (label -1) of source device 'cam_a' are left out" in out


def _plan_of(pair, store="/s.zarr") -> StudyPlan:
    n_s, n_t = pair.y_source.size, pair.y_target.size
    p = PairPlan(
        "cam_a->cam_b", "cam_a", "cam_b", "/g", "/g", True, np.arange(n_s),
        np.arange(n_t) + n_s, np.arange(n_t) + n_s, pair.y_source, pair.y_target,
        pair.splits, store, "f", "f", pair.target_groups,
    )  # fmt: skip
    return StudyPlan("spec", "data", 2, [p])


def test_plan_keeps_unlabelled_samples_and_groups_and_refuses_them_as_labelled(tmp_path):
    store = make_store(tmp_path / "b.zarr", unlabelled=(7, 40))
    pair = check_data(load_spec(write_spec(tmp_path / "s", "../b.zarr")), store, None)[0]
    path = tmp_path / "plan.json"
    save_plan(_plan_of(pair), path)
    back = load_plan(path).pairs[0]
    np.testing.assert_array_equal(back.y_target, pair.y_target)
    np.testing.assert_array_equal(back.target_groups, pair.target_groups)
    for sa, sb in zip(pair.splits, back.splits, strict=True):
        for f in (*SPLIT_FIELDS, "target_unlabelled"):
            np.testing.assert_array_equal(getattr(sa, f), getattr(sb, f))
    unl = int(np.flatnonzero(pair.y_target < 0)[0])
    with np.load(path.with_suffix(".npz")) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["pair0.split0.target_test"] = np.r_[arrays["pair0.split0.target_test"], unl]
    np.savez(path.with_suffix(".npz"), **arrays)
    doc = json.loads(path.read_text())
    doc["arrays_sha256"] = hashlib.sha256(path.with_suffix(".npz").read_bytes()).hexdigest()
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanError, match=r"pair0.split0.target_test holds unlabelled samples"):
        load_plan(path)


@pytest.mark.ray
def test_unlabelled_rows_leave_the_accuracies_unchanged(tmp_path, ray_local):
    """Methods that use no unlabelled sample score the same with and without them."""
    from mmdtl2_dist.study.preparation import build_plan, compute_grams, prepare_data
    from mmdtl2_dist.study.trial import evaluate_unit

    acc = {}
    for name, unl in (("a", (0, 0)), ("b", (7, 40))):
        make_store(tmp_path / f"{name}.zarr", unlabelled=unl)
        spec = load_spec(write_spec(tmp_path / name, f"../{name}.zarr"), output=tmp_path / name)
        store, _ = prepare_data(spec)
        plan = build_plan(
            spec, store, None, compute_grams(spec, store, address=None, progress=False)
        )
        pair = plan.pairs[0]
        methods = (("target_svm", {}), ("source_svm", {}), ("mmdtl2", {"qp_solver": "osqp"}))
        trials = [{"method": m, "params": p, "select": {}, "n_per_class": 3} for m, p in methods]
        acc[name] = [
            evaluate_unit(plan, pair, s, t)["accuracy"] for t in trials for s in pair.splits
        ]
    assert acc["a"] == acc["b"]


AUTO = """
[[methods]]
label = "auto"
method = "mmdtl2"
select = "auto"
[[methods]]
label = "auto named"
method = "mmdtl2"
select = "auto"
unlabelled = { groups = ["session_1", "cam_b-g2"] }
[[methods]]
label = "CORAL"
method = "coral_svm"
"""


@pytest.mark.ray
def test_study_on_a_mostly_unlabelled_target_device_runs_and_records_its_pools(
    tmp_path, ray_local, mlflow_sqlite
):
    """select = "auto" with unlabelled = "non-test": the prior's pool is the source training
    samples, the labelled non-test and the unlabelled target samples; the named pool
    keeps its groups; every run records its pool."""
    from mmdtl2_dist.study.runner import run_study

    make_store(tmp_path / "b.zarr", unlabelled=(5, 200))
    spec = load_spec(write_spec(tmp_path / "s", "../b.zarr", methods=AUTO), output=tmp_path / "o")
    run_study(spec, tracking_uri=mlflow_sqlite["tracking_uri"], progress=False)
    res = pd.read_csv(tmp_path / "o" / "report" / "results.csv")
    pair = load_plan(tmp_path / "o" / "plan.json").pairs[0]
    assert int((pair.y_target < 0).sum()) == 200
    for s in pair.splits:
        units = res[res["split"] == s.index].set_index("label")
        pool = s.target_pool.size + s.target_unlabelled.size
        assert s.target_unlabelled.size == 200
        assert (
            units.loc["auto", "target_pool_size"] == pool == units.loc["CORAL", "target_pool_size"]
        )
        assert units.loc["auto", "pool_size"] == s.source_train.size + pool
        named = unlabelled_pool(
            pair, s, labelled_subset(s, pair.y_target, 3),
            {"groups": ["cam_b-g2", "session_1"], "mode": "non-test"},
        )  # fmt: skip
        assert units.loc["auto named", "target_pool_size"] == named.size < pool
        assert np.isnan(units.loc["targetSVM", "target_pool_size"])
    assert ((res["accuracy"] > 0.4) & (res["accuracy"] <= 1)).all()
    client = MlflowClient(mlflow_sqlite["tracking_uri"])
    runs = client.search_runs([client.get_experiment_by_name("mmdtl2-unl").experiment_id])
    trials = [r for r in runs if r.data.tags.get("mmdtl2_role") == "trial"]
    params = {r.data.params["label"]: r.data.params.get("unlabelled") for r in trials}
    assert params["auto"] == "non-test"
    assert json.loads(params["auto named"]) == {
        "groups": ["cam_b-g2", "session_1"],
        "mode": "non-test",
    }


def test_split_file_indices_count_the_labelled_samples_only(tmp_path, capsys):
    """A split file indexes the labelled samples: an index past them is refused, naming
    their number, even where the device has that many samples with the unlabelled ones."""
    from mmdtl2_dist.cli import main

    make_store(tmp_path / "b.zarr", unlabelled=(0, 40))
    entry = {
        "source_train": list(range(30)),
        "target_train": list(range(40)),
        "target_test": [44, 45],
    }
    (tmp_path / "splits.json").write_text(json.dumps({"pairs": {"cam_a->cam_b": [entry] * 3}}))
    spec = write_spec(tmp_path / "s", "../b.zarr", "fixed", 'file = "../splits.json"')
    assert main(["study", "validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "target_test indices must be 0-based positions among the device's 45 labelled" in err
