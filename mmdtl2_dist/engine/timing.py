"""Where a Gram job's time goes: per-tile phase times, aggregated per worker and per job.

Every tile task (or part task, or combine task of a split tile) measures its phases
with a :class:`PhaseTimer` and returns them in its marker (``marker["timing"]``); a
combine's ``read`` is loading its parts and its ``product`` summing them:

``setup``
    Importing torch and opening the device, the first time a worker process needs them.
``read``
    Zarr reads of the feature blocks: file I/O, CRC32C check, decompression.
``check``
    The finiteness check of the finished tile: a NaN or infinity among a row's features
    (a lost chunk read by zarr as NaN, see
    :func:`mmdtl2_dist.store.feature_store.read_array_block`) reaches every entry of its
    row. On a GPU it runs on the device (``TorchProduct.all_finite``).
``cast``
    Preprocessing and the conversion to the product's precision (float32 → float64 in
    exact mode), on the CPU.
``transfer``
    Host → device copies (GPU tiles only).
``product``
    The block products and their accumulation (on a GPU: the device's time, which
    overlaps the host phases, so the phases can add up to more than the task's time).
``write``
    Writing the Gram chunk (its CRC32C, the file write).
``digest``
    The tile's CRC32C for its marker: the write's own, except for an edge chunk, whose
    stored bytes hold padding, and a partial tile, which are hashed here. (The marker is
    written after the timing is recorded.)

plus the wall-clock ``start`` and ``end`` of the task, its process (``pid``, ``host``),
the ``device`` it ran on and the BLAS threads of its process (``blas_threads``: one per
worker on Ray, which sets ``OMP_NUM_THREADS`` to a task's CPUs). The driver adds
``submitted`` (when it handed the task to Ray) and :func:`summarize_timing` aggregates
the markers of one run: seconds per phase, the scheduling wait (``start - submitted``),
and per worker the tiles, busy seconds and utilisation over the run's wall time.
"""

from __future__ import annotations

import os
import socket
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

PHASES = ("setup", "read", "check", "cast", "transfer", "product", "write", "digest")


class PhaseTimer:
    """Seconds spent per phase of one task (see the module docstring)."""

    def __init__(self):
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.start = time.time()
        self._t0 = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0

    def record(self, device: str) -> dict:
        """The task's timing record (JSON-ready), with its start and end wall time."""
        return {
            **{k: round(v, 6) for k, v in self.seconds.items()},
            "total": round(time.perf_counter() - self._t0, 6),
            "start": self.start,
            "end": self.start + (time.perf_counter() - self._t0),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "device": device,
            "blas_threads": blas_threads(),
        }


_BLAS_THREADS: list[int | None] = []


def blas_threads() -> int | None:
    """Threads of the BLAS this process uses (None if threadpoolctl cannot tell)."""
    if not _BLAS_THREADS:
        try:
            from threadpoolctl import threadpool_info

            counts = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
            _BLAS_THREADS.append(max(counts) if counts else None)
        except Exception:  # noqa: BLE001 - a diagnostic only
            _BLAS_THREADS.append(None)
    return _BLAS_THREADS[0]


def summarize_timing(records: list[dict], wall_seconds: float) -> dict:
    """Aggregate the timing records of one run's tiles.

    Parameters
    ----------
    records : list of dict
        :meth:`PhaseTimer.record` of each tile, with ``submitted`` (wall time the driver
        submitted it) added.
    wall_seconds : float
        Wall time of the run's tile phase (first submission to last result).

    Returns
    -------
    dict
        ``phases`` (seconds summed over tiles, and their share of the tiles' busy time),
        ``wait`` (scheduling wait summed and its maximum), ``workers`` (per
        ``host:pid``: tiles, busy seconds, utilisation = busy / wall) and ``tiles``.
    """
    records = [r for r in records if r]
    busy = sum(r["total"] for r in records)
    phases = {p: sum(r[p] for r in records) for p in PHASES}
    phases["other"] = max(0.0, busy - sum(phases.values()))
    waits = [max(0.0, r["start"] - r["submitted"]) for r in records if "submitted" in r]
    per_worker: dict[str, dict] = defaultdict(lambda: {"tiles": 0, "busy_seconds": 0.0})
    for r in records:
        w = per_worker[f"{r['host']}:{r['pid']}"]
        w["tiles"] += 1
        w["busy_seconds"] += r["total"]
        w["device"] = r["device"]
        w["blas_threads"] = r.get("blas_threads")
    wall = max(wall_seconds, 1e-9)
    for w in per_worker.values():
        w["utilisation"] = w["busy_seconds"] / wall
    return {
        "tiles": len(records),
        "wall_seconds": wall_seconds,
        "busy_seconds": busy,
        "phases": phases,
        "phase_share": {p: v / max(busy, 1e-12) for p, v in phases.items()},
        "wait_seconds": sum(waits),
        "max_wait_seconds": max(waits, default=0.0),
        "workers": dict(per_worker),
    }


def format_timing(summary: dict) -> str:
    """A few lines for humans: phase shares, wait, and per-worker utilisation."""
    share = summary["phase_share"]
    phases = ", ".join(f"{p} {summary['phases'][p]:.2f} s ({share[p]:.0%})" for p in share)
    lines = [
        f"{summary['tiles']} tiles, busy {summary['busy_seconds']:.2f} s in "
        f"{summary['wall_seconds']:.2f} s wall: {phases}",
        f"scheduling wait {summary['wait_seconds']:.2f} s in all "
        f"(longest {summary['max_wait_seconds']:.2f} s)",
    ]
    for name, w in sorted(summary["workers"].items()):
        lines.append(
            f"  worker {name} ({w['device']}, {w['blas_threads']} BLAS threads): "
            f"{w['tiles']} tiles, busy "
            f"{w['busy_seconds']:.2f} s, utilisation {w['utilisation']:.0%}"
        )
    return "\n".join(lines)
