"""Deployed adapters: the pyfunc model, ``mmdtl2 register`` and ``mmdtl2 predict``.

Everything runs on a real SQLite MLflow store and a real Zarr feature store. The study is
a *recorded* one: its spec, state file and MLflow trial runs are written the way
``mmdtl2 study run`` writes them (through :class:`StudyTracker`), with made-up accuracies,
so that which trial is best is known and no Ray cluster is needed. A real study run is
in ``test_register_after_real_study`` (marked ``slow`` and ``ray``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from loopback import mlflow_server_command
from mlflow.tracking import MlflowClient

from mmdtl2_dist.cli import main
from mmdtl2_dist.deploy.registry import use_tracking_uri
from mmdtl2_dist.deploy.training import fit_adapter, open_study
from mmdtl2_dist.estimators import MMDTL2
from mmdtl2_dist.store.feature_store import FeatureStore, StoreWriter
from mmdtl2_dist.study.runner import _write_state, tracker_config
from mmdtl2_dist.study.spec import load_spec
from mmdtl2_dist.study.tracking import KEY_TAG, ROLE_TAG, StudyTracker

pytestmark = pytest.mark.mlflow

CLASS_NAMES = ["adenoma", "hyperplastic", "normal"]
DIM = 20

SPEC = """
[study]
name = "deploy_tiny"
seed = 0
[data]
store = "store.zarr"
space = "f"
pairs = [["cam_a", "cam_b"]]
preprocessing = "l2_zscore"
[splits]
protocol = "half"
n_splits = 2
samples_per_class = [1, 3]
[[methods]]
label = "MMDTL2"
method = "mmdtl2"
grid = { c_d = [0.1, 1.0] }
[[methods]]
label = "MMDTL2 RBF"
method = "mmdtl2"
params = { kernel = "rbf" }
[[methods]]
label = "targetSVM"
method = "target_svm"
"""

# Made-up study results: (label, n_per_class) -> accuracy. The target SVM is "best" but
# cannot be deployed; the best deployable trial is MMDTL2 [c_d=1] at n = 3.
ACCURACY = {
    ("MMDTL2 [c_d=0.1]", 1): 0.60,
    ("MMDTL2 [c_d=0.1]", 3): 0.70,
    ("MMDTL2 [c_d=1]", 1): 0.65,
    ("MMDTL2 [c_d=1]", 3): 0.90,
    ("MMDTL2 RBF", 1): 0.62,
    ("MMDTL2 RBF", 3): 0.85,
    ("targetSVM", 1): 0.50,
    ("targetSVM", 3): 0.99,
}


def make_store(path: Path, n=(60, 45), seed=0, unlabelled=0) -> Path:
    """Two devices; the last ``unlabelled`` samples of the target device are labelled -1."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(size=(3, DIM)) * 0.8
    with StoreWriter(path, overwrite=True) as w:
        for d, (dev, m) in enumerate(zip(("cam_a", "cam_b"), n, strict=True)):
            y = np.arange(m) % 3 + 1
            X = mu[y - 1] + rng.normal(size=(m, DIM)) + d * rng.normal(size=DIM)
            if d == 1 and unlabelled:
                y[-unlabelled:] = -1
            a = w.create_array(dev, "f", m, DIM, dtype=np.float64)
            a.append(X)
            ids = [f"{dev}/{i}" for i in range(m)]
            names = [CLASS_NAMES[k - 1] if k > 0 else "" for k in y]
            a.set_metadata(label=y, class_name=names, group=ids, sample_id=ids)
    return path


def record_study(folder: Path, tracking_uri: str | None = None, unlabelled: int = 0) -> Path:
    """A study folder as `mmdtl2 study run` leaves it, with the ACCURACY results (logged
    to ``tracking_uri`` when given, else to the study's own SQLite store)."""
    folder.mkdir(parents=True, exist_ok=True)
    store = make_store(folder / "store.zarr", unlabelled=unlabelled)
    tracking = f'[tracking]\nuri = "{tracking_uri}"\n' if tracking_uri else ""
    (folder / "spec.toml").write_text(SPEC + tracking)
    spec = load_spec(folder / "spec.toml", output=folder / "out")
    spec.output.mkdir()
    _write_state(spec, {})
    tracker = StudyTracker(**tracker_config(spec, None))
    tags = {"data_fingerprint": FeatureStore.open(store).fingerprint, "study": spec.name}
    for t in spec.trials():
        acc = ACCURACY[(t.config.label, t.n_per_class)]
        units = [
            {"pair": "cam_a->cam_b", "split": i, "accuracy": acc + d, "per_class": {}, "info": {}}
            for i, d in enumerate((-0.01, 0.01))
        ]
        payload = {**t.to_dict(), "units": units, "accuracy": acc, "wall_s": 1.0, "solver_s": 1.0}
        tracker.log_trial(payload, tags)
    return spec.output


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return record_study(tmp_path_factory.mktemp("study"))


@pytest.fixture()
def fresh_study(tmp_path):
    return record_study(tmp_path / "s")


def target_samples(study_out: Path, n=12, seed=5) -> np.ndarray:
    """New raw samples of the target device (its distribution, unseen rows)."""
    fs = FeatureStore.open(Path(study_out).parent / "store.zarr")
    X = fs.read("cam_b", "f")
    rng = np.random.default_rng(seed)
    return X[rng.integers(0, len(X), n)] + 0.3 * rng.normal(size=(n, DIM))


def uri_of(study_out: Path) -> str:
    return f"sqlite:///{Path(study_out) / 'mlflow.db'}"


