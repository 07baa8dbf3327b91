"""Walk the README and the deployment guide as a newcomer would: every command, offline.

Each fenced ``bash`` or ``python`` block of README.md and then of docs/deploy.md runs, in
the order written, in one shell session inside an empty folder that holds only a copy of
``studies/`` (the commands use relative paths from the repository root), with the
installed ``mmdtl2`` and ``python`` first on PATH. Servers a document started are stopped
before the next document. The cluster guide is walked on a real two-node cluster by
``tests/test_cluster_loopback.py``. A block is preceded by an HTML comment to change how
it runs:

- ``<!-- walk: skip: REASON -->``: not run (the set-up commands themselves, a cluster);
- ``<!-- walk: background URL -->``: a server; started in the background and waited for
  until URL answers, stopped when the walk ends.

The walk fails on any non-zero exit, and on any line of output that a user would have to
interpret as a warning.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
WALKED = (README, ROOT / "docs" / "deploy.md")
FENCE = re.compile(
    r"^(?:<!-- walk: (?P<mark>[^>]*?) -->\n)?```(?P<lang>[a-z]*)\n(?P<body>.*?)^```$",
    re.M | re.S,
)
RUNNABLE = {"bash", "python"}
WARNING = re.compile(r"\bwarn(ing)?\b", re.I)
#: Warnings the walked documents announce: the offline demo extracts with random weights,
#: and the README says the command warns that such features mean nothing.
ANNOUNCED = re.compile(r"^mmdtl2 extract: warning: weights random:\d+ are random: ")


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    body: str
    mark: str


def readme_blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, with their walk marks."""
    return [
        Block(text.count("\n", 0, m.start("body")), m["lang"], m["body"], m["mark"] or "")
        for m in FENCE.finditer(text)
    ]


def shell_step(b: Block, i: int, doc: str) -> str:
    """The shell text that runs one block, announced with its document and line."""
    head = f'echo "=== {doc} line {b.line} ===" >&2\n'
    if b.mark.startswith("background "):
        url = b.mark.split(None, 1)[1]
        return (
            head + f"( {b.body.strip()} ) > bg_{i}.log 2>&1 &\nBG+=($!)\n"
            f"for _ in $(seq 120); do curl -sf {url} >/dev/null && break; sleep 1; done\n"
            f"curl -sf {url} >/dev/null || {{ cat bg_{i}.log >&2; exit 1; }}\n"
        )
    if b.lang == "python":
        return head + f"python - <<'README_PY'\n{b.body}README_PY\n"
    return head + b.body


def doc_steps(doc: Path) -> list[str]:
    """The shell steps of one document, then stopping the servers it started."""
    steps = [
        shell_step(b, f"{doc.stem}_{i}", doc.name)
        for i, b in enumerate(readme_blocks(doc.read_text()))
        if b.lang in RUNNABLE and not b.mark.startswith("skip:")
    ]
    return [*steps, "cleanup\nBG=()\n"]


def walk_script(docs) -> str:
    steps = [step for doc in docs for step in doc_steps(doc)]
    prologue = (
        "set -euo pipefail\nBG=()\n"
        'cleanup() { for p in "${BG[@]}"; do pkill -TERM -P "$p" 2>/dev/null || true; '
        'kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }\n'
        "trap cleanup EXIT\n"
    )
    return prologue + "\n".join(steps)


@pytest.mark.parametrize("doc", WALKED, ids=lambda p: p.name)
def test_every_runnable_block_is_marked_or_run(doc):
    blocks = readme_blocks(doc.read_text())
    assert blocks, f"{doc.name} has no fenced blocks"
    for b in blocks:
        if b.mark:
            kind = b.mark.split(None, 1)[0]
            where = f"{doc.name} line {b.line}"
            assert kind in ("skip:", "background"), f"{where}: unknown mark {b.mark!r}"
            if kind == "skip:":
                assert len(b.mark) > len("skip: ") + 10, f"{where}: give a reason"
        if b.lang in RUNNABLE:
            assert "..." not in b.body or b.mark.startswith("skip:"), (
                f"{doc.name} line {b.line}: a runnable block holds a placeholder '...'"
            )


@pytest.mark.slow
def test_readme_walk(tmp_path):
    """Every runnable block of the walked documents, in order, offline: exit 0, no warning."""
    work = tmp_path / "walk"
    work.mkdir()
    shutil.copytree(ROOT / "studies", work / "studies")
    script = walk_script(WALKED)
    (tmp_path / "walk.sh").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_ADDRESS"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        ["bash", str(tmp_path / "walk.sh")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    log = proc.stdout + proc.stderr
    (tmp_path / "walk.log").write_text(log)
    assert proc.returncode == 0, f"the walk failed (rc {proc.returncode}):\n{log[-6000:]}"
    warnings = [
        line for line in log.splitlines() if WARNING.search(line) and not ANNOUNCED.match(line)
    ]
    assert any(ANNOUNCED.match(line) for line in log.splitlines())  # said, as documented
    assert not warnings, "the walk printed warnings:\n" + "\n".join(warnings[:20])
