"""Shared fixtures: a real local Ray cluster, temporary MLflow stores."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray cluster with 2 CPUs, shared by the whole test session.

    ``address="local"`` always starts a new cluster (a stale /tmp/ray session would
    otherwise make ``ray.init`` try to connect to it).
    """
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    yield ray
    ray.shutdown()


@pytest.fixture()
def mlflow_sqlite(tmp_path, monkeypatch):
    """A real MLflow tracking store: SQLite in a temporary folder, artifacts beside it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return {"tracking_uri": uri, "artifact_root": str(tmp_path / "artifacts")}


@pytest.fixture(autouse=True)
def _restore_sys_path():
    """Undo what a test's ``mlflow.pyfunc.load_model`` leaves in ``sys.path``.

    MLflow prepends a model's ``code/`` folder for good; ours holds a few
    ``mmdtl2_dist`` modules under the package's name, which would shadow the package for
    the later tests of this process and the worker processes they spawn.
    """
    import sys

    saved = list(sys.path)
    yield
    sys.path[:] = saved