def reference_estimator(study_out: Path, c_d: float = 1.0) -> MMDTL2:
    """The in-process estimator the registered adapter must reproduce."""
    fs = FeatureStore.open(Path(study_out).parent / "store.zarr")
    Xs, Xt = fs.read("cam_a", "f"), fs.read("cam_b", "f")
    ys, yt = np.arange(60) % 3 + 1, np.arange(45) % 3 + 1
    return MMDTL2(c_d=c_d, preprocessing="l2_zscore").fit_domains(Xs, ys, Xt, yt)


def test_register_best_trial_and_predict_exactly(study, tmp_path, capsys):
    rc = main(["register", str(study), "--name", "tiny-adapter", "--metric", "accuracy", "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "version 1" in out and "models:/tiny-adapter@champion" in out
    client = MlflowClient(tracking_uri=uri_of(study), registry_uri=uri_of(study))
    mv = client.get_model_version_by_alias("tiny-adapter", "champion")
    assert str(mv.version) == "1"
    tags = mv.tags
    # the best deployable trial, not the (better) target SVM
    assert tags["study_label"] == "MMDTL2 [c_d=1]" and tags["n_per_class"] == "3"
    assert tags["metric"] == "accuracy" and float(tags["metric_value"]) == pytest.approx(0.90)
    assert json.loads(tags["params"])["c_d"] == 1.0
    assert json.loads(tags["study_accuracy"])["3"]["accuracy"] == pytest.approx(0.90)
    fs = FeatureStore.open(study.parent / "store.zarr")
    assert tags["data_fingerprint"] == fs.fingerprint
    assert tags["study"] == "deploy_tiny" and tags["pair"] == "cam_a->cam_b"
    assert tags["n_train_source"] == "60" and tags["n_train_target"] == "45"
    assert json.loads(tags["classes"]) == CLASS_NAMES
    assert "deploy_tiny" in mv.description and "90.00 %" in mv.description

    # `mmdtl2 predict` from the registry == the in-process estimator, exactly
    X = target_samples(study)
    np.save(tmp_path / "X.npy", X)
    sys_path = list(sys.path)
    rc = main(
        ["predict", "--model", "models:/tiny-adapter@champion", str(tmp_path / "X.npy"),
         "-o", str(tmp_path / "p.parquet"), "--tracking-uri", uri_of(study), "--quiet"]
    )  # fmt: skip
    assert rc == 0
    # MLflow prepends the model's code/ (a partial mmdtl2_dist) to sys.path; the load
    # puts it back, so later imports here and in spawned workers find the package
    assert sys.path == sys_path
    pred = pd.read_parquet(tmp_path / "p.parquet")
    est = reference_estimator(study)
    np.testing.assert_array_equal(pred["label"].to_numpy(), est.predict(X))
    scores = pred[[f"score_{c}" for c in CLASS_NAMES]].to_numpy()
    np.testing.assert_array_equal(scores, est.decision_function(X))
    assert list(pred["class"]) == [CLASS_NAMES[k - 1] for k in est.predict(X)]
    assert list(pred["row"]) == list(range(len(X)))


def test_model_layout_is_self_contained(study):
    import mlflow

    main(["register", str(study), "--name", "layout", "--metric", "accuracy", "--quiet"])
    client = MlflowClient(tracking_uri=uri_of(study), registry_uri=uri_of(study))
    mv = client.get_model_version_by_alias("layout", "champion")
    with use_tracking_uri(uri_of(study)):
        local = Path(mlflow.artifacts.download_artifacts(mv.source))
    files = {str(p.relative_to(local)) for p in local.rglob("*") if p.is_file()}
    assert {
        "MLmodel", "model_code.py", "requirements.txt", "input_example.json",
        "serving_input_example.json", "artifacts/adapter/adapter.npz",
        "artifacts/adapter/adapter.json", "code/mmdtl2_dist/core/adapter.py",
    } <= files  # fmt: skip
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".cloudpickle"))]
    with np.load(local / "artifacts/adapter/adapter.npz", allow_pickle=False) as z:
        assert set(z.files) == {"X_train", "P", "b", "pre_mean", "pre_scale"}
        assert z["X_train"].shape == (45, DIM) and z["P"].shape == (3, 45)
    meta = json.loads((local / "artifacts/adapter/adapter.json").read_text())
    assert meta["n_features"] == DIM and meta["feature_space"] == "f"
    reqs = (local / "requirements.txt").read_text().split()
    assert {r.split("==")[0] for r in reqs} == {"mlflow", "numpy", "pandas"}
    assert all("==" in r for r in reqs)
    mlmodel = (local / "MLmodel").read_text()
    assert "tensor" in mlmodel and f"[-1, {DIM}]" in mlmodel
    assert "target_device: cam_b" in mlmodel and "- adenoma" in mlmodel


