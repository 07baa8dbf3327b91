"""Submit, follow and stop jobs on a Ray cluster through the Ray Jobs API.

The Jobs API is served by the head node's dashboard (``http://HEAD:8265``). A job is a
shell command (the *entrypoint*, e.g. ``mmdtl2 study run ...`` or
``python jobs/study.py ...``) run by a driver on the cluster, with a *runtime
environment*: either the local working directory uploaded to the cluster, or nothing
uploaded when the package is installed on every node.

Token authentication (on by default for clusters started by Ray >= 2.59) is handled by
sending the cluster's token as a bearer header. The token is looked up the way Ray looks
it up, so the same settings serve ``ray`` and ``mmdtl2``: an explicit token file, then
``RAY_AUTH_TOKEN``, then the file named by ``RAY_AUTH_TOKEN_PATH``, then
``~/.ray/auth_token``.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlparse

import yaml

if TYPE_CHECKING:  # ray is imported lazily: ``mmdtl2 --help`` must stay fast.
    from ray.job_submission import JobStatus, JobSubmissionClient

#: Paths never uploaded with ``--working-dir`` (gitignore-style patterns, as Ray's
#: ``excludes``): environments, caches, local tracking stores, feature stores and their
#: Gram folders, which belong on shared storage, not in every job's upload.
DEFAULT_EXCLUDES: tuple[str, ...] = (
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    "*.egg-info",
    "build",
    "dist",
    "mlflow.db",
    "mlruns",
    "mlartifacts",
    "runs",
    "results",
    "*.zarr",
    "*.grams",
)

#: Ports that belong to the cluster but are not the Jobs API, with the fix to suggest.
_NOT_JOBS_PORTS = {
    6379: "6379 is the GCS port used by `ray start --address`",
    10001: "10001 is the Ray Client port (ray://)",
}

#: Exit status of ``mmdtl2 submit`` for each final job status.
_EXIT_CODES = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 3}


def auth_token(token_file: str | os.PathLike | None = None) -> str | None:
    """Find the cluster's authentication token, as Ray's own clients do.

    Parameters
    ----------
    token_file : path-like, optional
        A file holding the token; it wins over every other source.

    Returns
    -------
    str or None
        The token, or None when no source holds one (the cluster may not need it).

    Raises
    ------
    ValueError
        If ``token_file`` or ``RAY_AUTH_TOKEN_PATH`` names a missing or empty file.
    """
    if token_file is not None:
        return _read_token(Path(token_file), "--auth-token-file")
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip()
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return _read_token(Path(os.environ["RAY_AUTH_TOKEN_PATH"]), "RAY_AUTH_TOKEN_PATH")
    default = Path.home() / ".ray" / "auth_token"
    if default.is_file():
        return default.read_text().strip() or None
    return None


def _read_token(path: Path, source: str) -> str:
    try:
        token = path.expanduser().read_text().strip()
    except OSError as exc:
        raise ValueError(
            f"{source} names {path}, which cannot be read ({exc.strerror}); "
            "copy the cluster's token there (`ray get-auth-token` on the head node prints it)"
        ) from None
    if not token:
        raise ValueError(f"{source} names {path}, which is empty; write the cluster's token in it")
    return token


def auth_headers(token_file: str | os.PathLike | None = None) -> dict[str, str]:
    """HTTP headers that authenticate to a cluster with token authentication on.

    Parameters
    ----------
    token_file : path-like, optional
        A file holding the token (see :func:`auth_token` for the other sources).

    Returns
    -------
    dict
        ``{"Authorization": "Bearer <token>"}``, or an empty dict when no token is found.
        A cluster without authentication ignores the header.
    """
    token = auth_token(token_file)
    return {"Authorization": f"Bearer {token}"} if token else {}


def check_address(address: str | None) -> str:
    """Check that ``address`` is the HTTP address of a cluster's Jobs API.

    Parameters
    ----------
    address : str or None
        ``http://HEAD:8265`` (or ``https://...``). None reads ``RAY_API_SERVER_ADDRESS``,
        then ``RAY_ADDRESS``, as ``ray job submit`` does.

    Returns
    -------
    str
        The address without a trailing slash.

    Raises
    ------
    ValueError
        If no address is given, or it is not an http(s) URL with a host, or it names the
        GCS or Ray Client port instead of the dashboard's.
    """
    if not address:
        address = os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS")
    if not address:
        raise ValueError(
            "no cluster address: pass --address http://HEAD_IP:8265 "
            "(the head node's dashboard) or set RAY_API_SERVER_ADDRESS"
        )
    parsed = urlparse(address)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(
            f"cluster address {address!r} is not an http(s) URL; the Jobs API is served by "
            "the head node's dashboard: use --address http://HEAD_IP:8265"
        )
    if parsed.port in _NOT_JOBS_PORTS:
        raise ValueError(
            f"cluster address {address!r}: {_NOT_JOBS_PORTS[parsed.port]}, not the Jobs API; "
            "use the dashboard port (default 8265): --address http://HEAD_IP:8265"
        )
    return address.rstrip("/")


def connect(address: str | None, headers: Mapping[str, str] | None = None) -> JobSubmissionClient:
    """Open a Jobs API client to a running cluster.

    Parameters
    ----------
    address : str or None
        The dashboard address, see :func:`check_address`.
    headers : mapping, optional
        Extra HTTP headers, e.g. from :func:`auth_headers`.

    Returns
    -------
    ray.job_submission.JobSubmissionClient

    Raises
    ------
    ValueError
        If the address is malformed, nothing answers there, or the cluster refuses the
        token; the message says what to check.
    """
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    address = check_address(address)
    try:
        return JobSubmissionClient(address, headers=dict(headers or {}))
    except AuthenticationError as exc:
        raise ValueError(
            f"the cluster at {address} refused the request ({_first_line(exc)}); it has token "
            "authentication on: put its token in RAY_AUTH_TOKEN, in ~/.ray/auth_token, or in "
            "a file passed with --auth-token-file (`ray get-auth-token` on the head prints it)"
        ) from None
    except (ConnectionError, RuntimeError, OSError) as exc:
        raise ValueError(
            f"cannot reach a Ray cluster's Jobs API at {address} ({_first_line(exc)}); check "
            "that the head node is up (`ray status` there) with its dashboard (port 8265 by "
            "default, on the head's loopback), and that an SSH port-forward reaches it from "
            "here (`ssh -N -L 8265:127.0.0.1:8265 USER@HEAD_IP`, then --address "
            "http://127.0.0.1:8265; docs/run_on_a_cluster.md)"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def build_runtime_env(
    working_dir: str | os.PathLike | None = None,
    runtime_env_file: str | os.PathLike | None = None,
    env_vars: Mapping[str, str] | None = None,
    excludes: Sequence[str] = DEFAULT_EXCLUDES,
) -> dict[str, Any]:
    """Assemble a job's runtime environment.

    Parameters
    ----------
    working_dir : path-like, optional
        Local directory to upload; the job runs in (and imports from) its copy. None
        uploads nothing: the package must be installed on every node.
    runtime_env_file : path-like, optional
        YAML file with a Ray runtime environment (``cluster/runtime_env.yaml`` is the
        project's); ``working_dir`` and ``env_vars`` given here take precedence.
    env_vars : mapping, optional
        Environment variables for the job's driver and every task and actor it starts
        (``MLFLOW_TRACKING_URI`` for instance).
    excludes : sequence of str
        Patterns not uploaded with the working directory, added to the file's.

    Returns
    -------
    dict
        A runtime environment for :func:`submit_job`.

    Raises
    ------
    ValueError
        If the file is not a YAML mapping or ``working_dir`` is not a directory.
    FileNotFoundError
        If ``runtime_env_file`` does not exist.
    """
    env: dict[str, Any] = {}
    if runtime_env_file is not None:
        path = Path(runtime_env_file)
        if not path.is_file():
            raise FileNotFoundError(f"runtime environment file {path} does not exist")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(
                f"runtime environment file {path} must hold a YAML mapping "
                f"(working_dir:, env_vars:, ...), not a {type(loaded).__name__}"
            )
        env.update(loaded)
    if working_dir is not None:
        wd = Path(working_dir).expanduser().resolve()
        if not wd.is_dir():
            raise ValueError(f"--working-dir {working_dir} is not a directory")
        env["working_dir"] = str(wd)
    if "working_dir" in env:
        env["excludes"] = list(dict.fromkeys([*env.get("excludes", []), *excludes]))
    if env_vars:
        env["env_vars"] = {**env.get("env_vars", {}), **{k: str(v) for k, v in env_vars.items()}}
    _warn_local_tracking(env.get("env_vars", {}))
    return env


def _warn_local_tracking(env_vars: Mapping[str, str]) -> None:
    uri = env_vars.get("MLFLOW_TRACKING_URI", "")
    if uri.startswith(("sqlite:", "file:")) or (uri and "://" not in uri):
        warnings.warn(
            f"MLFLOW_TRACKING_URI={uri} is a local store: on a multi-node cluster it must lie "
            "on storage shared by every node, and SQLite takes one writer at a time; prefer "
            "an MLflow server (MLFLOW_TRACKING_URI=http://MLFLOW_HOST:5000)",
            UserWarning,
            stacklevel=3,
        )


def submit_job(
    client: JobSubmissionClient,
    entrypoint: Sequence[str] | str,
    runtime_env: Mapping[str, Any] | None = None,
    *,
    submission_id: str | None = None,
    entrypoint_num_cpus: float = 0,
    metadata: Mapping[str, str] | None = None,
) -> str:
    """Submit a job and return its submission id.

    Parameters
    ----------
    client : JobSubmissionClient
        From :func:`connect`.
    entrypoint : sequence of str or str
        The command the driver runs, as arguments (quoted for the shell here) or one
        shell string.
    runtime_env : mapping, optional
        From :func:`build_runtime_env`.
    submission_id : str, optional
        A job id of your choosing (it must be new to the cluster).
    entrypoint_num_cpus : float
        CPUs reserved for the driver. The default 0 leaves every CPU to the Gram tasks
        and Tune trials the driver starts.
    metadata : mapping, optional
        Free-form labels shown by ``ray job list``.

    Returns
    -------
    str
        The job's submission id.

    Raises
    ------
    ValueError
        If the entrypoint is empty, or the cluster does not accept the job.
    """
    command = entrypoint if isinstance(entrypoint, str) else shlex.join(entrypoint)
    if not command.strip():
        raise ValueError(
            "no entrypoint: put the command after `--`, e.g. "
            "`mmdtl2 submit --address http://HEAD_IP:8265 --installed -- mmdtl2 study run ...`"
        )
    try:
        return client.submit_job(
            entrypoint=command,
            runtime_env=dict(runtime_env or {}),
            submission_id=submission_id,
            entrypoint_num_cpus=entrypoint_num_cpus,
            metadata=dict(metadata or {}),
        )
    except RuntimeError as exc:  # the Jobs API answered with an error status
        raise ValueError(
            f"the cluster did not accept the job ({_first_line(exc)}); nothing runs. Check "
            "the head with `ray status` and its dashboard log "
            "(/tmp/ray/session_latest/logs/dashboard*.log), then submit again"
        ) from None


def check_job(client: JobSubmissionClient, job_id: str) -> None:
    """Raise ValueError naming the fix when the cluster knows no job ``job_id``."""
    try:
        client.get_job_info(job_id)
    except RuntimeError as exc:
        _raise_if_no_such_job(exc, job_id)
        raise


def _raise_if_no_such_job(exc: RuntimeError, job_id: str) -> None:
    """Raise ValueError naming the fix when the Jobs API's error says ``job_id`` is unknown."""
    if "does not exist" in str(exc) or "404" in str(exc):
        raise ValueError(
            f"the cluster has no job {job_id!r}; `ray job list --address ...` lists them"
        ) from None


def follow_job(
    client: JobSubmissionClient,
    job_id: str,
    out: IO[str] | None = None,
    poll_interval: float = 1.0,
) -> JobStatus:
    """Stream a job's logs until it ends and return its final status.

    Logs are tailed over the Jobs API's websocket; if that fails (a proxy that does not
    pass websockets, say) they are polled instead.

    Parameters
    ----------
    client : JobSubmissionClient
    job_id : str
    out : text stream, optional
        Where the logs go (standard output by default).
    poll_interval : float
        Seconds between status (and, when polling, log) requests.

    Returns
    -------
    ray.job_submission.JobStatus
        SUCCEEDED, FAILED or STOPPED.
    """
    out = out or sys.stdout
    try:
        asyncio.run(_tail(client, job_id, out))
    except asyncio.CancelledError:
        # Ctrl-C: asyncio.run cancels the log stream and raises KeyboardInterrupt, unless
        # the signal lands inside one of the stream's own timeouts, which count
        # cancellations too; then the cancellation itself escapes. Nothing else cancels it.
        raise KeyboardInterrupt from None
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"(log stream lost: {_first_line(exc)}; polling instead)", file=sys.stderr)
        _poll_logs(client, job_id, out, poll_interval)
    return _wait_terminal(client, job_id, poll_interval)


