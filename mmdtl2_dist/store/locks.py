"""Advisory locks that keep two processes out of one output.

A Gram, an extraction's work folder and a study folder are each written by one process
at a time: the writer holds ``fcntl.flock`` on a lock file of that output. A second
process either waits for the first (two studies needing the same Gram: the second then
uses it) or is refused with a message naming the holder's lock (a second ``study run``
or ``extract`` into the same folder, which would interleave their writes). A process
that dies, even by SIGKILL, releases its lock with it. On a file system without
advisory locks (some NFS set-ups, FUSE mounts) the work goes ahead unguarded, with a
warning.

Lock files stay in place, with one exception: a study run refused before it wrote
anything removes its lock and the folder it created for it (:func:`locked_folder`), so
that it leaves nothing behind. A process may therefore hold a lock on a file that has
since been removed; every lock taken here is checked to be on the file that is at the
path now, and taken again on the new one otherwise (:func:`lock_at`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mmdtl2_dist.store.outputs import NO_ROOM, OutputPathError, make_output_folder

#: Errors of a file system that offers no advisory locks.
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
#: A refusing lock tries this many times, this far apart, before it says "busy": a
#: reader's short shared probe (:func:`lock_is_held`) must not refuse a run.
BUSY_TRIES, BUSY_PAUSE_S = 5, 0.02
#: Times a lock is taken again because its file was replaced meanwhile (:func:`lock_at`).
RELOCKS = 10


class OutputBusy(ValueError):
    """Another process holds the lock of an output this one was asked to write."""


def open_lock_file(path: Path, fix: str, mode: int = 0o644) -> int:
    """A descriptor of the lock file ``path``, created (with ``mode``) if missing.

    ``fix`` completes the error when it cannot be created ("choose another folder …").
    """
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, mode)
    except OSError as exc:
        if exc.errno in NO_ROOM:
            raise
        raise OutputPathError(
            f"cannot create the lock file {path} ({exc.strerror}); {fix}"
        ) from exc


def take_lock(
    fd: int,
    path: Path,
    what: str,
    *,
    busy: str | None = None,
    waiting: Callable[[float | None], None] | None = None,
) -> None:
    """Lock ``fd`` (the lock file ``path`` of ``what``) for this process.

    When another process holds it: with ``busy``, raise :class:`OutputBusy` with that
    message (after :data:`BUSY_TRIES` tries); otherwise wait, calling ``waiting(None)``
    before and ``waiting(seconds)`` after. The caller closes ``fd`` to let go.
    """
    for attempt in range(BUSY_TRIES if busy is not None else 1):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if busy is not None and attempt + 1 < BUSY_TRIES:
                time.sleep(BUSY_PAUSE_S)
        except OSError as exc:
            if exc.errno not in NO_LOCKS:
                raise
            print(
                f"warning: {path.parent} offers no file locks ({exc.strerror}); two processes "
                f"writing {what} at once are not kept apart.",
                file=sys.stderr,
                flush=True,
            )
            return
    if busy is not None:
        raise OutputBusy(busy)
    if waiting is not None:
        waiting(None)
    t0 = time.monotonic()
    fcntl.flock(fd, fcntl.LOCK_EX)
    if waiting is not None:
        waiting(time.monotonic() - t0)


def _is_at(fd: int, path: Path) -> bool:
    """Whether ``fd`` is the file at ``path`` now (not one removed since it was opened)."""
    try:
        now = os.stat(path)  # through a link, as open() went
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


def lock_at(path: Path, what: str, fix: str, mode: int = 0o644, **how) -> int:
    """A descriptor of ``path`` locked by :func:`take_lock` (``how``), the file at ``path``."""
    for attempt in range(RELOCKS):
        if attempt and not path.parent.is_dir():  # its holder ended and removed the folder
            raise OutputBusy(
                f"the run that held {path} has just ended and removed its folder; run this "
                "command again."
            )
        fd = open_lock_file(path, fix, mode)
        try:
            take_lock(fd, path, what, **how)
            if _is_at(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # its holder removed it while this process waited: lock the new one
    raise OutputBusy(f"the lock file {path} kept changing while this process took it; {fix}")


@contextmanager
def held_lock(path: Path, what: str, *, fix: str, mode: int = 0o644, **how) -> Iterator[None]:
    """Hold the lock file ``path`` of ``what`` while inside (:func:`take_lock`'s ``how``)."""
    fd = lock_at(path, what, fix, mode, **how)
    try:
        yield
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def locked_folder(folder: Path, lock_name: str, what: str, busy: str) -> Iterator[None]:
    """Create ``folder`` if missing and hold its lock file ``lock_name`` while inside.

    Refused with ``busy`` (:class:`OutputBusy`) while another process holds it. When the
    call ends with the folder holding only the lock, the lock is removed (still held, so
    no other run is using it), and so are the folder and the parents this call created:
    a run refused before it wrote anything leaves nothing.
    """
    folder = Path(folder).absolute()
    created = [p for p in (folder, *folder.parents) if not os.path.lexists(p)]
    make_output_folder(folder, folder)
    path = folder / lock_name
    try:
        with held_lock(path, what, fix="give a path in a folder you can write to.", busy=busy):
            try:
                yield
            finally:
                if [p.name for p in folder.iterdir()] == [lock_name]:
                    path.unlink()
    finally:
        for p in created:  # the deepest first; stops at the first that holds anything
            try:
                p.rmdir()
            except OSError:
                break


def lock_is_held(path: Path) -> bool:
    """Whether another process holds the lock file ``path`` now."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def refuse_if_held(path: Path, busy: str) -> None:
    """Raise :class:`OutputBusy` with ``busy`` if another process holds the lock ``path``.

    For an output found in a state a writer passes through (its lock taken, its first
    files in flight) before this process has tried the lock itself.
    """
    if lock_is_held(path):
        raise OutputBusy(busy)
