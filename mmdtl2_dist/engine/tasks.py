"""The per-task work of a Gram job: tiny module-level functions run by Ray workers.

They take absolute paths and ranges (never arrays of features), read the Zarr feature
arrays themselves, and write only Zarr chunks they own (one Gram chunk per tile), then a
completion marker, atomically. They import neither the driver nor Ray.

A tile split into feature parts (:mod:`mmdtl2_dist.engine.plan`) runs one
:func:`gram_tile_task` per part, which writes its partial tile to
``tiles/parts/<i>_<j>.<k>.npy`` (to a temporary name, then renamed) and then its marker
``<i>_<j>.<k>.json`` holding the file's CRC32C; :func:`gram_combine_task` then checks
each part against its marker, sums them in part order, writes the tile's chunk and
marker as an unsplit tile does, and removes the part files.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path

import google_crc32c
import numpy as np

from mmdtl2_dist.engine.plan import Tile, part_blocks, row_segments
from mmdtl2_dist.engine.products import tile_product
from mmdtl2_dist.engine.timing import PhaseTimer
from mmdtl2_dist.store.atomic import atomic_file, write_json_atomic
from mmdtl2_dist.store.blocks import write_array_chunk
from mmdtl2_dist.store.feature_store import array_dtype, read_array_block

L2_METHODS = ("l2", "l2_zscore")
#: Folder of the partial tiles of split tiles, in the Gram store's ``tiles`` folder.
PARTS_DIR = "parts"
ZSCORE_METHODS = ("zscore", "l2_zscore")


def moments_task(
    array_path: str, r0: int, r1: int, col_blocks: list[tuple[int, int]], method: str
) -> dict:
    """Row norms and feature moments of rows ``[r0, r1)`` of one device's array.

    Returns float64 ``norms`` (Euclidean norms of the raw rows) and, for z-score methods,
    ``s1``/``s2``: per-feature sums of the (L2-normalised for ``l2_zscore``) rows and of
    their squares. The driver adds the tiles' sums in a fixed order (deterministic).
    """
    sq = np.zeros(r1 - r0)
    zscore = method in ZSCORE_METHODS
    for c0, c1 in col_blocks:
        x = read_array_block(array_path, r0, r1, c0, c1).astype(np.float64)
        sq += np.einsum("ij,ij->i", x, x)
    norms = np.sqrt(sq)
    out = {"norms": norms}
    if zscore:
        divide = np.where(norms > 0, norms, 1.0)[:, None] if method == "l2_zscore" else None
        s1, s2 = [], []
        for c0, c1 in col_blocks:
            x = read_array_block(array_path, r0, r1, c0, c1).astype(np.float64)
            if divide is not None:
                x /= divide
            s1.append(x.sum(axis=0))
            s2.append(np.einsum("ij,ij->j", x, x))
        out["s1"], out["s2"] = np.concatenate(s1), np.concatenate(s2)
    return out


def _preprocessed_rows(job, start, stop, c0, c1, stats, norms, product, timer, slot="a"):
    """Rows ``[start, stop)``, features ``[c0, c1)``, preprocessed, as the product takes them.

    Preprocessing is computed in float64; without preprocessing the stored values go to
    the product as they are (float32 features stay float32 in mixed precision and on
    torch devices, which convert them themselves), read into a buffer of the product
    that the next block of the same ``slot`` reuses.
    """
    segments = row_segments(job["offsets"], start, stop)
    dtypes = {array_dtype(job["arrays"][d]) for d, _, _ in segments}
    if job["method"] == "none" and len(dtypes) == 1:
        buf = product.block_buffer(slot, (stop - start, c1 - c0), dtypes.pop())
        for d, l0, l1 in segments:
            part = buf[job["offsets"][d] + l0 - start : job["offsets"][d] + l1 - start]
            with timer.phase("read"):
                read_array_block(
                    job["arrays"][d], l0, l1, c0, c1,
                    check_finite=False, out=part, pool=product.read_pool,
                )  # fmt: skip
        return product.cast(buf, slot)
    parts = []
    for d, l0, l1 in segments:
        with timer.phase("read"):
            x = read_array_block(
                job["arrays"][d], l0, l1, c0, c1, check_finite=False, pool=product.read_pool
            )
        with timer.phase("cast"):
            if job["method"] != "none":
                x = _preprocess(x.astype(np.float64), job, d, l0, l1, c0, c1, stats, norms)
            parts.append(x)
    with timer.phase("cast"):
        return product.cast(parts[0] if len(parts) == 1 else np.concatenate(parts), slot)


def _preprocess(x, job, d, l0, l1, c0, c1, stats, norms):
    if job["method"] in L2_METHODS:
        g0 = job["offsets"][d] + l0
        nrm = norms[g0 : g0 + (l1 - l0)]
        x /= np.where(nrm > 0, nrm, 1.0)[:, None]
    if job["method"] in ZSCORE_METHODS:
        mean, scale = stats[d]
        x -= mean[c0:c1]
        x /= scale[c0:c1]
    return x


def gram_tile_task(job: dict, tile: Tile, stats, norms, part: int | None = None) -> dict:
    """Compute Gram tile ``(i, j)`` (or its feature part ``part``) and store it.

    Parameters
    ----------
    job : dict
        ``arrays`` (absolute feature array paths, Gram row order), ``offsets``,
        ``col_blocks``, ``parts``, ``method``, ``gram_path``, ``tiles_dir``,
        ``precision`` (:data:`~mmdtl2_dist.engine.products.PRECISIONS`) and ``device``
        (None: numpy on the CPU; else a torch device,
        :mod:`mmdtl2_dist.engine.products`).
    tile : Tile
        The tile; it owns Gram chunk ``(i, j)`` entirely.
    stats : list of (mean, scale) or None
        Per-device z-score statistics.
    norms : ndarray of shape (n,) or None
        Raw row norms (for L2 methods).
    part : int or None
        None: the whole tile, written to its Gram chunk. Else the part's feature blocks
        only, written to the part's file for :func:`gram_combine_task`.

    Returns
    -------
    dict
        The marker's content; ``timing`` holds the task's phase times
        (:mod:`mmdtl2_dist.engine.timing`).
    """
    timer = PhaseTimer()
    blocks = job["col_blocks"]
    if part is not None:
        blocks = part_blocks(blocks, job["parts"])[part]
    shape = (tile.a1 - tile.a0, tile.b1 - tile.b0)
    product = tile_product(shape, job.get("precision", "float64"), timer, job.get("device"))
    # Fixed block order: the float64 sum has the same bits on any worker, any retry.
    for c0, c1 in blocks:
        A = _preprocessed_rows(job, tile.a0, tile.a1, c0, c1, stats, norms, product, timer)
        if tile.diagonal:
            product.add(A)  # symmetric product (BLAS syrk): half the flops
        else:
            B = _preprocessed_rows(job, tile.b0, tile.b1, c0, c1, stats, norms, product, timer, "b")
            product.add(A, B)
    G = product.result()
    with timer.phase("check"):
        if not product.all_finite():
            _raise_for_bad_inputs(job, tile, blocks)
    if part is None:
        return _store_tile(job, tile, G, timer, product.device)
    return _store_part(job, tile, part, G, timer, product.device)


def _store_tile(job: dict, tile: Tile, G: np.ndarray, timer: PhaseTimer, device, **extra) -> dict:
    """Write tile ``G`` to its Gram chunk, then its marker (what a finished tile is)."""
    with timer.phase("write"):
        crc = write_array_chunk(job["gram_path"], tile.i, tile.j, G)
    with timer.phase("digest"):  # the write's own CRC32C where the chunk is G's bytes
        fields = {
            "tile": tile.key,
            "rows_a": [tile.a0, tile.a1],
            "rows_b": [tile.b0, tile.b1],
            "crc32c": checksum(G) if crc is None else crc,
            **extra,
        }
    return _write_marker(Path(job["tiles_dir"]) / f"{tile.key}.json", fields, timer, device)


def _write_marker(path: Path, fields: dict, timer: PhaseTimer, device) -> dict:
    """A task's marker: ``fields``, its attempt, process, end time and phase times."""
    marker = {**fields, "attempt": uuid.uuid4().hex, "pid": os.getpid(), "finished": time.time()}
    marker["timing"] = timer.record(device)
    marker["seconds"] = marker["timing"]["total"]
    write_json_atomic(path, marker)
    return marker


