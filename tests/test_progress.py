"""The progress reporter: ETA arithmetic and throttling on a fake clock; terminals only."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
import time

import pytest

from mmdtl2_dist.progress import Progress, format_duration, progress_enabled


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Tty(io.StringIO):
    def isatty(self):
        return True


def _bar(total=10, **kw):
    clock, out = Clock(), io.StringIO()
    bar = Progress("work", total, unit="fits", enabled=True, clock=clock, stream=out, **kw)
    return bar, clock, out


def test_eta_is_the_remaining_units_at_this_runs_rate():
    bar, clock, out = _bar()
    assert bar.eta() is None  # nothing done yet: no rate
    clock.t += 4.0
    assert bar.update(2)
    assert bar.eta() == pytest.approx(16.0)  # 2 fits in 4 s, 8 left
    assert out.getvalue() == "work: 2/10 fits (20 %), 4 s elapsed, ETA 16 s\n"
    clock.t += 16.0
    assert bar.update(10, "all fitted")
    assert out.getvalue().splitlines()[-1] == "work: 10/10 fits (100 %), 20 s elapsed; all fitted"


def test_units_done_before_the_run_count_as_done_but_not_in_the_rate():
    bar, clock, _ = _bar(total=100, done=40)  # e.g. 40 resumed tiles
    clock.t += 10.0
    bar.update(50)
    assert bar.eta() == pytest.approx(50.0)  # 10 units in 10 s, 50 left
    assert "50/100 fits (50 %), 10 s elapsed, ETA 50 s" in bar.line()


def test_throttling():
    bar, clock, out = _bar(total=100, every_s=5.0, step=0.1, min_gap_s=1.0, heartbeat_s=30.0)
    clock.t += 0.5
    assert not bar.update(11)  # crossed 10 %, but within min_gap_s of the start
    clock.t += 2.0
    assert bar.update(12)  # crossed 10 % and 1 s since the last line
    clock.t += 2.0
    assert not bar.update(13)  # advanced, but neither 5 s nor a 10 % step
    clock.t += 3.0
    assert bar.update(14)  # 5 s and advanced
    clock.t += 29.0
    assert not bar.update(14)  # nothing finished: silent until the heartbeat
    clock.t += 1.0
    assert bar.update(14)  # heartbeat: still alive, ETA from the rate so far
    assert bar.update(100)  # complete: always a line
    assert len(out.getvalue().splitlines()) == 4


def test_unknown_total_shows_elapsed_only():
    bar, clock, out = _bar(total=None)
    clock.t += 75.0
    bar.update(0, "fitting", force=True)
    assert out.getvalue() == "work: 1 min 15 s elapsed; fitting\n"


def test_enabled_only_on_a_terminal_unless_overridden(monkeypatch):
    monkeypatch.delenv("MMDTL2_PROGRESS", raising=False)
    assert not progress_enabled(None, io.StringIO())
    assert progress_enabled(None, Tty())
    assert progress_enabled(True, io.StringIO()) and not progress_enabled(False, Tty())
    piped, tty = io.StringIO(), Tty()
    for stream in (piped, tty):
        bar = Progress("x", 1, stream=stream)
        bar.update(1)
        bar.say("a stage")
    assert piped.getvalue() == "" and tty.getvalue().count("\n") == 2
    # A job's logs are no terminal: MMDTL2_PROGRESS decides where no option does.
    monkeypatch.setenv("MMDTL2_PROGRESS", "1")
    assert progress_enabled(None, io.StringIO()) and not progress_enabled(False, Tty())
    monkeypatch.setenv("MMDTL2_PROGRESS", "0")
    assert not progress_enabled(None, Tty()) and progress_enabled(True, io.StringIO())


def test_format_duration():
    assert [format_duration(s) for s in (0.4, 59.6, 61, 3599, 3600, 7385)] == [
        "0 s",
        "1 min 00 s",
        "1 min 01 s",
        "59 min 59 s",
        "1 h 00 min",
        "2 h 03 min",
    ]


def test_ticking_beats_while_a_blocking_call_runs():
    out = io.StringIO()
    bar = Progress("register", enabled=True, stream=out)
    with bar.ticking("fitting", period_s=0.05):
        time.sleep(0.3)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2 and all(x.endswith("elapsed; fitting") for x in lines)


OFFICE = [
    sys.executable, "-m", "mmdtl2_dist.cli", "office", "--trials", "2",
    "--shifts", "dslr-webcam", "webcam-dslr", "--methods", "source SVM", "target SVM",
]  # fmt: skip


def _run_with_stderr_on_a_terminal(argv):
    """Run ``argv`` with stdout piped and stderr on a pseudo-terminal; (stdout, terminal)."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "MMDTL2_PROGRESS"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, env=env, text=True)
    os.close(slave)
    term = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        term += chunk
    out = proc.communicate(timeout=300)[0]
    os.close(master)
    assert proc.returncode == 0, term.decode(errors="replace")
    return out, term.decode(errors="replace")


def test_piped_output_is_the_table_and_progress_goes_to_the_terminal():
    out, term = _run_with_stderr_on_a_terminal(OFFICE)
    assert re.search(r"study: (\d+)/\1 fits \(100 %\)", term), term  # a terminal: progress
    lines = out.splitlines()
    assert lines[0] == "Per pair, 3 labelled target samples per class"
    assert lines[2].startswith("Accuracy (%): mean ± standard deviation over 2 splits")
    assert lines[4] == "| pair | source SVM | target SVM |"
    assert "elapsed" not in out and "ETA" not in out
    # --no-progress silences the terminal too; stderr piped as well: nothing but errors.
    _, quiet = _run_with_stderr_on_a_terminal([*OFFICE, "--no-progress"])
    assert "fits" not in quiet and "ETA" not in quiet
    env = {k: v for k, v in os.environ.items() if k != "MMDTL2_PROGRESS"}
    piped = subprocess.run(OFFICE, capture_output=True, text=True, timeout=300, env=env)
    assert piped.returncode == 0 and piped.stderr == ""
    assert piped.stdout.splitlines()[4] == "| pair | source SVM | target SVM |"
