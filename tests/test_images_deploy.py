"""From images to an adapter that takes images, end to end, as the README walks it.

``mmdtl2 synth-images`` -> ``mmdtl2 extract`` (real local Ray) -> ``mmdtl2 study run``
-> ``mmdtl2 register --with-extractor`` (real SQLite MLflow store) -> the image-input
model, loaded locally and served by ``mlflow models serve`` on loopback, answers images
with exactly the scores of the feature-input model on the store's features.
Weights are seeded random ones (no network here).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")
pytest.importorskip("torchvision")

from mmdtl2_dist.cli import main  # noqa: E402
from mmdtl2_dist.store.feature_store import FeatureStore  # noqa: E402

pytestmark = [pytest.mark.mlflow, pytest.mark.ray]

SPEC = """
[study]
name = "images_demo"
seed = 0
[data]
store = "store.zarr"
space = "conv5"
pairs = [["scope_a", "scope_b"]]
preprocessing = "l2_zscore"
[splits]
protocol = "half"
n_splits = 2
samples_per_class = [2]
[[methods]]
label = "MMDTL2"
method = "mmdtl2"
params = { kernel = "rbf" }
"""


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    """The README's walk from images to registered image- and feature-input adapters."""
    root = tmp_path_factory.mktemp("walk")
    run = lambda *a: main([str(x) for x in a])  # noqa: E731
    assert run("synth-images", root / "images", "--n-source", 8, "--n-target", 6,
               "--classes", 2) == 0  # fmt: skip
    assert run("extract", root / "images", root / "store.zarr", "--model", "alexnet:conv5",
               "--weights", "random:0", "--workers", 2, "--quiet") == 0  # fmt: skip
    (root / "spec.toml").write_text(SPEC)
    study = root / "study"
    assert run("study", "run", root / "spec.toml", "--output", study, "--num-cpus", 2,
               "--executor", "local", "--quiet") == 0  # fmt: skip
    assert run("register", study, "--name", "img", "--with-extractor", "random:0",
               "--quiet") == 0  # fmt: skip
    assert run("register", study, "--name", "feat", "--quiet") == 0
    return root, f"sqlite:///{study / 'mlflow.db'}"


def _device_images(root: Path, device: str) -> tuple[list[bytes], np.ndarray]:
    fs = FeatureStore.open(root / "store.zarr")
    m = fs.metadata[fs.metadata.device == device].sort_values("row")
    images = [(root / "images" / s).read_bytes() for s in m.sample_id]
    return images, fs.read(device, "conv5").astype(np.float64)


def test_image_model_scores_equal_feature_model_scores(walked, capsys):
    import mlflow

    from mmdtl2_dist.deploy.registry import use_tracking_uri

    root, uri = walked
    with use_tracking_uri(uri):
        img = mlflow.pyfunc.load_model("models:/img@champion")
        feat = mlflow.pyfunc.load_model("models:/feat@champion")
        mv = mlflow.MlflowClient().get_model_version_by_alias("img", "champion")
    for device in ("scope_a", "scope_b"):
        images, X = _device_images(root, device)
        got = img.predict(pd.DataFrame({"image": images}))
        b64 = img.predict(pd.DataFrame({"image": [base64.b64encode(i).decode() for i in images]}))
        want = feat.predict(X)
        pd.testing.assert_frame_equal(got, want)
        pd.testing.assert_frame_equal(b64, want)
    prov = FeatureStore.open(root / "store.zarr").provenance["extraction"]
    with use_tracking_uri(uri):
        client = mlflow.MlflowClient()
        mv_feat = client.get_model_version_by_alias("feat", "champion")
        study_run = client.search_runs(
            [client.get_experiment_by_name("mmdtl2-images_demo").experiment_id],
            "tags.mmdtl2_role = 'parent'",
        )
    assert mv.tags["input"] == "images" and "input" not in mv_feat.tags
    for tags in (mv.tags, mv_feat.tags, study_run[0].data.tags):
        assert tags["extractor_weights"] == "random:0"
        assert tags["extractor_weights_sha256"] == prov["weights"]["sha256"]
        assert tags["extractor"] == "alexnet:conv5->conv5"
    config = img.model_config
    assert config["extractor"]["layer"] == "conv5" and config["extractor"]["n_features"] == 43264
    with pytest.raises(Exception, match="cannot read the image in row 1: not an image file"):
        img.predict(pd.DataFrame({"image": [images[0], b"GIF89a broken"]}))


def test_register_with_other_weights_is_refused(walked, capsys):
    root, _ = walked
    rc = main(["register", str(root / "study"), "--name", "x", "--with-extractor", "random:1"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--with-extractor random:1: these weights (random:1, SHA-256" in err
    assert "are not those the study's features were extracted with (random:0" in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _wait_ping(port: int, proc: subprocess.Popen, log: Path, limit_s: float = 180.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if proc.poll() is not None:
            pytest.fail(f"mlflow models serve exited ({proc.returncode}):\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    pytest.fail(f"no /ping answer within {limit_s} s:\n{log.read_text()}")


def test_mlflow_models_serve_answers_one_image_with_a_class(walked, tmp_path):
    import mlflow

    from mmdtl2_dist.deploy.registry import use_tracking_uri

    root, uri = walked
    images, X = _device_images(root, "scope_b")
    with use_tracking_uri(uri):
        want = mlflow.pyfunc.load_model("models:/feat@champion").predict(X[:1])
    port, log = _free_port(), tmp_path / "serve.log"
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    cmd = ["mlflow", "models", "serve", "-m", "models:/img@champion", "--env-manager",
           "local", "-h", "127.0.0.1", "-p", str(port)]  # fmt: skip
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        _wait_ping(port, proc, log)
        one = {"dataframe_split": {"columns": ["image"],
                                   "data": [[base64.b64encode(images[0]).decode()]]}}  # fmt: skip
        status, body = _post(port, one)
        assert status == 200, body
        row = body["predictions"][0]
        assert row["class"] == want["class"][0]
        assert row[f"score_{want.columns[-1][6:]}"] == want.iloc[0, -1]
        junk = base64.b64encode(b"not an image").decode()
        bad = {"dataframe_split": {"columns": ["image"], "data": [[junk]]}}
        status, body = _post(port, bad)
        assert status == 400 and "cannot read the image in row 0" in body["message"], body
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_feature_commands_refuse_the_image_model_saying_what_to_use(walked, tmp_path, capsys):
    root, uri = walked
    _, X = _device_images(root, "scope_b")
    np.save(tmp_path / "X.npy", X)
    model = "models:/img@champion"
    assert main(["predict", "--model", model, str(tmp_path / "X.npy"), "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert "takes images (registered with --with-extractor)" in err and "mlflow models serve" in err
    assert main(["serve", "--model", model, "--tracking-uri", uri, "-p", "1"]) == 2
    err = capsys.readouterr().err
    assert f"serve it with `mlflow models serve -m {model} --env-manager local`" in err