def test_register_twice_moves_alias_only(fresh_study, capsys):
    uri = uri_of(fresh_study)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert main(["register", str(fresh_study), "--name", "m", "--quiet"]) == 0
    assert "registered model" not in capsys.readouterr().err  # MLflow's notice dropped
    client.set_registered_model_alias("m", "stable", "1")
    v1 = client.get_model_version("m", "1")
    exp = client.get_experiment_by_name("mmdtl2-deploy_tiny")
    trials_before = client.search_runs([exp.experiment_id], f"tags.{ROLE_TAG} = 'trial'")

    assert main(["register", str(fresh_study), "--name", "m", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "already exists" not in err and "Created version" not in err
    versions = sorted(int(v.version) for v in client.search_model_versions("name = 'm'"))
    assert versions == [1, 2]
    rm = client.get_registered_model("m")
    assert {k: str(v) for k, v in rm.aliases.items()} == {"champion": "2", "stable": "1"}
    v1_after = client.get_model_version("m", "1")
    assert v1_after.tags == v1.tags and v1_after.description == v1.description
    assert v1_after.source == v1.source and v1_after.run_id == v1.run_id
    v2 = client.get_model_version("m", "2")
    assert {k: v for k, v in v2.tags.items()} == v1.tags  # same configuration, same data
    trials_after = client.search_runs([exp.experiment_id], f"tags.{ROLE_TAG} = 'trial'")
    assert sorted((r.info.run_id, r.info.status) for r in trials_after) == sorted(
        (r.info.run_id, r.info.status) for r in trials_before
    )
    assert {r.data.tags[KEY_TAG] for r in trials_after} == {
        r.data.tags[KEY_TAG] for r in trials_before
    }
    # both versions score alike (a deterministic fit of the same configuration)
    import mlflow

    X = target_samples(fresh_study)
    with use_tracking_uri(uri):
        p1 = mlflow.pyfunc.load_model("models:/m/1").predict(X)
        p2 = mlflow.pyfunc.load_model("models:/m@champion").predict(X)
    pd.testing.assert_frame_equal(p1, p2)


def test_register_default_is_the_auto_rule_with_the_unlabelled_targets(tmp_path):
    """Without --method/--metric/--label: MMDTL2(select="auto"), fitted with the target
    device's unlabelled samples (label -1 in the store), its rule and pool recorded."""
    import mlflow

    from mmdtl2_dist.core.auto import AUTO_RULE
    from mmdtl2_dist.core.auto_candidates import CANDIDATES

    study = record_study(tmp_path / "s", unlabelled=6)
    assert main(["register", str(study), "--name", "auto", "--quiet"]) == 0
    uri = uri_of(study)
    mv = MlflowClient(tracking_uri=uri, registry_uri=uri).get_model_version("auto", "1")
    tags = mv.tags
    assert tags["selected_by"] == f"recommended configuration (select='auto', rule {AUTO_RULE})"
    assert tags["auto_rule"] == AUTO_RULE and tags["select_grid"] == "auto"
    assert tags["auto_pool_size"] == str(60 + 45) and tags["n_unlabelled_target"] == "6"
    assert tags["n_train_target"] == "39" and json.loads(tags["auto_choice"])["pick"] in CANDIDATES
    assert AUTO_RULE in mv.description and "6 unlabelled target samples" in mv.description
    fs = FeatureStore.open(study.parent / "store.zarr")
    Xt = fs.read("cam_b", "f")
    est = MMDTL2(select="auto", preprocessing="l2_zscore").fit_domains(
        fs.read("cam_a", "f"), np.arange(60) % 3 + 1, Xt[:39], np.arange(39) % 3 + 1,
        Xt_unlabelled=Xt[39:],
    )  # fmt: skip
    assert json.loads(tags["auto_choice"])["pick"] == est.auto_["pick"]
    # The method and parameters recorded are the fitted model's: the rule's pick.
    method = "target_svm" if est.auto_["pick"] == "O" else "mmdtl2"
    assert tags["method"] == method and f"Method {method}, parameters" in mv.description
    assert json.loads(tags["params"]).items() >= est.auto_["params"].items()
    # 13 labels per class: many, so no self-training (the 6 unlabelled shaped the prior)
    assert tags["auto_pseudo_labelled"] == str(est.auto_["pseudo_labelled"]) == "0"
    assert "without self-training" in mv.description
    assert tags.get("auto_neighbours") == (
        str(est.auto_["neighbours"]) if est.auto_["neighbours"] else None
    )  # 13 labels a class: no smoothing either
    assert "auto_source_alone_right" not in tags  # nor the source test (the target SVM's default)
    X = target_samples(study)
    with use_tracking_uri(uri):
        pred = mlflow.pyfunc.load_model("models:/auto@champion").predict(X)
    scores = pred[[f"score_{c}" for c in CLASS_NAMES]].to_numpy()
    np.testing.assert_allclose(scores, est.decision_function(X), rtol=1e-12, atol=1e-12)


def test_register_explicit_params_with_study_accuracy_and_w(fresh_study):
    uri = uri_of(fresh_study)
    rc = main(
        ["register", str(fresh_study), "--name", "explicit", "--alias", "challenger",
         "--method", "mmdtl2", "--param", "c_d=0.1", "--export-w", "--quiet"]
    )  # fmt: skip
    assert rc == 0
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    mv = client.get_model_version_by_alias("explicit", "challenger")
    assert mv.tags["selected_by"] == "explicit parameters"
    # the study ran this configuration (grid point c_d = 0.1): its accuracy is recorded
    acc = json.loads(mv.tags["study_accuracy"])
    assert acc["1"]["accuracy"] == pytest.approx(0.60)
    assert acc["3"]["accuracy"] == pytest.approx(0.70)
    W_path = client.download_artifacts(mv.run_id, "W/W.npy")
    W = np.load(W_path, allow_pickle=False)
    est = reference_estimator(fresh_study, c_d=0.1)
    assert W.shape == (DIM, DIM + 1)
    np.testing.assert_array_equal(W, est.transform_matrix())


def test_register_configuration_not_in_study(fresh_study):
    rc = main(
        ["register", str(fresh_study), "--name", "x", "--method", "mmdtl2",
         "--param", "c_d=0.5", "--param", "kernel=poly", "--quiet"]
    )  # fmt: skip
    assert rc == 0
    uri = uri_of(fresh_study)
    mv = MlflowClient(tracking_uri=uri, registry_uri=uri).get_model_version("x", "1")
    assert json.loads(mv.tags["study_accuracy"]) == {}
    assert "did not evaluate" in mv.description


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metric", "accuracy_f1"], "has metric 'accuracy_f1'"),
        (["--label", "targetSVM"], "Deployable labels"),
        (["--pair", "cam_b->cam_a"], "is not in the study"),
        (["--pair", "cam_b -> cam_a"], "pair 'cam_b->cam_a' is not in the study"),
        (["--pair", "cam_a-"], "quote the pair, --pair 'cam_a->TARGET'"),
        (["--method", "mmdtl2", "--param", "kernel=rbf", "--export-w"], "linear kernel"),
        (["--method", "mmdtl2", "--param", "c_q=1"], "--param: method 'mmdtl2' has no parameter"),
        (["--method", "mmdtl2", "--param", "c_d=-1"], "c_d must be"),
        (["--param", "c_d=1"], "need --method"),
        (["--method", "mmdt", "--select", "auto"], "--select auto is a rule for method 'mmdtl2'"),
        (
            ["--method", "mmdtl2", "--select", "auto", "--param", "c_f=1"],
            "remove ['c_f'] from the --param",
        ),
        (["--alias", "latest"], "reserved"),
    ],
)
def test_register_errors_name_the_fix(study, capsys, args, message):
    rc = main(["register", str(study), "--name", "err", "--quiet", *args])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_register_uses_the_study_store_whatever_the_environment_says(tmp_path, monkeypatch, capsys):
    """`study run` does not read MLFLOW_TRACKING_URI, and neither does `register`: the
    study's own store is found as the study found it, whatever the environment says."""
    elsewhere = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    out = record_study(tmp_path / "s")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", elsewhere)
    assert main(["register", str(out), "--name", "m", "--metric", "accuracy", "--quiet"]) == 0
    assert f"tracking: {uri_of(out)}" in capsys.readouterr().out
    assert not (tmp_path / "elsewhere.db").exists()


