"""A cost model of a Gram job: predicted wall time from the plan and measured rates.

Each tile task reads its rows' features and multiplies them, then writes one Gram chunk:

* an off-diagonal tile of ``T`` rows reads ``2 T L b`` bytes and does ``2 T² L`` flops;
  a diagonal tile reads ``T L b`` bytes and does ``T² L`` (the symmetric product);
* it writes ``T² · 8`` bytes and costs a fixed ``task_overhead_s`` (scheduling, opening
  arrays, the marker).

A tile split into ``P`` feature parts (:mod:`mmdtl2_dist.engine.plan`) is ``P`` tasks of
``1/P`` of its reads and flops, each writing its partial ``T² · 8`` bytes, and a combine
task that reads the ``P`` partial tiles and writes the chunk; the combines run after
the parts.

A task takes ``flops / r + bytes_read / s + bytes_written / w + overhead``, with ``r``
the product rate of one worker (flop/s: one BLAS thread, or one GPU), ``s`` the rate
at which one worker reads and decodes features (bytes/s: storage, CRC32C,
decompression and the cast) and ``w`` the rate at which it writes, checks and
checksums Gram bytes (by default ``s``). A GPU task (a copy rate ``x`` given) overlaps
reading one block with copying and multiplying the last:
``max(bytes_read / s, bytes_read / x + flops / r) + bytes_written / w + overhead``.
The tiles are dealt to ``W`` workers in the plan's order (off-diagonal first,
:func:`~mmdtl2_dist.engine.plan.gram_tile_plan`), each to the worker free first, as Ray
does; the prediction is when the last worker finishes, plus
``startup_s`` (starting or connecting to Ray). With few tiles per worker the makespan,
not the total work, sets the time: 3 tiles on 2 workers take two tiles' time.

Calibrate ``r`` with one worker's product on a tile-sized block while the node's other
workers multiply too, and ``s`` with one worker's read of a feature block
(``benchmarks/bench_gram.py`` does both); on a cluster,
measure ``s`` on the shared storage the store is on, with as many readers as workers.
For GPU workers calibrate all four on one run's phase times
(``benchmarks/bench_cost_model.py`` does, and predicts the other plans of that run).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from mmdtl2_dist.engine.plan import gram_tile_plan


@dataclass(frozen=True)
class _Rates:
    """One worker's rates (bytes or flops per second); ``transfer`` None: a CPU worker."""

    flops: float
    read: float
    write: float
    transfer: float | None

    def tile_task(self, t, n_features: int, itemsize: int, parts: int):
        """One part task of tile ``t``: its time, its product time and its I/O work."""
        rows_a, rows_b = t.a1 - t.a0, t.b1 - t.b0
        flops = (1.0 if t.diagonal else 2.0) * rows_a * rows_b * n_features / parts
        read = (rows_a + (0 if t.diagonal else rows_b)) * n_features * itemsize / parts
        c, r, w = flops / self.flops, read / self.read, 8.0 * rows_a * rows_b / self.write
        if self.transfer is None:
            return r + c + w, c, r + w
        x = read / self.transfer
        return max(r, x + c) + w, c, r + x + w

    def combine(self, t, parts: int) -> float:
        """The combine task of a tile split into ``parts``: reads them, writes the chunk."""
        tile_bytes = 8.0 * (t.a1 - t.a0) * (t.b1 - t.b0)
        return tile_bytes * parts / self.read + tile_bytes / self.write


def predict_gram_seconds(
    n: int,
    n_features: int,
    workers: int,
    flops_per_s: float,
    read_bytes_per_s: float,
    tile_rows: int = 2048,
    itemsize: int = 4,
    task_overhead_s: float = 0.01,
    startup_s: float = 0.0,
    parts: int = 1,
    write_bytes_per_s: float | None = None,
    transfer_bytes_per_s: float | None = None,
) -> dict:
    """Predicted wall time of the Gram of ``n`` samples of ``n_features`` features.

    Parameters
    ----------
    n, n_features : int
        Gram rows and feature dimension ``L``.
    workers : int
        Tasks running at once (one per worker: a CPU with one BLAS thread, or a GPU).
    flops_per_s : float
        Product rate of one worker.
    read_bytes_per_s : float
        Feature bytes one worker reads and decodes per second (while the others do too).
    tile_rows, itemsize : int
        Rows per tile (``T``); bytes per stored feature.
    task_overhead_s, startup_s : float
        Fixed cost of one task and of the job.
    parts : int
        Feature parts per tile (1: one task per tile).
    write_bytes_per_s : float, optional
        Gram bytes one worker writes, checks and checksums per second (default: the read
        rate, as one CPU calibration measures).
    transfer_bytes_per_s : float, optional
        Host-to-device copy rate of a GPU worker. Given, the tasks are GPU tiles: the
        device copies and multiplies one block while the host reads the next, so a task
        takes ``max(read, copy + product) + write`` instead of their sum.

    Returns
    -------
    dict
        ``seconds`` (predicted wall time); ``compute_seconds`` and ``io_seconds``, the
        products' and the reads', copies' and writes' work summed over tasks (on a GPU
        reading overlaps the rest, so they add up to more than the tasks take);
        ``tiles``, ``tasks``, ``busy_workers`` and ``balance`` (total work / (workers ×
        makespan): 1 when the tasks divide evenly).
    """
    given = [r for r in (write_bytes_per_s, transfer_bytes_per_s) if r is not None]
    if workers < 1 or parts < 1 or not all(r > 0 for r in [flops_per_s, read_bytes_per_s, *given]):
        raise ValueError("need workers >= 1, parts >= 1 and positive rates.")
    rates = _Rates(
        flops_per_s, read_bytes_per_s, write_bytes_per_s or read_bytes_per_s, transfer_bytes_per_s
    )
    tiles = gram_tile_plan(n, min(tile_rows, n))
    compute = io = 0.0
    durations, combines = [], []
    for t in tiles:
        task, c, i = rates.tile_task(t, n_features, itemsize, parts)
        durations += [task + task_overhead_s] * parts
        compute, io = compute + c * parts, io + i * parts
        if parts > 1:  # reads the parts, writes the chunk
            combines.append(rates.combine(t, parts))
            io += combines[-1]
            combines[-1] += task_overhead_s
    durations += combines
    free = [0.0] * min(workers, len(durations))
    for d in durations:  # each task to the worker free first, in plan order
        heapq.heappush(free, heapq.heappop(free) + d)
    makespan = max(free)
    return {
        "seconds": startup_s + makespan,
        "compute_seconds": compute,
        "io_seconds": io,
        "tiles": len(tiles),
        "tasks": len(durations),
        "busy_workers": len(free),
        "balance": sum(durations) / (workers * makespan) if makespan > 0 else 1.0,
    }


def workers_for(
    seconds: float, n: int, n_features: int, flops_per_s: float, read_bytes_per_s: float, **kw
) -> int | None:
    """Fewest workers whose predicted time is at most ``seconds`` (a cluster's size).

    None when even one worker per task is too slow (smaller tiles would be needed).
    """
    tiles = len(gram_tile_plan(n, min(kw.get("tile_rows", 2048), n))) * kw.get("parts", 1)
    lo, hi = 1, max(1, tiles)
    most = predict_gram_seconds(n, n_features, hi, flops_per_s, read_bytes_per_s, **kw)
    if most["seconds"] > seconds:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        t = predict_gram_seconds(n, n_features, mid, flops_per_s, read_bytes_per_s, **kw)
        if t["seconds"] <= seconds:
            hi = mid
        else:
            lo = mid + 1
    return lo