async def _tail(client: JobSubmissionClient, job_id: str, out: IO[str]) -> None:
    async for chunk in client.tail_job_logs(job_id):
        out.write(chunk)
        out.flush()


def _poll_logs(client: JobSubmissionClient, job_id: str, out: IO[str], interval: float) -> None:
    shown = 0
    while True:
        done = client.get_job_status(job_id).is_terminal()
        logs = client.get_job_logs(job_id)
        out.write(logs[shown:])
        out.flush()
        shown = len(logs)
        if done:
            return
        time.sleep(interval)


def _wait_terminal(
    client: JobSubmissionClient, job_id: str, interval: float, timeout: float | None = None
) -> JobStatus:
    start = time.monotonic()
    while True:
        status = client.get_job_status(job_id)
        if status.is_terminal():
            return status
        if timeout is not None and time.monotonic() - start > timeout:
            return status
        time.sleep(interval)


def stop_job(
    client: JobSubmissionClient, job_id: str, wait: bool = True, timeout: float = 60.0
) -> JobStatus:
    """Ask the cluster to stop a job and return its status afterwards.

    Parameters
    ----------
    client : JobSubmissionClient
    job_id : str
    wait : bool
        Wait (up to ``timeout`` seconds) until the job has ended.
    timeout : float

    Returns
    -------
    ray.job_submission.JobStatus
        STOPPED when the stop took effect; the job's own final status if it had ended
        already; RUNNING or PENDING if it has not ended within ``timeout``.

    Raises
    ------
    ValueError
        If the cluster knows no job with that id.
    """
    try:
        client.stop_job(job_id)
    except RuntimeError as exc:
        _raise_if_no_such_job(exc, job_id)
        raise
    if not wait:
        return client.get_job_status(job_id)
    return _wait_terminal(client, job_id, 0.5, timeout)


def exit_code(status: JobStatus | str) -> int:
    """Exit status of ``mmdtl2 submit`` for a final job status.

    0 for SUCCEEDED, 1 for FAILED, 3 for STOPPED, 4 for a job that has not ended.
    """
    return _EXIT_CODES.get(str(getattr(status, "value", status)), 4)
