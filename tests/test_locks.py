"""The advisory locks of :mod:`mmdtl2_dist.store.locks` (real ``flock`` on real files)."""

from __future__ import annotations

import os

import pytest

from mmdtl2_dist.store import locks


def test_a_lock_taken_on_a_removed_file_is_taken_again_on_the_file_at_the_path(
    tmp_path, monkeypatch
):
    """A refused study run removes its lock file while it still holds it; a process that
    had opened that file and locks it once it is let go holds a lock on nothing. lock_at
    checks the locked file is the one at the path and locks the new one instead."""
    path, calls = tmp_path / ".study.lock", []
    real = locks.take_lock

    def holder_removed_it_meanwhile(fd, p, what, **how):
        calls.append(fd)
        if len(calls) == 1:  # the file this process opened is removed and made anew
            path.unlink()
            path.write_text("")
        return real(fd, p, what, **how)

    monkeypatch.setattr(locks, "take_lock", holder_removed_it_meanwhile)
    fd = locks.lock_at(path, "one study", "fix", busy="busy")
    try:
        assert len(calls) == 2
        assert os.fstat(fd).st_ino == os.stat(path).st_ino
        assert locks.lock_is_held(path)  # seen from another open file description
    finally:
        os.close(fd)
    assert not locks.lock_is_held(path)


def test_a_held_lock_refuses_with_the_busy_message_and_releases_on_close(tmp_path):
    path = tmp_path / ".lock"
    with locks.held_lock(path, "one store", fix="fix", busy="first"):
        with pytest.raises(locks.OutputBusy, match="second"):
            with locks.held_lock(path, "one store", fix="fix", busy="second"):
                pass
    with locks.held_lock(path, "one store", fix="fix", busy="third"):
        assert path.is_file()


def test_a_lock_file_behind_a_link_is_locked_once(tmp_path):
    """A lock path that is a symbolic link locks its target (open follows it), and the
    check that the locked file is the one at the path follows it too: no endless retry."""
    target = tmp_path / "real.lock"
    target.write_text("")
    link = tmp_path / ".lock"
    link.symlink_to(target)
    fd = locks.lock_at(link, "one store", "fix", busy="busy")
    try:
        assert locks.lock_is_held(target)
    finally:
        os.close(fd)


def test_a_folder_removed_by_the_lock_holder_meanwhile_is_busy_not_unwritable(
    tmp_path, monkeypatch
):
    """The holder of a study's lock ends, removing the lock and the folder it created,
    while this process waited for that lock: the run is told to run again, not that the
    folder cannot be written."""
    folder = tmp_path / "study"
    folder.mkdir()
    path, real = folder / ".study.lock", locks.take_lock

    def holder_ended_meanwhile(fd, p, what, **how):
        path.unlink()
        folder.rmdir()
        return real(fd, p, what, **how)

    monkeypatch.setattr(locks, "take_lock", holder_ended_meanwhile)
    with pytest.raises(locks.OutputBusy, match="has just ended and removed its folder"):
        locks.lock_at(path, "one study", "fix", busy="busy")
