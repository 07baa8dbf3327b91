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
from mmdtl2_dist.study.preparation import build_plan
from mmdtl2_dist.study.runner import report_study, resume_study, run_study
from mmdtl2_dist.study.spec import SpecError, load_spec, parse_spec


def make_store(path, n=(60, 45), dim=20, seed=0, shift=1.0, classes=(3, 3)):
    rng = np.random.default_rng(seed)
    mu = rng.normal(size=(3, dim)) * 0.8
    with StoreWriter(path, overwrite=True) as w:
        for d, (dev, m, k) in enumerate(zip(("cam_a", "cam_b"), n, classes, strict=True)):
            y = np.arange(m) % k + 1
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
        ({"methods": [{"method": "svm"}]}, r"method must be one of \('source_svm'.*got 'svm'"),
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
    from mmdtl2_dist.study.preparation import compute_grams, prepare_data

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
    raw = dict(spec.raw, splits={**spec.raw["splits"], "samples_per_class": [1, 10]})
    big = parse_spec(raw, spec.path, output=tmp_path / "g")
    with pytest.raises(
        ValueError, match="class 1 has only 7 target training samples but 10 per class"
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
    from mmdtl2_dist.study.preparation import compute_grams, prepare_data
    from mmdtl2_dist.study.trial import evaluate_unit, unit_problem

    spec = load_spec(write_spec(tmp_path), output=tmp_path / "u")
    store, split_file = prepare_data(spec)
    grams = compute_grams(spec, store, address=None, progress=False)
    plan = build_plan(spec, store, split_file, grams)
    pair, split = plan.pairs[0], plan.pairs[0].splits[0]
    prob, yq, _ = unit_problem(plan, pair, split, 3, need_qq=True)
    q = yq.size
    assert prob.Kqq.shape == (q, q) and np.allclose(np.diag(prob.Kqq), prob.sq_q)

    trial = {"method": "mmdt_hoffman", "params": {"pca_dim": 5}, "n_per_class": 3}
    u = evaluate_unit(plan, pair, split, trial)
    assert 0 <= u["accuracy"] <= 1 and u["chosen"] == {}

    select = {"c_d": [0.1, 1.0], "gamma": ["auto", 0.5]}
    params = {"kernel": "rbf", "qp_solver": "osqp", "qp_tol": 1e-6}
    trial = {"method": "mmdtl2", "params": params, "select": select, "n_per_class": 3}
    u = evaluate_unit(plan, pair, split, trial)
    # The same choice as calling the core directly on the unit's blocks.
    grid = [{**params, "c_d": c, "gamma": g} for c in (0.1, 1.0) for g in (None, 0.5)]
    best, table = select_by_cv("mmdtl2", grid, prob)
    assert u["chosen"] == {"c_d": best["c_d"], "gamma": best["gamma"] or "auto"}
    assert u["cv_accuracy"] == max(r["cv_accuracy"] for r in table)
    direct = fit_predict(
        "mmdtl2",
        best,
        GramProblem(
            **{k: getattr(prob, k) for k in ("ys", "yt", "Kss", "Ktt", "Ktq", "sq_q", "Kst", "Ksq")}
        ),
    )
    assert u["accuracy"] == pytest.approx(float(np.mean(direct.y_pred == yq)))


def test_bundled_specs_use_core_parameter_names():
    """Every method and parameter name in studies/*.toml is one the core (or skada) takes."""
    from pathlib import Path

    from mmdtl2_dist.core.params import DEFAULTS
    from mmdtl2_dist.study.spec import EXTRA_PARAMS

    for p in sorted(Path(__file__).resolve().parents[1].glob("studies/*.toml")):
        for m in load_spec(p).methods:
            selected = set(m.select) if isinstance(m.select, dict) else set()  # or "auto"
            names = set(m.params) | set(m.grid) | selected
            allowed = DEFAULTS.get(m.method) or EXTRA_PARAMS[m.method]
            assert names <= set(allowed), (p.name, m.label, names - set(allowed))


def test_cpu_accounting_splits_capacity():
    from mmdtl2_dist.study.timing import cpu_accounting

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
@pytest.mark.parametrize("executor", ["local", "ray"])
def test_cli_study_interrupted_and_resumed_matches_uninterrupted(tmp_path, executor):
    """`mmdtl2 study run` interrupted (Ctrl-C) mid-way exits 130 and says how to resume;
    `study resume` stopped by SIGTERM exits 143; a last `study resume` gives the same
    report as an uninterrupted run and one MLflow run per trial, on either executor. The
    study's MLflow run is KILLED while stopped and FINISHED once resumed to the end."""
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
    opts = ["--executor", executor, "--num-cpus", "2"]

    def run(*args, **kw):
        return subprocess.run(
            cli + list(args), env=env, capture_output=True, text=True, timeout=300, **kw
        )

    full = run("run", str(spec), "--output", str(tmp_path / "full"), *opts)
    assert full.returncode == 0, full.stderr[-2000:]
    assert "| n_per_class | targetSVM | sourceSVM | MMDTL2 CV | CORAL | SA |" in full.stdout

    part = tmp_path / "part"

    def n_done():
        return len(list((part / "results").glob("*.json"))) if (part / "results").exists() else 0

    def stop_after(args, n, sig, group):
        """Start `mmdtl2 study ARGS`, send `sig` once `n` trials are done; rc and stderr."""
        with open(tmp_path / "stderr.txt", "w+") as err:
            proc = subprocess.Popen(
                cli + args, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
            )
            deadline = time.time() + 240
            while time.time() < deadline and n_done() < n and proc.poll() is None:
                time.sleep(0.2)
            # Ctrl-C in a terminal reaches the whole process group; `kill` reaches one.
            if group:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            err.seek(0)
            return proc.returncode, err.read()

    rc, err = stop_after(["run", str(spec), "--output", str(part), *opts], 2, signal.SIGINT, True)
    done = n_done()
    assert done < 10, "the study finished before it could be interrupted"
    assert rc == 130, err[-3000:]
    assert f"mmdtl2 study run: stopped by SIGINT with {done} of 10 trials done" in err, err[-3000:]
    assert f"Continue it with:\n    mmdtl2 study resume {part} {' '.join(opts)}\n" in err
    assert "Failed to fetch metrics" not in err  # Tune's list of the trials stopped early
    assert not (part / "report").exists()  # no report that could pass for the study's
    client = MlflowClient(f"sqlite:///{part / 'mlflow.db'}")
    exp = client.get_experiment_by_name("mmdtl2-tiny").experiment_id
    parent = [r for r in client.search_runs([exp]) if r.data.tags["mmdtl2_role"] == "parent"]
    assert [r.info.status for r in parent] == ["KILLED"]  # stopped, not left RUNNING
    rc, err = stop_after(["resume", str(part), *opts], done + 1, signal.SIGTERM, False)
    assert n_done() < 10, "the study finished before it could be stopped"
    assert rc == 143, err[-3000:]
    assert f"mmdtl2 study resume: stopped by SIGTERM with {n_done()} of 10 trials done" in err, err[
        -3000:
    ]
    res = run("resume", str(part), *opts)
    assert res.returncode == 0, res.stderr[-2000:]
    pd.testing.assert_frame_equal(_table(part), _table(tmp_path / "full"))
    runs = client.search_runs([exp])
    assert [r.info.status for r in runs if r.info.run_id == parent[0].info.run_id] == ["FINISHED"]
    keys = [
        r.data.tags["mmdtl2_trial_key"] for r in runs if r.data.tags.get("mmdtl2_role") == "trial"
    ]
    assert len(keys) == len(set(keys)) == 10


# -- the plan is data, and nothing in a study folder is unpickled ------------------------


class _Marker:
    """Unpickling this object creates the file ``path``: proof that code ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _crafted_pickle(path, marker):
    import pickle

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(_Marker(marker)))


def _tiny_plan():
    from mmdtl2_dist.study.plan import PairPlan, StudyPlan
    from mmdtl2_dist.study.splits import draw_splits

    ys, yt = np.arange(12) % 3 + 1, np.arange(9) % 3 + 1
    pairs = []
    for i, shared in enumerate((True, False)):
        splits = draw_splits(ys, yt, n_splits=2, seed=i, pair=("a", "b"))
        pairs.append(
            PairPlan(
                name=f"a->b{i}",
                source="a",
                target=f"b{i}",
                source_gram="/g/src",
                target_gram="/g/src" if shared else "/g/tgt",
                shared=shared,
                source_rows=np.arange(12) + 9,
                target_rows=np.arange(9),
                target_rows_in_source=np.arange(9) if shared else None,
                y_source=ys,
                y_target=yt,
                splits=splits,
                store="/s.zarr",
                source_space="f",
                target_space="f" if shared else "g",
            )
        )
    return StudyPlan("spec", "data", 7, pairs)


def _rewrite_arrays(path, **change):
    """Replace arrays of a saved plan and fix the digest (a consistent, crafted plan)."""
    import hashlib
    import io

    from mmdtl2_dist.study.plan import arrays_path

    with np.load(arrays_path(path), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays.update(change)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    arrays_path(path).write_bytes(buf.getvalue())
    doc = json.loads(path.read_text())
    doc["arrays_sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()
    path.write_text(json.dumps(doc))


def test_plan_round_trips_as_json_and_npz(tmp_path):
    from mmdtl2_dist.study.plan import load_plan, save_plan

    plan = _tiny_plan()
    save_plan(plan, tmp_path / "plan.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "plan.npz"]
    back = load_plan(tmp_path / "plan.json")
    assert (back.spec_fingerprint, back.data_fingerprint, back.seed) == ("spec", "data", 7)
    for a, b in zip(plan.pairs, back.pairs, strict=True):
        assert (a.name, a.shared, a.source_gram, a.target_gram, a.store, a.target_space) == (
            b.name,
            b.shared,
            b.source_gram,
            b.target_gram,
            b.store,
            b.target_space,
        )
        for f in ("source_rows", "target_rows", "y_source", "y_target"):
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
        assert (b.target_rows_in_source is None) == (not a.shared)
        for sa, sb in zip(a.splits, b.splits, strict=True):
            assert sa.index == sb.index
            for f in ("source_train", "target_pool", "target_test", "target_order"):
                np.testing.assert_array_equal(getattr(sa, f), getattr(sb, f))


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda p: p.write_text("{"), "not valid JSON"),
        (lambda p: p.write_text('{"format": "other"}'), "not a 'mmdtl2-study-plan' file"),
        (
            lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "version": 99})),
            "format version 99, this code reads 1",
        ),
        (lambda p: p.unlink(), "does not exist"),
        (lambda p: p.with_suffix(".npz").write_bytes(b"PK\x03\x04junk"), "does not match"),
        (
            lambda p: _rewrite_arrays(p, **{"pair0.split1.target_test": np.array([3, 99])}),
            r"'pair0.split1.target_test' holds values outside \[0, 9\)",
        ),
        (
            lambda p: _rewrite_arrays(p, **{"pair1.y_source": np.zeros(12)}),
            "'pair1.y_source' must be a 1-D integer vector, got float64",
        ),
        (
            lambda p: _rewrite_arrays(p, **{"pair0.split0.target_order": np.arange(2)}),
            "is not an order of pair0.split0.target_pool",
        ),
        (
            lambda p: p.write_text(
                json.dumps(
                    {
                        **json.loads(p.read_text()),
                        "pairs": [{**json.loads(p.read_text())["pairs"][0], "store": 3}],
                    }
                )
            ),
            "pair 0: 'store' must be a str, got 3",
        ),
    ],
)
def test_malformed_plan_gives_a_clear_error(tmp_path, damage, match):
    from mmdtl2_dist.study.plan import PlanError, load_plan, save_plan

    path = tmp_path / "study" / "plan.json"
    path.parent.mkdir()
    save_plan(_tiny_plan(), path)
    damage(path)
    with pytest.raises(PlanError, match=match) as err:
        load_plan(path)
    assert f"delete plan.json and plan.npz and run `mmdtl2 study resume {path.parent}`" in str(
        err.value
    )


def test_plan_arrays_with_a_pickle_inside_are_refused_unexecuted(tmp_path):
    """An object array in plan.npz is a pickle: it is refused, never loaded."""
    from mmdtl2_dist.study.plan import PlanError, load_plan, save_plan

    marker = tmp_path / "PWNED"
    path = tmp_path / "plan.json"
    save_plan(_tiny_plan(), path)
    evil = np.empty(1, dtype=object)
    evil[0] = _Marker(marker)
    _rewrite_arrays(path, **{"pair0.y_source": evil})  # np.savez pickles object arrays
    with pytest.raises(PlanError, match="not a pickle-free npz"):
        load_plan(path)
    assert not marker.exists()


TINY = """
[study]
name = "tiny2"
seed = 3
[data]
store = "store.zarr"
space = "f"
pairs = [["cam_a", "cam_b"]]
[splits]
n_splits = 2
samples_per_class = [1, 3]
[[methods]]
method = "target_svm"
[[methods]]
method = "source_svm"
"""


@pytest.mark.ray
def test_resume_unpickles_nothing_from_the_study_folder(tmp_path, ray_local):
    """Crafted pickles where the study, Tune and a trial would find them are never run;
    resume still completes, and a damaged plan file stops it with a clear error."""
    from mmdtl2_dist.study.plan import PlanError

    make_store(tmp_path / "store.zarr")
    (tmp_path / "spec.toml").write_text(TINY)
    out, uri = tmp_path / "out", f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = load_spec(tmp_path / "spec.toml", output=out)
    run_study(spec, executor="ray", tracking_uri=uri, progress=False, max_trials=1)
    assert (out / "plan.json").exists() and (out / "tune").is_dir()
    markers = []
    crafted = [out / "plan.pkl", out / "tune" / "tuner.pkl", out / "results" / "x.pkl"]
    crafted += [d / "error.pkl" for d in (out / "tune").glob("trial_*")]
    for i, path in enumerate(crafted):
        markers.append(tmp_path / f"PWNED_{i}")
        _crafted_pickle(path, markers[-1])

    resume_study(out, executor="ray", tracking_uri=uri, progress=False)
    assert [m.name for m in markers if m.exists()] == []
    assert len(list((out / "results").glob("*.json"))) == len(spec.trials()) == 4

    (out / "plan.json").write_text("{")
    with pytest.raises(PlanError, match=r"plan\.json is unusable: not valid JSON"):
        resume_study(out, tracking_uri=uri, progress=False)
    assert [m.name for m in markers if m.exists()] == []


# -- the spec is checked against the store's metadata before any compute ----------------


def _spec_for(tmp_path, store_kw=None, replace=(), protocol="half"):
    make_store(tmp_path / "store.zarr", **(store_kw or {}))
    text = SPEC.format(protocol=protocol)
    for old, new in replace:
        assert old in text
        text = text.replace(old, new)
    p = tmp_path / "spec.toml"
    p.write_text(text)
    return p


BAD_DATA = [
    pytest.param(
        {},
        [("samples_per_class = [1, 3]", "samples_per_class = [1, 10]")],
        r"cam_a->cam_b: split 0: class 1 has only 8 target training samples but 10 per class",
        id="samples_per_class",
    ),
    pytest.param(
        {},
        [("samples_per_class = [1, 3]", "samples_per_class = [1, 30]")],
        r"cam_a->cam_b: target device 'cam_b' has too few labelled samples: class 1 has 15, "
        r"class 2 has 15, class 3 has 15; the study asks 30 labelled per class plus 1 to "
        r"test \(31\)",
        id="class_counts",
    ),
    pytest.param(
        {},
        [('pairs = [["cam_a", "cam_b"]]', 'pairs = [["cam_a", "cam_z"]]')],
        r"device 'cam_z' has no features in 'f'; devices there: \['cam_a', 'cam_b'\]",
        id="device",
    ),
    pytest.param(
        {},
        [('space = "f"', 'space = "g"')],
        r"the feature store has no space 'g'; it has \['f'\]",
        id="space",
    ),
    pytest.param(
        {"classes": (3, 2)},
        [],
        r"both devices must have the same classes, but classes \[3\] of 'cam_a' have no "
        r"'cam_b' sample",
        id="classes",
    ),
    pytest.param(
        {"n": (60, 3)},
        [("n_splits = 4", "n_splits = 4\ntrain_fraction = 0.6"), ("[1, 3]", "[1]")],
        r"cam_a->cam_b: target device 'cam_b' has too few labelled samples: class 1 has 1, "
        r"class 2 has 1, class 3 has 1; the study asks 1 labelled per class plus 1 to test",
        id="empty_test",
    ),
]


@pytest.mark.parametrize(("store_kw", "replace", "match"), BAD_DATA)
def test_validate_checks_the_spec_against_the_store(tmp_path, capsys, store_kw, replace, match):
    import re

    from mmdtl2_dist.cli import main

    spec = _spec_for(tmp_path, store_kw, replace)
    assert main(["study", "validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert re.search(match, err), err
    assert not (tmp_path / "mmdtl2-studies").exists()


def test_validate_reports_the_checked_data(tmp_path, capsys):
    from mmdtl2_dist.cli import main

    assert main(["study", "validate", str(_spec_for(tmp_path))]) == 0
    assert "data: 1 device pair(s) x 4 splits checked against the store" in capsys.readouterr().out


def test_validate_checks_bundled_data_without_writing(tmp_path, capsys, monkeypatch):
    from mmdtl2_dist.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "office.toml").write_text(
        '[study]\nname = "o"\n[data]\nbuiltin = "office_caltech10"\nspace = "surf800"\n'
        'pairs = [["amazon", "Webcam"]]\n[splits]\nprotocol = "fixed"\nn_splits = 2\n'
        'samples_per_class = [3]\n[[methods]]\nmethod = "target_svm"\n'
    )
    assert main(["study", "validate", "office.toml"]) == 2
    assert "device 'Webcam' has no features in 'surf800'" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["office.toml"]


@pytest.mark.parametrize(("store_kw", "replace", "match"), BAD_DATA)
def test_run_fails_on_bad_data_before_an_executor_starts(
    tmp_path, capsys, monkeypatch, store_kw, replace, match
):
    import re

    from mmdtl2_dist.cli import main
    from mmdtl2_dist.study import runner
    from mmdtl2_dist.study.executors import LocalExecutor
    from mmdtl2_dist.study.ray_executor import RayTuneExecutor

    def no_ray(*args, **kwargs):
        raise AssertionError("an executor was started before the data were checked")

    for executor in (LocalExecutor, RayTuneExecutor):
        monkeypatch.setattr(executor, "start", no_ray)
    monkeypatch.setattr(runner, "compute_grams", no_ray)
    spec, out = _spec_for(tmp_path, store_kw, replace), tmp_path / "out"
    for executor in ("local", "ray"):
        cmd = ["study", "run", str(spec), "--output", str(out), "--quiet", "--executor", executor]
        assert main(cmd) == 2
        err = capsys.readouterr().err
        assert re.search(match, err), err
        assert not out.exists()  # nothing written: the fixed spec can run in the same folder


@pytest.mark.parametrize(
    ("method", "match"),
    [
        ({"method": "target_svm", "select": "auto"}, "rule for method 'mmdtl2'"),
        ({"method": "mmdtl2", "select": "auto", "params": {"c_f": 1.0}}, r"remove \['c_f'\]"),
        ({"method": "mmdtl2", "select": "auto", "unlabelled": "test"}, "unlabelled must be one"),
    ],
)
def test_spec_auto_and_unlabelled_errors_name_the_fix(method, match):
    with pytest.raises(SpecError, match=match):
        parse_spec(_raw(methods=[method]))
    with pytest.raises(SpecError, match=r"\[splits\] unlabelled must be one of"):
        parse_spec(_raw(splits={"samples_per_class": [3], "unlabelled": "transductive"}))


def test_spec_auto_needs_one_feature_space():
    data = {"builtin": "office_caltech10", "source_space": "a", "target_space": "b", "pairs": "all"}
    methods = [{"label": "auto", "method": "mmdtl2", "select": "auto"}]
    with pytest.raises(SpecError, match=r"\['auto'\] need source and target in one feature"):
        parse_spec(_raw(data=data, methods=methods))


def test_spec_unlabelled_pool_reaches_the_trials():
    methods = [
        {"label": "auto", "method": "mmdtl2", "select": "auto"},
        {"label": "auto all", "method": "mmdtl2", "select": "auto", "unlabelled": "all"},
    ]
    spec = parse_spec(_raw(methods=methods))
    assert [t.to_dict()["unlabelled"] for t in spec.trials()] == ["non-test"] * 2 + ["all"] * 2
    assert all(t.to_dict()["select"] == "auto" for t in spec.trials())
    raw = _raw(methods=methods[:1], splits={"samples_per_class": [3], "unlabelled": "none"})
    assert parse_spec(raw).trials()[0].unlabelled == "none"


@pytest.mark.ray
@pytest.mark.parametrize("mode", ["none", "non-test", "all"])
def test_auto_unit_learns_from_the_protocols_pool_only(tmp_path, ray_local, mode):
    """select = "auto" in a unit == the estimator on the same features with the pool's
    unlabelled samples as Xt_unlabelled: the test samples shape the prior only under
    "all", and the unit records the pool size and the rule."""
    from mmdtl2_dist.core.auto import AUTO_RULE
    from mmdtl2_dist.estimators import MMDTL2
    from mmdtl2_dist.study.preparation import compute_grams, prepare_data
    from mmdtl2_dist.study.trial import _features, evaluate_unit, unit_problem

    spec = load_spec(write_spec(tmp_path), output=tmp_path / "u")
    store, split_file = prepare_data(spec)
    plan = build_plan(
        spec, store, split_file, compute_grams(spec, store, address=None, progress=False)
    )
    pair, split = plan.pairs[0], plan.pairs[0].splits[1]
    trial = {"method": "mmdtl2", "params": {}, "select": "auto", "n_per_class": 3}
    u = evaluate_unit(plan, pair, split, {**trial, "unlabelled": mode})
    _, _, rows = unit_problem(plan, pair, split, 3, unlabelled=mode)
    Xs = _features(pair.store, pair.source, pair.source_space, pair.source_gram)
    Xt = _features(pair.store, pair.target, pair.target_space, pair.target_gram)
    s, t, q = rows["source"], rows["target"], rows["test"]
    unl = np.setdiff1d(rows["pool"], t)
    est = MMDTL2(select="auto").fit_domains(
        Xs[s], pair.y_source[s], Xt[t], pair.y_target[t], Xt_unlabelled=Xt[unl]
    )
    assert u["pool_size"] == len(s) + len(t) + len(unl) == est.auto_["pool_size"]
    assert {"none": len(unl) == 0, "non-test": 0 < len(unl), "all": len(unl) > len(q)}[mode]
    assert u["auto"]["rule"] == AUTO_RULE and u["auto"]["pick"] == est.auto_["pick"]
    assert u["chosen"]["rule"] == AUTO_RULE
    assert u["accuracy"] == pytest.approx(est.score(Xt[q], pair.y_target[q]), abs=1e-12)


def test_an_auto_trials_key_holds_the_rules_version(monkeypatch):
    """A study resumed under another version of select="auto" runs its trials again;
    the keys of other methods do not depend on the rule."""
    import mmdtl2_dist.core.auto as auto
    from mmdtl2_dist.study.spec import MethodConfig, trial_key

    rule = MethodConfig("MMDTL2 auto", "mmdtl2", {}, "auto", "MMDTL2 auto", {}, "all")
    plain = MethodConfig("MMDTL2", "mmdtl2", {}, {}, "MMDTL2", {}, None)
    before = trial_key(rule, 3, "all"), trial_key(plain, 3)
    monkeypatch.setattr(auto, "AUTO_RULE", "auto-next")
    assert trial_key(rule, 3, "all") != before[0] and trial_key(plain, 3) == before[1]


@pytest.mark.mlflow
def test_results_of_a_replaced_store_are_set_aside_and_rerun(tmp_path, mlflow_sqlite):
    """A store re-ingested with other data under the same path: the old plan is refused;
    drawn again as the error says, the old data's results neither count as done nor enter
    the report or MLflow's trial runs. They are kept aside (results/other_data/<fp>, or
    other_data/unknown for a result written before results carried the fingerprint) and
    the superseded MLflow runs keep their metrics under the role ``superseded``, from the
    first run on the new data, even one that runs no trial."""
    from mmdtl2_dist.store.feature_store import FeatureStore
    from mmdtl2_dist.study.plan import PlanError

    make_store(tmp_path / "store.zarr", seed=0)
    (tmp_path / "spec.toml").write_text(TINY)
    spec = load_spec(tmp_path / "spec.toml", output=tmp_path / "out")
    uri, out = mlflow_sqlite["tracking_uri"], tmp_path / "out"
    run_study(spec, executor="local", tracking_uri=uri, progress=False)
    keys = [t.key for t in spec.trials()]
    old = {k: json.loads((out / "results" / f"{k}.json").read_text()) for k in keys}
    old_fp = FeatureStore.open(tmp_path / "store.zarr").fingerprint
    assert {o["data_fingerprint"] for o in old.values()} == {old_fp}
    legacy = {k: v for k, v in old[keys[0]].items() if k != "data_fingerprint"}
    (out / "results" / f"{keys[0]}.json").write_text(json.dumps(legacy))  # an older version's

    make_store(tmp_path / "store.zarr", seed=5, shift=3.0)  # other features, same path
    with pytest.raises(PlanError, match="other data"):
        run_study(spec, executor="local", tracking_uri=uri, progress=False)
    (out / "plan.json").unlink()
    (out / "plan.npz").unlink()
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("mmdtl2-tiny2").experiment_id

    def roles():
        out = {}
        for r in client.search_runs([exp]):
            out.setdefault(r.data.tags.get("mmdtl2_role"), []).append(r)
        return out

    with pytest.raises(ValueError, match="no finished trials"):  # all set aside, none run
        resume_study(out, executor="local", tracking_uri=uri, progress=False, max_trials=0)
    assert "trial" not in roles() and len(roles()["superseded"]) == len(keys)
    resume_study(out, executor="local", tracking_uri=uri, progress=False)

    new_fp = FeatureStore.open(tmp_path / "store.zarr").fingerprint
    aside = out / "results" / "other_data"
    assert json.loads((aside / "unknown" / f"{keys[0]}.json").read_text()) == legacy
    for key in keys[1:]:
        assert json.loads((aside / old_fp / f"{key}.json").read_text()) == old[key]
    table = _table(out).set_index(["label", "n_per_class"])
    for key in keys:
        new = json.loads((out / "results" / f"{key}.json").read_text())
        assert new["data_fingerprint"] == new_fp != old_fp and new["units"] != old[key]["units"]
        cell = table.loc[(new["label"], new["n_per_class"]), "mean"]
        assert cell == pytest.approx(100 * new["accuracy"])
    trials, gone = roles()["trial"], roles()["superseded"]
    assert len(trials) == len(keys) and {r.data.tags["data_fingerprint"] for r in trials} == {
        new_fp
    }
    assert {r.data.tags["data_fingerprint"] for r in gone} == {old_fp}


def test_local_workers_run_every_blas_on_one_thread_numpys_and_scipys():
    """A local worker is one trial on one core. scipy's wheels bring an OpenBLAS of their
    own (the pool's eigendecomposition runs on it), which a limit set before it was loaded
    would leave at the machine's cores (`mmdtl2 office --trials 3`: 26.2 s against 19.7 s
    with OMP_NUM_THREADS=1 on 2 cores)."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    from threadpoolctl import threadpool_info

    from mmdtl2_dist.study.executors import _init_worker

    ctx = multiprocessing.get_context("spawn")
    env = {k: os.environ.pop(k) for k in list(os.environ) if k.endswith("_NUM_THREADS")}
    try:
        with ProcessPoolExecutor(1, mp_context=ctx, initializer=_init_worker,
                                 initargs=(os.getpid(),)) as pool:  # fmt: skip
            pool.submit(exec, "import numpy, scipy.linalg").result()  # as a trial loads them
            info = pool.submit(threadpool_info).result()
    finally:
        os.environ.update(env)
    blas = [i for i in info if i["user_api"] == "blas"]  # numpy's and scipy's, or one shared
    assert blas and {i["num_threads"] for i in blas} == {1}


def test_every_commands_help_is_plain_text():
    """``--help`` of every command and sub-command shows no reStructuredText markup (a
    module docstring used as a description keeps it for the API docs): no double
    backquotes, no ``::`` ending a line, no section underline."""
    import argparse
    import re

    from mmdtl2_dist.cli import build_parser

    def parsers(p):
        yield p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    yield from parsers(child)

    seen = 0
    for p in parsers(build_parser()):
        text = p.format_help()
        seen += 1
        assert "``" not in text, p.prog
        assert not re.search(r"::$", text, flags=re.MULTILINE), p.prog
        assert not re.search(r"^-{3,}$", text, flags=re.MULTILINE), p.prog
    assert seen > 15
