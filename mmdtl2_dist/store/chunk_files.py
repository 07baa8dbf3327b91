"""Reading blocks of a stored array straight from its chunk files, in one or many threads.

The store writes its arrays in one layout (Zarr v3, a regular chunk grid, chunk files
``c/<i>/<j>`` holding the chunk's little-endian bytes followed by their CRC32C): that
of ``FeatureStore(compression="none")``, the default, and of the Gram engine's output.
A block of such an array is its chunks' bytes, checked against their CRC32C and copied
into place; :func:`read_block` does that with a plain file read per chunk, without
going through zarr, whose synchronous reads of a process all run on one event-loop
thread. One thread reads about 1.5 times as fast as zarr, and threads given in ``pool``
read the chunks of one block at once: a GPU's tiles need the features faster than one
core delivers them (BENCHMARKS.md, "Direct chunk reads and writes, and the engine on a
GPU"). The CRC32C (``google_crc32c``) holds the GIL, so threads overlap the file reads
and copies, not the checksums: about 8 GB/s in all on one core's checksums.

:func:`chunk_layout` recognises the layout from the array's ``zarr.json`` and returns
None for anything else (compressed chunks, another key encoding or byte order), which
zarr then reads. Every chunk is read whole, and a missing, short, long or miscounted
chunk file raises :class:`~mmdtl2_dist.store.errors.CorruptChunkError` naming it. Zarr
reads a missing chunk as the fill value instead (it writes no chunk that is all fill
value): the store's arrays have NaN as fill value, which ingest refuses in features and
no Gram holds, so every chunk of theirs is written. :func:`write_chunk` writes a whole
chunk straight to its file.
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import google_crc32c
import numpy as np

from mmdtl2_dist.store.atomic import atomic_file, remove_temporaries
from mmdtl2_dist.store.errors import CorruptChunkError

_CRC_BYTES = 4
_LAYOUTS: dict[tuple, ChunkLayout | None] = {}
_UNKNOWN = object()
#: The stored types this reader takes, little-endian as the layout stores them.
_DTYPES = {"float32": np.dtype("<f4"), "float64": np.dtype("<f8")}
_SCRATCH = threading.local()
#: Largest chunk a reading thread keeps a scratch buffer for (see :func:`_checked_chunk`).
KEPT_SCRATCH = 64 << 20


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

    Cached per path and content of its ``zarr.json`` (half a kilobyte, read on every
    call): an array written anew at the same path, a store replaced with
    ``--overwrite`` say, is looked at again whatever the file system's timestamps.
    """
    root = Path(array_path)
    try:
        raw = (root / "zarr.json").read_bytes()
    except OSError:
        return None
    key = (str(root), raw)
    layout = _LAYOUTS.get(key, _UNKNOWN)
    if layout is _UNKNOWN:
        if len(_LAYOUTS) > 256:
            _LAYOUTS.clear()
        layout = _LAYOUTS[key] = _parse_layout(root, raw)
    return layout


