"""A real ``mlflow models serve`` of a registered adapter, on loopback, offline.

The test registers an adapter in a temporary SQLite store, starts the documented command
(``--env-manager local``, the venv's ``bin`` first on ``PATH``) in its own process group,
waits for ``/ping`` (bounded), and checks: correct classes and exact scores for
``inputs`` and ``dataframe_split`` requests; a 400 naming the problem for a wrong feature
dimension and for NaN; that the server still answers afterwards. It stops only the
process group it started.
"""

from __future__ import annotations

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
import pytest

from mmdtl2_dist.deploy.pyfunc import log_adapter
from mmdtl2_dist.deploy.registry import use_tracking_uri
from mmdtl2_dist.estimators import MMDTL2

pytestmark = pytest.mark.mlflow

DIM = 20
NAMES = ["adenoma", "hyperplastic", "normal"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, body: str, timeout: float = 30.0) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations",
        data=body.encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _wait_ping(port: int, proc: subprocess.Popen, log: Path, limit_s: float = 90.0) -> None:
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


@pytest.fixture()
def served(tmp_path):
    """A fitted estimator, registered as models:/served@champion and being served."""
    import mlflow
    from mlflow.tracking import MlflowClient

    rng = np.random.default_rng(3)
    mu = rng.normal(size=(3, DIM))
    ys, yt = np.arange(60) % 3, np.arange(15) % 3
    Xs = mu[ys] + rng.normal(size=(60, DIM))
    Xt = mu[yt] + rng.normal(size=(15, DIM)) + 0.5
    est = MMDTL2(kernel="rbf", preprocessing="l2_zscore").fit_domains(Xs, ys, Xt, yt)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.create_experiment("serve", artifact_location=(tmp_path / "art").as_uri())
    with use_tracking_uri(uri):
        with mlflow.start_run(experiment_id=exp):
            info = log_adapter(est.adapter_, class_names=NAMES, input_example=Xt[:1])
        mv = mlflow.register_model(info.model_uri, "served")
    client.set_registered_model_alias("served", "champion", mv.version)

    port = _free_port()
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    log = tmp_path / "serve.log"
    cmd = ["mlflow", "models", "serve", "-m", "models:/served@champion",
           "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]  # fmt: skip
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_ping(port, proc, log)
        yield est, port, rng
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the group of the process started here
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_served_adapter_answers_and_rejects_bad_input(served):
    est, port, rng = served
    X = rng.normal(size=(7, DIM))
    want = est.predict(X)
    want_scores = est.decision_function(X)

    status, body = _post(port, json.dumps({"inputs": X.tolist()}))
    assert status == 200
    preds = body["predictions"]
    assert [p["label"] for p in preds] == want.tolist()
    assert [p["class"] for p in preds] == [NAMES[k] for k in want]
    # JSON carries float64 exactly (repr round-trips): the served scores are the estimator's
    got = np.array([[p[f"score_{n}"] for n in NAMES] for p in preds])
    np.testing.assert_array_equal(got, want_scores)

    split = {"columns": [f"f{i}" for i in range(DIM)], "data": X.tolist()}
    status, body = _post(port, json.dumps({"dataframe_split": split}))
    assert status == 200
    assert [p["label"] for p in body["predictions"]] == want.tolist()

    status, body = _post(port, json.dumps({"inputs": X[:, :5].tolist()}))
    assert status == 400
    assert body["error_code"] == "INVALID_PARAMETER_VALUE"
    assert "Shape of input (7, 5) does not match expected shape (-1, 20)" in body["message"]

    Xn = X.copy()
    Xn[4, 2] = np.nan
    status, body = _post(port, json.dumps({"inputs": Xn.tolist()}))  # NaN token (allow_nan)
    assert status == 400
    assert "NaN or Inf in 1 row(s): 4" in body["message"]
    assert f"{DIM} features" in body["message"]

    row = [1.0] * DIM
    row[3] = None
    status, body = _post(port, json.dumps({"inputs": [row]}))  # JSON null reads as NaN
    assert status == 400 and "NaN or Inf" in body["message"]

    status, body = _post(port, json.dumps({"inputs": X[:2].tolist()}))  # still serving
    assert status == 200
    assert [p["label"] for p in body["predictions"]] == want[:2].tolist()
