"""``mmdtl2 submit`` without a cluster: addresses, tokens, runtime environments, arguments.

The submission itself, against a real two-node cluster, is in tests/test_cluster_loopback.py.
"""

from __future__ import annotations

import argparse
import warnings

import pytest
from loopback import free_ports

from mmdtl2_dist.cluster import submit as sub
from mmdtl2_dist.commands import submit as command


@pytest.fixture()
def clean_auth_env(tmp_path, monkeypatch):
    """No token anywhere: a fresh HOME and none of Ray's token variables."""
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mmdtl2")
    command.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["submit", *argv])


# --- addresses -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "hint"),
    [
        ("127.0.0.1:8265", "http(s) URL"),
        ("ray://head:10001", "http(s) URL"),
        ("http://head:6379", "GCS port"),
        ("http://head:10001", "Ray Client port"),
        ("http://:8265", "http(s) URL"),
    ],
)
def test_check_address_refuses_what_is_not_the_jobs_api(address, hint, clean_auth_env):
    with pytest.raises(ValueError, match="8265") as info:
        sub.check_address(address)
    assert hint in str(info.value)


def test_check_address_reads_the_environment_like_ray(clean_auth_env, monkeypatch):
    with pytest.raises(ValueError, match="--address"):
        sub.check_address(None)
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265/")
    assert sub.check_address(None) == "http://head:8265"
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "https://jobs.example.org")
    assert sub.check_address(None) == "https://jobs.example.org"


def test_connect_to_nothing_says_what_to_check(clean_auth_env):
    (port,) = free_ports(1)  # nothing listens there
    with pytest.raises(ValueError, match="cannot reach") as info:
        sub.connect(f"http://127.0.0.1:{port}")
    assert "ray status" in str(info.value)


# --- tokens --------------------------------------------------------------------------


def test_auth_token_sources_in_rays_order(clean_auth_env, tmp_path, monkeypatch):
    assert sub.auth_token() is None and sub.auth_headers() == {}
    (clean_auth_env / ".ray").mkdir()
    (clean_auth_env / ".ray" / "auth_token").write_text("from-home\n")
    assert sub.auth_token() == "from-home"
    path_file = tmp_path / "token_path"
    path_file.write_text("from-path")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(path_file))
    assert sub.auth_token() == "from-path"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    assert sub.auth_token() == "from-env"
    explicit = tmp_path / "explicit"
    explicit.write_text("from-file")
    assert sub.auth_token(explicit) == "from-file"
    assert sub.auth_headers(explicit) == {"Authorization": "Bearer from-file"}


def test_unreadable_or_empty_token_file_is_an_error(clean_auth_env, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="cannot be read"):
        sub.auth_token(tmp_path / "missing")
    (tmp_path / "empty").write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        sub.auth_token(tmp_path / "empty")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="RAY_AUTH_TOKEN_PATH"):
        sub.auth_token()


# --- runtime environments ------------------------------------------------------------


def test_runtime_env_for_an_upload(tmp_path):
    spec = tmp_path / "env.yaml"
    spec.write_text("excludes: [big/]\nenv_vars: {A: '1', B: '2'}\n")
    env = sub.build_runtime_env(tmp_path, spec, {"B": "3", "C": 4})
    assert env["working_dir"] == str(tmp_path.resolve())
    assert env["excludes"][0] == "big/" and ".venv" in env["excludes"]
    assert env["env_vars"] == {"A": "1", "B": "3", "C": "4"}


def test_runtime_env_for_an_installed_package_uploads_nothing(tmp_path):
    env = sub.build_runtime_env(None, None, {"X": "1"})
    assert env == {"env_vars": {"X": "1"}}


def test_runtime_env_bad_inputs(tmp_path):
    with pytest.raises(FileNotFoundError):
        sub.build_runtime_env(runtime_env_file=tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="mapping"):
        sub.build_runtime_env(runtime_env_file=tmp_path / "list.yaml")
    with pytest.raises(ValueError, match="not a directory"):
        sub.build_runtime_env(working_dir=tmp_path / "nope")


