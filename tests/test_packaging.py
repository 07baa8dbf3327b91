"""What an install and a first run leave behind: no deprecated metadata, no untracked output."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_license_is_an_spdx_expression_that_the_build_backend_supports():
    """setuptools deprecates ``project.license`` as a table (a warning on every install);
    an SPDX string needs setuptools >= 77 (PEP 639)."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "BSD-3-Clause"
    bounds = [r for r in meta["build-system"]["requires"] if r.startswith("setuptools")]
    low = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", bounds[0].replace(" ", ""))
    assert low and int(low.group(1)) >= 77, bounds


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout"
)
def test_default_study_output_is_git_ignored():
    """`mmdtl2 study run` writes ./mmdtl2-studies/<name> by default (`make run` too)."""
    out = subprocess.run(
        ["git", "check-ignore", "-q", "mmdtl2-studies/office_caltech10/mlflow.db"], cwd=ROOT
    )
    assert out.returncode == 0