def test_register_creates_no_mlruns_where_it_runs(tmp_path, monkeypatch):
    """An explicit configuration registered where the study's experiment does not exist yet:
    the experiment is created with the study's artifact folder, not ./mlruns of the
    current folder."""
    out = record_study(tmp_path / "s", tracking_uri=f"sqlite:///{tmp_path / 'team.db'}")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    other = f"sqlite:///{tmp_path / 'new.db'}"
    args = ["register", str(out), "--name", "m", "--method", "mmdtl2", "--param", "c_d=0.3", "-q"]
    assert main([*args, "--tracking-uri", other]) == 0
    assert list(cwd.iterdir()) == []


def test_register_not_a_study(tmp_path, capsys):
    assert main(["register", str(tmp_path), "--name", "m"]) == 2
    assert "not a study folder" in capsys.readouterr().err


def test_fit_adapter_uses_study_preprocessing_and_space(study):
    handle = open_study(study)
    from mmdtl2_dist.deploy.training import best_trial

    cfg = best_trial(handle, "accuracy_pair/cam_a_to_cam_b", label="MMDTL2 RBF")
    assert cfg.params == {"kernel": "rbf"} and cfg.n_per_class == 3
    fitted = fit_adapter(handle, ("cam_a", "cam_b"), cfg)
    ad = fitted.estimator.adapter_
    assert ad.feature_space == "f" and ad.preprocessing.method == "l2_zscore"
    assert ad.kernel.kernel == "rbf" and ad.kernel.gamma is not None
    assert fitted.class_names == CLASS_NAMES


# -- predict: input formats and errors --------------------------------------------------


@pytest.fixture(scope="module")
def registered(study):
    assert main(["register", str(study), "--name", "io", "--metric", "accuracy", "--quiet"]) == 0
    return study


def _predict(study, inp, out, *extra):
    return main(
        ["predict", "--model", "models:/io@champion", str(inp), "-o", str(out),
         "--tracking-uri", uri_of(study), "--quiet", *extra]
    )  # fmt: skip


def test_predict_parquet_columns_and_list_column(registered, tmp_path):
    X = target_samples(registered)
    ref = reference_estimator(registered).predict(X)
    cols = pd.DataFrame(X, columns=[f"f{i}" for i in range(DIM)])
    cols.insert(0, "sample_id", [f"s{i}" for i in range(len(X))])
    cols.to_parquet(tmp_path / "cols.parquet")
    assert (
        _predict(registered, tmp_path / "cols.parquet", tmp_path / "a.csv", "--batch-size", "5")
        == 0
    )
    a = pd.read_csv(tmp_path / "a.csv")
    assert list(a["sample_id"]) == list(cols["sample_id"])
    np.testing.assert_array_equal(a["label"].to_numpy(), ref)
    pd.DataFrame({"features": list(X)}).to_parquet(tmp_path / "list.parquet")
    assert _predict(registered, tmp_path / "list.parquet", tmp_path / "b.parquet") == 0
    np.testing.assert_array_equal(pd.read_parquet(tmp_path / "b.parquet")["label"], ref)


