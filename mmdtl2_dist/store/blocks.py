"""Reading blocks of a stored feature array, and naming the chunks that are damaged.

:func:`read_array_block` is the small, picklable reader that
:class:`~mmdtl2_dist.store.feature_store.FeatureStore` and the Gram engine's tasks use; a
damaged or missing chunk raises :class:`CorruptChunkError` naming the chunks.
"""

from __future__ import annotations

from concurrent.futures import Executor

import numpy as np
import zarr
from zarr.core.buffer import default_buffer_prototype

from mmdtl2_dist.store.chunk_files import chunk_layout, read_block, write_chunk
from mmdtl2_dist.store.errors import CorruptChunkError


def _chunk_grid(shape, chunks, r0, r1, c0, c1) -> list[tuple[int, int]]:
    rs = range(r0 // chunks[0], (max(r1, r0 + 1) - 1) // chunks[0] + 1)
    cs = range(c0 // chunks[1], (max(c1, c0 + 1) - 1) // chunks[1] + 1)
    return [(i, j) for i in rs for j in cs]


def _locate_bad_chunks(arr, r0: int, r1: int, c0: int, c1: int) -> tuple[list, str]:
    """Read a region chunk by chunk to name the chunks that fail or read as missing."""
    bad, reasons = [], set()
    cr, cc = arr.chunks
    for i, j in _chunk_grid(arr.shape, arr.chunks, r0, r1, c0, c1):
        sl = (
            slice(i * cr, min((i + 1) * cr, arr.shape[0])),
            slice(j * cc, min((j + 1) * cc, arr.shape[1])),
        )
        try:
            block = arr[sl]
        except Exception as exc:  # noqa: BLE001 - any decode failure is corruption here
            bad.append((i, j))
            reasons.add(f"failed to decode ({type(exc).__name__}: {exc})")
            continue
        if np.issubdtype(block.dtype, np.floating) and np.isnan(block).all():
            bad.append((i, j))
            reasons.add("are missing (read back as the NaN fill value)")
    return bad, "; ".join(sorted(reasons)) or "could not be read"


_OPEN_ARRAYS: dict[str, zarr.Array] = {}


def _open_cached(array_path: str) -> zarr.Array:
    arr = _OPEN_ARRAYS.get(array_path)
    if arr is None:
        arr = zarr.open_array(array_path, mode="r")
        if len(_OPEN_ARRAYS) > 64:
            _OPEN_ARRAYS.clear()
        _OPEN_ARRAYS[array_path] = arr
    return arr


def array_dtype(array_path: str) -> np.dtype:
    """The stored dtype of a feature array."""
    return _open_cached(array_path).dtype


def read_array_block(
    array_path: str,
    r0: int,
    r1: int,
    c0: int,
    c1: int,
    *,
    check_finite: bool = True,
    out: np.ndarray | None = None,
    pool: Executor | None = None,
) -> np.ndarray:
    """Read ``array[r0:r1, c0:c1]`` of a feature array, refusing damaged data.

    Arrays in the store's plain layout (uncompressed chunks with a CRC32C) are read
    straight from their chunk files (:mod:`mmdtl2_dist.store.chunk_files`), others by
    zarr; the values are the same.

    Parameters
    ----------
    array_path : str
        Absolute path of the Zarr array (as given by :meth:`FeatureStore.array_path`).
    r0, r1, c0, c1 : int
        Row and column range.
    check_finite : bool
        Refuse non-finite values (NaN is the fill value of a lost chunk). A caller that
        checks its results instead (a NaN reaches every product it enters) passes False
        and saves a pass over the data, then reads again with the check to name the
        damaged chunks.
    out : ndarray, optional
        A C-ordered array of the block's shape and the stored dtype to read into (a
        caller reading block after block reuses one: a fresh block of tens of MB is
        mapped and faulted in page by page, which costs as much as decoding it).
    pool : Executor, optional
        Threads that read the block's chunks at once (plain layout only).

    Returns
    -------
    ndarray of shape (r1 - r0, c1 - c0)
        The stored values, in the stored dtype.

    Raises
    ------
    CorruptChunkError
        If a chunk fails its checksum, cannot be decoded, or is missing.
    """
    layout = chunk_layout(array_path)
    if layout is not None and r1 > r0 and c1 > c0:
        if out is None:
            out = np.empty((r1 - r0, c1 - c0), dtype=layout.dtype)
        block = read_block(layout, r0, r1, c0, c1, out, pool)
    else:
        block = _read_with_zarr(array_path, r0, r1, c0, c1, out)
    # Ingest refuses NaN and NaN is the fill value: a NaN here is a lost chunk.
    if check_finite and block.size and not np.isfinite(block).all():
        bad, reason = _locate_bad_chunks(_open_cached(array_path), r0, r1, c0, c1)
        raise CorruptChunkError(array_path, bad or [("?",)], reason or "hold non-finite values")
    return block


def write_array_chunk(array_path: str, i: int, j: int, values: np.ndarray) -> int | None:
    """Write chunk ``(i, j)`` of a 2-d array whole (``values``: its part inside the array).

    Plain-layout arrays are written straight to the chunk's file, atomically
    (:func:`~mmdtl2_dist.store.chunk_files.write_chunk`), which returns the CRC32C of
    ``values`` where the stored bytes are theirs; others go through zarr (None).
    """
    layout = chunk_layout(array_path)
    if layout is not None:
        return write_chunk(layout, i, j, values)
    arr = zarr.open_array(array_path, mode="r+")
    r0, c0 = i * arr.chunks[0], j * arr.chunks[1]
    arr[r0 : r0 + values.shape[0], c0 : c0 + values.shape[1]] = values
    return None


def _read_with_zarr(array_path: str, r0, r1, c0, c1, out: np.ndarray | None) -> np.ndarray:
    arr = _open_cached(array_path)
    try:
        if out is None:
            return arr[r0:r1, c0:c1]
        nd = default_buffer_prototype().nd_buffer.from_numpy_array(out)
        arr.get_basic_selection((slice(r0, r1), slice(c0, c1)), out=nd)
        return out
    except Exception as exc:  # noqa: BLE001 - translated into a located error below
        bad, reason = _locate_bad_chunks(arr, r0, r1, c0, c1)
        raise CorruptChunkError(array_path, bad or [("?",)], reason) from exc
