"""Fault injection from the test side: Gram tile tasks that announce themselves, then wait.

:func:`slow_gram_tiles` replaces :func:`mmdtl2_dist.engine.tasks.gram_tile_task` in this
(the driver's) process while it is active. The driver hands that function to
``ray.remote``; the replacement is a closure, so Ray ships it to the workers by value and
the workers need nothing of this module. In a worker it writes
``<probe_dir>/<tile key>.<worker pid>`` (``<tile key>-p<part>.<pid>`` for a feature part:
which process is busy with which task), sleeps
``delay`` seconds (the window in which a test kills that worker, or its whole node), then
runs the real task from the worker's own, unpatched, ``mmdtl2_dist.engine.tasks``.

Test modules import it directly (pytest puts ``tests/`` on ``sys.path``); a driver script
that a test runs in a subprocess or submits as a Ray job puts ``tests/`` there itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mmdtl2_dist.engine import tasks


def announcing_tile_task(probe_dir: str | os.PathLike, delay: float):
    """A ``gram_tile_task`` that records ``<tile key>.<pid>`` and waits ``delay`` s first."""
    probe_dir = str(probe_dir)

    def gram_tile_task(job, tile, stats, norms, part=None):
        from mmdtl2_dist.engine import tasks as worker_tasks  # the real one, in the worker

        task = tile.key if part is None else f"{tile.key}-p{part}"
        Path(probe_dir, f"{task}.{os.getpid()}").touch()
        time.sleep(delay)
        return worker_tasks.gram_tile_task(job, tile, stats, norms, part)

    return gram_tile_task


@contextmanager
def slow_gram_tiles(probe_dir: str | os.PathLike, delay: float) -> Iterator[None]:
    """Gram jobs started inside the block run :func:`announcing_tile_task` tiles."""
    real = tasks.gram_tile_task
    tasks.gram_tile_task = announcing_tile_task(probe_dir, delay)
    try:
        yield
    finally:
        tasks.gram_tile_task = real
