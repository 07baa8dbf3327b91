"""MLflow tracking on a real SQLite store: layout, metrics, idempotent trial runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mlflow.entities import RunStatus
from mlflow.tracking import MlflowClient

from mmdtl2_dist.store.feature_store import FeatureStore, StoreWriter
from mmdtl2_dist.study.tracking import KEY_TAG, StudyTracker, class_names, trial_metrics

pytestmark = pytest.mark.mlflow


def _payload(key="k1", acc=(0.8, 0.9)):
    units = [
        {
            "pair": "a->b",
            "split": i,
            "accuracy": a,
            "per_class": {"1": a, "2": a - 0.1},
            "info": {
                "objective": [3.0, 2.0, 1.9],
                "n_iter": 3,
                "qp_status": ["solved"] * 3,
                "qp_kkt_residual": [1e-7, 2e-7, 1e-8],
                "time_wstep_s": 0.1,
                "time_svm_s": 0.05,
                "time_total_s": 0.2,
            },
        }
        for i, a in enumerate(acc)
    ]
    return {
        "key": key,
        "label": "MMDTL2",
        "method": "mmdtl2",
        "params": {"c_f": 0.1},
        "select": {},
        "n_per_class": 3,
        "units": units,
        "wall_s": 1.0,
        "solver_s": 0.4,
    }


def test_trial_metrics_content():
    m = {(k, s): v for k, v, s in trial_metrics(_payload())}
    assert m[("accuracy", 0)] == pytest.approx(0.85)
    assert m[("accuracy_class/2", 0)] == pytest.approx(0.75)
    assert m[("accuracy_pair/a_to_b", 0)] == pytest.approx(0.85)
    assert [m[("objective_mean", i)] for i in range(3)] == [3.0, 2.0, 1.9]
    assert m[("qp_not_solved", 0)] == 0 and m[("qp_solves", 0)] == 6
    assert m[("qp_kkt_residual_max", 0)] == pytest.approx(2e-7)


def test_alternation_means_count_only_the_units_that_ran_one():
    payload = _payload()
    payload["units"][1]["info"] = {"time_total_s": 0.01}  # a target-SVM pick: no alternation
    m = {(k, s): v for k, v, s in trial_metrics(payload)}
    assert m[("n_units", 0)] == 2 and m[("alternation_units", 0)] == 1
    assert [m[("objective_mean", i)] for i in range(3)] == payload["units"][0]["info"]["objective"]
    for unit in payload["units"]:
        unit["info"] = {}
    m = {(k, s): v for k, v, s in trial_metrics(payload)}
    assert m[("alternation_units", 0)] == 0 and ("objective_mean", 0) not in m


def test_one_run_per_trial_across_restarts(mlflow_sqlite, tmp_path):
    uri = mlflow_sqlite["tracking_uri"]
    kw = dict(study_name="s", spec_fingerprint="fp1", artifact_location=(tmp_path / "art").as_uri())
    t = StudyTracker(uri, "mmdtl2-s", **kw)
    rid = t.log_trial(_payload("k1"), {"split_seed": "0"})
    # A half-logged run (driver killed before set_terminated) for another trial.
    client = MlflowClient(uri)
    half = client.create_run(
        t.experiment_id,
        tags={"mmdtl2_role": "trial", KEY_TAG: "k2", "mmdtl2_spec_fingerprint": "fp1"},
    )
    # "Resume": a new tracker finds the same parent, skips k1, replaces the half run of k2.
    t2 = StudyTracker(uri, "mmdtl2-s", **kw)
    assert t2.parent_id == t.parent_id
    assert t2.log_trial(_payload("k1"), {}) == rid
    rid2 = t2.log_trial(_payload("k2"), {})
    assert rid2 != half.info.run_id
    runs = t2.trial_runs()
    assert {k: len(v) for k, v in runs.items()} == {"k1": 1, "k2": 1}
    assert all(r.info.status == "FINISHED" for v in runs.values() for r in v)
    r = client.get_run(rid)
    assert r.info.status == RunStatus.to_string(RunStatus.FINISHED)
    assert r.data.tags["mlflow.parentRunId"] == t.parent_id
    assert r.data.tags["split_seed"] == "0"
    assert r.data.params["c_f"] == "0.1"
    hist = client.get_metric_history(rid, "objective_mean")
    assert [h.step for h in hist] == [0, 1, 2]
    arts = [a.path for a in client.list_artifacts(rid)]
    assert arts == ["trial.json"]
    path = client.download_artifacts(rid, "trial.json", str(tmp_path))
    assert json.loads(open(path).read())["key"] == "k1"


def _tracker(mlflow_sqlite, tmp_path, **kw):
    art = (tmp_path / "art").as_uri()
    uri = mlflow_sqlite["tracking_uri"]
    return StudyTracker(uri, "e", study_name="s", spec_fingerprint="f", artifact_location=art, **kw)


def test_parent_gets_report(mlflow_sqlite, tmp_path):
    t = _tracker(mlflow_sqlite, tmp_path)
    f = tmp_path / "report.md"
    f.write_text("# hi")
    t.log_parent(params={"seed": 0}, metrics={"study_wall_s": 3.0}, files=[f], finished=True)
    t.log_parent(params={"seed": 0})  # idempotent for existing params
    client = MlflowClient(mlflow_sqlite["tracking_uri"])
    assert [a.path for a in client.list_artifacts(t.parent_id, "report")] == ["report/report.md"]
    assert client.get_run(t.parent_id).data.metrics["study_wall_s"] == 3.0


def test_per_class_metrics_are_named_after_the_classes(mlflow_sqlite, tmp_path):
    """Class names from the store's metadata, sanitised for MLflow's metric-name rules;
    two names that sanitise alike keep their labels apart; a label without a name keeps
    its number."""
    with StoreWriter(tmp_path / "st") as w:
        a = w.create_array("cam", "f", 4, 2, dtype=np.float64)
        a.append(np.ones((4, 2)))
        a.set_metadata(label=[1, 2, 3, -1], class_name=["back pack", "bike:helmet", "", ""])
    names = class_names(FeatureStore.open(tmp_path / "st").metadata)
    assert names == {"1": "back pack", "2": "bike:helmet"}
    payload = _payload()
    for u in payload["units"]:
        u["per_class"]["3"] = 0.5
    keys = {k for k, _, _ in trial_metrics(payload, names)}
    assert {"accuracy_class/back pack", "accuracy_class/bike_helmet", "accuracy_class/3"} <= keys
    clash = {k for k, _, _ in trial_metrics(payload, {"1": "a:b", "2": "a?b"})}
    assert {"accuracy_class/a_b_1", "accuracy_class/a_b_2"} <= clash
    t = _tracker(mlflow_sqlite, tmp_path, class_names=names)
    rid = t.log_trial(payload, {})  # MLflow accepts the names
    metrics = MlflowClient(mlflow_sqlite["tracking_uri"]).get_run(rid).data.metrics
    assert metrics["accuracy_class/back pack"] == pytest.approx(0.85)
    assert "accuracy_class/1" not in metrics
