"""Real servers of a registered adapter, on loopback, offline.

An adapter is registered in a temporary SQLite store and served by the two documented
commands, each started in its own process group and stopped by it alone, after a bounded
wait for ``/ping``:

- ``mlflow models serve`` (``--env-manager local``, the venv's ``bin`` first on ``PATH``):
  correct classes and exact scores for ``inputs`` and ``dataframe_split`` requests, a
  400 naming the problem for a wrong feature dimension and for NaN, still serving after;
- ``mmdtl2 serve`` (the served configuration, with small limits): the same answers, and
  what it refuses: booleans and numeric strings (400 naming row and column), malformed
  JSON (400 without the body, fast), a body over the byte limit (413 before it is read,
  and while a chunked body streams), more rows than allowed (413), other content types.
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
from contextlib import contextmanager
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


def _post(
    port: int, body: str, timeout: float = 30.0, content_type: str = "application/json"
) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations",
        data=body.encode(),
        headers={"Content-Type": content_type},
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


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """A fitted estimator, registered as models:/served@champion; the store's URI."""
    import mlflow
    from mlflow.tracking import MlflowClient

    tmp_path = tmp_path_factory.mktemp("registry")
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
    return est, uri


@contextmanager
def running(cmd: list[str], uri: str, port: int, log: Path):
    """Run a server command in its own process group until the block ends."""
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_ping(port, proc, log)
        yield proc
    finally:
        _signal_group(proc.pid, signal.SIGTERM)  # the group of the process started here
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # every process of the group has exited
        pass


@pytest.fixture()
def served(registered, tmp_path):
    """The adapter under ``mlflow models serve`` (the documented command)."""
    est, uri = registered
    port = _free_port()
    cmd = ["mlflow", "models", "serve", "-m", "models:/served@champion",
           "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]  # fmt: skip
    with running(cmd, uri, port, tmp_path / "serve.log"):
        yield est, port, np.random.default_rng(3)


MAX_ROWS = 50


@pytest.fixture(scope="module")
def mmdtl2_served(registered, tmp_path_factory):
    """The adapter under ``mmdtl2 serve``: 1 MiB and 50 rows per request, two workers."""
    est, uri = registered
    port = _free_port()
    cmd = [sys.executable, "-m", "mmdtl2_dist.cli", "serve", "--model", "models:/served@champion",
           "--port", str(port), "--workers", "2", "--max-request-mb", "1",
           "--max-rows", str(MAX_ROWS)]  # fmt: skip
    with running(cmd, uri, port, tmp_path_factory.mktemp("serve") / "serve.log"):
        yield est, port


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


def test_mmdtl2_serve_answers_exactly(mmdtl2_served):
    est, port = mmdtl2_served
    X = np.random.default_rng(4).normal(size=(7, DIM))
    status, body = _post(port, json.dumps({"inputs": X.tolist()}))
    assert status == 200
    preds = body["predictions"]
    assert [p["label"] for p in preds] == est.predict(X).tolist()
    got = np.array([[p[f"score_{n}"] for n in NAMES] for p in preds])
    np.testing.assert_array_equal(got, est.decision_function(X))
    split = {"columns": [f"f{i}" for i in range(DIM)], "data": X.tolist()}
    status, body = _post(port, json.dumps({"dataframe_split": split}))
    assert status == 200 and [p["label"] for p in body["predictions"]] == est.predict(X).tolist()
    ints = np.arange(DIM).reshape(1, -1)  # JSON integers are numbers too
    status, body = _post(port, json.dumps({"inputs": ints.tolist()}))
    assert status == 200 and body["predictions"][0]["label"] == est.predict(ints)[0]


def _row(**at) -> list:
    row = [0.5] * DIM
    for col, value in at.items():
        row[int(col[1:])] = value
    return row


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"inputs": [_row(), _row(c3=True)]}, "holds bool True at row 1, column 3"),
        ({"inputs": [_row(c5="1.5")]}, "holds str '1.5' at row 0, column 5"),
        ({"instances": [_row(c0=False)]}, "holds bool False at row 0, column 0"),
        ({"dataframe_split": {"columns": [f"f{i}" for i in range(DIM)],
                              "data": [_row(), _row(), _row(c7="2")]}},
         "holds str '2' at row 2, column 7"),
        ({"inputs": [_row()[:5]]}, "has 5 features, but the model (target) is expecting 20"),
        ({"inputs": [_row(), _row()[:3]]}, "rows of different lengths"),
        ({"inputs": [_row(c2=None)]}, "NaN or Inf in 1 row(s): 0"),
        ({"dataframe_records": [{"f0": 1.0}]}, "one of the keys ['inputs', 'instances'"),
        ({"inputs": []}, "holds no rows"),
        ({"inputs": "abc"}, "the request's 'inputs' is a JSON str, not a list of rows"),
        ({"dataframe_split": {"columns": ["f0"], "data": 5}},
         "the request's dataframe_split's \"data\" is a JSON int, not a list of rows"),
        ({"inputs": [_row(c4=10**400)]}, "integer too large for float64 at row 0, column 4"),
    ],
)  # fmt: skip
def test_mmdtl2_serve_refuses_what_is_not_a_row_of_numbers(mmdtl2_served, payload, message):
    _, port = mmdtl2_served
    status, body = _post(port, json.dumps(payload))
    assert status == 400, body
    assert body["error_code"] == "INVALID_PARAMETER_VALUE"
    assert message in body["message"]
    assert len(body["message"]) < 300  # the message, never the data


