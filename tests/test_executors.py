"""The study's executors: local worker processes and Ray Tune give the same study.

Real Zarr stores, real worker processes, a real local Ray, real signals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from test_study import make_store

from mmdtl2_dist.study.runner import report_study, resume_study, run_study
from mmdtl2_dist.study.spec import load_spec

REPO = Path(__file__).resolve().parents[1]

SPEC = """
[study]
name = "parity"
seed = 3
[data]
store = "store.zarr"
space = "f"
pairs = [["cam_a", "cam_b"], ["cam_b", "cam_a"]]
preprocessing = "l2_zscore"
[splits]
protocol = "half"
n_splits = 3
samples_per_class = [2, 3]
[[methods]]
label = "target SVM"
method = "target_svm"
[[methods]]
label = "source SVM"
method = "source_svm"
[[methods]]
label = "MMDTL2 CV-selected"
method = "mmdtl2"
params = { prior = "identity", c_f = 1.0 }
select = { prior_weight = [0.0, 0.5, 1.0] }
"""

#: Payload fields that are timings (of this run, on this machine).
TIMING = {"wall_s", "solver_s", "slice_s", "t_start", "t_end", "cpus"}
UNIT_TIMING = {"fit_s", "cv_s", "slice_s"}


def _spec(tmp_path, extra: str = "") -> Path:
    if not (tmp_path / "store.zarr").exists():
        make_store(tmp_path / "store.zarr", n=(45, 36))
    p = tmp_path / "spec.toml"
    p.write_text(SPEC + textwrap.dedent(extra))
    return p


def _results_without_times(folder: Path) -> list[str]:
    """results.csv, line by line, without its fit-time column."""
    lines = (folder / "report" / "results.csv").read_text().splitlines()
    col = lines[0].split(",").index("fit_s")
    # No field before fit_s holds a comma (keys, labels, methods, "{}", pairs, numbers).
    return [",".join(x for i, x in enumerate(line.split(",")) if i != col) for line in lines]


def _payloads_without_times(folder: Path) -> dict:
    out = {}
    for p in (folder / "results").glob("*.json"):
        d = json.loads(p.read_text())
        d = {k: v for k, v in d.items() if k not in TIMING}
        d["units"] = [
            {
                **{k: v for k, v in u.items() if k not in UNIT_TIMING},
                "info": {k: v for k, v in u["info"].items() if not k.startswith("time_")},
            }
            for u in d["units"]
        ]
        out[p.name] = d
    return out


@pytest.mark.ray
def test_local_and_ray_executors_give_the_same_study(tmp_path, ray_local):
    """One spec (two pairs, three splits, two sample counts, a CV-selected MMDTL2) run on
    both executors: the same results.csv (fit times aside), table.csv and
    chosen_params.csv, and the same trial payloads, bit for bit. The Ray run shares
    each trial's units between the trial and a Ray task, the local run spreads them
    over two worker processes: the order in which units are computed does not matter."""
    spec_file = _spec(tmp_path, "[execution]\nsplit_tasks = 1\n")
    studies = {}
    for executor in ("local", "ray"):
        spec = load_spec(spec_file, output=tmp_path / executor)
        kw = {"num_cpus": 2} if executor == "local" else {}
        rep = run_study(spec, executor=executor, track=False, progress=False, **kw)
        assert rep["timing"]["executor"] == executor
        studies[executor] = tmp_path / executor
    local, ray = studies["local"], studies["ray"]
    assert _results_without_times(local) == _results_without_times(ray)
    for name in ("table.csv", "chosen_params.csv"):
        assert (local / "report" / name).read_bytes() == (ray / "report" / name).read_bytes()
    assert _payloads_without_times(local) == _payloads_without_times(ray)
    chosen = (local / "report" / "chosen_params.csv").read_text()
    assert "MMDTL2 CV-selected" in chosen and "prior_weight=" in chosen
    assert not (local / "tune").exists() and (ray / "tune").is_dir()


def test_local_executor_runs_without_ray(tmp_path, capsys):
    """`mmdtl2 study run` on the local executor (the default without --address) with Ray
    not importable at all: the study runs, is tracked in MLflow and reported."""
    spec = _spec(tmp_path)
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["ray"] = None  # `import ray` raises ImportError
        from mmdtl2_dist.cli import main
        rc = main(["study", "run", {str(spec)!r}, "--output", {str(tmp_path / "out")!r},
                   "--num-cpus", "2", "--quiet"])
        assert not any(m == "ray" or m.startswith("ray.") for m in sys.modules
                       if sys.modules[m] is not None)
        sys.exit(rc)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "| n_per_class | target SVM | source SVM | MMDTL2 CV-selected |" in res.stdout
    assert len(list((tmp_path / "out" / "results").glob("*.json"))) == 6
    assert (tmp_path / "out" / "mlflow.db").stat().st_size > 0
    # register's --metric on a study of two pairs: the mean over both is said to be that,
    # and a standard deviation is no score to maximise
    from mmdtl2_dist.cli import main

    reg = ["register", str(tmp_path / "out"), "--name", "parity-x", "--pair", "cam_a->cam_b",
           "--quiet"]  # fmt: skip
    with pytest.warns(UserWarning, match=r"mean over the study's 2 device pairs; the pair"):
        assert main([*reg, "--metric", "accuracy"]) == 0
    assert main([*reg, "--metric", "accuracy_std"]) == 2
    assert "is a standard deviation over splits" in capsys.readouterr().err


def test_local_executor_reports_failed_trials_and_keeps_the_others(tmp_path):
    """A trial whose fits raise: the study stops with the trial's error and the resume
    command; the other trials' results are kept (a partial report can be written)."""
    spec = load_spec(
        _spec(
            tmp_path,
            """
            [[methods]]
            label = "SA"
            method = "sa_svm"
            params = { n_components = 50 }
            """,
        ),
        output=tmp_path / "out",
    )
    with pytest.raises(RuntimeError) as err:
        run_study(spec, executor="local", num_cpus=2, track=False, progress=False)
    msg = str(err.value)
    assert msg.startswith("2 trial(s) failed; the first error: SA: ValueError: ")
    assert "n_components" in msg
    assert msg.endswith(f"Fix the cause and run `mmdtl2 study resume {tmp_path / 'out'}`.")
    rep = report_study(tmp_path / "out", log=False, progress=False)
    assert len(rep["missing"]) == 2 and len(list((tmp_path / "out" / "results").iterdir())) == 6


