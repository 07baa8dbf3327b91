"""On-disk layout of a feature store and the pure choices about it (chunk shapes, names).

A feature store is a directory::

    STORE/
      zarr.json                    root Zarr group; attribute ``mmdtl2_feature_store``
      features/<device>/<space>/   one 2-D Zarr array per device and feature space,
                                   rows = samples, columns = features
      metadata.parquet             one row per (device, space, row)

Feature arrays are chunked for row-tile reads: a chunk holds ``chunk_rows`` whole-ish
rows and a column block of about :data:`TARGET_CHUNK_COLS` features (so that the Gram
engine can stream column blocks of a row tile with bounded memory), is at least
:data:`MIN_CHUNK_BYTES` when the array is that large, and carries a CRC32C checksum.
Missing chunks read as NaN (the fill value); since ingest refuses NaN, a NaN read back
always means a lost chunk.
"""

from __future__ import annotations

import math
import re

FORMAT_VERSION = 1
ROOT_ATTR = "mmdtl2_feature_store"
METADATA_FILE = "metadata.parquet"
#: Files a writer may add at a store's top level (``StoreWriter.add_file``): the images
#: ``mmdtl2 extract --skip-bad`` left out.
SIDE_FILES = ("skipped_images.csv",)
FEATURES_GROUP = "features"
METADATA_COLUMNS = ("device", "space", "row", "label", "class_name", "group", "sample_id")

MIN_CHUNK_BYTES = 1 << 20
TARGET_CHUNK_COLS = 4096
DEFAULT_CHUNK_ROWS = 256

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def is_name(name) -> bool:
    """Whether ``name`` can be a device or space name (it becomes a path component)."""
    return isinstance(name, str) and _NAME.match(name) is not None


def check_name(kind: str, name: str) -> str:
    """Validate a device or space name (it becomes a path component)."""
    if not is_name(name):
        raise ValueError(
            f"{kind} name {name!r} is not allowed; use letters, digits, '_', '.', '-' "
            "(starting with a letter or digit), e.g. 'olympus_nbi' or 'conv3'."
        )
    return name


def array_key(device: str, space: str) -> str:
    """Path of a feature array inside the store."""
    return f"{FEATURES_GROUP}/{device}/{space}"


def choose_chunks(
    n_rows: int, n_features: int, itemsize: int, chunk_rows: int | None = None
) -> tuple[int, int]:
    """Chunk shape ``(rows, cols)`` of a feature array.

    Columns are split into ``ceil(L / 4096)`` near-equal blocks (64,896 -> 16 blocks of
    4,056, which divides it exactly); rows default to 256 and grow until a chunk holds at
    least 1 MiB. Both are clipped to the array shape.

    Parameters
    ----------
    n_rows, n_features : int
        Array shape.
    itemsize : int
        Bytes per element.
    chunk_rows : int, optional
        Rows per chunk; default chosen as above.
    """
    if n_rows < 1 or n_features < 1:
        raise ValueError(
            f"a feature array needs at least one row and one column, got ({n_rows}, {n_features})."
        )
    n_col_blocks = max(1, math.ceil(n_features / TARGET_CHUNK_COLS))
    cols = math.ceil(n_features / n_col_blocks)
    if chunk_rows is None:
        chunk_rows = max(DEFAULT_CHUNK_ROWS, math.ceil(MIN_CHUNK_BYTES / (cols * itemsize)))
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be positive, got {chunk_rows}.")
    return min(chunk_rows, n_rows), cols
