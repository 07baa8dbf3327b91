"""Where a Gram job's tasks run: a Ray session (connected or started here) or this process.

A local Ray started here is guarded by the watchdog of
:mod:`mmdtl2_dist.engine.ray_watchdog`, which stops its processes if this process dies.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
from pathlib import Path

from mmdtl2_dist.engine.in_process import IN_PROCESS, InProcessTasks

#: Niceness of the workers of a local Ray started here: that of the command that started
#: them. Ray's default (15) makes them yield the cores to any other process at normal
#: priority (another user's job, the plain loop a benchmark compares them with), so a
#: local run would be slowest exactly when the machine is shared. A cluster keeps the
#: niceness it was started with; ``RAY_worker_niceness`` set by the user wins.
WORKER_NICENESS = "0"


def task_runner(address: str | None, num_cpus: int | None, num_gpus: int | None = None):
    """Where the Gram's tasks run: this process (``address=IN_PROCESS``), else Ray.

    Returns ``(runner, owned)`` as :func:`ensure_ray` does; the in-process runner answers
    the same calls (:mod:`mmdtl2_dist.engine.in_process`) and is always owned: shutting
    it down frees what its tiles kept.
    """
    if address == IN_PROCESS:
        return InProcessTasks(), True
    return ensure_ray(address, num_cpus, num_gpus)


def ensure_ray(address: str | None, num_cpus: int | None, num_gpus: int | None = None):
    """Connect to Ray (a running session, the given cluster or a new local one).

    Returns ``(ray, owned)``: ``owned`` is True when this call connected or started Ray,
    so the caller shuts it down when done. A new local Ray is guarded by the watchdog of
    :mod:`mmdtl2_dist.engine.ray_watchdog`.
    """
    import ray

    if ray.is_initialized():
        return ray, False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address is None:
        # Ray starts its workers at niceness 15, below every other process of the machine;
        # the workers of a local run are this command's own work (see WORKER_NICENESS).
        os.environ.setdefault("RAY_worker_niceness", WORKER_NICENESS)
    # Workers must import this package even when it is not installed (a source checkout).
    pkg_root = str(Path(__file__).resolve().parents[2])
    env = {
        "env_vars": {
            "PYTHONPATH": os.pathsep.join(
                p for p in (pkg_root, os.environ.get("PYTHONPATH", "")) if p
            )
        }
    }
    if address is None:
        watchdog = _start_watchdog(ray)
        try:
            _hide_token_notice()
            ray.init(
                address="local",
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                runtime_env=env,
            )
        except BaseException:
            _dismiss_watchdog()  # it stops whatever the failed start left running
            raise
        _announce_session(watchdog)
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    return ray, True


#: Ray's notice on every local start with token authentication on by default. Its advice
#: (``RAY_AUTH_MODE=disabled`` "to opt out") would turn off the protection of a cluster
#: the product started for this command alone; the notice that authentication is *off*
#: is kept.
_TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"
_TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"


class _DropTokenNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_TOKEN_NOTICE)


def _hide_token_notice() -> None:
    """Keep Ray's token-authentication notice (:data:`_TOKEN_NOTICE`) off the output."""
    log = logging.getLogger(_TOKEN_LOGGER)
    if not any(isinstance(f, _DropTokenNotice) for f in log.filters):
        log.addFilter(_DropTokenNotice())


_WATCHDOG_SCRIPT = Path(__file__).with_name("ray_watchdog.py")
_watchdog: subprocess.Popen | None = None


def _start_watchdog(ray) -> subprocess.Popen | None:
    """Start the process that stops this local Ray's processes if this process dies.

    See :mod:`mmdtl2_dist.engine.ray_watchdog`. It runs in a session of its own and is
    dismissed (its input closed) when the next local Ray starts or this process exits.
    Returns None (and Ray starts unguarded) if it cannot start.
    """
    global _watchdog
    _dismiss_watchdog()  # the previous local Ray, if any, has been shut down
    cmd = [sys.executable, "-I", str(_WATCHDOG_SCRIPT), str(os.getpid())]
    proc = subprocess.Popen(
        [*cmd, str(Path(ray.__file__).parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    # Wait until it knows this process's existing children: Ray's must come after.
    ready, _, _ = select.select([proc.stdout], [], [], 30.0)
    if not ready or proc.stdout.readline().strip() != b"ready":
        proc.kill()
        proc.wait()
        return None
    proc.stdout.close()
    _watchdog = proc
    return proc


def _dismiss_watchdog() -> None:
    """Close the watchdog's input: it stops what is left of its session and exits."""
    global _watchdog
    if _watchdog is not None:
        _watchdog.stdin.close()
        _watchdog = None


def _announce_session(watchdog: subprocess.Popen | None) -> None:
    """Tell the watchdog the Ray session directory (it finds the session's orphans)."""
    if watchdog is None:
        return
    try:
        import ray._private.worker as ray_worker

        session_dir = ray_worker._global_node.get_session_dir_path()
        watchdog.stdin.write(f"session {session_dir}\n".encode())
        watchdog.stdin.flush()
    except (AttributeError, OSError):
        pass  # a Ray without this private API: the watchdog still tracks the processes
