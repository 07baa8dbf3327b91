"""Advisory locks that keep two processes out of one output.

A Gram, an extraction's work folder and a study folder are each written by one process
at a time: the writer holds ``fcntl.flock`` on a lock file of that output. A second
process either waits for the first (two studies needing the same Gram: the second then
uses it) or is refused with a message naming the holder's lock (a second ``study run``
or ``extract`` into the same folder, which would interleave their writes). The lock file
stays in place: removing it would let a third process lock a file that a waiting one no
longer sees. A process that dies, even by SIGKILL, releases its lock with it. On a file
system without advisory locks (some NFS set-ups, FUSE mounts) the work goes ahead
unguarded, with a warning.
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


class OutputBusy(ValueError):
    """Another process holds the lock of an output this one was asked to write."""


def open_lock_file(path: Path, fix: str) -> int:
    """A descriptor of the lock file ``path``, created if missing.

    ``fix`` completes the error when it cannot be created ("choose another folder …").
    """
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
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
    message; otherwise wait, calling ``waiting(None)`` before and ``waiting(seconds)``
    after. The caller closes ``fd`` to let go.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        if busy is not None:
            raise OutputBusy(busy) from None
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
    if waiting is not None:
        waiting(None)
    t0 = time.monotonic()
    fcntl.flock(fd, fcntl.LOCK_EX)
    if waiting is not None:
        waiting(time.monotonic() - t0)


@contextmanager
def held_lock(path: Path, what: str, *, busy: str, fix: str) -> Iterator[None]:
    """Hold the lock file ``path`` of ``what`` while inside; refused (``busy``) if held."""
    fd = open_lock_file(path, fix)
    try:
        take_lock(fd, path, what, busy=busy)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def locked_folder(folder: Path, lock_name: str, what: str, busy: str) -> Iterator[None]:
    """Create ``folder`` if missing and hold its lock file ``lock_name`` while inside.

    Refused with ``busy`` (:class:`OutputBusy`) while another process holds it. A folder
    this call created (with the parents it created) that holds only the lock when the call
    ends is removed again, so a run refused before it wrote anything leaves nothing.
    """
    folder = Path(folder).absolute()
    created = [p for p in (folder, *folder.parents) if not os.path.lexists(p)]
    make_output_folder(folder, folder)
    path = folder / lock_name
    try:
        with held_lock(path, what, busy=busy, fix="give a path in a folder you can write to."):
            try:
                yield
            finally:
                if created and [p.name for p in folder.iterdir()] == [lock_name]:
                    path.unlink()  # still locked: no other run can be using it
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
