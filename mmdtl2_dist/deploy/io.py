"""Batch inputs and outputs of ``mmdtl2 predict``.

Inputs (raw target-device features, one row per sample):

- ``.npy``: a 2-D numeric array (a 1-D one is one sample; memory-mapped, read in batches;
  ``allow_pickle=False``);
- ``.parquet``: either one list-valued column ``features`` or numeric feature columns;
  the other (non-numeric) columns, e.g. ``sample_id``, are copied to the output;
- Zarr: a feature store of this project (the rows of one device in one space; the output
  gets ``device``, ``row`` and ``sample_id``), or a plain 2-D Zarr array.

Outputs: ``.parquet`` or ``.csv`` (by extension), or CSV on stdout. A missing folder of
the output is created. An existing output is replaced only when asked (``overwrite``) and
only when it is a predictions file this system wrote (its columns: ``row``, ``class``,
``label``, ``score_<class>``); any other file or directory there is refused
(:func:`~mmdtl2_dist.store.outputs.claim_output`). The file is written under a temporary
name and renamed when complete.
"""

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from mmdtl2_dist.store.outputs import OutputKind, StagedOutput, claim_output

OUTPUT_SUFFIXES = (".parquet", ".csv")


@dataclass
class Batch:
    """Features of consecutive samples and the columns that identify them.

    ``not_numbers``: columns of a one-column-per-feature table left out of the features
    because they do not hold numbers (copied to the output with the identifiers).
    """

    X: np.ndarray
    ids: pd.DataFrame
    not_numbers: tuple[str, ...] = ()


def _is_zarr(path: Path) -> bool:
    return path.is_dir() and any((path / f).exists() for f in ("zarr.json", ".zarray", ".zgroup"))


def iter_batches(
    path: str | Path,
    batch_size: int = 4096,
    *,
    device: str | None = None,
    space: str | None = None,
) -> Iterator[Batch]:
    """Read ``path`` in batches of ``batch_size`` rows (see the module docstring).

    Parameters
    ----------
    device, space : str, optional
        For a feature store: which device's features in which space.
    """
    path = Path(path)
    if batch_size < 1:
        raise ValueError(f"batch size must be positive, got {batch_size}.")
    if not path.exists():
        raise FileNotFoundError(f"input {str(path)!r} does not exist.")
    if path.suffix == ".npy":
        yield from _npy(path, batch_size)
    elif path.suffix == ".parquet":
        yield from _parquet(path, batch_size)
    elif _is_zarr(path):
        yield from _zarr(path, batch_size, device, space)
    else:
        raise ValueError(
            f"cannot read {str(path)!r}: give a .npy file, a .parquet file or a Zarr store "
            "(a feature store or a 2-D array)."
        )


def _npy(path: Path, batch_size: int) -> Iterator[Batch]:
    try:
        X = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise ValueError(f"{path} is not a plain numeric .npy array ({exc}).") from exc
    X = _check_2d(X, path)
    for r0 in range(0, X.shape[0], batch_size):
        r1 = min(r0 + batch_size, X.shape[0])
        yield Batch(np.asarray(X[r0:r1], dtype=np.float64), pd.DataFrame({"row": range(r0, r1)}))


def _check_2d(X, path) -> object:
    if X.ndim == 1:
        X = X.reshape(1, -1)  # a single sample
    if X.ndim != 2:
        raise ValueError(
            f"{path} holds an array of shape {X.shape}; expected (n_samples, n_features)."
        )
    if not np.issubdtype(X.dtype, np.number):
        raise ValueError(f"{path} holds {X.dtype} values; expected numbers.")
    return X


def _feature_lists(rows: list, path: Path, start: int) -> np.ndarray:
    """The rows of a list column ``features`` as a float64 array; refuse unequal lengths."""
    missing = next((i for i, r in enumerate(rows) if r is None), None)
    if missing is not None:
        raise ValueError(f"{path}: row {start + missing} has no 'features' (null).")
    lengths = {len(r) for r in rows}
    if len(lengths) > 1:
        first = next(i for i, r in enumerate(rows) if len(r) != len(rows[0]))
        raise ValueError(
            f"{path}: the 'features' lists have different lengths ({sorted(lengths)[:5]}), "
            f"first at row {start + first}; every sample needs the same features."
        )
    return np.asarray(rows, dtype=np.float64)


def _parquet(path: Path, batch_size: int) -> Iterator[Batch]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    schema = pf.schema_arrow
    ftype = schema.field("features").type if "features" in schema.names else None
    if ftype is not None and (
        pa.types.is_list(ftype)
        or pa.types.is_large_list(ftype)
        or pa.types.is_fixed_size_list(ftype)
    ):
        feature_cols = ["features"]
    else:
        feature_cols = [
            f.name for f in schema if pa.types.is_floating(f.type) or pa.types.is_integer(f.type)
        ]
        if not feature_cols:
            raise ValueError(
                f"{path} has no numeric columns and no list column 'features'; write one "
                "column per feature or a list column named 'features'."
            )
    id_cols = [n for n in schema.names if n not in feature_cols]
    not_numbers = () if feature_cols == ["features"] else tuple(id_cols)
    start = 0
    for rb in pf.iter_batches(batch_size=batch_size):
        if feature_cols == ["features"]:
            X = _feature_lists(rb.column("features").to_pylist(), path, start)
        else:
            X = np.column_stack(
                [rb.column(c).to_numpy(zero_copy_only=False) for c in feature_cols]
            ).astype(np.float64)
        ids = rb.select(id_cols).to_pandas() if id_cols else pd.DataFrame(index=range(rb.num_rows))
        ids.insert(0, "row", np.arange(start, start + rb.num_rows))
        start += rb.num_rows
        yield Batch(X, ids.reset_index(drop=True), not_numbers)


