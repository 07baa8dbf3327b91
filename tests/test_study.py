"""Studies end to end on a real local Ray, real Zarr stores and a real SQLite MLflow store.

The tiny store holds two devices in one 20-d space; the methods are the core's source and
target SVMs and MMDTL2 (one column with its parameters chosen by cross-validation on the
labelled target samples) and skada's CORAL.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from mmdtl2_dist.store.feature_store import StoreWriter
from mmdtl2_dist.study.runner import build_plan, report_study, resume_study, run_study
from mmdtl2_dist.study.spec import SpecError, load_spec, parse_spec


def make_store(path, n=(60, 45), dim=20, seed=0, shift=1.0):
    rng = np.random.default_rng(seed)
    mu = rng.normal(size=(3, dim)) * 0.8
    with StoreWriter(path, overwrite=True) as w:
        for d, (dev, m) in enumerate(zip(("cam_a", "cam_b"), n, strict=True)):
            y = np.arange(m) % 3 + 1
            X = mu[y - 1] + rng.normal(size=(m, dim)) + d * shift * rng.normal(size=dim)
            a = w.create_array(dev, "f", m, dim, dtype=np.float64)
            a.append(X)
            a.set_metadata(label=y, group=[f"{dev}-g{i // 3}" for i in range(m)])
    return path


SPEC = """
[study]
name = "tiny"
seed = 1
[data]
store = "store.zarr"
space = "f"
pairs = [["cam_a", "cam_b"]]
preprocessing = "l2_zscore"
[splits]
protocol = "{protocol}"
n_splits = 4
samples_per_class = [1, 3]
[[methods]]
label = "targetSVM"
method = "target_svm"
[[methods]]
label = "sourceSVM"
method = "source_svm"
[[methods]]
label = "MMDTL2 CV"
method = "mmdtl2"
params = {{ qp_solver = "osqp", qp_tol = 1e-6 }}
select = {{ c_d = [0.1, 1.0] }}
[[methods]]
label = "CORAL"
method = "coral_svm"
"""


def write_spec(tmp_path, protocol="half", extra=""):
    if not (tmp_path / "store.zarr").exists():
        make_store(tmp_path / "store.zarr")
    p = tmp_path / "spec.toml"
    p.write_text(SPEC.format(protocol=protocol) + textwrap.dedent(extra))
    return p


# -- spec validation (no Ray) -----------------------------------------------------------


def _raw(**over):
    raw = {
        "study": {"name": "s"},
        "data": {"builtin": "office_caltech10", "space": "surf800", "pairs": "all"},
        "splits": {"protocol": "fixed", "samples_per_class": [1, 3]},
        "methods": [{"method": "mmdtl2", "params": {"kernel": "rbf"}}],
    }
    for k, v in over.items():
        raw[k] = v
    return raw


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"methods": [{"method": "svm"}]}, "unknown method 'svm'"),
        ({"methods": [{"method": "mmdtl2", "params": {"c_f": -1}}]}, "c_f must be a positive"),
        ({"methods": [{"method": "mmdtl2", "params": {"cf": 1}}]}, "no parameter 'cf'"),
        ({"methods": [{"method": "mmdtl2", "grid": {"c_f": 0.1}}]}, "non-empty list"),
        ({"methods": [{"method": "mmdtl2", "grid": {"c_f": []}}]}, "non-empty list"),
        ({"methods": [{"method": "mmdtl2"}, {"method": "mmdtl2"}]}, "used twice"),
        (
            {"methods": [{"method": "mmdtl2", "grid": {"c_f": [1]}, "select": {"c_f": [1]}}]},
            "both swept",
        ),
        ({"data": {"store": "/nonexistent.zarr", "space": "f", "pairs": "all"}}, "does not exist"),
        (
            {
                "data": {
                    "builtin": "office_caltech10",
                    "source_space": "a",
                    "target_space": "b",
                    "pairs": "all",
                },
                "methods": [{"method": "source_svm"}],
            },
            "need source and target in one feature space",
        ),
        ({"splits": {"samples_per_class": [0, 1]}}, "contains 0"),
        ({"splits": {"samples_per_class": []}}, "non-empty list"),
        ({"splits": {"protocol": "random", "samples_per_class": [1]}}, "protocol must be"),
        (
            {"data": {"builtin": "office_caltech10", "space": "x", "pairs": [["a", "a"]]}},
            "pairs must be",
        ),
        ({"extra": {}}, "unknown key"),
        ({"study": {"name": "a/b"}}, "name must be"),
    ],
)
def test_spec_errors_name_the_problem(over, match):
    with pytest.raises(SpecError, match=match):
        parse_spec(_raw(**over))


def test_spec_grid_expands_to_configs_and_trials(tmp_path):
    raw = _raw(
        methods=[
            {
                "label": "L2",
                "method": "mmdtl2",
                "grid": {"c_f": [1e-3, 10.0]},
                "select": {"c_d": [0.1, 1.0]},
            },
            {"method": "target_svm"},
        ]
    )
    spec = parse_spec(raw, output=tmp_path)
    assert [c.label for c in spec.configs()] == ["L2 [c_f=0.001]", "L2 [c_f=10]", "target_svm"]
    keys = [t.key for t in spec.trials()]
    assert len(keys) == 6 and len(set(keys)) == 6
    assert keys == [t.key for t in parse_spec(raw, output=tmp_path).trials()]


def test_bundled_specs_validate():
    from pathlib import Path

    for p in sorted(Path(__file__).resolve().parents[1].glob("studies/*.toml")):
        spec = load_spec(p)
        assert spec.trials()


def test_yaml_spec(tmp_path):
    make_store(tmp_path / "store.zarr")
    (tmp_path / "s.yaml").write_text(
        "study: {name: y}\ndata: {store: store.zarr, space: f, pairs: [[cam_a, cam_b]]}\n"
        "splits: {samples_per_class: [1]}\nmethods: [{method: target_svm}]\n"
    )
    assert load_spec(tmp_path / "s.yaml").store == (tmp_path / "store.zarr").resolve()
    (tmp_path / "bad.yaml").write_text("study: [")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(tmp_path / "bad.yaml")


# -- end to end -------------------------------------------------------------------------


def _table(folder):
    t = pd.read_csv(folder / "report" / "table.csv")
    return t.sort_values(["pair", "n_per_class", "label"]).reset_index(drop=True)


@pytest.mark.slow  # about 45-90 s on 2 busy cores
@pytest.mark.ray
@pytest.mark.mlflow
def test_study_runs_reports_and_tracks(tmp_path, ray_local, mlflow_sqlite):
    spec = load_spec(write_spec(tmp_path), output=tmp_path / "out")
    rep = run_study(spec, tracking_uri=mlflow_sqlite["tracking_uri"], progress=False)
    out = tmp_path / "out"
    for name in ("report.md", "table.csv", "results.csv", "accuracy_vs_n_cam_a_cam_b.png"):
        assert (out / "report" / name).stat().st_size > 0
    assert "| n_per_class | targetSVM | sourceSVM | MMDTL2 CV | CORAL |" in rep["summary"]
    table = _table(out)
    assert set(table["n_splits"]) == {4} and len(table) == 8
    assert ((table["mean"] > 40) & (table["mean"] <= 100)).all()
    # The CV column reports what it chose (n = 1 cannot be cross-validated: first value).
    chosen = pd.read_csv(out / "report" / "chosen_params.csv")
    assert set(chosen["label"]) == {"MMDTL2 CV"} and set(chosen["n_per_class"]) == {1, 3}
    assert "chosen by cross-validation" in (out / "report" / "report.md").read_text()

    client = MlflowClient(mlflow_sqlite["tracking_uri"])
    exp = client.get_experiment_by_name("mmdtl2-tiny")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("mmdtl2_role") == "parent"]
    children = [r for r in runs if r.data.tags.get("mmdtl2_role") == "trial"]
    assert len(parents) == 1 and len(children) == len(spec.trials()) == 8
    c = children[0]
    assert c.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
    assert {"split_seed", "data_fingerprint", "code_version"} <= set(c.data.tags)
    assert "accuracy" in c.data.metrics and "accuracy_class/1" in c.data.metrics
    arts = {a.path for a in client.list_artifacts(parents[0].info.run_id, "report")}
    assert "report/report.md" in arts and "report/accuracy_vs_n_cam_a_cam_b.png" in arts

    # The plan: splits are disjoint; the Gram was computed once and is reused.
    plan = json.loads((out / "study.json").read_text())
    assert plan["spec_fingerprint"] == spec.fingerprint()
    # Running again does nothing new: same report, still one run per trial.
    run_study(spec, tracking_uri=mlflow_sqlite["tracking_uri"], progress=False)
    pd.testing.assert_frame_equal(_table(out), table)
    runs = client.search_runs([exp.experiment_id])
    assert len([r for r in runs if r.data.tags.get("mmdtl2_role") == "trial"]) == 8

    # Interrupted after 2 trials, then resumed: the same report, one run per trial.
    spec2 = load_spec(write_spec(tmp_path), output=tmp_path / "out2")
    uri2 = f"sqlite:///{tmp_path / 'out2.db'}"
    run_study(spec2, tracking_uri=uri2, progress=False, max_trials=2)
    assert len(list((tmp_path / "out2" / "results").glob("*.json"))) == 2
    part = report_study(tmp_path / "out2", tracking_uri=uri2, progress=False)
    assert len(part["missing"]) == 6
    resume_study(tmp_path / "out2", tracking_uri=uri2, progress=False)
    pd.testing.assert_frame_equal(_table(tmp_path / "out2"), table)
    c2 = MlflowClient(uri2)
    runs2 = c2.search_runs([c2.get_experiment_by_name("mmdtl2-tiny").experiment_id])
    keys = [
        r.data.tags["mmdtl2_trial_key"] for r in runs2 if r.data.tags.get("mmdtl2_role") == "trial"
    ]
    assert sorted(keys) == sorted(t.key for t in spec.trials())


@pytest.mark.ray
def test_group_protocol_plan_and_errors(tmp_path, ray_local):
    from mmdtl2_dist.study.runner import compute_grams, prepare_data

    spec = load_spec(write_spec(tmp_path, protocol="group"), output=tmp_path / "g")
    store, split_file = prepare_data(spec)
    grams = compute_grams(spec, store, address=None, progress=False)
    plan = build_plan(spec, store, split_file, grams)
    from mmdtl2_dist.store.feature_store import FeatureStore

    meta = FeatureStore.open(store).metadata
    g = meta[meta.device == "cam_b"].sort_values("row")["group"].to_numpy()
    for sp in plan.pairs[0].splits:
        assert not set(g[sp.target_pool]) & set(g[sp.target_test])
    # Too many labelled samples per class for the training half: a clear error.
    raw = dict(spec.raw, splits={**spec.raw["splits"], "samples_per_class": [1, 30]})
    big = parse_spec(raw, spec.path, output=tmp_path / "g")
    with pytest.raises(
        ValueError, match="class 1 has only 7 target training samples but 30 per class"
    ):
        build_plan(big, store, split_file, grams)
    raw = dict(spec.raw, data={**spec.raw["data"], "pairs": [["cam_a", "cam_z"]]})
    with pytest.raises(ValueError, match="cam_z"):
        build_plan(parse_spec(raw, spec.path, output=tmp_path / "g"), store, split_file, grams)


@pytest.mark.ray
def test_units_call_the_core_with_cv_and_test_gram(tmp_path, ray_local):
    """A unit slices Kqq for mmdt_hoffman, and `select` goes through select_by_cv."""
    from mmdtl2_dist.core.methods import GramProblem, fit_predict
    from mmdtl2_dist.core.selection import select_by_cv
    from mmdtl2_dist.study.runner import compute_grams, prepare_data
    from mmdtl2_dist.study.trial import _core_problem, evaluate_unit, unit_blocks

    spec = load_spec(write_spec(tmp_path), output=tmp_path / "u")
    store, split_file = prepare_data(spec)
    grams = compute_grams(spec, store, address=None, progress=False)
    plan = build_plan(spec, store, split_file, grams)
    pair, split = plan.pairs[0], plan.pairs[0].splits[0]
    blocks, _ = unit_blocks(plan, pair, split, 3, need_qq=True)
    q = blocks.yq.size
    assert blocks.Kqq.shape == (q, q) and np.allclose(np.diag(blocks.Kqq), blocks.sq_q)

    trial = {"method": "mmdt_hoffman", "params": {"pca_dim": 5}, "n_per_class": 3}
    u = evaluate_unit(plan, pair, split, trial)
    assert 0 <= u["accuracy"] <= 1 and u["chosen"] == {}

    select = {"c_d": [0.1, 1.0], "gamma": ["auto", 0.5]}
    params = {"kernel": "rbf", "qp_solver": "osqp", "qp_tol": 1e-6}
    trial = {"method": "mmdtl2", "params": params, "select": select, "n_per_class": 3}
    u = evaluate_unit(plan, pair, split, trial)
    # The same choice as calling the core directly on the unit's blocks.
    grid = [{**params, "c_d": c, "gamma": g} for c in (0.1, 1.0) for g in (None, 0.5)]
    best, table = select_by_cv("mmdtl2", grid, _core_problem(blocks))
    assert u["chosen"] == {"c_d": best["c_d"], "gamma": best["gamma"] or "auto"}
    assert u["cv_accuracy"] == max(r["cv_accuracy"] for r in table)
    direct = fit_predict(
        "mmdtl2",
        best,
        GramProblem(
            **{
                k: getattr(blocks, k)
                for k in ("ys", "yt", "Kss", "Ktt", "Ktq", "sq_q", "Kst", "Ksq")
            }
        ),
    )
    assert u["accuracy"] == pytest.approx(float(np.mean(direct.y_pred == blocks.yq)))


def test_spec_params_are_the_cores():
    from mmdtl2_dist.core.methods import DEFAULTS
    from mmdtl2_dist.study.spec import CORE_METHODS, core_params, param_rules

    assert set(CORE_METHODS) == set(DEFAULTS)
    for m in CORE_METHODS:
        assert set(param_rules(m)) == set(DEFAULTS[m])
    with pytest.raises(SpecError, match="no parameter 'kernel'"):
        parse_spec(_raw(methods=[{"method": "mmdt", "params": {"kernel": "rbf"}}]))
    with pytest.raises(SpecError, match="qp_solver must be one of"):
        parse_spec(_raw(methods=[{"method": "mmdt", "params": {"qp_solver": "cvx"}}]))
    with pytest.raises(SpecError, match='pca_dim must be a positive integer or "none"'):
        parse_spec(_raw(methods=[{"method": "mmdt_hoffman", "params": {"pca_dim": 0}}]))
    assert core_params({"gamma": "auto", "pca_dim": "none", "c_f": 1.0}) == {
        "gamma": None,
        "pca_dim": None,
        "c_f": 1.0,
    }


def test_bundled_specs_use_core_parameter_names():
    """Every method and parameter name in studies/*.toml is one the core (or skada) takes."""
    from pathlib import Path

    from mmdtl2_dist.core.methods import DEFAULTS
    from mmdtl2_dist.study.spec import EXTRA_PARAMS

    for p in sorted(Path(__file__).resolve().parents[1].glob("studies/*.toml")):
        for m in load_spec(p).methods:
            names = set(m.params) | set(m.grid) | set(m.select)
            allowed = DEFAULTS.get(m.method) or EXTRA_PARAMS[m.method]
            assert names <= set(allowed), (p.name, m.label, names - set(allowed))


def test_cpu_accounting_splits_capacity():
    from mmdtl2_dist.study.runner import cpu_accounting

    # 2 CPUs for 10 s; trial A 1-6 s (1 CPU), trial B 2-9 s (1 CPU), trial C 6.5-8 s.
    acc = cpu_accounting([(1, 6, 1), (2, 9, 1), (6.5, 8, 1)], 0.0, 10.0, 2)
    assert acc["capacity_cpu_s"] == 20
    assert acc["in_trials_cpu_s"] == pytest.approx(5 + 7 + 1.5)
    # Idle before C started (6.5 s): 2 (0-1) + 1 (1-2) + 0.5 (6-6.5).
    assert acc["scheduling_idle_cpu_s"] == pytest.approx(3.5)
    assert acc["tail_idle_cpu_s"] == pytest.approx(20 - 13.5 - 3.5)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.mlflow
def test_cli_study_interrupted_and_resumed_matches_uninterrupted(tmp_path):
    """`mmdtl2 study run` interrupted (Ctrl-C) mid-way, then `study resume`: the same
    report as an uninterrupted run and one MLflow run per trial."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = write_spec(
        tmp_path,
        extra="""
        [[methods]]
        label = "SA"
        method = "sa_svm"
        params = { n_components = 5 }
        """,
    )
    env = {**os.environ, "PYTHONPATH": str(root), "RAY_USAGE_STATS_ENABLED": "0"}
    cli = [sys.executable, "-m", "mmdtl2_dist.cli", "study"]

    def run(*args, **kw):
        return subprocess.run(
            cli + list(args), env=env, capture_output=True, text=True, timeout=300, **kw
        )

    full = run("run", str(spec), "--output", str(tmp_path / "full"), "--num-cpus", "2")
    assert full.returncode == 0, full.stderr[-2000:]
    assert "| n_per_class | targetSVM | sourceSVM | MMDTL2 CV | CORAL | SA |" in full.stdout

    part = tmp_path / "part"
    proc = subprocess.Popen(
        cli + ["run", str(spec), "--output", str(part), "--num-cpus", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.time() + 240
    while time.time() < deadline:
        if (
            len(list((part / "results").glob("*.json"))) >= 2
            if (part / "results").exists()
            else False
        ):
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    n_done = len(list((part / "results").glob("*.json")))
    assert n_done < 10, "the study finished before it could be interrupted"
    res = run("resume", str(part), "--num-cpus", "2")
    assert res.returncode == 0, res.stderr[-2000:]
    pd.testing.assert_frame_equal(_table(part), _table(tmp_path / "full"))
    client = MlflowClient(f"sqlite:///{part / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("mmdtl2-tiny").experiment_id])
    keys = [
        r.data.tags["mmdtl2_trial_key"] for r in runs if r.data.tags.get("mmdtl2_role") == "trial"
    ]
    assert len(keys) == len(set(keys)) == 10