def test_predict_feature_store_and_zarr_array(registered, tmp_path):
    import zarr

    store = registered.parent / "store.zarr"
    # the model's target device and space are the defaults
    assert _predict(registered, store, tmp_path / "s.parquet", "--batch-size", "16") == 0
    s = pd.read_parquet(tmp_path / "s.parquet")
    fs = FeatureStore.open(store)
    Xb = fs.read("cam_b", "f")
    np.testing.assert_array_equal(s["label"], reference_estimator(registered).predict(Xb))
    assert list(s["sample_id"][:2]) == ["cam_b/0", "cam_b/1"] and set(s["device"]) == {"cam_b"}
    with pytest.warns(
        UserWarning, match="adapts device 'cam_b'.s features; the features of 'cam_a'"
    ):
        assert _predict(registered, store, tmp_path / "a.parquet", "--device", "cam_a") == 0
    arr = zarr.create_array(str(tmp_path / "x.zarr"), shape=Xb.shape, dtype="f8", chunks=(8, DIM))
    arr[:] = Xb
    assert _predict(registered, tmp_path / "x.zarr", tmp_path / "z.parquet") == 0
    pd.testing.assert_frame_equal(
        pd.read_parquet(tmp_path / "z.parquet").drop(columns="row"),
        s.drop(columns=["device", "row", "sample_id"]),
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda X: X[:, :5], "has 5 features, but model models:/io@champion is expecting 20"),
        (lambda X: np.where(np.arange(X.size).reshape(X.shape) == 3 * DIM + 2, np.nan, X),
         "NaN or Inf in 1 row(s): 3"),
    ],
)  # fmt: skip
def test_predict_bad_input_names_the_problem(registered, tmp_path, capsys, make, message):
    np.save(tmp_path / "bad.npy", make(target_samples(registered)))
    assert _predict(registered, tmp_path / "bad.npy", tmp_path / "o.csv") == 2
    assert message in capsys.readouterr().err


def test_predict_unknown_model(registered, tmp_path, capsys):
    np.save(tmp_path / "X.npy", target_samples(registered))
    rc = main(
        ["predict", "--model", "models:/io@nope", str(tmp_path / "X.npy"),
         "--tracking-uri", uri_of(registered)]
    )  # fmt: skip
    assert rc == 2
    assert "cannot load model 'models:/io@nope'" in capsys.readouterr().err


def test_predict_output_paths(registered, tmp_path, capsys):
    np.save(tmp_path / "X.npy", target_samples(registered))
    X = tmp_path / "X.npy"
    out = tmp_path / "new" / "dir" / "p.parquet"
    assert _predict(registered, X, out) == 0  # missing folders are created
    first = pd.read_parquet(out)
    assert _predict(registered, X, out) == 2
    assert "a predictions file written by this system); pass --overwrite" in capsys.readouterr().err
    assert _predict(registered, X, out, "--overwrite") == 0
    pd.testing.assert_frame_equal(pd.read_parquet(out), first)
    assert [p.name for p in out.parent.iterdir()] == ["p.parquet"]
    other = tmp_path / "notes.csv"
    other.write_text("a,b\n1,2\n")
    (tmp_path / "d.csv").mkdir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    for path, message in [
        (other, "is a file, not a predictions file written by this system"),
        (tmp_path / "d.csv", "is a directory, not a predictions file"),
        (blocker / "x.parquet", f"cannot create the folder {blocker} of the output"),
    ]:
        assert _predict(registered, X, path, "--overwrite") == 2
        err = capsys.readouterr().err
        assert message in err and "--overwrite" not in err, err
    assert other.read_text() == "a,b\n1,2\n"


def test_deploy_core_needs_no_study_or_engine():
    """The served code path imports numpy-only modules (shipped as code_paths)."""
    code = (
        "import sys; import mmdtl2_dist.core.adapter; "
        "bad = [m for m in ('ray', 'zarr', 'scipy', 'sklearn', 'osqp', 'mlflow') "
        "if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# A sitecustomize that makes scikit-learn and scipy unimportable in a whole interpreter.
BLOCK_SKLEARN_SCIPY = """
import sys


class BlockSklearnScipy:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("sklearn", "scipy"):
            raise ImportError(f"{name} is blocked: the deployed model must not need it")
        return None


sys.meta_path.insert(0, BlockSklearnScipy())
"""

PREDICT_FROM_ARTIFACTS = """
import sys
import numpy as np
import mlflow

model_dir, x_path, out_path = sys.argv[1:4]
try:
    import sklearn  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("the blocker did not load")
model = mlflow.pyfunc.load_model(model_dir)
pred = model.predict(np.load(x_path))
import mmdtl2_dist

assert mmdtl2_dist.__file__.startswith(model_dir), mmdtl2_dist.__file__  # the shipped copy
assert not [m for m in sys.modules if m.split(".")[0] in ("sklearn", "scipy")]
np.save(out_path, pred[[c for c in pred.columns if c.startswith("score_")]].to_numpy())
"""


def test_logged_model_predicts_without_sklearn_or_scipy(registered, tmp_path):
    """A prediction, not just imports: the logged model from its artifact folder, in an
    interpreter where importing scikit-learn or scipy raises ImportError."""
    import mlflow

    uri = uri_of(registered)
    mv = MlflowClient(tracking_uri=uri, registry_uri=uri).get_model_version_by_alias(
        "io", "champion"
    )
    with use_tracking_uri(uri):
        model_dir = mlflow.artifacts.download_artifacts(mv.source, dst_path=str(tmp_path / "m"))
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCK_SKLEARN_SCIPY)
    X = target_samples(registered)
    np.save(tmp_path / "X.npy", X)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tmp_path / "site")
    result = subprocess.run(
        [sys.executable, "-c", PREDICT_FROM_ARTIFACTS, model_dir, str(tmp_path / "X.npy"),
         str(tmp_path / "scores.npy")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    want = reference_estimator(registered).decision_function(X)
    np.testing.assert_array_equal(np.load(tmp_path / "scores.npy"), want)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([[0.5, True], [0.1, 0.2]], "holds bool True at row 0, column 1"),
        ([[0.5, 0.1], [0.1, "1.5"]], "holds str '1.5' at row 1, column 1"),
        (np.array([["0.5", "1"]]), "holds strings, e.g. '0.5' at row 0, column 0"),
        (np.array([[True, False]]), "holds booleans"),
        ([[0.5, 0.1], [0.2]], "rows of different lengths"),
        ([[0.5, None]], "NaN or Inf in 1 row(s): 0"),
        ([[]], "has 0 features, but the adapter is expecting 2"),
        (np.zeros((0, 2)), "has no samples"),
        (np.zeros(2), "must be 2-D"),
    ],
)
def test_adapter_refuses_what_is_not_a_number(rows, message):
    est = MMDTL2().fit_domains(
        np.eye(4, 2) + 0.1, [0, 1, 0, 1], np.eye(4, 2)[::-1] + 0.2, [0, 1, 0, 1]
    )
    with pytest.raises(ValueError) as err:
        est.adapter_.decision_function(rows)
    assert message in str(err.value)
    # numbers of every kind are accepted, and agree with the float64 array
    ref = est.adapter_.decision_function(np.array([[1.0, 2.0]]))
    for same in ([[1, 2.0]], [[np.int32(1), np.float32(2)]], np.array([[1, 2]])):
        np.testing.assert_array_equal(est.adapter_.decision_function(same), ref)


