"""A real two-node Ray cluster on this machine, token authentication on.

The head and a worker are started with ``ray start`` (``LoopbackCluster``: one CPU each,
separate temporary directories, ports and process sessions), and every job goes through
the real ``mmdtl2 submit`` in a subprocess. The commands are those of
docs/run_on_a_cluster.md, rendered with this machine's addresses: a test checks that the
documented commands are exactly the ones run here. Only the processes these tests start
are stopped (never ``ray stop``: other Ray clusters may run on the same machine).

``MMDTL2_CLI`` overrides how ``mmdtl2`` is run (default: this interpreter with
``-m mmdtl2_dist.cli``; e.g. ``MMDTL2_CLI=mmdtl2`` tests an installed console script).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from loopback import (
    LoopbackCluster,
    free_ports,
    head_command,
    mlflow_server_command,
    worker_command,
)

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "run_on_a_cluster.md"
CLUSTER_README = ROOT / "cluster" / "README.md"
MMDTL2 = shlex.split(os.environ.get("MMDTL2_CLI", f"{sys.executable} -m mmdtl2_dist.cli"))
JOB_TIMEOUT = 300  # seconds; a job here takes 10-60 s on a busy 2-core machine

# The documented commands, with the values the documentation shows them with.
# The dashboard and the MLflow server listen on the head's loopback interface: your
# machine reaches them through an SSH port-forward, the job's driver (on the head) directly.
DOC_VALUES = {
    "head_ip": "HEAD_IP",
    "address": "http://127.0.0.1:8265",
    "shared": "/mnt/shared/mmdtl2",
    "mlflow": "http://127.0.0.1:5000",
    "job_id": "JOB_ID",
}
# The MLflow user the study jobs log as (docs/run_on_a_cluster.md, step 3).
JOB_USER = ("mmdtl2", "job-Pw-0123456789")
SYNTH = "mmdtl2 synth {shared}/study.zarr --n-source 60 --n-target 45 --dim 64 --groups 10"
SUBMIT_STUDY = (
    "mmdtl2 submit --address {address} --working-dir . --runtime-env cluster/runtime_env.yaml "
    "-- python jobs/study.py run {shared}/study.toml --output {shared}/studies/cluster_demo "
    "--address auto --tracking-uri {mlflow}"
)
SUBMIT_GRAM_NO_WAIT = (
    "mmdtl2 submit --address {address} --installed --no-wait -- python -m mmdtl2_dist.cli "
    "gram {shared}/study.zarr --space conv3 --address auto"
)
FOLLOW = "mmdtl2 submit --address {address} --follow {job_id}"
STOP = "mmdtl2 submit --address {address} --stop {job_id}"


# --- the documentation's commands ----------------------------------------------------


def doc_blocks(lang: str, doc: Path = DOC) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", doc.read_text(), flags=re.S)


def doc_commands(doc: Path) -> set[str]:
    """Each shell command of a document on one line, comments removed."""
    commands = set()
    for block in doc_blocks("bash", doc):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line:
                commands.add(" ".join(line.split()))
    return commands


@pytest.mark.parametrize("doc", [DOC, CLUSTER_README], ids=lambda p: p.parent.name + "/" + p.name)
def test_documented_commands_are_the_tested_ones(doc):
    documented = doc_commands(doc)
    expected = [
        shlex.join(head_command(6379, 8265, 8)),
        shlex.join(worker_command("HEAD_IP:6379", 8)),
        shlex.join(mlflow_server_command(DOC_VALUES["shared"], 5000)),
        *(t.format(**DOC_VALUES) for t in (SYNTH, SUBMIT_STUDY)),
        *(t.format(**DOC_VALUES) for t in (SUBMIT_GRAM_NO_WAIT, FOLLOW, STOP)),
        "export RAY_AUTH_MODE=token",
    ]
    missing = [c for c in expected if c not in documented]
    assert not missing, f"not in {doc} (or changed there): {missing}"
    assert len(doc_blocks("toml")) == 1  # the study spec the test runs


def run(template: str, values: dict, env: dict, timeout: float = JOB_TIMEOUT, **kw):
    """Run a documented command with this cluster's values (``mmdtl2`` -> MMDTL2)."""
    argv = shlex.split(template.format(**values))
    if argv[0] == "mmdtl2":
        argv = [*MMDTL2, *argv[1:]]
    return subprocess.run(
        argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kw
    )


