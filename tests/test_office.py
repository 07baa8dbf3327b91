"""`mmdtl2 office`: the Office-Caltech10 protocol as a study on the local executor.

Its numbers are those of the stored full run (``benchmarks/results/office_caltech10*.json``,
the README's table), bit for bit; ``benchmarks/check_office_numbers.py`` checks all
12 shifts x 20 splits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmdtl2_dist.cli import main
from mmdtl2_dist.core.auto import AUTO_RULE
from mmdtl2_dist.office import COLUMNS

REPO = Path(__file__).resolve().parents[1]
STORED = REPO / "benchmarks" / "results"


def stored_accuracies() -> dict:
    """``"source-target|label"`` -> accuracy per split, and the choices, of the stored full run."""
    stored = json.loads((STORED / "office_caltech10.json").read_text())
    return stored["acc"], stored["chosen"]


def test_office_gives_the_stored_numbers_bit_for_bit(tmp_path, capsys):
    """Every column on two shifts: the per-split accuracies and the selecting columns'
    choices are those of the stored full run, to the last bit; the table is the study
    report's, and the study folder is kept for `mmdtl2 study report`."""
    shifts = ["dslr-webcam", "amazon-caltech"]
    args = ["office", "--trials", "1", "--shifts", *shifts, "--out", str(tmp_path), "-q"]
    assert main(args) == 0
    out = capsys.readouterr().out
    header = "| pair | " + " | ".join(c["label"] for c in COLUMNS) + " |"
    assert header in out and "| dslr->webcam |" in out and "| all pairs |" in out
    assert "2 shifts x 1 split," in out
    assert "of one split: no standard deviation" in out and " ± " not in out  # one split
    got = json.loads((tmp_path / "office_caltech10.json").read_text())
    acc, chosen = stored_accuracies()
    assert len(got["acc"]) == 2 * len(COLUMNS)
    for key, values in got["acc"].items():
        assert values == acc[key][:1], key
    for key, per_split in got["chosen"].items():
        assert per_split == {"0": chosen[key]["0"]}, key
    auto = [v["0"] for k, v in got["chosen"].items() if k.endswith("|MMDTL2 auto")]
    assert len(auto) == 2 and all(c["rule"] == AUTO_RULE for c in auto)
    assert (tmp_path / "office_caltech10.md").read_text().strip() in out
    assert (tmp_path / "study" / "report" / "results.csv").is_file()
    assert main(["study", "report", str(tmp_path / "study"), "--no-mlflow"]) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--methods", "MMDT"], "unknown column(s) ['MMDT']; choose from ['source SVM',"),
        (["--trials", "0"], "the number of splits (--trials) must be between 1 and 20, got 0."),
        (["--shifts", "amazon"], "bad shift 'amazon'; use SRC-TGT (or 'SRC->TGT', quoted)"),
    ],
)
def test_office_bad_arguments_name_the_fix(tmp_path, capsys, args, message):
    assert main(["office", *args, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_office_shifts_in_either_form():
    from mmdtl2_dist.commands.office import _shifts

    args = argparse.Namespace(shifts=["amazon-webcam", "dslr->caltech"])
    assert _shifts(args) == [("amazon", "webcam"), ("dslr", "caltech")]


def test_office_lists_its_columns(capsys):
    assert main(["office", "--list"]) == 0
    out = capsys.readouterr().out
    assert "'MMDTL2 CV-selected': method=mmdtl2" in out and "prior_weight" in out


@pytest.mark.slow
def test_office_interrupted_says_how_to_resume(tmp_path):
    """Ctrl-C stops `mmdtl2 office --out` with exit status 130 and the command that
    finishes its study; that command then finishes it."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cli = [sys.executable, "-m", "mmdtl2_dist.cli"]
    out = tmp_path / "out"
    results = out / "study" / "results"
    proc = subprocess.Popen(
        [*cli, "office", "--shifts", "dslr-webcam", "--trials", "2", "--workers", "2"]
        + ["--out", str(out), "-q"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if results.is_dir() and any(results.glob("*.json")):
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    done = len(list(results.glob("*.json")))
    assert done < len(COLUMNS), "office finished before it could be interrupted"
    assert proc.returncode == 130, err[-3000:]
    assert f"mmdtl2 office: stopped by SIGINT with {done} of {len(COLUMNS)} trials done" in err
    resume = f"mmdtl2 study resume {out / 'study'} --executor local"
    assert f"Its study goes on with:\n    {resume}\n" in err
    res = subprocess.run(
        [*cli, *resume.split()[1:], "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(list(results.glob("*.json"))) == len(COLUMNS)