def test_register_logs_without_mlflow_type_hint_warning(fresh_study, capfd):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["register", str(fresh_study), "--name", "quiet", "--quiet"]) == 0
    out, err = capfd.readouterr()
    assert "type hints" not in out + err
    assert not [w for w in caught if "type hint" in str(w.message)]


def test_predict_wrong_dimension_says_only_what_is_wrong(registered, tmp_path, capsys):
    np.save(tmp_path / "X5.npy", target_samples(registered)[:, :5])
    assert _predict(registered, tmp_path / "X5.npy", tmp_path / "o.csv") == 2
    err = capsys.readouterr().err
    assert "X5.npy has 5 features, but model models:/io@champion is expecting 20" in err
    assert len(err) < 400 and "[[" not in err  # no array in the message
    # a feature column stored as strings: left out of the features, and named
    X = target_samples(registered)
    table = pd.DataFrame({f"f{j}": X[:, j] for j in range(X.shape[1])})
    table["f5"] = table["f5"].astype(str)
    table.to_parquet(tmp_path / "strings.parquet")
    assert _predict(registered, tmp_path / "strings.parquet", tmp_path / "o.csv") == 2
    err = capsys.readouterr().err
    assert "has 19 features" in err and "Its columns 'f5' are not numbers" in err
    # features in a list column: the other columns are identifiers, numbers or not
    lists = pd.DataFrame({"features": list(X[:, :5]), "weight": 1.0, "sample_id": "a"})
    lists.to_parquet(tmp_path / "lists.parquet")
    assert _predict(registered, tmp_path / "lists.parquet", tmp_path / "o.csv") == 2
    err = capsys.readouterr().err
    assert "has 5 features" in err and "not numbers" not in err


def test_predict_without_store_creates_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    np.save(tmp_path / "X.npy", np.zeros((2, DIM)))
    assert main(["predict", "--model", "models:/nowhere@champion", "X.npy"]) == 2
    err = capsys.readouterr().err
    assert f"no MLflow store at sqlite:///{tmp_path}/mlflow.db" in err
    assert "neither --tracking-uri nor MLFLOW_TRACKING_URI is set" in err
    assert "--tracking-uri sqlite:///STUDY/mlflow.db" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["X.npy"]
    missing = tmp_path / "elsewhere" / "mlflow.db"
    argv = ["predict", "--model", "models:/m@champion", "X.npy", "--tracking-uri"]
    assert main([*argv, f"sqlite:///{missing}"]) == 2
    assert f"no MLflow store at sqlite:///{missing} (--tracking-uri)" in capsys.readouterr().err
    assert not missing.parent.exists()


@pytest.mark.slow
@pytest.mark.ray
def test_register_after_real_study(tmp_path):
    """`mmdtl2 study run` (real Ray, Tune, MLflow) then `mmdtl2 register` and `predict`."""
    make_store(tmp_path / "store.zarr")
    spec = SPEC.split("[[methods]]")[0] + (
        '[[methods]]\nlabel = "MMDTL2"\nmethod = "mmdtl2"\n'
        'params = { qp_solver = "osqp", qp_tol = 1e-6 }\ngrid = { c_d = [0.1, 1.0] }\n'
    )
    (tmp_path / "spec.toml").write_text(spec)
    out = tmp_path / "out"
    assert main(["study", "run", str(tmp_path / "spec.toml"), "--output", str(out),
                 "--num-cpus", "2", "--quiet"]) == 0  # fmt: skip
    assert main(["register", str(out), "--name", "real", "--metric", "accuracy", "--quiet"]) == 0
    uri = uri_of(out)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    mv = client.get_model_version_by_alias("real", "champion")
    trial = client.get_run(mv.tags["trial_run_id"])
    assert float(mv.tags["metric_value"]) == trial.data.metrics["accuracy"]
    best = max(
        r.data.metrics["accuracy"]
        for r in client.search_runs([trial.info.experiment_id], f"tags.{ROLE_TAG} = 'trial'")
    )
    assert trial.data.metrics["accuracy"] == best
    X = target_samples(out)
    np.save(tmp_path / "X.npy", X)
    pred = tmp_path / "p.parquet"
    argv = ["predict", "--model", "models:/real@champion", str(tmp_path / "X.npy"), "-o", str(pred)]
    assert main([*argv, "--tracking-uri", uri, "--quiet"]) == 0
    c_d = json.loads(mv.tags["params"])["c_d"]
    fs = FeatureStore.open(tmp_path / "store.zarr")
    est = MMDTL2(c_d=c_d, qp_solver="osqp", qp_tol=1e-6, preprocessing="l2_zscore").fit_domains(
        fs.read("cam_a", "f"), np.arange(60) % 3 + 1, fs.read("cam_b", "f"), np.arange(45) % 3 + 1
    )
    np.testing.assert_array_equal(pd.read_parquet(pred)["label"], est.predict(X))


