"""A throwaway multi-node Ray cluster on one machine, started with ``ray start``.

Each node is a separate ``ray start --block`` process with its own temporary directory
and its own ports, in a session of its own: stopping a node ends exactly the processes
that node started (its raylet, agents and workers), never other Ray clusters running on
the same machine. Token authentication is on, with a fresh token passed to the nodes in
``RAY_AUTH_TOKEN`` (``~/.ray/auth_token`` is left alone).

A test fixture of the cluster workflow (``tests/test_cluster_loopback.py``,
``tests/test_submit.py``), not part of the package. The ``ray start`` arguments it adds
to the documented ones (``--block``, ``--temp-dir`` and explicit ports) only keep several
nodes apart on one host.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

# Unix socket paths (under --temp-dir) must stay below ~107 bytes: keep the root short.
_ROOT_PREFIX = "/tmp/mm2c-"


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that were free on the loopback interface a moment ago."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def head_command(port: int, dashboard_port: int, num_cpus: int) -> list[str]:
    """The documented command that starts a head node (see docs/run_on_a_cluster.md).

    The dashboard (and with it the Jobs API) listens on the head's loopback interface
    only: clients reach it through an SSH or ``kubectl`` port-forward.
    """
    return [
        "ray", "start", "--head",
        f"--port={port}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard_port}",
        f"--num-cpus={num_cpus}",
    ]  # fmt: skip


def worker_command(head_address: str, num_cpus: int) -> list[str]:
    """The documented command that adds a worker node (see docs/run_on_a_cluster.md)."""
    return ["ray", "start", f"--address={head_address}", f"--num-cpus={num_cpus}"]


def mlflow_server_command(shared: str | Path, port: int | str) -> list[str]:
    """The documented MLflow tracking server (docs/deploy.md, docs/run_on_a_cluster.md).

    MLflow's basic-auth app on the loopback interface: the study's driver runs on the same
    machine, and other machines go through a port-forward or an authenticating TLS proxy.
    Its configuration is ``MLFLOW_AUTH_CONFIG_PATH`` (``cluster/mlflow-auth.ini``).
    """
    return [
        "mlflow", "server", "--app-name=basic-auth",
        f"--backend-store-uri=sqlite:///{shared}/mlflow.db",
        f"--artifacts-destination={shared}/mlartifacts",
        "--host=127.0.0.1",
        f"--port={port}",
    ]  # fmt: skip


@dataclass
class LoopbackNode:
    """One ``ray start --block`` process and everything it started."""

    name: str
    temp_dir: Path
    log_path: Path
    proc: subprocess.Popen

    def pids(self) -> list[int]:
        """Processes of this node: those in the session its ``ray start`` leads."""
        sid = self.proc.pid
        mine = []
        for p in psutil.process_iter():
            try:
                if os.getsid(p.pid) == sid:
                    mine.append(p.pid)
            except (ProcessLookupError, PermissionError):
                continue
        return mine

    def processes(self) -> list[psutil.Process]:
        """:meth:`pids` as ``psutil.Process`` objects (those still alive)."""
        procs = []
        for pid in self.pids():
            try:
                procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
        return procs

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        """Stop this node's processes: ``sig`` first, SIGKILL for what survives ``timeout``."""
        _terminate(self.processes(), sig, timeout)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _terminate(procs: list[psutil.Process], sig: int, timeout: float) -> None:
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


