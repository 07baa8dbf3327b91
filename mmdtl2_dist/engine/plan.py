"""Pure planning of a Gram job: row tiles, feature blocks, parts, memory (no Ray, no I/O).

The Gram ``G = X Xᵀ`` of ``n`` rows is cut into square tiles of ``tile_rows`` rows; tile
``(i, j)`` with ``i <= j`` (the upper triangle only) owns the whole Gram chunk
``(i, j)``. The two row tiles are streamed in column blocks of ``col_span`` features (a
multiple of the feature store's column chunk), so a task's memory is bounded by
:func:`task_memory_bytes` whatever the dimension ``L``.

Tiles are as large as the memory budget allows (fewer tiles: each row is read from the
store fewer times). When there are fewer tiles than workers (few samples, many
features: 2,000 × 64,896 is one tile), each tile's feature blocks are split into
``parts`` contiguous groups (:func:`choose_parts`, :func:`part_blocks`): one task per
part computes a partial float64 tile, and a combine task sums the parts in part order.
The plan ``(tile_rows, col_blocks, parts)`` is fixed when a job starts and stored with
it; the Gram's last bits depend on it (the float64 sums run in its order), and the same
plan gives the same bits on any worker and any retry.

The rows of a space shared by several devices are the concatenation of each device's
rows, devices in sorted order (:func:`row_segments` maps a global row range back to the
device arrays).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_TILE_ROWS = 2048
#: Most rows of a tile computed on a GPU: its float64 accumulator (2 GB) and blocks live
#: on the device, and every row read from the store feeds ``tile_rows`` dot products.
GPU_TILE_ROWS = 16384
DEFAULT_TASK_MEMORY_MB = 1024
TARGET_COL_SPAN = 8192
_FIXED_OVERHEAD = 96 << 20  # interpreter, numpy, zarr and Ray worker baseline


@dataclass(frozen=True)
class Tile:
    """One Gram task: rows ``[a0, a1)`` against rows ``[b0, b1)``, chunk ``(i, j)``."""

    i: int
    j: int
    a0: int
    a1: int
    b0: int
    b1: int

    @property
    def key(self) -> str:
        return f"{self.i}_{self.j}"

    @property
    def diagonal(self) -> bool:
        return self.i == self.j


def gram_tile_plan(n_rows: int, tile_rows: int) -> list[Tile]:
    """Upper-triangle tiles of an ``n_rows`` Gram, off-diagonal tiles first.

    Off-diagonal tiles cost twice a diagonal one (which uses the symmetric product), so
    scheduling them first packs the workers better; the order never changes results.

    Parameters
    ----------
    n_rows : int
        Rows of the Gram (samples of the space).
    tile_rows : int
        Rows per tile (and per Gram chunk side).
    """
    if n_rows < 1 or tile_rows < 1:
        raise ValueError(f"need n_rows >= 1 and tile_rows >= 1, got {n_rows}, {tile_rows}.")
    bounds = [(s, min(s + tile_rows, n_rows)) for s in range(0, n_rows, tile_rows)]
    tiles = [
        Tile(i, j, *bounds[i], *bounds[j])
        for i in range(len(bounds))
        for j in range(i, len(bounds))
    ]
    return sorted(tiles, key=lambda t: (t.diagonal, t.i, t.j))


def row_segments(offsets: list[int], start: int, stop: int) -> list[tuple[int, int, int]]:
    """Split global rows ``[start, stop)`` into ``(device_index, local_start, local_stop)``.

    Parameters
    ----------
    offsets : list of int
        Cumulative row counts ``[0, n_0, n_0 + n_1, ...]`` of the devices, in Gram order.
    """
    segs = []
    for d in range(len(offsets) - 1):
        lo, hi = max(start, offsets[d]), min(stop, offsets[d + 1])
        if lo < hi:
            segs.append((d, lo - offsets[d], hi - offsets[d]))
    return segs


def task_memory_bytes(
    tile_rows: int, col_span: int, itemsize: int = 4, gpu: bool = False, prep: bool = False
) -> int:
    """Peak host memory of one Gram task (upper bound used for planning and Ray scheduling).

    On the CPU, two row tiles of ``col_span`` columns are held as stored (``itemsize``)
    and as float64, plus a conversion buffer, the float64 accumulator and one product
    block. A GPU tile (``gpu``) holds two page-locked buffers per row tile, as stored,
    and the finished tile and its encoded chunk; its accumulator and products are on the
    device.
    """
    return _per_row(col_span, itemsize, gpu) * tile_rows + 16 * tile_rows**2 + _FIXED_OVERHEAD


def _per_row(col_span: int, itemsize: int, gpu: bool, prep: bool = False) -> int:
    """Host bytes of a task per row of its tile, besides the tile itself."""
    if not gpu:
        return 2 * (2 * itemsize + 8) * col_span
    return (4 * itemsize + (2 * (itemsize + 20) if prep else 0)) * col_span


def feature_blocks(
    n_features: int,
    chunk_cols: int,
    tile_rows: int,
    max_task_memory_mb: float,
    itemsize: int = 4,
    gpu: bool = False,
    prep: bool = False,
) -> list[tuple[int, int]]:
    """Column blocks ``(c0, c1)`` a task streams, aligned to the store's column chunks.

    The span is the largest multiple of ``chunk_cols`` up to about 8,192 columns whose
    task fits ``max_task_memory_mb``.

    Raises
    ------
    ValueError
        If even one column chunk does not fit; the message gives the largest tile that does.
    """
    budget = max_task_memory_mb * 2**20
    need = task_memory_bytes(tile_rows, min(chunk_cols, n_features), itemsize, gpu, prep)
    if need > budget:
        fit = max_tile_rows(min(chunk_cols, n_features), max_task_memory_mb, itemsize, gpu, prep)
        raise ValueError(
            f"a Gram task of tile_rows={tile_rows} needs {need / 2**20:.0f} MB "
            f"with column blocks of {chunk_cols}, over max_task_memory_mb={max_task_memory_mb}; "
            f"use tile_rows <= {fit} or raise max_task_memory_mb."
        )
    k = max(1, TARGET_COL_SPAN // chunk_cols)
    while k > 1 and task_memory_bytes(tile_rows, k * chunk_cols, itemsize, gpu, prep) > budget:
        k -= 1
    span = k * chunk_cols
    return [(c, min(c + span, n_features)) for c in range(0, n_features, span)]


def max_tile_rows(
    col_span: int, max_task_memory_mb: float, itemsize: int = 4, gpu: bool = False, prep=False
) -> int:
    """Largest tile whose task fits the memory budget with ``col_span`` columns."""
    budget = max_task_memory_mb * 2**20 - _FIXED_OVERHEAD
    # 16 t^2 + per_row t - budget = 0
    b = _per_row(col_span, itemsize, gpu, prep)
    return max(0, int((-b + math.sqrt(b * b + 64 * max(budget, 0))) / 32))


def choose_tile_rows(
    n_rows: int,
    chunk_rows: int,
    chunk_cols: int,
    max_task_memory_mb: float = DEFAULT_TASK_MEMORY_MB,
    itemsize: int = 4,
    gpu: bool = False,
    prep: bool = False,
) -> int:
    """Default tile size for a Gram of ``n_rows``: as large as allowed.

    At most 2,048 rows (:data:`GPU_TILE_ROWS` on a GPU, with tiles as even as the fewest
    allow), a multiple of the store's chunk rows, fitting ``max_task_memory_mb``, and at
    most ``n_rows``: each row is read from the store once per tile of its row, so fewer
    tiles read less. Workers are kept busy by splitting the features of the tiles
    (:func:`choose_parts`), not by smaller tiles.
    """
    fit = max_tile_rows(chunk_cols, max_task_memory_mb, itemsize, gpu, prep)
    most = max(1, min(GPU_TILE_ROWS if gpu else DEFAULT_TILE_ROWS, fit))
    want = min(most, n_rows)
    if gpu:
        # The fewest tiles, of equal size: an edge tile's chunk is stored whole (zarr's
        # regular grid), so 20,000 rows are two tiles of 10,240, not 16,384 + 3,616.
        want = math.ceil(n_rows / math.ceil(n_rows / most))
    if want >= chunk_rows:
        # Align tiles with the store's row chunks so each chunk is decoded by few tasks.
        up = math.ceil(want / chunk_rows) * chunk_rows
        want = up if up <= most else (want // chunk_rows) * chunk_rows
    return int(max(1, min(want, n_rows)))


def choose_parts(n_tiles: int, n_blocks: int, n_workers: int) -> int:
    """Feature parts per tile: enough tasks for ``n_workers``, one part if tiles suffice.

    With fewer tiles than workers, each tile is split into ``ceil(workers / tiles)``
    parts (at most one per feature block), so every worker has a part of the same size.
    """
    if n_tiles >= n_workers:
        return 1
    return int(max(1, min(n_blocks, math.ceil(n_workers / max(n_tiles, 1)))))


def part_blocks(col_blocks: list, parts: int) -> list[list[tuple[int, int]]]:
    """The feature blocks of each part: ``parts`` contiguous groups, sizes within one."""
    if not 1 <= parts <= max(1, len(col_blocks)):
        raise ValueError(
            f"feature_parts must lie in [1, {len(col_blocks)}] (one part per feature block "
            f"at most), got {parts}; give at most {len(col_blocks)}, or leave it out to "
            "let the plan choose."
        )
    base, extra = divmod(len(col_blocks), parts)
    bounds = [0]
    for k in range(parts):
        bounds.append(bounds[-1] + base + (k < extra))
    return [[tuple(b) for b in col_blocks[bounds[k] : bounds[k + 1]]] for k in range(parts)]


def plan_summary(
    n_rows: int, n_features: int, tiles: list[Tile], blocks: list, parts: int = 1
) -> dict:
    """Flops, bytes and tasks of a plan (for progress lines and the cluster cost model).

    A part reads its features of the tile's rows, so the rows read (in whole rows of
    ``n_features``) do not depend on ``parts``; a split tile runs ``parts`` part tasks
    and one combine task.
    """
    pairs = sum((t.a1 - t.a0) * (t.b1 - t.b0) * (0.5 if t.diagonal else 1.0) for t in tiles)
    reads = sum((t.a1 - t.a0) + (0 if t.diagonal else t.b1 - t.b0) for t in tiles)
    return {
        "tiles": len(tiles),
        "feature_blocks": len(blocks),
        "parts": int(parts),
        "tasks": len(tiles) * (parts + 1 if parts > 1 else 1),
        "flops": 2.0 * pairs * n_features,
        "rows_read": int(reads),
        "read_amplification": float(reads / max(n_rows, 1)),
        "gram_entries": int(np.sum([(t.a1 - t.a0) * (t.b1 - t.b0) for t in tiles])),
    }