@pytest.mark.parametrize(
    ("uri", "warns"),
    [
        ("sqlite:///tmp/mlflow.db", True),
        ("/data/mlruns", True),
        ("http://mlflow:5000", False),
        ("databricks", True),
    ],
)
def test_local_mlflow_store_warns(uri, warns):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sub.build_runtime_env(env_vars={"MLFLOW_TRACKING_URI": uri})
    assert bool([w for w in caught if "MLflow server" in str(w.message)]) == warns


# --- statuses and arguments ----------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code"), [("SUCCEEDED", 0), ("FAILED", 1), ("STOPPED", 3), ("RUNNING", 4)]
)
def test_exit_codes(status, code):
    from ray.job_submission import JobStatus

    assert sub.exit_code(status) == code
    assert sub.exit_code(JobStatus(status)) == code


def test_entrypoint_after_double_dash_keeps_its_own_options():
    args = parse(["--address", "http://h:8265", "--installed", "--", "mmdtl2", "gram", "-q"])
    assert args.entrypoint == ["--", "mmdtl2", "gram", "-q"]
    assert args.installed and args.address == "http://h:8265"


def test_working_dir_and_installed_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        parse(["--working-dir", ".", "--installed", "--", "true"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--address", "http://h:8265", "--", "true"], "--working-dir DIR"),
        (["--address", "http://h:8265", "--installed"], "no command"),
        (
            ["--address", "http://h:8265", "--installed", "--env", "NOEQUALS", "--", "x"],
            "KEY=VALUE",
        ),
    ],
)
def test_usage_errors_before_any_connection(argv, message, clean_auth_env):
    args = parse(argv)
    with pytest.raises(ValueError, match=message):
        command.run(args)


def test_submit_job_refuses_an_empty_entrypoint():
    with pytest.raises(ValueError, match="no entrypoint"):
        sub.submit_job(object(), [])


class _RefusingClient:
    """A Jobs API client whose server answers every request with an error status."""

    def submit_job(self, **kw):
        raise RuntimeError("Request failed with status code 500: No available agent to submit job")

    def get_job_info(self, job_id):
        raise RuntimeError(f"Request failed with status code 404: Job {job_id} does not exist.")


def test_a_job_the_cluster_refuses_or_does_not_know_is_one_clear_error():
    with pytest.raises(ValueError, match=r"did not accept the job \(Request failed .* 500"):
        sub.submit_job(_RefusingClient(), ["true"])
    with pytest.raises(ValueError, match=r"has no job 'raysubmit_nope'; `ray job list"):
        sub.check_job(_RefusingClient(), "raysubmit_nope")


def test_an_unreachable_cluster_is_reached_through_a_tunnel_not_an_open_port(clean_auth_env):
    (port,) = free_ports(1)
    with pytest.raises(ValueError, match="cannot reach") as info:
        sub.connect(f"http://127.0.0.1:{port}")
    assert "ssh -N -L 8265:127.0.0.1:8265" in str(info.value)
    assert "0.0.0.0" not in str(info.value)


def test_an_interrupt_that_escapes_as_a_cancellation_is_an_interrupt(monkeypatch):
    """A Ctrl-C inside the log stream's own timeouts leaves ``asyncio.run`` with the task's
    cancellation instead of KeyboardInterrupt (seen once in the loopback suite: exit 1 and
    a traceback, the job not stopped); following maps it back, so ``mmdtl2 submit`` stops
    the job and exits 130."""
    import asyncio

    async def cancelled(*_):
        raise asyncio.CancelledError

    monkeypatch.setattr(sub, "_tail", cancelled)
    with pytest.raises(KeyboardInterrupt):
        sub.follow_job(object(), "raysubmit_x")

    class Stopped:
        value = "STOPPED"

    stopped = []
    fake = argparse.Namespace(
        follow_job=sub.follow_job,
        stop_job=lambda client, job_id: stopped.append(job_id) or Stopped(),
    )
    assert command._follow(fake, object(), "raysubmit_x", False) == 130
    assert stopped == ["raysubmit_x"]
