"""Output paths: what a command may write over, and how it writes them atomically.

Ownership rule (:func:`claim_output`, applied to every output path: feature stores, Gram
stores, study folders, prediction files). A command writes at a path only when

- nothing is there, or an empty directory where a directory goes (nothing to lose); or
- the path holds an output of the same kind that this system wrote, recognised by the
  kind's signature (:class:`OutputKind`: a feature store's root attribute, a Gram store's
  ``job.json``, a study folder's ``study.json``, the columns of a prediction file). Such
  an output is resumed (Gram stores, study folders) or replaced, and replaced only when
  the caller asked for it (``overwrite``, ``--overwrite``).

Anything else (a plain file where a directory goes, a directory or file this system did
not write, a symbolic link to be replaced, an output to be replaced that also holds files
of the user's: :attr:`OutputKind.written`) is refused with an :class:`OutputPathError`
that names the path, says what is there and asks for another path; ``--overwrite`` never
applies to it, so a mistyped path cannot destroy a user's files.

Atomic writes (:class:`StagedOutput`). An output is built under a hidden sibling
``.<name>.tmp-<host>-<pid>-<token>`` and renamed into place when complete; a directory
being replaced is first renamed to ``.<name>.old-<host>-<pid>-<token>`` and deleted after
the swap. The host and process id in these names make leftovers provable: when a writer
for the same target starts, it deletes the temporary siblings of writers on this host
whose process is gone, puts back an ``.old-`` sibling when the target itself is missing
(the writer was killed between the two renames of a swap), and deletes it otherwise (the
swap completed). It says so in one line on stderr. Siblings of live processes or of
other hosts are left alone.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mmdtl2_dist.lifecycle import process_runs
from mmdtl2_dist.store.layout import (
    FEATURES_GROUP,
    METADATA_FILE,
    ROOT_ATTR,
    SIDE_FILES,
    is_name,
)

#: ``errno`` values of an output that found no room: a full disk or quota.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)

_FIX = "choose another path, or remove it yourself if it is no longer needed"


class OutputPathError(ValueError):
    """An output path holds something this system did not write (or may not replace)."""


@dataclass(frozen=True)
class OutputKind:
    """A kind of output this system writes, and how to recognise one.

    Attributes
    ----------
    what : str
        Its name in messages ("feature store").
    is_dir : bool
        A directory (else a single file).
    recognise : callable
        ``recognise(path) -> bool``: ``path`` holds this kind of output written by this
        system (checks the signature only; must not raise).
    replace_hint : str
        How to ask for a replacement (said only about outputs of this kind).
    written : callable or None
        For a directory that is replaced: ``written(path)`` is the set of relative POSIX
        paths of the files this system wrote in it (read from the output's own record).
        Any other file (or a symbolic link) in it is the user's, and a replacement that
        would delete it is refused (:func:`foreign_files`).
    """

    what: str
    is_dir: bool
    recognise: Callable[[Path], bool]
    replace_hint: str = "pass --overwrite to replace it"
    written: Callable[[Path], set[str]] | None = None


def _store_record(path: Path) -> dict | None:
    try:
        attrs = json.loads((path / "zarr.json").read_text()).get("attributes") or {}
    except (OSError, ValueError, AttributeError):
        return None
    record = attrs.get(ROOT_ATTR) if isinstance(attrs, dict) else None
    return record if isinstance(record, dict) else None


def _is_feature_store(path: Path) -> bool:
    return _store_record(path) is not None


def _store_files(path: Path) -> set[str]:
    """The files a feature store's writer made, from the store's own record.

    The root, its metadata table and side files, the features group, and for every array
    the record lists (device, space) the device's group, the array's metadata and its
    chunk files ``c/<row block>/<column block>``.
    """
    record = _store_record(path) or {}
    names = {"zarr.json", METADATA_FILE, f"{FEATURES_GROUP}/zarr.json", *_side_files(record)}
    arrays = record.get("arrays")
    for a in arrays if isinstance(arrays, list) else []:
        d, s = (a.get("device"), a.get("space")) if isinstance(a, dict) else (None, None)
        if not (is_name(d) and is_name(s)):
            continue  # a damaged record vouches for nothing
        names |= {f"{FEATURES_GROUP}/{d}/zarr.json", f"{FEATURES_GROUP}/{d}/{s}/zarr.json"}
        for root, _, files in os.walk(path / FEATURES_GROUP / d / s / "c"):
            rel = Path(root).relative_to(path).as_posix()
            names |= {f"{rel}/{f}" for f in files if _CHUNK.fullmatch(f"{rel}/{f}")}
    return names


_CHUNK = re.compile(rf"{FEATURES_GROUP}/[^/]+/[^/]+/c(/[0-9]+)+")


def _side_files(record: dict) -> tuple[str, ...]:
    """The side files a store's record lists.

    A store written before records listed them may hold ``skipped_images.csv`` when
    ``extract --skip-bad`` skipped images (its provenance says so).
    """
    files = record.get("files")
    if isinstance(files, list):
        return tuple(f for f in files if f in SIDE_FILES)
    provenance = record.get("provenance")
    extraction = provenance.get("extraction") if isinstance(provenance, dict) else None
    skipped = isinstance(extraction, dict) and extraction.get("n_skipped")
    return SIDE_FILES if skipped and "files" not in record else ()


FEATURE_STORE = OutputKind(
    "feature store",
    is_dir=True,
    recognise=_is_feature_store,
    replace_hint="pass --overwrite (overwrite=True in Python) to replace it",
    written=_store_files,
)


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and next(path.iterdir(), None) is None


def _what_is_there(path: Path) -> str:
    if path.is_symlink():
        return "is a symbolic link"
    if path.is_file():
        return "is a file"
    if path.is_dir():
        entries = sorted(p.name for p in path.iterdir())
        if not entries:
            return "is a directory"
        shown = ", ".join(repr(e) for e in entries[:3])
        more = f" and {len(entries) - 3} more" if len(entries) > 3 else ""
        return f"is a non-empty directory (holding {shown}{more})"
    return "is neither a regular file nor a directory"


def foreign_files(path: Path, written: set[str]) -> list[str]:
    """Files and links under ``path`` whose relative path is not in ``written``.

    What a user put there, sorted; links are listed, never followed.
    """
    found = []
    for root, dirs, files in os.walk(path):
        rel = Path(root).relative_to(path)
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            p = (rel / name).as_posix()
            if os.path.islink(os.path.join(root, name)) or p not in written:
                found.append(p)
    return sorted(found)


def _check_nothing_foreign(path: Path, kind: OutputKind) -> None:
    """Refuse to replace ``path`` when it holds files this system did not write."""
    foreign = foreign_files(path, kind.written(path)) if kind.written is not None else []
    if foreign:
        shown = ", ".join(repr(f) for f in foreign[:3])
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise OutputPathError(
            f"{path} is a {kind.what} written by this system, but it also holds files this "
            f"system did not write ({shown}{more}); replacing it would delete them, so "
            f"nothing was changed: move them out of {path}, or choose another path."
        )


def claim_output(path: str | os.PathLike, kind: OutputKind, *, overwrite: bool | None) -> bool:
    """Check that writing ``kind`` at ``path`` can lose nothing this system did not write.

    Parameters
    ----------
    path : str or Path
        The output path.
    kind : OutputKind
        What will be written there.
    overwrite : bool or None
        For outputs that are replaced: whether the caller asked to replace an existing
        one. ``None`` for outputs that are resumed in place (an existing one is reused).

    Returns
    -------
    bool
        True when ``path`` holds an output of this kind (to be replaced or resumed);
        False when it is free (missing, or an empty directory for a directory kind).

    Raises
    ------
    OutputPathError
        If ``path`` holds anything else, or an output of this kind that may not be
        replaced (``overwrite=False``, or files of the user's inside it).
    """
    path = Path(path).absolute()
    if not os.path.lexists(path):
        return False
    if kind.recognise(path):
        if overwrite is False:
            raise OutputPathError(
                f"{path} already exists (a {kind.what} written by this system); "
                f"{kind.replace_hint}, or choose another path."
            )
        if overwrite is None:
            return True
        if not path.is_symlink():
            _check_nothing_foreign(path, kind)
            return True
        real = os.path.realpath(path)
        raise OutputPathError(
            f"{path} is a symbolic link to the {kind.what} {real}; links are never replaced: "
            f"give {real} itself, or another path."
        )
    if kind.is_dir and _is_empty_dir(path):
        return False
    raise OutputPathError(
        f"{path} {_what_is_there(path)}, not a {kind.what} written by this system, so it "
        f"is left untouched; {_FIX}."
    )


# -- atomic writes and their leftovers ------------------------------------------------------


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _sibling(target: Path, role: str) -> Path:
    return target.parent / f".{target.name}.{role}-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _dead_siblings(target: Path, role: str) -> list[Path]:
    """Siblings ``.<name>.<role>-<host>-<pid>-<token>`` of this host's dead processes."""
    pattern = re.compile(
        re.escape(f".{target.name}.{role}-") + r"(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{8}$"
    )
    host, found = _host(), []
    if not target.parent.is_dir():
        return found
    for p in target.parent.iterdir():
        m = pattern.match(p.name)
        if m and m["host"] == host and not process_runs(int(m["pid"])):
            found.append(p)
    return found


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def recover_leftovers(target: str | os.PathLike) -> str | None:
    """Restore or delete what killed writers of ``target`` left; describe it (or None).

    An ``.old-`` sibling is put back when ``target`` is missing (the newest, if several),
    and deleted otherwise; ``.tmp-`` siblings are deleted. Only siblings of processes of
    this host that no longer run are touched.
    """
    target = Path(target).absolute()
    olds = sorted(_dead_siblings(target, "old"), key=lambda p: p.stat().st_mtime)
    tmps = _dead_siblings(target, "tmp")
    said = []
    if olds and not os.path.lexists(target):
        restored = olds.pop()
        os.replace(restored, target)
        said.append(f"restored {target} from {restored.name} (a run was killed while replacing it)")
    for p in olds + tmps:
        _remove(p)
    if olds or tmps:
        said.append(
            f"removed {len(olds) + len(tmps)} unfinished write(s) of {target} left by killed runs"
        )
    return "; ".join(said) or None


#: The name of the file :func:`make_output_folder` creates and removes to test a folder.
PROBE_PREFIX = ".mmdtl2-probe-"
#: Errors of creating a folder or file that the user can fix by choosing another path.
_UNUSABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.EEXIST, errno.ENOTDIR}


def make_output_folder(folder: str | os.PathLike, output: str | os.PathLike) -> None:
    """Create ``folder`` (and its parents) and check that files can be created in it.

    Raises :class:`OutputPathError` naming ``output`` (the path the user gave) and what is
    wrong: a file where a folder of the path must be, or no permission (a read-only file
    system included). Any other error propagates.
    """
    folder = Path(folder).absolute()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        if exc.errno not in _UNUSABLE:
            raise
        blocker = next((p for p in (folder, *folder.parents) if os.path.lexists(p)), None)
        if blocker is not None and not os.path.isdir(blocker):
            why = f"{blocker} is a file, where a folder of that path must be"
        else:
            why = f"no files can be created in {blocker or folder} ({exc.strerror})"
        raise OutputPathError(
            f"cannot write {Path(output).absolute()}: {why}; give a path in a folder you can "
            "write to."
        ) from None


class StagedOutput:
    """Write an output under a hidden temporary sibling, then move it into place.

    Creating one first calls :func:`recover_leftovers` for the target (printing its line
    to stderr). Write to :attr:`tmp`, then call :meth:`commit`; :meth:`discard` (always
    safe) deletes what is left of :attr:`tmp`. As a context manager it commits when the
    block succeeds and discards in any case.

    Parameters
    ----------
    target : str or Path
        The final path (a directory or a file).
    replace : bool
        The target may hold an output to replace (the caller checked it with
        :func:`claim_output`). Otherwise only a missing target or an empty directory is
        written over.
    """

    def __init__(self, target: str | os.PathLike, *, replace: bool = False):
        self.target = Path(target).absolute()
        self.replace = replace
        make_output_folder(self.target.parent, self.target)
        note = recover_leftovers(self.target)
        if note:
            print(f"mmdtl2: {note}", file=sys.stderr, flush=True)
        self.tmp = _sibling(self.target, "tmp")

    def commit(self) -> None:
        """Move :attr:`tmp` to the target (a directory being replaced is swapped out).

        Raises
        ------
        OutputPathError
            If something appeared at the target while writing and ``replace`` is false.
        """
        target = self.target
        if os.path.lexists(target) and not self.replace and not _is_empty_dir(target):
            raise OutputPathError(f"{target} appeared while writing; not replacing it.")
        if target.is_dir() and not target.is_symlink() and not _is_empty_dir(target):
            old = _sibling(target, "old")
            os.replace(target, old)
            os.replace(self.tmp, target)
            _remove(old)
        else:
            os.replace(self.tmp, target)

    def discard(self) -> None:
        """Delete the temporary output if it is still there."""
        if os.path.lexists(self.tmp):
            _remove(self.tmp)

    def __enter__(self) -> Path:
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.commit()
        finally:
            self.discard()