@dataclass
class LoopbackCluster:
    """A head node and ``num_workers`` worker nodes on this machine, token auth on.

    Parameters
    ----------
    num_workers : int
        Worker nodes besides the head.
    num_cpus : int
        CPUs each node offers to Ray.
    object_store_memory : int
        Bytes of ``/dev/shm`` each node's object store may take.
    env : dict, optional
        Extra environment for every node (``PYTHONPATH`` to emulate an installed
        package, for instance).

    Examples
    --------
    >>> with LoopbackCluster(num_workers=1) as cluster:  # doctest: +SKIP
    ...     env = cluster.client_env()   # RAY_AUTH_MODE / RAY_AUTH_TOKEN for clients
    ...     print(cluster.dashboard_url)
    """

    num_workers: int = 1
    num_cpus: int = 1
    object_store_memory: int = 100 * 2**20
    env: dict[str, str] = field(default_factory=dict)
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix=_ROOT_PREFIX)))
    nodes: list[LoopbackNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.port, self.dashboard_port = free_ports(2)

    @property
    def gcs_address(self) -> str:
        """``host:port`` that worker nodes join (``ray start --address``)."""
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard_url(self) -> str:
        """The Jobs API address for ``mmdtl2 submit --address``."""
        return f"http://127.0.0.1:{self.dashboard_port}"

    def client_env(self) -> dict[str, str]:
        """Environment for a client of this cluster: ours plus the auth variables."""
        return {**os.environ, **self._auth_env()}

    def _auth_env(self) -> dict[str, str]:
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token}

    def _node_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            **self._auth_env(),
            **self.env,
        }

    def _isolation_args(self, temp_dir: Path, head: bool) -> list[str]:
        # Distinct ports and temp dirs keep two nodes of one host (and other
        # engineers' clusters) apart; a real cluster needs none of this.
        names = [
            "--node-manager-port", "--object-manager-port", "--metrics-export-port",
            "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
            "--runtime-env-agent-port",
        ]  # fmt: skip
        if head:
            names.append("--ray-client-server-port")
        ports = free_ports(len(names))
        return [
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--temp-dir={temp_dir}",
            f"--object-store-memory={self.object_store_memory}",
            "--disable-usage-stats",
            *(f"{n}={p}" for n, p in zip(names, ports, strict=True)),
        ]

    def _launch(self, name: str, command: list[str], head: bool) -> LoopbackNode:
        temp_dir = self.root / name
        temp_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.root / f"{name}.log"
        ray_bin = str(Path(sys.executable).with_name("ray"))
        argv = [ray_bin if command[0] == "ray" else command[0], *command[1:]]
        argv += self._isolation_args(temp_dir, head)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._node_env(),
                start_new_session=True,  # its own session: stop() finds its processes
            )
        node = LoopbackNode(name, temp_dir, log_path, proc)
        self.nodes.append(node)
        return node

    def start(self, timeout: float = 90.0) -> LoopbackCluster:
        """Start the head, then the workers; return once every node is alive."""
        self._launch("head", head_command(self.port, self.dashboard_port, self.num_cpus), True)
        self._wait(1, timeout)
        for i in range(self.num_workers):
            self.add_worker(f"worker{i + 1}", timeout=timeout)
        return self

    def add_worker(self, name: str, timeout: float = 90.0) -> LoopbackNode:
        """Start one more worker node and wait until the cluster counts it."""
        expected = self.alive_nodes() + 1
        node = self._launch(name, worker_command(self.gcs_address, self.num_cpus), False)
        self._wait(expected, timeout)
        return node

    def node(self, name: str) -> LoopbackNode:
        """The node called ``name`` (``"head"``, ``"worker1"``, ...)."""
        return next(n for n in self.nodes if n.name == name)

    def api(self, path: str, timeout: float = 10.0) -> dict:
        """GET a JSON endpoint of the dashboard (``/api/v0/nodes``, ``/api/v0/tasks``, ...)."""
        request = urllib.request.Request(
            f"{self.dashboard_url}{path}", headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)

    def alive_nodes(self) -> int:
        """Number of nodes the cluster reports alive (0 while the dashboard is down)."""
        try:
            payload = self.api("/api/v0/nodes?limit=100", timeout=5)
        except (OSError, ValueError):
            return 0
        rows = payload.get("data", {}).get("result", {}).get("result", [])
        return sum(1 for row in rows if row.get("state") == "ALIVE")

    def node_ids(self) -> dict[str, str]:
        """Ray node id of each node ever started, by name (dead ones included).

        The head is the node Ray marks as head; workers are matched by start order
        (:meth:`add_worker` waits for each one before starting the next).
        """
        rows = self.api("/api/v0/nodes?limit=100&detail=1")["data"]["result"]["result"]
        heads = [r["node_id"] for r in rows if r.get("is_head_node")]
        others = sorted(
            (r for r in rows if not r.get("is_head_node")), key=lambda r: r["start_time_ms"]
        )
        names = [n.name for n in self.nodes if n.name != "head"]
        return {"head": heads[0], **{n: r["node_id"] for n, r in zip(names, others, strict=False)}}

    def _wait(self, n_nodes: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc.poll() is not None:
                    raise RuntimeError(
                        f"node {node.name} exited with status {node.proc.returncode}; "
                        f"see {node.log_path}:\n{_tail(node.log_path)}"
                    )
            if self.alive_nodes() >= n_nodes:
                return
            time.sleep(1.0)
        raise TimeoutError(
            f"the loopback cluster has not {n_nodes} live node(s) after {timeout:.0f} s; "
            f"logs under {self.root}"
        )

    def stop(self, keep_logs: bool = False) -> None:
        """Stop every node at once and remove the temporary directory."""
        _terminate([p for node in self.nodes for p in node.processes()], signal.SIGTERM, 10.0)
        for node in self.nodes:
            try:
                node.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if not keep_logs:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LoopbackCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""