# -- an MLflow server with authentication -------------------------------------------------

# The documented configuration of the auth app, with its shared folder made local.
AUTH_INI = Path(__file__).resolve().parents[1] / "cluster" / "mlflow-auth.ini"
ADMIN = ("admin", "admin-Pw-0123456789")
TRAINER = ("trainer", "trainer-Pw-0123456789")
READER = ("reader", "reader-Pw-0123456789")


def _http(url: str, method: str = "GET", body: bytes | None = None, user=None) -> int:
    """Status of one HTTP request to the test server, with basic auth for ``user``."""
    import base64
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if user:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(user).encode()).decode()
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _answers(url: str) -> bool:
    try:
        return _http(url) == 200
    except OSError:  # not listening yet
        return False


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    """``mlflow server --app-name basic-auth`` on loopback as documented (docs/deploy.md,
    "Authentication"; cluster/mlflow-auth.ini), with users ``trainer`` and ``reader``."""
    import signal
    import socket
    import time

    folder = tmp_path_factory.mktemp("auth")
    ini = AUTH_INI.read_text().replace("/mnt/shared/mmdtl2", str(folder))
    (folder / "basic_auth.ini").write_text(ini)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        MLFLOW_AUTH_CONFIG_PATH=str(folder / "basic_auth.ini"),
        MLFLOW_AUTH_ADMIN_PASSWORD=ADMIN[1],
        MLFLOW_FLASK_SERVER_SECRET_KEY="test-secret-key-0123456789",
    )
    cmd = [*mlflow_server_command(folder, port), "--workers", "1"]  # the documented command
    cmd[0] = str(Path(sys.executable).with_name("mlflow"))
    log = folder / "server.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while not _answers(f"{uri}/health"):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"mlflow server --app-name basic-auth did not start:\n{log.read_text()}"
                )
            time.sleep(1)
        for name, password in (TRAINER, READER):
            body = json.dumps({"username": name, "password": password}).encode()
            assert _http(f"{uri}/api/2.0/mlflow/users/create", "POST", body, ADMIN) == 200
        yield uri, folder
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server's own session: its workers too
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _login(monkeypatch, user) -> None:
    if user is None:
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user[0])
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", user[1])


@pytest.mark.slow
def test_auth_server_refuses_anonymous_writes(auth_server):
    uri, _ = auth_server
    api = f"{uri}/api/2.0/mlflow"
    create = json.dumps({"name": "anonymous"}).encode()
    assert _http(f"{api}/experiments/create", "POST", create) == 401
    assert _http(f"{api}/registered-models/create", "POST", create) == 401
    assert _http(f"{uri}/api/2.0/mlflow-artifacts/artifacts/0/x/model_code.py", "PUT", b"x") == 401
    assert _http(f"{api}/registered-models/search") == 401
    assert _http(f"{api}/experiments/create", "POST", create, ("admin", "wrong")) == 401


@pytest.mark.slow
def test_register_and_predict_with_credentials(auth_server, tmp_path, monkeypatch, capsys):
    uri, folder = auth_server
    _login(monkeypatch, TRAINER)
    study = record_study(tmp_path / "s", tracking_uri=uri)  # trials logged as the trainer
    register = ["register", str(study), "--name", "secure", "--metric", "accuracy", "--quiet"]
    assert main(register) == 0  # the best trial: reference_estimator's configuration
    assert "models:/secure@champion" in capsys.readouterr().out

    # A prediction host with read-only credentials: the model, exactly.
    _login(monkeypatch, READER)
    X = target_samples(study)
    np.save(tmp_path / "X.npy", X)
    argv = ["predict", "--model", "models:/secure@champion", str(tmp_path / "X.npy"),
            "-o", str(tmp_path / "p.parquet"), "--tracking-uri", uri, "--quiet"]  # fmt: skip
    assert main(argv) == 0
    scores = pd.read_parquet(tmp_path / "p.parquet")[[f"score_{c}" for c in CLASS_NAMES]]
    np.testing.assert_array_equal(
        scores.to_numpy(), reference_estimator(study).decision_function(X)
    )

    # ... which can neither register a version, nor move the alias, nor change the code.
    assert main(register) == 2
    err = capsys.readouterr().err
    assert "Permission denied" in err and "write access to experiment" in err
    assert "MLFLOW_TRACKING_USERNAME" in err
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException, match="403"):
        client.set_registered_model_alias("secure", "champion", "1")
    code = next((folder / "mlartifacts").rglob("model_code.py"))
    path = code.relative_to(folder / "mlartifacts").as_posix()
    put = f"{uri}/api/2.0/mlflow-artifacts/artifacts/{path}"
    before = code.read_bytes()
    assert _http(put, "PUT", b"raise SystemExit('replaced')", READER) == 403
    assert code.read_bytes() == before
    versions = client.search_model_versions("name = 'secure'")
    assert [v.version for v in versions] == ["1"]

    # No credentials: refused, with what to set.
    _login(monkeypatch, None)
    assert main([*argv[:5], str(tmp_path / "p_anonymous.parquet"), *argv[6:]]) == 2
    err = capsys.readouterr().err
    assert "cannot load model 'models:/secure@champion'" in err and "401" in err
    assert "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in err


