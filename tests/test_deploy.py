"""Deployed adapters: the pyfunc model, ``mmdtl2 register`` and ``mmdtl2 predict``.

Everything runs on a real SQLite MLflow store and a real Zarr feature store. The study is
a *recorded* one: its spec, state file and MLflow trial runs are written the way
``mmdtl2 study run`` writes them (through :class:`StudyTracker`), with made-up accuracies,
so that which trial is best is known and no Ray cluster is needed. A real study run is
in ``test_register_after_real_study`` (marked ``slow`` and ``ray``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
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


def make_store(path: Path, n=(60, 45), seed=0) -> Path:
    rng = np.random.default_rng(seed)
    mu = rng.normal(size=(3, DIM)) * 0.8
    with StoreWriter(path, overwrite=True) as w:
        for d, (dev, m) in enumerate(zip(("cam_a", "cam_b"), n, strict=True)):
            y = np.arange(m) % 3 + 1
            X = mu[y - 1] + rng.normal(size=(m, DIM)) + d * rng.normal(size=DIM)
            a = w.create_array(dev, "f", m, DIM, dtype=np.float64)
            a.append(X)
            ids = [f"{dev}/{i}" for i in range(m)]
            a.set_metadata(
                label=y, class_name=[CLASS_NAMES[k - 1] for k in y], group=ids, sample_id=ids
            )
    return path


def record_study(folder: Path) -> Path:
    """A study folder as `mmdtl2 study run` leaves it, with the ACCURACY results."""
    folder.mkdir(parents=True, exist_ok=True)
    store = make_store(folder / "store.zarr")
    (folder / "spec.toml").write_text(SPEC)
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
    rc = main(["register", str(study), "--name", "tiny-adapter", "--quiet"])
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
    rc = main(
        ["predict", "--model", "models:/tiny-adapter@champion", str(tmp_path / "X.npy"),
         "-o", str(tmp_path / "p.parquet"), "--tracking-uri", uri_of(study), "--quiet"]
    )  # fmt: skip
    assert rc == 0
    pred = pd.read_parquet(tmp_path / "p.parquet")
    est = reference_estimator(study)
    np.testing.assert_array_equal(pred["label"].to_numpy(), est.predict(X))
    scores = pred[[f"score_{c}" for c in CLASS_NAMES]].to_numpy()
    np.testing.assert_array_equal(scores, est.decision_function(X))
    assert list(pred["class"]) == [CLASS_NAMES[k - 1] for k in est.predict(X)]
    assert list(pred["row"]) == list(range(len(X)))


def test_model_layout_is_self_contained(study):
    import mlflow

    main(["register", str(study), "--name", "layout", "--quiet"])
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


def test_register_twice_moves_alias_only(fresh_study):
    uri = uri_of(fresh_study)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert main(["register", str(fresh_study), "--name", "m", "--quiet"]) == 0
    client.set_registered_model_alias("m", "stable", "1")
    v1 = client.get_model_version("m", "1")
    exp = client.get_experiment_by_name("mmdtl2-deploy_tiny")
    trials_before = client.search_runs([exp.experiment_id], f"tags.{ROLE_TAG} = 'trial'")

    assert main(["register", str(fresh_study), "--name", "m", "--quiet"]) == 0
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
        (["--method", "mmdtl2", "--param", "kernel=rbf", "--export-w"], "linear kernel"),
        (["--method", "mmdtl2", "--param", "c_q=1"], "no parameter 'c_q'"),
        (["--method", "mmdtl2", "--param", "c_d=-1"], "c_d must be"),
        (["--param", "c_d=1"], "need --method"),
        (["--alias", "latest"], "reserved"),
    ],
)
def test_register_errors_name_the_fix(study, capsys, args, message):
    rc = main(["register", str(study), "--name", "err", "--quiet", *args])
    assert rc == 2
    assert message in capsys.readouterr().err


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
    assert main(["register", str(study), "--name", "io", "--quiet"]) == 0
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
        (lambda X: X[:, :5], "does not match expected shape (-1, 20)"),
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
    import subprocess
    import sys

    code = (
        "import sys; import mmdtl2_dist.core.adapter; "
        "bad = [m for m in ('ray', 'zarr', 'scipy', 'sklearn', 'osqp', 'mlflow') "
        "if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


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
    assert main(["register", str(out), "--name", "real", "--quiet"]) == 0
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