def _cmdline(p: psutil.Process) -> list[str]:
    """A process's command line; empty for one that exited (or is a zombie) meanwhile."""
    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


def _workers(pid: int) -> list[psutil.Process]:
    """The local executor's worker processes under process ``pid``."""
    return [
        p
        for p in psutil.Process(pid).children(recursive=True)
        if any("multiprocessing" in a for a in _cmdline(p))
        and not any("resource_tracker" in a for a in _cmdline(p))
    ]


@pytest.mark.slow
def test_killed_worker_stops_the_study_and_resume_finishes_it(tmp_path):
    """SIGKILL of a local worker mid-study: the study stops with an error that says a
    worker died and how to resume, keeping finished trials; the resume finishes the
    study with the results of an uninterrupted run."""
    spec_file = _spec(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cli = [sys.executable, "-m", "mmdtl2_dist.cli", "study"]
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*cli, "run", str(spec_file), "--output", str(out), "--num-cpus", "2", "--quiet"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / "results").is_dir() and any((out / "results").glob("*.json")):
            break
        time.sleep(0.05)
    workers = _workers(proc.pid)
    assert proc.poll() is None and workers, "the study ended before a worker could be killed"
    workers[0].kill()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    assert "trial(s) failed; the first error:" in err and "terminated abruptly" in err
    assert f"run `mmdtl2 study resume {out}`" in err
    assert psutil.wait_procs(workers, timeout=30)[1] == []
    kept = len(list((out / "results").glob("*.json")))
    assert 1 <= kept < 6
    # what a kill in the middle of a result's or the state's write leaves: removed on
    # resume; a file of the user's with another name is not touched
    stray = [out / "results" / ".abc.json.0123abcd.tmp", out / ".study.json.89abcdef.tmp"]
    for p in [*stray, out / "results" / "notes.tmp"]:
        p.write_text("{")

    rep = resume_study(out, executor="local", num_cpus=2, track=False, progress=False)
    assert rep["missing"] == []
    assert not any(p.exists() for p in stray) and (out / "results" / "notes.tmp").exists()
    (out / "results" / "notes.tmp").unlink()
    full = load_spec(spec_file, output=tmp_path / "full")
    run_study(full, executor="local", num_cpus=2, track=False, progress=False)
    assert _results_without_times(out) == _results_without_times(tmp_path / "full")


@pytest.mark.slow
def test_killed_driver_leaves_no_local_worker(tmp_path):
    """SIGKILL of `mmdtl2 study run` while its local workers compute: they exit too."""
    spec_file = _spec(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmdtl2_dist.cli", "study", "run", str(spec_file)]
        + ["--output", str(out), "--num-cpus", "2", "--quiet"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    workers = []
    while time.monotonic() < deadline and proc.poll() is None and len(workers) < 2:
        workers = _workers(proc.pid)
        time.sleep(0.05)
    assert proc.poll() is None and len(workers) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    _, alive = psutil.wait_procs(workers, timeout=60)
    assert not alive, [(p.pid, _cmdline(p)) for p in alive]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--executor", "local", "--address", "auto"],
            "--address auto names a Ray cluster, and the local executor runs without Ray; "
            "add --executor ray, or leave out --address.",
        ),
        (["--num-cpus", "0"], "--num-cpus must be at least 1, got 0."),
    ],
)
def test_local_executor_refuses_a_ray_address(tmp_path, capsys, args, message):
    from mmdtl2_dist.cli import main

    out = tmp_path / "out"
    assert main(["study", "run", str(_spec(tmp_path)), "--output", str(out), *args]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