# --- fixtures ------------------------------------------------------------------------


def _cluster():
    # PYTHONPATH on the nodes plays the part of an installed mmdtl2-dist (--installed); the
    # MLflow credentials are those exported before `ray start` on the head (the driver's).
    env = {"PYTHONPATH": str(ROOT), **_mlflow_login(JOB_USER)}
    return LoopbackCluster(num_workers=1, num_cpus=1, env=env)


def _mlflow_login(user: tuple[str, str]) -> dict[str, str]:
    return {"MLFLOW_TRACKING_USERNAME": user[0], "MLFLOW_TRACKING_PASSWORD": user[1]}


@pytest.fixture(scope="module")
def cluster():
    c = _cluster()
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture(scope="module")
def shared():
    """The 'shared storage' of the loopback nodes: a short folder on this machine."""
    with tempfile.TemporaryDirectory(prefix="mm2s-") as d:
        yield Path(d)


@pytest.fixture(scope="module")
def mlflow_server(shared):
    """A real ``mlflow server`` with authentication on loopback (the documented command
    and ``cluster/mlflow-auth.ini``, one worker), with the jobs' user created."""
    import base64
    import json
    import urllib.request

    (port,) = free_ports(1)
    ini = (ROOT / "cluster" / "mlflow-auth.ini").read_text()
    (shared / "mlflow-auth.ini").write_text(ini.replace("/mnt/shared/mmdtl2", str(shared)))
    admin = ("admin", "admin-Pw-0123456789")
    env = dict(
        os.environ,
        MLFLOW_AUTH_CONFIG_PATH=str(shared / "mlflow-auth.ini"),
        MLFLOW_AUTH_ADMIN_PASSWORD=admin[1],
        MLFLOW_FLASK_SERVER_SECRET_KEY="test-secret-key-0123456789",
    )
    argv = [*mlflow_server_command(shared, port), "--workers", "1"]
    argv[0] = str(Path(sys.executable).with_name("mlflow"))
    log = open(shared / "mlflow-server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{uri}/health", proc, 180)
        request = urllib.request.Request(
            f"{uri}/api/2.0/mlflow/users/create",
            data=json.dumps({"username": JOB_USER[0], "password": JOB_USER[1]}).encode(),
            headers={
                "Content-Type": "application/json",
                "Authorization": "Basic " + base64.b64encode(":".join(admin).encode()).decode(),
            },
        )
        urllib.request.urlopen(request, timeout=30).close()
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server's own session: its workers too
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


def _wait_http(url: str, proc: subprocess.Popen, timeout: float) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"no answer from {url} after {timeout} s")


@pytest.fixture(scope="module")
def store(shared):
    result = run(SYNTH, {"shared": shared}, dict(os.environ), timeout=120)
    assert result.returncode == 0, result.stderr
    return shared / "study.zarr"


def values(cluster: LoopbackCluster, shared: Path, **more) -> dict:
    return {"address": cluster.dashboard_url, "shared": shared, **more}


def trials_by_node(cluster: LoopbackCluster) -> dict[str, int]:
    """How many Tune trial actors (function trainables) ran on each node, by node name."""
    rows = cluster.api("/api/v0/actors?limit=10000&detail=1")["data"]["result"]["result"]
    ids = {v: k for k, v in cluster.node_ids().items()}
    counts: dict[str, int] = {}
    for row in rows:
        if row.get("class_name") == "ImplicitFunc":
            node = ids.get(row.get("node_id"), row.get("node_id"))
            counts[node] = counts.get(node, 0) + 1
    return counts