def part_paths(tiles_dir: str | os.PathLike, tile: Tile, part: int) -> tuple[Path, Path]:
    """The partial tile's file and its marker: ``tiles/parts/<i>_<j>.<k>.npy``, ``.json``."""
    stem = Path(tiles_dir) / PARTS_DIR / f"{tile.key}.{part}"
    return stem.with_name(stem.name + ".npy"), stem.with_name(stem.name + ".json")


def _store_part(job: dict, tile: Tile, part: int, G, timer: PhaseTimer, device) -> dict:
    """Write a partial tile to its file (atomically), then its marker with the file's CRC32C."""
    data, marker_path = part_paths(job["tiles_dir"], tile, part)
    with timer.phase("write"):
        data.parent.mkdir(exist_ok=True)
        with atomic_file(data) as f:
            np.save(f, G, allow_pickle=False)
    with timer.phase("digest"):
        fields = {"tile": tile.key, "part": part, "crc32c": checksum(G)}
    return _write_marker(marker_path, fields, timer, device)


class DamagedPartError(RuntimeError):
    """A partial tile's file is missing or holds other values than its task wrote."""


def load_part(tiles_dir: str | os.PathLike, tile: Tile, part: int, marker: dict) -> np.ndarray:
    """The partial tile ``part`` of ``tile``, checked against the CRC32C in its marker.

    Raises
    ------
    DamagedPartError
        If the marker records no checksum (damaged, or written by a version that
        recorded another), or the file is missing, unreadable (empty included), of
        another shape, or its checksum differs.
    """
    data, _ = part_paths(tiles_dir, tile, part)
    shape = (tile.a1 - tile.a0, tile.b1 - tile.b0)
    if not isinstance(marker, dict) or "crc32c" not in marker:
        raise DamagedPartError(f"the marker of part file {data} records no CRC32C checksum")
    try:
        G = np.load(data, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise DamagedPartError(f"part file {data} cannot be read ({exc})") from None
    if G.shape != shape or G.dtype != np.float64 or checksum(G) != marker.get("crc32c"):
        raise DamagedPartError(
            f"part file {data} holds other values than its task wrote (checksum in its marker)"
        )
    return G


def gram_combine_task(job: dict, tile: Tile, *markers: dict) -> dict:
    """Sum the parts of a split tile in part order; write its chunk and marker as a tile.

    ``markers`` are the parts' markers, in part order (Ray hands over the results of
    the part tasks it waited for). A part whose file does not match its marker is
    removed with its marker and named in the error: the next run recomputes it, and no
    damaged part is ever summed. The part files go once the tile's marker is written;
    a retry that finds the marker (its worker died after writing it) only tidies up.
    """
    done = Path(job["tiles_dir"]) / f"{tile.key}.json"
    if done.exists():
        remove_parts(job["tiles_dir"], tile, len(markers))
        return json.loads(done.read_text())
    timer = PhaseTimer()
    G = None
    for k, marker in enumerate(markers):
        with timer.phase("read"):
            try:
                P = load_part(job["tiles_dir"], tile, k, marker)
            except DamagedPartError as exc:
                remove_parts(job["tiles_dir"], tile, k + 1, only=k)
                raise DamagedPartError(
                    f"Gram tile {tile.key}: {exc}; removed it: run the Gram again to "
                    "recompute that part."
                ) from None
        with timer.phase("product"):
            G = P if G is None else np.add(G, P, out=G)
    parts = [m["attempt"] for m in markers]
    marker = _store_tile(job, tile, G, timer, "numpy", parts=parts)
    remove_parts(job["tiles_dir"], tile, len(markers))
    return marker


def remove_parts(tiles_dir, tile: Tile, parts: int, only: int | None = None) -> None:
    """Remove the part files and markers of ``tile`` (or of part ``only``)."""
    for k in range(parts) if only is None else [only]:
        for path in part_paths(tiles_dir, tile, k):
            path.unlink(missing_ok=True)


def _raise_for_bad_inputs(job: dict, tile: Tile, blocks) -> None:
    """Name the damaged chunks behind a non-finite tile, else say why it overflowed.

    A NaN or inf input reaches every entry of its row of the tile: the tile's rows are
    read again over ``blocks`` (the features the tile or part summed), checked, and a
    damaged chunk raises its located error.
    """
    for start, stop in ((tile.a0, tile.a1), (tile.b0, tile.b1)):
        for d, l0, l1 in row_segments(job["offsets"], start, stop):
            for c0, c1 in blocks:
                read_array_block(job["arrays"][d], l0, l1, c0, c1)
    raise FloatingPointError(
        f"Gram tile {tile.key} is not finite although its inputs are: its products "
        "overflow (features or preprocessing statistics of extreme scale; float32, used "
        "by precision='mixed', overflows above 3.4e38). Rescale the stored features."
    )


def checksum(G: np.ndarray) -> int:
    """CRC32C of a tile's (or a partial tile's) values, recorded in its marker.

    It tells whether the stored chunk or part file still holds what the task wrote (a
    truncated, overwritten or swapped file), at several GB/s: a GPU tile of 16,384 rows
    is 2 GB, which a cryptographic hash (blake2b, under 1 GB/s) would take seconds over.
    """
    return google_crc32c.value(np.ascontiguousarray(G).reshape(-1).view(np.uint8))


def tile_matches(G: np.ndarray, marker: dict) -> bool:
    """Whether ``G`` holds what the marker's task wrote.

    Markers record a CRC32C; a marker that holds a blake2b hash instead is checked
    against it.
    """
    if "crc32c" in marker:
        return checksum(G) == marker["crc32c"]
    digest = hashlib.blake2b(np.ascontiguousarray(G).data, digest_size=16).hexdigest()
    return "blake2b" in marker and digest == marker["blake2b"]