def test_mmdtl2_serve_malformed_and_oversize_requests(mmdtl2_served):
    est, port = mmdtl2_served
    rows = [_row()] * (MAX_ROWS // 2)
    broken = json.dumps({"inputs": rows})[:-3]  # valid up to its end
    t0 = time.monotonic()
    status, body = _post(port, broken)
    assert (
        status == 400 and "not valid JSON" in body["message"] and "line 1 column" in body["message"]
    )
    assert len(json.dumps(body)) < 400 and time.monotonic() - t0 < 10

    status, body = _post(port, json.dumps({"inputs": [_row()] * (MAX_ROWS + 1)}))
    assert (
        status == 413
        and f"{MAX_ROWS + 1} rows, over the server's limit of {MAX_ROWS}" in (body["message"])
    )

    status, body = _post(port, json.dumps({"inputs": [_row()]}), content_type="text/csv")
    assert status == 415 and "application/json" in body["message"]

    # A declared body over the limit: refused before the server reads it.
    head = (
        "POST /invocations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {50 * 2**20}\r\n\r\n"
    )
    assert _raw_status(port, head.encode() + b'{"inputs": [[') == 413
    # A chunked body with no declared length: refused once it passes the limit.
    head = (
        "POST /invocations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"%x\r\n%s\r\n" % (2**18, b" " * 2**18)
    assert _raw_status(port, head.encode() + chunk * 5) == 413

    status, body = _post(port, json.dumps({"inputs": [_row()]}))  # still serving
    assert status == 200 and body["predictions"][0]["label"] == est.predict([_row()])[0]


def _raw_status(port: int, data: bytes) -> int:
    """Send raw bytes of an HTTP request; the status code of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed while the body was still coming
        answer = sock.recv(4096)
    return int(answer.split(b" ", 2)[1])


def test_mmdtl2_serve_on_a_port_in_use_names_it_before_downloading(tmp_path, capsys):
    """A port another process holds: a clear error and exit 2, before the model is even
    looked up (uvicorn would start, then exit 3 with "Address already in use")."""
    from mmdtl2_dist.cli import main

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        uri = f"sqlite:///{tmp_path / 'none.db'}"
        rc = main(["serve", "--model", "models:/x/1", "--port", str(port), "--tracking-uri", uri])
    err = capsys.readouterr().err
    assert rc == 2 and f"cannot serve on 127.0.0.1:{port}" in err and "--port" in err
    assert not (tmp_path / "none.db").exists()


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


def test_workers_of_a_killed_server_stop_and_free_its_port(registered, tmp_path):
    """A real SIGKILL of ``mmdtl2 serve`` (two workers): its workers, orphaned, stop
    within seconds instead of answering on its port with the model it served, and the
    port is free for the next server."""
    _, uri = registered
    port = _free_port()
    cmd = [sys.executable, "-m", "mmdtl2_dist.cli", "serve", "--model", "models:/served@champion",
           "--port", str(port), "--workers", "2"]  # fmt: skip
    with running(cmd, uri, port, tmp_path / "serve.log") as proc:
        os.kill(proc.pid, signal.SIGKILL)  # the server alone; its workers live on
        proc.wait(timeout=10)
        t0 = time.monotonic()
        while _answers(port) and time.monotonic() - t0 < 30:
            time.sleep(0.5)
        log = (tmp_path / "serve.log").read_text()
        assert not _answers(port), log[-2000:]
        deadline = time.monotonic() + 30  # a loaded machine: the two lines may come late
        while log.count("is gone.") < 2 and time.monotonic() < deadline:  # each worker says so
            time.sleep(0.2)
            log = (tmp_path / "serve.log").read_text()
        assert log.count("stops: its server (process") == 2, log[-2000:]
    with running(cmd, uri, port, tmp_path / "again.log"):
        assert _answers(port)


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_port_out_of_range_is_a_usage_error(port, capsys):
    from mmdtl2_dist.cli import main

    with pytest.raises(SystemExit) as e:
        main(["serve", "--model", "models:/x@champion", "--port", port])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument -p/--port:" in err and "Traceback" not in err


WORKER = """
import signal, sys, time
from mmdtl2_dist.deploy.serve import stop_when_orphaned
signal.signal(signal.SIGTERM, lambda *a: (print("stopped", flush=True), sys.exit(0)))
stop_when_orphaned(int(sys.argv[1]))
time.sleep(5)
print("still serving", flush=True)
"""


def test_a_worker_whose_server_died_while_it_loaded_stops_at_once():
    """A server SIGKILLed while a worker still loaded its model: the worker, re-parented
    before it could watch its server, stops instead of serving on its port forever. A
    worker naming a server that runs but is not its parent is left alone."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for server, expected in ((gone.pid, "stopped"), (sibling.pid, "still serving")):
            out = subprocess.run(
                [sys.executable, "-c", WORKER, str(server)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert out.stdout.strip() == expected, out.stderr
    finally:
        sibling.kill()
        sibling.wait()