# --- tests ---------------------------------------------------------------------------


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.mlflow
def test_study_on_two_nodes_reports_and_logs_to_mlflow(cluster, shared, store, mlflow_server):
    from mlflow.tracking import MlflowClient

    (shared / "study.toml").write_text(doc_blocks("toml")[0])
    v = values(cluster, shared, mlflow=mlflow_server)
    result = run(SUBMIT_STUDY, v, cluster.client_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "SUCCEEDED" in result.stderr
    # The logs were streamed: the study's table is in the output.
    assert "| n_per_class | target SVM | MMDTL2 |" in result.stdout

    out = shared / "studies" / "cluster_demo"
    for name in ("report.md", "table.csv", "results.csv"):
        assert (out / "report" / name).stat().st_size > 0

    with mock.patch.dict(os.environ, _mlflow_login(JOB_USER)):
        client = MlflowClient(mlflow_server)
        exp = client.get_experiment_by_name("mmdtl2-cluster_demo")
        runs = client.search_runs([exp.experiment_id])
    roles = [r.data.tags.get("mmdtl2_role") for r in runs]
    assert roles.count("parent") == 1
    assert roles.count("trial") == 2 * 2  # 2 methods x 2 sample counts
    trials = [r for r in runs if r.data.tags.get("mmdtl2_role") == "trial"]
    assert all("accuracy" in r.data.metrics for r in trials)

    # The study's Tune trials ran as actors of this two-node cluster. (Which node gets a
    # trial is Ray's choice: this tiny study has few, short trials, so spreading is shown
    # with slow Gram tiles in test_worker_node_lost_during_gram_loses_nothing.)
    trials = trials_by_node(cluster)
    assert sum(trials.values()) >= 1 and set(trials) <= {"head", "worker1"}, trials
    assert cluster.alive_nodes() == 2


SIGINT_DEFAULT_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


@pytest.mark.ray
@pytest.mark.slow
def test_no_wait_follow_and_stop(cluster, shared, store):
    env = cluster.client_env()
    v = values(cluster, shared)
    submitted = run(SUBMIT_GRAM_NO_WAIT, v, env)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]
    assert job_id.startswith("raysubmit_")
    followed = run(FOLLOW, {**v, "job_id": job_id}, env)
    assert followed.returncode == 0, followed.stderr
    assert "tiles" in followed.stdout  # the Gram command's own summary, streamed

    from mmdtl2_dist.core.preprocessing import fit_preprocessing
    from mmdtl2_dist.engine import GramStore, gram_location
    from mmdtl2_dist.store.feature_store import FeatureStore

    # The Gram is where the documented study (preprocessing l2_zscore) finds it.
    fs = FeatureStore.open(store)
    gram = GramStore.open(gram_location(fs, "conv3", "l2_zscore"))
    assert gram.complete and gram.path.parent == shared / "study.zarr.grams"
    raw = [fs.read(d, "conv3").astype(np.float64) for d in gram.devices]
    X = np.concatenate([fit_preprocessing(x, "l2_zscore").transform(x) for x in raw])
    # Same float64 sums in another order: a few ulps of the largest entries.
    np.testing.assert_allclose(gram.to_numpy(), X @ X.T, rtol=1e-10, atol=1e-8)

    sleeper = shlex.join(["python", "-c", "import time; time.sleep(600)"])
    template = "mmdtl2 submit --address {address} --installed --no-wait -- " + sleeper
    started = run(template, v, env)
    job_id = started.stdout.strip().splitlines()[-1]
    stopped = run(STOP, {**v, "job_id": job_id}, env)
    assert stopped.returncode == 0 and "STOPPED" in stopped.stderr, stopped.stderr
    assert run(FOLLOW, {**v, "job_id": job_id}, env).returncode == 3

    # Ctrl-C while following a job stops the job (exit status 130).
    argv = [*MMDTL2, *shlex.split(template.format(**v).replace(" --no-wait", ""))[1:]]
    # Start it as a terminal would: a suite launched in the background (`make test &`,
    # many CI runners) ignores SIGINT, and an ignored signal stays ignored across exec.
    argv = [sys.executable, "-c", SIGINT_DEFAULT_EXEC, *argv]
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    while line and "submitted job" not in line:
        line = proc.stderr.readline()
    job_id = line.split()[2]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and f"job {job_id}: STOPPED" in err, err