URIS_SET_BACK = """
import os, sys, mlflow
from mmdtl2_dist.deploy.registry import use_tracking_uri

def state():
    env = [os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")]
    return [mlflow.get_tracking_uri(), mlflow.get_registry_uri(), *env]

db = sys.argv[1]
for case in ("default", "set", "environment", "registry"):
    mlflow.set_tracking_uri(None)
    mlflow.set_registry_uri(None)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("MLFLOW_REGISTRY_URI", None)
    if case == "set":
        mlflow.set_tracking_uri(db + "/set.db")
    elif case == "environment":
        os.environ["MLFLOW_TRACKING_URI"] = db + "/env.db"
    elif case == "registry":
        mlflow.set_registry_uri(db + "/registry.db")
    before = state()
    with use_tracking_uri(db + "/inside.db"):
        assert mlflow.get_registry_uri() == mlflow.get_tracking_uri() == db + "/inside.db"
    assert state() == before, (case, before, state())
    mlflow.set_tracking_uri(db + "/later.db")  # a registry URI not set follows this one
    later = db + ("/registry.db" if case == "registry" else "/later.db")
    assert mlflow.get_registry_uri() == later, (case, mlflow.get_registry_uri())
print("ok")
"""


def test_use_tracking_uri_sets_back_the_uris_in_force(tmp_path):
    """Default, set, from the environment, a separate registry: each is in force again
    after the block, and a registry URI that was not set still follows the tracking URI."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    db = f"sqlite:///{tmp_path}"
    out = subprocess.run(
        [sys.executable, "-c", URIS_SET_BACK, db], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_deployed_method_and_params_name_the_rules_pick():
    """What a registered select='auto' version records is the pick's model: the target
    SVM keeps only its c_t and the configuration's solver settings; an MMDTL2 pick
    replaces the configuration's prior, weight and c_f, and records the c_d the rule
    fitted it with (scaled with a large source, 0 for D0); without the rule, the
    configuration's own."""
    from types import SimpleNamespace

    from mmdtl2_dist.deploy.registry import deployed_method_and_params

    full = {"prior": "zero", "prior_weight": 1.0, "c_f": 0.1, "c_t": 0.1, "qp_tol": 1e-6}
    cfg = SimpleNamespace(method="mmdtl2")
    o = SimpleNamespace(full_params=full, auto={"pick": "O", "method": "target_svm"})
    assert deployed_method_and_params(cfg, o) == ("target_svm", {"c_t": 1.0, "qp_tol": 1e-6})
    d = SimpleNamespace(full_params=full, auto={"pick": "D", "method": "mmdtl2", "c_d": 0.05})
    method, params = deployed_method_and_params(cfg, d)
    assert method == "mmdtl2" and params == {
        **full,
        "prior": "matrix",
        "prior_weight": 0.5,
        "c_f": 1.0,
        "c_d": 0.05,
    }
    # D without the pull: c_d = 0 whatever the configuration's
    d0 = SimpleNamespace(
        full_params={**full, "c_d": 0.1}, auto={"pick": "D0", "method": "mmdtl2", "c_d": 0.0}
    )
    assert deployed_method_and_params(cfg, d0)[1] == {**params, "c_d": 0.0}
    fixed = SimpleNamespace(full_params=full, auto=None)
    assert deployed_method_and_params(cfg, fixed) == ("mmdtl2", full)


def test_printed_serve_commands_survive_a_space_in_the_path():
    """`register` prints commands to paste: a study folder with a space stays one word."""
    import shlex

    from mmdtl2_dist.commands.register import serve_command

    uri = "sqlite:////tmp/my study/mlflow.db"
    for images in (False, True):
        words = shlex.split(serve_command(uri, "models:/m@champion", images))
        assert words[0] == f"MLFLOW_TRACKING_URI={uri}"
        assert "models:/m@champion" in words


def test_a_parquet_features_column_of_unequal_lists_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mmdtl2_dist.deploy.io import iter_batches

    path = tmp_path / "rag.parquet"
    pq.write_table(pa.table({"features": [[1.0, 2.0], [1.0, 2.0], [1.0, 2.0, 3.0]]}), path)
    with pytest.raises(
        ValueError, match=r"'features' lists have different lengths \(\[2, 3\]\), first at row 2"
    ):
        list(iter_batches(path, 10))


def test_registry_notices_are_dropped_and_other_lines_kept(capsys):
    """Whole lines pass, split over writes or not; MLflow's notices do not; a last line
    without its newline is flushed at the end."""
    from mmdtl2_dist.commands.register import registry_notices_dropped

    with registry_notices_dropped():
        print("Successfully registered model 'm'.", file=sys.stderr)
        sys.stderr.write("a warning, ")
        sys.stderr.write("in two writes\nCreated version '2' of model 'm'.\n")
        sys.stderr.write("unterminated")
    assert capsys.readouterr().err == "a warning, in two writes\nunterminated"