def _parse_layout(root: Path, raw: bytes) -> ChunkLayout | None:
    try:
        meta = json.loads(raw)
    except ValueError:
        return None
    codecs = meta.get("codecs", [])
    plain = (
        meta.get("zarr_format") == 3
        and meta.get("chunk_grid", {}).get("name") == "regular"
        and meta.get("chunk_key_encoding")
        == {"name": "default", "configuration": {"separator": "/"}}
        and [c.get("name") for c in codecs] == ["bytes", "crc32c"]
        and codecs[0].get("configuration", {}).get("endian") == "little"
        and meta.get("data_type") in _DTYPES
        and len(meta.get("shape", ())) == 2
        and not meta.get("storage_transformers")
    )
    if not plain:
        return None
    try:
        fill = float(meta.get("fill_value", 0.0))
    except (TypeError, ValueError):  # a fill value written as bytes: leave it to zarr
        return None
    chunks = meta["chunk_grid"]["configuration"]["chunk_shape"]
    return ChunkLayout(root, tuple(meta["shape"]), tuple(chunks), _DTYPES[meta["data_type"]], fill)


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

    Raises
    ------
    IndexError
        If the block lies outside the array, or ``out`` has another shape.
    CorruptChunkError
        Naming every chunk of the block that is missing, of the wrong size or fails its
        CRC32C, and what is wrong with each.
    """
    n, m = layout.shape
    if not (0 <= r0 < r1 <= n and 0 <= c0 < c1 <= m) or out.shape != (r1 - r0, c1 - c0):
        raise IndexError(
            f"rows [{r0}, {r1}) x columns [{c0}, {c1}) into an array of shape {out.shape}: "
            f"{layout.root} has shape {layout.shape}; ask for a block inside it, into an "
            "array of the block's shape."
        )
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
    bad = {ij: p for ij, p in zip(pieces, problems, strict=True) if p is not None}
    if bad:
        raise CorruptChunkError(str(layout.root), list(bad), _reasons(bad))
    return out


def _reasons(bad: dict[tuple[int, int], str]) -> str:
    """What is wrong with the bad chunks; with several kinds of damage, which has which."""
    kinds = sorted(set(bad.values()))
    if len(kinds) == 1:
        return kinds[0]
    return "are damaged: " + "; ".join(
        f"{', '.join(str(ij) for ij, p in bad.items() if p == kind)} {kind}" for kind in kinds
    )


def _checked_chunk(layout: ChunkLayout, i: int, j: int) -> tuple[np.ndarray | None, str | None]:
    """Chunk ``(i, j)`` as a view of a scratch buffer, or what is wrong with it.

    Each thread keeps a scratch buffer for chunks up to :data:`KEPT_SCRATCH` bytes (a
    feature chunk is about 4 MB); a larger one (a GPU Gram's chunk is up to 2 GB) is
    read into a buffer of its own, freed with the block.

    A chunk file that exists but cannot be read (its permissions, the disk) raises
    OSError naming it: that is not damage that re-ingesting would mend.
    """
    size = layout.chunk_bytes + _CRC_BYTES
    scratch = getattr(_SCRATCH, "buf", None)
    if size > KEPT_SCRATCH:
        scratch = np.empty(size, dtype=np.uint8)
    elif scratch is None or scratch.size < size:
        scratch = _SCRATCH.buf = np.empty(size, dtype=np.uint8)
    path = layout.chunk_path(i, j)
    try:
        with open(path, "rb", buffering=0) as f:
            stored = os.fstat(f.fileno()).st_size
            got = _read_into(f, scratch[:size]) if stored == size else stored
    except FileNotFoundError:
        return None, "are missing"
    except OSError as exc:
        raise OSError(
            exc.errno, f"cannot read the chunk file {path} ({exc.strerror}); check its "
            "permissions and the disk it is on"
        ) from None  # fmt: skip
    if got != size:
        return None, f"have the wrong size ({got} bytes where {size} are expected)"
    data = scratch[: layout.chunk_bytes]
    if google_crc32c.value(data) != int.from_bytes(scratch[layout.chunk_bytes : size], "little"):
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


def write_chunk(layout: ChunkLayout, i: int, j: int, values: np.ndarray) -> int | None:
    """Write chunk ``(i, j)`` whole, atomically: its bytes, then their CRC32C.

    Returns that CRC32C when the chunk's bytes are ``values``' own (a chunk wholly inside
    the array, of the array's dtype: the CRC32C of ``values`` as a caller records it),
    else None (an edge chunk's padding, or a cast, is in the stored bytes).

    The file is written under a temporary name, then renamed into place: readers see
    the old chunk or the new one, never a part.
    ``values`` is the chunk's part inside the array; an edge chunk is stored at the full
    chunk shape, the rest filled with the array's fill value, as zarr stores it. One
    file write of the array's own memory: zarr's write of a 512 MB chunk takes about ten
    times as long (it copies the chunk several times on one thread).
    """
    grid = zip(layout.chunks, layout.shape, (i, j), strict=True)
    inside = tuple(max(0, min(c, s - k * c)) if k >= 0 else 0 for c, s, k in grid)
    if min(inside) <= 0 or values.shape != inside:
        raise ValueError(
            f"chunk ({i}, {j}) of {layout.root} (shape {layout.shape}, chunks "
            f"{layout.chunks}) holds {inside} values inside the array, got {values.shape}; "
            "pass a chunk of the array's grid and its part inside the array."
        )
    own = values.shape == layout.chunks and values.dtype == layout.dtype
    if values.shape != layout.chunks:
        full = np.full(layout.chunks, layout.fill_value, dtype=layout.dtype)
        full[: values.shape[0], : values.shape[1]] = values
        values = full
    data = np.ascontiguousarray(values, dtype=layout.dtype).reshape(-1).view(np.uint8)
    path = layout.chunk_path(i, j)
    path.parent.mkdir(parents=True, exist_ok=True)
    crc = google_crc32c.value(data)
    with atomic_file(path) as f:
        f.write(memoryview(data))
        f.write(crc.to_bytes(_CRC_BYTES, "little"))
    return crc if own else None


def remove_stray_writes(array_path: str) -> list[Path]:
    """Remove the temporary chunk files that writes stopped before their rename left.

    Only files named as :func:`write_chunk` names them (``c/<i>/.<j>.<8 hex>.tmp``) are
    touched. Returns what was removed.
    """
    return remove_temporaries(array_path, "c/*/.*.tmp")