@pytest.mark.ray
@pytest.mark.slow
def test_failed_job_and_missing_token(cluster, shared, tmp_path):
    env = cluster.client_env()
    v = values(cluster, shared)
    failing = "mmdtl2 submit --address {address} --installed -- python -c 'raise SystemExit(5)'"
    assert run(failing, v, env).returncode == 1
    # No token anywhere (HOME without ~/.ray/auth_token): refused, with the fix.
    bare = {k: x for k, x in env.items() if not k.startswith("RAY_AUTH")}
    bare["HOME"] = str(tmp_path)
    refused = run("mmdtl2 submit --address {address} --installed -- true", v, bare)
    assert refused.returncode == 2
    assert "token" in refused.stderr and "RAY_AUTH_TOKEN" in refused.stderr
    # A job id the cluster does not know: one line and exit 2, following or stopping it.
    for template in (FOLLOW, STOP):
        unknown = run(template, {**v, "job_id": "raysubmit_nope"}, env)
        assert unknown.returncode == 2, unknown.stderr
        assert "has no job 'raysubmit_nope'" in unknown.stderr
        assert "Traceback" not in unknown.stderr


SLOW_GRAM = """
import sys
from mmdtl2_dist.engine.driver import compute_gram

store, out, probe, tests = sys.argv[1:5]
sys.path.insert(0, tests)
from slow_tiles import slow_gram_tiles

with slow_gram_tiles(probe, delay=2.0):
    gs = compute_gram(store, "conv3", out, tile_rows=16, address="auto", progress=False)
print("GRAM DONE", gs.last_run if hasattr(gs, "last_run") else "")
"""


@pytest.mark.ray
@pytest.mark.slow
def test_worker_node_lost_during_gram_loses_nothing(store, tmp_path):
    """SIGKILL every process of the worker node while it computes a tile: the job still
    succeeds, the lost tiles run again on the head, and the Gram is exact."""
    from mmdtl2_dist.engine.gram_store import GramStore
    from mmdtl2_dist.store.feature_store import FeatureStore

    script = tmp_path / "slow_gram.py"
    script.write_text(SLOW_GRAM)
    probe = tmp_path / "probe"
    probe.mkdir()
    out = tmp_path / "gram"
    with _cluster() as cluster:
        env = cluster.client_env()
        v = values(cluster, tmp_path)
        entry = shlex.join(
            ["python", str(script), str(store), str(out), str(probe), str(ROOT / "tests")]
        )
        started = run("mmdtl2 submit --address {address} --installed --no-wait -- " + entry, v, env)
        assert started.returncode == 0, started.stderr
        job_id = started.stdout.strip().splitlines()[-1]
        worker, head = cluster.node("worker1"), cluster.node("head")
        deadline = time.monotonic() + 120
        victim, on_head = None, False
        while not (victim and on_head) and time.monotonic() < deadline:
            started = {p: int(p.suffix[1:]) for p in probe.iterdir()}
            on_worker = [p for p, pid in started.items() if pid in set(worker.pids())]
            on_head = on_head or any(pid in set(head.pids()) for pid in started.values())
            victim = on_worker[0] if on_worker else None
            time.sleep(0.2)
        # Gram tiles spread over both nodes (2 s each, one CPU per node).
        assert victim is not None and on_head, "tiles did not run on both nodes"
        worker.stop(sig=signal.SIGKILL)
        assert not worker.pids()
        followed = run(FOLLOW, {**v, "job_id": job_id}, env)
        assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr[-3000:]

    # The tile being computed on the lost node was computed again, by another process.
    key = victim.stem
    attempts = {p.suffix for p in probe.glob(f"{key}.*")}
    assert len(attempts) >= 2, attempts
    gram = GramStore.open(out)
    assert gram.complete
    fs = FeatureStore.open(store)
    X = np.concatenate([fs.read(d, "conv3") for d in gram.devices]).astype(np.float64)
    np.testing.assert_allclose(gram.to_numpy(), X @ X.T, rtol=1e-10, atol=1e-8)
