"""Reading blocks of a stored array straight from its chunk files, in one or many threads.

The store writes its arrays in one layout (Zarr v3, a regular chunk grid, chunk files
``c/<i>/<j>`` holding the chunk's little-endian bytes followed by their CRC32C): that
of ``FeatureStore(compression="none")``, the default, and of the Gram engine's output.
A block of such an array is its chunks' bytes, checked against their CRC32C and copied
into place; :func:`read_block` does that with a plain file read per chunk, without
going through zarr, whose synchronous reads of a process all run on one event-loop
thread. One thread reads about 1.5 times as fast as zarr, and threads given in ``pool``
read the chunks of one block at once: a GPU's tiles need the features faster than one
core delivers them (BENCHMARKS.md, "The Gram engine on a GPU").

:func:`chunk_layout` recognises the layout from the array's ``zarr.json`` and returns
None for anything else (compressed chunks, another key encoding or byte order), which
zarr then reads. Every chunk is read whole, and a missing, short, long or miscounted
chunk file raises :class:`~mmdtl2_dist.store.blocks.CorruptChunkError` naming it; zarr
would read a missing chunk as the fill value instead, NaN for feature arrays.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import google_crc32c
import numpy as np

_CRC_BYTES = 4
_LAYOUTS: dict[tuple, ChunkLayout | None] = {}
_SCRATCH = threading.local()


@dataclass(frozen=True)
class ChunkLayout:
    """Where the chunks of a plain-layout array are and what they hold."""

    root: Path
    shape: tuple[int, int]
    chunks: tuple[int, int]
    dtype: np.dtype
    fill_value: float = float("nan")

    @property
    def chunk_bytes(self) -> int:
        return self.chunks[0] * self.chunks[1] * self.dtype.itemsize

    def chunk_path(self, i: int, j: int) -> Path:
        return self.root / "c" / str(i) / str(j)


def chunk_layout(array_path: str) -> ChunkLayout | None:
    """The array's layout if its chunks can be read directly, else None.

    Cached per path and version of its ``zarr.json``: an array written anew at the same
    path (a store replaced with ``--overwrite``) is looked at again.
    """
    root = Path(array_path)
    try:
        st = (root / "zarr.json").stat()
    except OSError:
        return None
    key = (str(root), st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _LAYOUTS:
        if len(_LAYOUTS) > 256:
            _LAYOUTS.clear()
        _LAYOUTS[key] = _read_layout(root)
    return _LAYOUTS[key]


def _read_layout(root: Path) -> ChunkLayout | None:
    try:
        meta = json.loads((root / "zarr.json").read_text())
    except (OSError, ValueError):
        return None
    codecs = meta.get("codecs", [])
    plain = (
        meta.get("zarr_format") == 3
        and meta.get("chunk_grid", {}).get("name") == "regular"
        and meta.get("chunk_key_encoding")
        == {"name": "default", "configuration": {"separator": "/"}}
        and [c.get("name") for c in codecs] == ["bytes", "crc32c"]
        and codecs[0].get("configuration", {}).get("endian") == "little"
        and meta.get("data_type") in ("float32", "float64")
        and len(meta.get("shape", ())) == 2
        and not meta.get("storage_transformers")
    )
    if not plain:
        return None
    chunks = meta["chunk_grid"]["configuration"]["chunk_shape"]
    fill = meta.get("fill_value", 0.0)
    return ChunkLayout(
        root,
        tuple(meta["shape"]),
        tuple(chunks),
        np.dtype(meta["data_type"]),
        float(fill) if isinstance(fill, (int, float, str)) else float("nan"),
    )


def read_block(
    layout: ChunkLayout,
    r0: int,
    r1: int,
    c0: int,
    c1: int,
    out: np.ndarray,
    pool: Executor | None = None,
) -> np.ndarray:
    """Fill ``out`` with ``array[r0:r1, c0:c1]``, chunk by chunk (in ``pool``'s threads).

    Raises CorruptChunkError naming every chunk of the block that is missing, of the
    wrong size or fails its CRC32C.
    """
    cr, cc = layout.chunks
    pieces = [
        (i, j)
        for i in range(r0 // cr, (r1 - 1) // cr + 1)
        for j in range(c0 // cc, (c1 - 1) // cc + 1)
    ]

    def copy_chunk(ij: tuple[int, int]) -> str | None:
        i, j = ij
        chunk, problem = _checked_chunk(layout, i, j)
        if problem is None:
            rows = slice(max(r0, i * cr), min(r1, (i + 1) * cr))
            cols = slice(max(c0, j * cc), min(c1, (j + 1) * cc))
            out[rows.start - r0 : rows.stop - r0, cols.start - c0 : cols.stop - c0] = chunk[
                rows.start - i * cr : rows.stop - i * cr, cols.start - j * cc : cols.stop - j * cc
            ]
        return problem

    problems = list(pool.map(copy_chunk, pieces) if pool else map(copy_chunk, pieces))
    bad = [ij for ij, p in zip(pieces, problems, strict=True) if p is not None]
    if bad:
        from mmdtl2_dist.store.blocks import CorruptChunkError

        reasons = "; ".join(sorted({p for p in problems if p is not None}))
        raise CorruptChunkError(str(layout.root), bad, reasons)
    return out


def _checked_chunk(layout: ChunkLayout, i: int, j: int) -> tuple[np.ndarray | None, str | None]:
    """Chunk ``(i, j)`` as a view of this thread's scratch buffer, or what is wrong with it."""
    size = layout.chunk_bytes + _CRC_BYTES
    scratch = getattr(_SCRATCH, "buf", None)
    if scratch is None or scratch.size < size + 1:
        scratch = _SCRATCH.buf = np.empty(size + 1, dtype=np.uint8)
    try:
        with open(layout.chunk_path(i, j), "rb", buffering=0) as f:
            got = _read_into(f, scratch[: size + 1])
    except FileNotFoundError:
        return None, "are missing"
    except OSError as exc:
        return None, f"could not be read ({exc.strerror or exc})"
    if got != size:
        return None, f"have the wrong size ({got} bytes where {size} are stored)"
    data = scratch[: layout.chunk_bytes]
    stored = int.from_bytes(scratch[layout.chunk_bytes : size].tobytes(), "little")
    if google_crc32c.value(data) != stored:
        return None, "failed their CRC32C checksum"
    return data.view(layout.dtype).reshape(layout.chunks), None


def _read_into(f, buf: np.ndarray) -> int:
    """Read ``f`` into ``buf`` until it is full or the file ends; the bytes read."""
    view, got = memoryview(buf), 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def write_chunk(layout: ChunkLayout, i: int, j: int, values: np.ndarray) -> None:
    """Write chunk ``(i, j)`` whole, atomically: its bytes, then their CRC32C.

    The file is written under a temporary name, then renamed into place: readers see
    the old chunk or the new one, never a part.
    ``values`` is the chunk's part inside the array; an edge chunk is stored at the full
    chunk shape, the rest filled with the array's fill value, as zarr stores it. One
    file write of the array's own memory: zarr's write of a 512 MB chunk takes about ten
    times as long (it copies the chunk several times on one thread).
    """
    if values.shape != layout.chunks:
        full = np.full(layout.chunks, layout.fill_value, dtype=layout.dtype)
        full[: values.shape[0], : values.shape[1]] = values
        values = full
    data = np.ascontiguousarray(values, dtype=layout.dtype).reshape(-1).view(np.uint8)
    path = layout.chunk_path(i, j)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(memoryview(data))
            f.write(google_crc32c.value(data).to_bytes(_CRC_BYTES, "little"))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
