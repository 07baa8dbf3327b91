"""The per-task work of a Gram job: tiny module-level functions run by Ray workers.

They take absolute paths and ranges (never arrays of features), read the Zarr feature
arrays themselves, and write only Zarr chunks they own (one Gram chunk per tile), then a
completion marker, atomically. They import neither the driver nor Ray.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path

import numpy as np
import zarr

from mmdtl2_dist.engine.plan import Tile, row_segments
from mmdtl2_dist.engine.products import tile_product
from mmdtl2_dist.engine.timing import PhaseTimer
from mmdtl2_dist.store.feature_store import read_array_block

L2_METHODS = ("l2", "l2_zscore")
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
    """Rows ``[start, stop)``, features ``[c0, c1)``, preprocessed, in the product's dtype.

    Preprocessing is computed in float64; without preprocessing the stored values go to
    the product as they are (float32 features stay float32 in mixed precision and on
    torch devices, which convert them themselves).
    """
    parts = []
    for d, l0, l1 in row_segments(job["offsets"], start, stop):
        with timer.phase("read"):
            x = read_array_block(job["arrays"][d], l0, l1, c0, c1, check_finite=False)
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


def gram_tile_task(job: dict, tile: Tile, stats, norms) -> dict:
    """Compute Gram tile ``(i, j)``, write its chunk, then its marker.

    Parameters
    ----------
    job : dict
        ``arrays`` (absolute feature array paths, Gram row order), ``offsets``,
        ``col_blocks``, ``method``, ``gram_path``, ``tiles_dir``, ``precision``
        (:data:`~mmdtl2_dist.engine.products.PRECISIONS`) and ``device`` (None: numpy on
        the CPU; else a torch device, :mod:`mmdtl2_dist.engine.products`).
    tile : Tile
        The tile; it owns Gram chunk ``(i, j)`` entirely.
    stats : list of (mean, scale) or None
        Per-device z-score statistics.
    norms : ndarray of shape (n,) or None
        Raw row norms (for L2 methods).

    Returns
    -------
    dict
        The marker's content; ``timing`` holds the task's phase times
        (:mod:`mmdtl2_dist.engine.timing`).
    """
    timer = PhaseTimer()
    shape = (tile.a1 - tile.a0, tile.b1 - tile.b0)
    product = tile_product(shape, job.get("precision", "float64"), timer, job.get("device"))
    # Fixed block order: the float64 sum has the same bits on any worker, any retry.
    for c0, c1 in job["col_blocks"]:
        A = _preprocessed_rows(job, tile.a0, tile.a1, c0, c1, stats, norms, product, timer)
        if tile.diagonal:
            product.add(A)  # symmetric product (BLAS syrk): half the flops
        else:
            B = _preprocessed_rows(job, tile.b0, tile.b1, c0, c1, stats, norms, product, timer, "b")
            product.add(A, B)
    G = product.result()
    with timer.phase("check"):
        if not np.isfinite(G).all():
            _raise_for_bad_inputs(job, tile)
    with timer.phase("write"):
        gram = zarr.open_array(job["gram_path"], mode="r+")
        gram[tile.a0 : tile.a1, tile.b0 : tile.b1] = G
    with timer.phase("digest"):
        marker = {
            "tile": tile.key,
            "rows_a": [tile.a0, tile.a1],
            "rows_b": [tile.b0, tile.b1],
            "blake2b": tile_digest(G),
            "attempt": uuid.uuid4().hex,
            "pid": os.getpid(),
            "finished": time.time(),
        }
    marker["timing"] = timer.record(product.device)
    marker["seconds"] = marker["timing"]["total"]
    write_json_atomic(Path(job["tiles_dir"]) / f"{tile.key}.json", marker)
    return marker


def _raise_for_bad_inputs(job: dict, tile: Tile) -> None:
    """Name the damaged chunks behind a non-finite tile, else say why it overflowed.

    A NaN or inf input reaches every entry of its row of the tile: the tile's rows are
    read again, checked, and a damaged chunk raises its located error.
    """
    for start, stop in ((tile.a0, tile.a1), (tile.b0, tile.b1)):
        for d, l0, l1 in row_segments(job["offsets"], start, stop):
            for c0, c1 in job["col_blocks"]:
                read_array_block(job["arrays"][d], l0, l1, c0, c1)
    raise FloatingPointError(
        f"Gram tile {tile.key} is not finite although its inputs are: its products "
        "overflow (features or preprocessing statistics of extreme scale; float32, used "
        "by precision='mixed', overflows above 3.4e38). Rescale the stored features."
    )


def tile_digest(G: np.ndarray) -> str:
    """Hash of a tile's values, recorded in its marker to verify its chunk later."""
    return hashlib.blake2b(np.ascontiguousarray(G).tobytes(), digest_size=16).hexdigest()


def write_json_atomic(path: Path, content: dict) -> None:
    """Write JSON so that readers see the old file or the whole new one, never a part."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(content))
    os.replace(tmp, path)
