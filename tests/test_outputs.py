"""Output paths: only what this system wrote is ever replaced; killed writers leave nothing.

Real CLI runs (``mmdtl2_dist.cli.main`` and real subprocesses), real Zarr stores, real
SIGKILLs of real writer processes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from mmdtl2_dist.cli import main
from mmdtl2_dist.store import FeatureStore, StoreWriter
from mmdtl2_dist.store.outputs import FEATURE_STORE, StagedOutput, claim_output

ROOT = Path(__file__).resolve().parents[1]
SYNTH = ["--n-source", "20", "--n-target", "10", "--dim", "8", "-q"]


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    """Run ``mmdtl2`` in a new process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run(
        [sys.executable, "-m", "mmdtl2_dist.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        **kw,
    )


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def _refused(capsys, command: str, path: Path, what: str) -> str:
    err = capsys.readouterr().err
    assert f"mmdtl2 {command}: error: {path}" in err, err
    assert f"not a {what} written by this system" in err and "Traceback" not in err
    assert "--overwrite" not in err  # never offered for a path that is not ours
    return err


# -- the ownership rule -------------------------------------------------------------------


def test_overwrite_keeps_a_foreign_directory(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.tex").write_text("x\n")
    assert main(["synth", str(victim), *SYNTH, "--overwrite"]) == 2
    err = _refused(capsys, "synth", victim, "feature store")
    assert "non-empty directory (holding 'thesis.tex')" in err
    assert "choose another path, or remove it yourself" in err
    assert sorted(p.name for p in victim.iterdir()) == ["thesis.tex"]
    assert (victim / "thesis.tex").read_text() == "x\n"
    assert _hidden(tmp_path) == []


def test_overwrite_keeps_a_plain_file(tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("keep me")
    np.save(tmp_path / "x.npy", np.ones((4, 3), np.float32))
    assert main(["ingest", str(f), "-i", f"a:s:{tmp_path / 'x.npy'}", "--overwrite", "-q"]) == 2
    assert "is a file" in _refused(capsys, "ingest", f, "feature store")
    assert f.read_text() == "keep me"


def test_overwrite_replaces_our_own_store(tmp_path, capsys):
    path = tmp_path / "s.zarr"
    assert main(["synth", str(path), *SYNTH]) == 0
    first = FeatureStore.open(path).fingerprint
    assert main(["synth", str(path), *SYNTH, "--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert "already exists (a feature store written by this system)" in err
    assert "--overwrite" in err
    assert FeatureStore.open(path).fingerprint == first
    assert main(["synth", str(path), *SYNTH, "--seed", "1", "--overwrite"]) == 0
    assert FeatureStore.open(path).fingerprint != first
    assert _hidden(tmp_path) == []
    (tmp_path / "empty").mkdir()  # an empty directory holds nothing to lose
    assert main(["synth", str(tmp_path / "empty"), *SYNTH]) == 0
    assert FeatureStore.open(tmp_path / "empty").fingerprint == first


@pytest.mark.parametrize(
    "inside",
    [
        "NOTES.txt",
        "plots/p.png",
        "features/mine.csv",
        "features/my_extra/pca50/zarr.json",  # an array of the user's beside the store's
        "features/source/conv3/c/0/notes",
        "skipped_images.csv.bak",
    ],
)
def test_overwrite_keeps_our_store_that_holds_a_users_file(tmp_path, capsys, inside):
    """A store this system wrote, with a file of the user's put inside it: --overwrite
    would delete that file with the store, so it is refused and nothing changes."""
    path = tmp_path / "s.zarr"
    assert main(["synth", str(path), *SYNTH]) == 0
    first = FeatureStore.open(path).fingerprint
    (path / inside).parent.mkdir(parents=True, exist_ok=True)
    (path / inside).write_text("keep me")
    capsys.readouterr()
    assert main(["synth", str(path), *SYNTH, "--seed", "1", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert f"also holds files this system did not write ('{inside}')" in err, err
    assert "nothing was changed" in err and "Traceback" not in err
    assert (path / inside).read_text() == "keep me"
    assert FeatureStore.open(path).fingerprint == first
    assert _hidden(tmp_path) == []
    (path / inside).unlink()  # moved out: the replacement goes ahead
    assert main(["synth", str(path), *SYNTH, "--seed", "1", "--overwrite"]) == 0
    assert FeatureStore.open(path).fingerprint != first


def test_overwrite_keeps_our_image_set_that_holds_a_users_image(tmp_path, capsys):
    from mmdtl2_dist.extract.synthetic import ImageSetSpec, make_image_set
    from mmdtl2_dist.store.outputs import OutputPathError

    spec = ImageSetSpec(n_source=1, n_target=1, n_classes=2, size=16)
    folder = make_image_set(tmp_path / "imgs", spec)
    # named like the set's own images, but not among those its marker lists
    for added in ("scope_a/class0/patient.png", "scope_a/class0/00042.png", "x/class7/00000.png"):
        (folder / added).parent.mkdir(parents=True, exist_ok=True)
        (folder / added).write_bytes(b"x")
        with pytest.raises(OutputPathError, match=rf"did not write \('{added}'\)"):
            make_image_set(folder, spec, overwrite=True)
        assert (folder / added).read_bytes() == b"x"
        (folder / added).unlink()
    make_image_set(folder, spec, overwrite=True)  # only its own images: replaced
    # a set whose marker predates the list of images: its layout's names are its own
    from mmdtl2_dist.extract.synthetic import MARKER

    (folder / MARKER).write_text(repr(spec) + "\n")
    make_image_set(folder, spec, overwrite=True)
    with pytest.raises(ValueError, match="two names"):
        make_image_set(tmp_path / "same", ImageSetSpec(source_device="a", target_device="a"))


def test_symlink_is_not_replaced(tmp_path):
    target = tmp_path / "s.zarr"
    with StoreWriter(target) as w:
        w.create_array("a", "s", 2, 2).append(np.ones((2, 2), np.float32))
    link = tmp_path / "link.zarr"
    link.symlink_to(target)
    with pytest.raises(ValueError, match="is a symbolic link to the feature store"):
        StoreWriter(link, overwrite=True)
    with pytest.raises(ValueError, match="already exists"):
        StoreWriter(link)
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "a.txt").write_text("a")
    (tmp_path / "dirlink").symlink_to(tmp_path / "dir")
    with pytest.raises(ValueError, match="is a symbolic link, not a feature store"):
        StoreWriter(tmp_path / "dirlink", overwrite=True)
    assert link.is_symlink() and FeatureStore.open(target).shape("a", "s") == (2, 2)
    assert claim_output(target, FEATURE_STORE, overwrite=True) is True


def test_gram_out_foreign_directory_is_refused(tmp_path, capsys):
    assert main(["synth", str(tmp_path / "s.zarr"), *SYNTH]) == 0
    out = tmp_path / "g"
    out.mkdir()
    (out / "data.csv").write_text("1,2\n")
    assert main(["gram", str(tmp_path / "s.zarr"), "--out", str(out), "-q"]) == 2
    assert "non-empty directory" in _refused(capsys, "gram", out, "Gram store")
    assert sorted(p.name for p in out.iterdir()) == ["data.csv"]
    assert _hidden(tmp_path) == []


def test_study_output_foreign_directory_is_refused(tmp_path, capsys):
    assert main(["synth", str(tmp_path / "store.zarr"), *SYNTH, "--classes", "2"]) == 0
    spec = tmp_path / "spec.toml"
    spec.write_text(
        textwrap.dedent(
            """
            [study]
            name = "foreign"
            [data]
            store = "store.zarr"
            space = "conv3"
            pairs = [["source", "target"]]
            [splits]
            protocol = "half"
            n_splits = 1
            samples_per_class = [1]
            [[methods]]
            method = "target_svm"
            """
        )
    )
    out = tmp_path / "home"
    out.mkdir()
    (out / "thesis.tex").write_text("x\n")
    assert main(["study", "run", str(spec), "--output", str(out), "--quiet"]) == 2
    _refused(capsys, "study", out, "study folder")
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]


# -- leftovers of killed writers ----------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_dead_local_writers_leftovers_are_removed(tmp_path, capsys):
    from mmdtl2_dist.store.outputs import _host

    target = tmp_path / "out.zarr"
    host, token = _host(), "0123abcd"
    dead = tmp_path / f".out.zarr.tmp-{host}-{_dead_pid()}-{token}"
    live = tmp_path / f".out.zarr.tmp-{host}-{os.getpid()}-{token}"
    remote = tmp_path / f".out.zarr.tmp-otherhost-{_dead_pid()}-{token}"
    other = tmp_path / f".other.zarr.tmp-{host}-{_dead_pid()}-{token}"
    for p in (dead, live, remote, other):
        (p / "features").mkdir(parents=True)
    with StagedOutput(target) as tmp:
        tmp.mkdir()
        (tmp / "zarr.json").write_text("{}")
    assert "removed 1 unfinished write(s) of" in capsys.readouterr().err
    assert not dead.exists() and live.exists() and remote.exists() and other.exists()
    assert (target / "zarr.json").exists()


def test_gram_skeleton_cleans_a_dead_writers_leftover(tmp_path, capsys):
    from mmdtl2_dist.engine import GramStore
    from mmdtl2_dist.engine.driver import _create_skeleton, _job_spec
    from mmdtl2_dist.store.outputs import _host

    assert main(["synth", str(tmp_path / "s.zarr"), *SYNTH]) == 0
    fs = FeatureStore.open(tmp_path / "s.zarr")
    (tmp_path / f".g.tmp-{_host()}-{_dead_pid()}-0123abcd" / "tiles").mkdir(parents=True)
    job = _job_spec(fs, "conv3", fs.devices_in("conv3"), "none", 16, [(0, 8)])
    _create_skeleton(tmp_path / "g", job, fs)
    assert "removed 1 unfinished write(s) of" in capsys.readouterr().err
    assert _hidden(tmp_path) == [] and GramStore.open(tmp_path / "g").n == 30


def _wait_for(predicate, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.005)


def test_sigkilled_ingest_leftover_is_cleaned_by_the_next_run(tmp_path):
    X = np.random.default_rng(0).standard_normal((4000, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    store = tmp_path / "st.zarr"
    args = ["ingest", str(store), "-i", f"a:s:{tmp_path / 'x.npy'}", "-q"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def _tmps():
        return [p for p in tmp_path.iterdir() if p.name.startswith(".st.zarr.tmp-")]

    # One row per chunk: thousands of chunk files, so the write takes seconds.
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmdtl2_dist.cli", *args, "--chunk-rows", "1"], env=env
    )
    try:
        _wait_for(lambda: any((p / "features" / "a" / "s" / "c").exists() for p in _tmps()))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not store.exists() and len(_tmps()) == 1  # killed mid-write
    res = _cli(*args)
    assert res.returncode == 0, res.stderr
    assert f"mmdtl2: removed 1 unfinished write(s) of {store} left by killed runs" in res.stderr
    assert _hidden(tmp_path) == []
    assert np.array_equal(FeatureStore.open(store).read("a", "s"), X)
    assert FeatureStore.open(store).verify() == []


_KILL_AT = """
import os, signal, sys
from mmdtl2_dist.store import outputs
from mmdtl2_dist.cli import main

real_replace, real_remove = os.replace, outputs._remove

def replace(src, dst):
    real_replace(src, dst)
    if sys.argv[1] == "first-rename" and ".old-" in str(dst):
        os.kill(os.getpid(), signal.SIGKILL)

def remove(path):
    if sys.argv[1] == "delete-old" and ".old-" in str(path):
        os.kill(os.getpid(), signal.SIGKILL)
    real_remove(path)

os.replace, outputs._remove = replace, remove
main(sys.argv[2:])
"""


@pytest.mark.parametrize("when", ["first-rename", "delete-old"])
def test_killed_swap_is_recovered(tmp_path, when):
    """A writer replacing a store is SIGKILLed between its renames, or before deleting."""
    store = tmp_path / "s.zarr"
    assert _cli("synth", str(store), *SYNTH).returncode == 0
    before = FeatureStore.open(store).fingerprint
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = subprocess.run(
        [sys.executable, "-c", _KILL_AT, when, "synth", str(store), *SYNTH, "--seed", "1"]
        + ["--overwrite"],
        env=env,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL
    hidden = _hidden(tmp_path)
    assert [h.split("-")[0] for h in hidden] == (
        [".s.zarr.old", ".s.zarr.tmp"] if when == "first-rename" else [".s.zarr.old"]
    )
    assert store.exists() == (when == "delete-old")
    res = _cli("synth", str(store), *SYNTH, "--seed", "2")
    assert res.returncode == 2 and "already exists" in res.stderr  # no --overwrite
    if when == "first-rename":
        assert f"mmdtl2: restored {store} from .s.zarr.old-" in res.stderr
        assert "removed 1 unfinished write(s)" in res.stderr
        assert FeatureStore.open(store).fingerprint == before
    else:
        assert "removed 1 unfinished write(s)" in res.stderr and "restored" not in res.stderr
        assert FeatureStore.open(store).fingerprint != before  # the swap had completed
    assert _hidden(tmp_path) == []


def test_an_unusable_output_path_is_one_line_and_exit_2(tmp_path, capsys):
    """A file where the output's folder must be: one line naming both, no traceback."""
    np.save(tmp_path / "x.npy", np.ones((4, 3), np.float32))
    (tmp_path / "token").write_text("keep me")
    out = tmp_path / "token" / "x.zarr"
    assert main(["ingest", str(out), "-i", f"a:s:{tmp_path / 'x.npy'}", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mmdtl2 ingest: error: cannot write {out}: {tmp_path / 'token'} is a")
    assert "give a path in a folder you can write to" in err and "Traceback" not in err
    assert (tmp_path / "token").read_text() == "keep me"


def test_a_folder_without_write_permission_is_named(tmp_path, monkeypatch):
    """No permission (or a read-only file system): the folder and the reason, found before
    anything is written (root ignores permission bits, so the refusal is simulated)."""
    import errno
    import tempfile

    from mmdtl2_dist.store.outputs import OutputPathError, make_output_folder

    def denied(*args, **kw):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "ro"))

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(OutputPathError) as info:
        StagedOutput(tmp_path / "ro" / "s.zarr")
    assert str(info.value) == (
        f"cannot write {tmp_path / 'ro' / 's.zarr'}: no files can be created in "
        f"{tmp_path / 'ro'} (Permission denied); give a path in a folder you can write to."
    )

    def broken(*args, **kw):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(tempfile, "mkstemp", broken)
    with pytest.raises(OSError, match="I/O error"):  # a fault, not a path to change
        make_output_folder(tmp_path / "ro", tmp_path / "ro" / "s.zarr")


def test_a_users_side_file_or_damaged_record_is_never_vouched_for(tmp_path, capsys):
    """A store lists the side files it wrote: a user's own skipped_images.csv (in a store
    that skipped nothing) is kept, and a damaged record vouches for nothing."""
    import json

    path = tmp_path / "s.zarr"
    assert main(["synth", str(path), *SYNTH]) == 0
    (path / "skipped_images.csv").write_text("my notes")
    capsys.readouterr()
    assert main(["synth", str(path), *SYNTH, "--overwrite"]) == 2
    assert "('skipped_images.csv')" in capsys.readouterr().err
    (path / "skipped_images.csv").unlink()
    meta = json.loads((path / "zarr.json").read_text())
    for arrays in (["x"], 5, "ab", {"a": 1}):
        meta["attributes"]["mmdtl2_feature_store"]["arrays"] = arrays
        (path / "zarr.json").write_text(json.dumps(meta))
        assert main(["synth", str(path), *SYNTH, "--overwrite"]) == 2  # no traceback
        assert "did not write" in capsys.readouterr().err


SMALL_SYNTHETIC_STUDY = """
[study]
name = "tiny"
[data]
space = "conv3"
pairs = [["source", "target"]]
[data.synthetic]
n_source = 40
n_target = 30
n_classes = 2
dim = 12
seed = 0
[splits]
protocol = "half"
n_splits = 1
samples_per_class = [2]
[[methods]]
method = "target_svm"
"""


def test_a_study_stopped_while_building_its_data_runs_again_in_the_same_folder(tmp_path, capsys):
    """A study stopped before its state file (Ctrl-C while it built its data) leaves
    ``<output>/data`` with what it built, or a write in flight; the same command runs
    again there (``It stopped before it began; run the same command again``), while a
    folder with anything else beside or inside ``data`` stays refused."""
    spec = tmp_path / "tiny.toml"
    spec.write_text(SMALL_SYNTHETIC_STUDY)
    out = tmp_path / "out"
    (out / "data" / ".synthetic.zarr.tmp-host-1-0123abcd").mkdir(parents=True)
    cmd = ["study", "run", str(spec), "--output", str(out), "--executor", "local", "-q"]
    assert main(cmd) == 0, capsys.readouterr().err
    assert (out / "study.json").is_file() and (out / "data" / "synthetic.zarr").is_dir()
    for inside in ("data", ".", "data/.hoffman_splits.json.swp"):
        other = tmp_path / f"other{len(inside)}"
        shutil.copytree(out / "data", other / "data")
        shutil.rmtree(other / "data" / "synthetic.zarr")
        mine = other / inside if inside.endswith(".swp") else other / inside / "notes.txt"
        mine.write_text("mine")
        cmd[4] = str(other)
        assert main(cmd) == 2
        assert "not a study folder written by this system" in capsys.readouterr().err
        assert mine.read_text() == "mine"


HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(120)
"""


def test_a_second_run_of_a_study_is_refused_while_another_process_holds_its_folder(
    tmp_path, capsys
):
    """Two runs of one study would interleave their writes (its data, plan and results):
    while a real process holds the study's lock, ``study run`` exits 2 naming the lock and
    changes nothing, also while the folder holds a file of the first run in flight; once
    that process is SIGKILLed, the kernel releases the lock and the
    same command runs (a folder holding only the lock is the study's)."""
    spec = tmp_path / "tiny.toml"
    spec.write_text(SMALL_SYNTHETIC_STUDY)
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(out / ".study.lock")], stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        cmd = ["study", "run", str(spec), "--output", str(out), "--executor", "local", "-q"]
        assert main(cmd) == 2
        err = capsys.readouterr().err
        assert "another run of this study is writing" in err and ".study.lock" in err
        assert [p.name for p in out.iterdir()] == [".study.lock"]
        probe = out / ".study.json.tmp-host-1-0123abcd"  # a first run's write in flight
        probe.write_text("")
        assert main(cmd) == 2
        assert "another run of this study is writing" in capsys.readouterr().err
        probe.unlink()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert main(cmd) == 0, capsys.readouterr().err
    assert (out / "study.json").is_file()


def test_a_study_refused_by_its_data_leaves_no_folder_behind(tmp_path, capsys):
    """The study's lock is taken in its folder before the spec is checked against the
    data; a run refused there removes the folder (and the parents) it created for it."""
    store = tmp_path / "s.zarr"
    assert main(["synth", str(store), *SYNTH]) == 0
    spec = tmp_path / "bad.toml"
    spec.write_text(
        f'[study]\nname = "bad"\n[data]\nstore = "{store}"\nspace = "conv3"\n'
        'pairs = [["source", "target"]]\n[splits]\nprotocol = "half"\nn_splits = 1\n'
        'samples_per_class = [500]\n[[methods]]\nmethod = "target_svm"\n'
    )
    out = tmp_path / "new" / "out"
    cmd = ["study", "run", str(spec), "--output", str(out), "--executor", "local", "-q"]
    assert main(cmd) == 2
    assert "500" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_report_of_a_study_another_run_is_writing_says_so(tmp_path, capsys):
    """`study report` (and `resume`) of a folder whose run is still going is refused
    naming that run, before its state file exists too: the report is the run's to write
    when it ends. Of a stopped study with no finished trial, `report` gives the `resume`
    command, not `study run`."""
    spec = tmp_path / "tiny.toml"
    spec.write_text(SMALL_SYNTHETIC_STUDY + '[[methods]]\nmethod = "source_svm"\n')
    out, early = tmp_path / "out", tmp_path / "early"
    run = ["study", "run", str(spec), "--output", str(out), "--executor", "local", "-q"]
    assert main(run) == 0, capsys.readouterr().err
    results = sorted((out / "results").glob("*.json"))
    assert len(results) == 2
    results[0].unlink()
    written = (out / "report" / "report.md").stat().st_mtime_ns
    early.mkdir()
    holders = [
        subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(f / ".study.lock")],
                         stdout=subprocess.PIPE, text=True)
        for f in (out, early)
    ]  # fmt: skip
    try:
        assert [h.stdout.readline().strip() for h in holders] == ["locked", "locked"]
        capsys.readouterr()
        for folder in (out, early):
            for cmd in (["report", str(folder), "--no-mlflow"], ["resume", str(folder), "-q"]):
                assert main(["study", *cmd]) == 2
                err = capsys.readouterr().err
                assert f"run of this study is writing {folder}" in err, err
        assert (out / "report" / "report.md").stat().st_mtime_ns == written  # untouched
    finally:
        for h in holders:
            h.send_signal(signal.SIGKILL)
            h.wait()
    for r in results[1:]:
        r.unlink()
    assert main(["study", "report", str(out), "--no-mlflow"]) == 2
    assert f"continue it with `mmdtl2 study resume {out}`" in capsys.readouterr().err


def test_quiet_study_run_prints_no_mlflow_info_lines(tmp_path):
    """`-q` is quiet for MLflow's INFO lines too (its database set-up), in a new process
    as a user runs it; the report goes to stdout and stderr stays empty."""
    spec = tmp_path / "tiny.toml"
    spec.write_text(SMALL_SYNTHETIC_STUDY)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_LOGGING_LEVEL"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run(
        [sys.executable, "-m", "mmdtl2_dist.cli", "study", "run", str(spec), "--output",
         str(tmp_path / "out"), "--executor", "local", "-q"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| n_per_class |" in proc.stdout
    assert "INFO" not in proc.stderr and "mlflow" not in proc.stderr.lower(), proc.stderr


def test_a_study_that_fails_marks_its_mlflow_run_failed_and_a_resume_running(tmp_path, monkeypatch):
    """An error while the trials run leaves the study's MLflow run FAILED, not RUNNING;
    the next run of the study marks it RUNNING while it works and FINISHED at the end."""
    from mlflow.tracking import MlflowClient

    import mmdtl2_dist.study.runner as runner

    spec = tmp_path / "tiny.toml"
    spec.write_text(SMALL_SYNTHETIC_STUDY)
    out = tmp_path / "out"
    real, seen = runner._run_trials, []

    def broken(*a, **k):
        raise RuntimeError("a worker's disk went away")

    def watched(*a, **k):
        seen.append(parent_status())
        return real(*a, **k)

    def parent_status():
        client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
        exp = client.get_experiment_by_name("mmdtl2-tiny").experiment_id
        runs = client.search_runs([exp], "tags.mmdtl2_role = 'parent'")
        return [r.info.status for r in runs]

    monkeypatch.setattr(runner, "_run_trials", broken)
    with pytest.raises(RuntimeError, match="disk went away"):
        runner.run_study(_spec_at(spec, out), executor="local", progress=False)
    assert parent_status() == ["FAILED"]
    monkeypatch.setattr(runner, "_run_trials", watched)
    runner.run_study(_spec_at(spec, out), executor="local", progress=False)
    assert seen == [["RUNNING"]] and parent_status() == ["FINISHED"]


def _spec_at(path, out):
    from mmdtl2_dist.study.spec import load_spec

    return load_spec(path, output=out)