def _zarr(path: Path, batch_size: int, device, space) -> Iterator[Batch]:
    from mmdtl2_dist.store.feature_store import FeatureStore

    try:
        fs = FeatureStore.open(path)
    except ValueError:
        fs = None
    if fs is None:
        import zarr

        try:
            arr = zarr.open_array(str(path), mode="r")
        except Exception as exc:  # noqa: BLE001 - zarr raises several types here
            raise ValueError(
                f"{path} is neither a feature store nor a 2-D Zarr array ({exc})."
            ) from exc
        arr = _check_2d(arr if arr.ndim == 2 else np.asarray(arr), path)
        for r0 in range(0, arr.shape[0], batch_size):
            r1 = min(r0 + batch_size, arr.shape[0])
            yield Batch(
                np.asarray(arr[r0:r1], dtype=np.float64), pd.DataFrame({"row": range(r0, r1)})
            )
        return
    if space is None or space not in fs.spaces:
        if len(fs.spaces) != 1:
            raise ValueError(
                f"the feature store has spaces {fs.spaces}; choose one with --space "
                f"(the model expects {space!r})."
            )
        space = fs.spaces[0]
    devices = fs.devices_in(space)
    if device is None or device not in devices:
        if len(devices) != 1:
            raise ValueError(
                f"the feature store has devices {devices} in {space!r}; choose one with --device."
            )
        device = devices[0]
    n, _ = fs.shape(device, space)
    meta = fs.metadata
    m = meta[(meta.device == device) & (meta.space == space)].sort_values("row")
    sample_ids = m["sample_id"].to_numpy(object)
    for r0 in range(0, n, batch_size):
        r1 = min(r0 + batch_size, n)
        ids = pd.DataFrame(
            {"device": device, "row": np.arange(r0, r1), "sample_id": sample_ids[r0:r1]}
        )
        yield Batch(fs.read(device, space, slice(r0, r1)).astype(np.float64), ids)


def _columns_of(path: Path) -> list[str]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.ParquetFile(path).schema_arrow.names)
    with open(path, newline="") as fh:
        return next(csv.reader(fh), [])


def _is_predictions_file(path: Path) -> bool:
    """A ``.parquet`` / ``.csv`` file with the columns ``mmdtl2 predict`` writes."""
    if not path.is_file() or path.suffix not in OUTPUT_SUFFIXES:
        return False
    try:
        cols = _columns_of(path)
    except Exception:  # noqa: BLE001 - unreadable or not a table: not a predictions file
        return False
    return {"row", "class", "label"} <= set(cols) and any(c.startswith("score_") for c in cols)


PREDICTIONS = OutputKind("predictions file", is_dir=False, recognise=_is_predictions_file)


def check_output(output: str | Path | None, overwrite: bool = False) -> Path | None:
    """Check (before any work) that predictions can be written to ``output``.

    Returns the output path, or None for stdout (``None`` or ``-``). Creates a missing
    folder of the output.

    Raises
    ------
    ValueError
        If the extension is not ``.parquet`` / ``.csv``, the path holds anything but a
        predictions file this system wrote (or one without ``overwrite``), or its folder
        cannot be created or written.
    """
    if output is None or str(output) == "-":
        return None
    out = Path(output).absolute()
    if out.suffix not in OUTPUT_SUFFIXES:
        raise ValueError(f"output {str(output)!r}: use a .parquet or .csv file name, or '-'.")
    claim_output(out, PREDICTIONS, overwrite=overwrite)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(
            f"cannot create the folder {out.parent} of the output ({exc.strerror}); give -o "
            "a path in a folder you can write."
        ) from exc
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise ValueError(
            f"cannot write in {out.parent} (permission denied); give -o a path in a folder "
            "you can write."
        )
    return out


def write_predictions(
    frame: pd.DataFrame, output: str | Path | None, *, overwrite: bool = False
) -> None:
    """Write to ``.parquet`` / ``.csv`` (by extension), or CSV on stdout for ``None``/``-``.

    The output is checked with :func:`check_output` and written atomically.
    """
    out = check_output(output, overwrite)
    if out is None:
        frame.to_csv(sys.stdout, index=False)
        return
    with StagedOutput(out, replace=overwrite) as tmp:
        if out.suffix == ".parquet":
            frame.to_parquet(tmp, index=False)
        else:
            frame.to_csv(tmp, index=False)
