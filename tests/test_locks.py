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
