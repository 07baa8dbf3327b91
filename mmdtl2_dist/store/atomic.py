"""Files that readers see whole or not at all: written under a temporary name, then renamed."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

#: The temporary names :func:`atomic_file` gives, ``.<name>.<8 hex>.tmp``.
TEMPORARY_NAME = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{8}\.tmp")


@contextmanager
def atomic_file(path: str | os.PathLike, tmp: Path | None = None) -> Iterator[BinaryIO]:
    """A binary file to write ``path`` into, renamed to ``path`` when the block ends.

    It is written as ``tmp`` beside ``path`` (same file system, so the rename is
    atomic), by default ``.<name>.<8 hex>.tmp``: readers see the old file or the whole
    new one, never a part. If the block raises, the temporary file is removed; a killed
    process leaves it, under a name its caller's cleanup recognises
    (:data:`TEMPORARY_NAME` for the default).
    """
    path = Path(path)
    tmp = tmp or path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def remove_temporaries(folder: str | os.PathLike, pattern: str = ".*.tmp") -> list[Path]:
    """Remove the temporary files that killed :func:`atomic_file` writes left in ``folder``.

    Only names :func:`atomic_file` gives (:data:`TEMPORARY_NAME`) among those matching
    ``pattern`` (a glob, relative to ``folder``) are touched; their writer must be gone
    (the caller owns the folder). Returns what was removed.
    """
    stray = [p for p in Path(folder).glob(pattern) if TEMPORARY_NAME.fullmatch(p.name)]
    for p in stray:
        p.unlink(missing_ok=True)
    return stray


def write_json_atomic(path: str | os.PathLike, content, **dumps) -> None:
    """Write ``content`` as JSON (``json.dumps`` options ``dumps``), atomically.

    Through :func:`atomic_file`: readers see the old file or the whole new one, never a part.
    """
    with atomic_file(path) as f:
        f.write(json.dumps(content, **dumps).encode())
