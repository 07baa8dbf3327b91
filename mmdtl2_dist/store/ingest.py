"""Convert feature files into a feature store (``mmdtl2 ingest``).

Supported inputs (rows = samples):

- ``.npy``: one 2-D array (memory-mapped, streamed). Metadata from a side table.
- ``.npz`` and ``.mat`` (MATLAB v5 via scipy, v7.3 / HDF5 via h5py): a 2-D features
  variable plus optional per-sample variables for labels, class names, groups and ids.
  v7.3 files are streamed; ``.npz`` members and v5 files are read whole (their formats
  cannot be read in parts), so convert very large ones to ``.npy`` or v7.3 first.
  v7.3 variables are stored column-major; they are transposed back so that a MATLAB
  ``n x L`` matrix gives ``n`` samples (use ``transpose=True`` for ``L x n`` data).
- ``.csv`` and ``.parquet``: one row per sample; the metadata columns (``label``,
  ``class_name``, ``group``, ``sample_id`` or the names given) are taken out and every
  other column is a feature, in file order. Without a label column, a column whose name
  means labels to a user (``Label``, ``class``, ``target``: ``sources.LABEL_LIKE``) is
  refused rather than read as a feature, with every sample unlabelled. A Parquet list
  column can hold the whole feature vector instead. A CSV's first row names the columns
  unless all its fields are numbers: then it is a sample (a file without a header; its
  columns are all features, metadata comes from a side table). A first row ``0,1,...,L-1``
  is ambiguous (pandas writes it for unnamed columns) and needs ``header=True`` or
  ``False`` (``--header`` / ``--no-header``); so every row of the file is a sample in the
  store.
- A CSV's row index is never a feature. pandas' ``to_csv`` writes the frame's index as
  a first column by default (``index=True``): with a header row its name is empty (pandas
  reads it back as ``Unnamed: 0``), without one its values are ``0..n-1``. Such a first
  column is refused unless ``index=True`` (``--index``: the file has a row index, drop it)
  or ``index=False`` (``--no-index``: it is a feature) says what it is. The column would
  otherwise change the feature dimension and add a feature that only counts rows, and a
  guess (dropping it) could remove a real feature; saying it once costs nothing. (A
  Parquet file keeps pandas' index in its pandas metadata, and it is read back as the
  index, never as a feature.)

Data types are kept when they are float32 or float64 (so a round trip is exact; CSV
carries no type, its numbers are read as float64: pass ``dtype="float32"`` for float32 data);
float16 becomes float32, integers and booleans become float64 (exact below 2**53).
``dtype="float32"`` forces a (lossy) cast. NaN or Inf refuses the file and names the rows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from mmdtl2_dist.store.feature_store import FeatureStore, StoreWriter
from mmdtl2_dist.store.sources import (
    DEFAULT_KEYS,
    META_FIELDS,
    ArraySource,
    IngestError,
    Source,
    TableSource,
    refuse_label_like_columns,
)

__all__ = ["FORMATS", "IngestError", "IngestInput", "ingest"]

FORMATS = (".npy", ".npz", ".mat", ".csv", ".parquet")
_BLOCK_BYTES = 64 << 20


@dataclass(frozen=True)
class IngestInput:
    """One input file: the features of ``device`` in ``space``.

    Parameters
    ----------
    device, space : str
        Names in the store.
    path : str
        Input file (see the module docstring for formats).
    features_key : str, optional
        Variable (npz/mat) or list column (parquet) holding the features; found
        automatically when the file holds a single 2-D numeric variable.
    keys : dict, optional
        Variable / column names of the metadata fields ``label``, ``class_name``,
        ``group``, ``sample_id`` when they differ from the defaults.
    metadata_path : str, optional
        A ``.csv`` or ``.parquet`` side table with one row per sample and any of the
        metadata columns (needed for ``.npy``).
    transpose : bool
        The features are stored ``L x n`` (features as rows).
    header : bool, optional
        CSV only: the first row names the columns (True) or is a sample (False);
        default: detected (see the module docstring).
    index : bool, optional
        CSV only: the first column is a row index, dropped (True), or a feature (False);
        default: detected, a first column that looks like pandas' index is refused (see
        the module docstring).
    """

    device: str
    space: str
    path: str
    features_key: str | None = None
    keys: dict | None = None
    metadata_path: str | None = None
    transpose: bool = False
    header: bool | None = None
    index: bool | None = None


def _pick_features(path, variables: dict, features_key):
    if features_key is not None:
        if features_key not in variables:
            raise IngestError(
                f"{path}: no variable {features_key!r}; it has {sorted(variables)}. "
                "--features-key applies to every input: leave it out to let each file's one "
                "2-D numeric variable be found, or save files that name it otherwise as "
                ".npz with X (and y) first."
            )
        return features_key
    known = {k for ks in DEFAULT_KEYS.values() for k in ks}
    cands = [
        k
        for k, v in variables.items()
        if len(v.shape) == 2
        and min(v.shape) > 1
        and k not in known
        and np.dtype(v.dtype).kind in "fiub"
    ]
    if len(cands) != 1:
        raise IngestError(
            f"{path}: cannot tell which variable holds the features (2-D numeric candidates: "
            f"{cands or 'none'}; all variables: {sorted(variables)}); pass features_key "
            "(--features-key)."
        )
    return cands[0]


def _pick_meta(path, variables: dict, keys: dict, loader) -> dict:
    meta = {}
    for field in META_FIELDS:
        want = keys.get(field)
        if want is not None and want not in variables:
            raise IngestError(
                f"{path}: no variable {want!r} for {field}; it has {sorted(variables)}."
            )
        cands = [want] if want else [k for k in DEFAULT_KEYS[field] if k in variables]
        if cands:
            meta[field] = loader(cands[0])
    return meta


def _mat_strings(value) -> np.ndarray:
    """Flatten a MATLAB cell array / char matrix of strings to a 1-D array of str."""
    value = np.asarray(value)
    if value.dtype.kind in "US":
        return (
            value.reshape(-1).astype(str)
            if value.ndim <= 1 or 1 in value.shape
            else np.array(["".join(r).strip() for r in value])
        )
    if value.dtype == object:
        return np.array(
            [str(np.asarray(v).reshape(-1)[0]) if np.size(v) else "" for v in value.reshape(-1)]
        )
    return value.reshape(-1)


def open_source(inp: IngestInput) -> Source:
    """Open one input file for streaming (no feature data is read yet)."""
    path = Path(inp.path)
    if not path.exists():
        raise FileNotFoundError(f"input file {path} does not exist.")
    ext = path.suffix.lower()
    keys = dict(inp.keys or {})
    unknown = set(keys) - set(META_FIELDS)
    if unknown:
        raise IngestError(f"unknown metadata field(s) {sorted(unknown)}; use {META_FIELDS}.")
    try:
        if ext == ".npy":
            a = np.load(path, mmap_mode="r", allow_pickle=False)
            if a.ndim != 2:
                raise IngestError(
                    f"{path}: expected a 2-D array (samples x features), got {a.shape}."
                )
            src = ArraySource(a, {}, inp.transpose)
        elif ext == ".npz":
            z = np.load(path, allow_pickle=False)
            variables = {k: z[k] for k in z.files}
            key = _pick_features(path, variables, inp.features_key)
            meta = _pick_meta(path, variables, keys, lambda k: np.asarray(variables[k]).reshape(-1))
            src = ArraySource(variables[key], meta, inp.transpose)
        elif ext == ".mat":
            src = _open_mat(path, inp, keys)
        elif ext in (".csv", ".parquet"):
            if inp.transpose:
                raise IngestError(f"{path}: transpose is not supported for tables.")
            src = TableSource(path, ext[1:], inp.features_key, keys, inp.header, inp.index)
        else:
            raise IngestError(f"{path}: unsupported format {ext!r}; supported: {FORMATS}.")
    except (IngestError, FileNotFoundError):
        raise
    except Exception as exc:  # noqa: BLE001 - a reader's own error on a malformed file
        raise IngestError(
            f"{path}: cannot read it as {ext} ({type(exc).__name__}: {exc})."
        ) from exc
    if src.dtype.kind not in "fiub":
        raise IngestError(f"{path}: features must be numeric, got dtype {src.dtype}.")
    if inp.metadata_path:
        src.meta.update(_read_side_table(Path(inp.metadata_path), src.n_rows, keys))
    if isinstance(src, TableSource) and "label" not in src.meta:
        refuse_label_like_columns(path, src.feature_cols)
    for field, values in src.meta.items():
        if len(values) != src.n_rows and field != "class_name":  # names may be per class
            raise IngestError(
                f"{path}: {field} has {len(values)} entries but there are {src.n_rows} samples "
                f"({src.n_rows} x {src.n_features}); if the features are stored features x "
                "samples, pass transpose (--transpose)."
            )
    return src


def _open_mat(path: Path, inp: IngestInput, keys: dict) -> Source:
    import h5py

    if h5py.is_hdf5(path):  # MATLAB v7.3
        f = h5py.File(path, "r")
        variables = {k: v for k, v in f.items() if isinstance(v, h5py.Dataset)}
        key = _pick_features(path, variables, inp.features_key)

        def load(k):
            v = variables[k]
            if v.dtype.kind == "O":
                raise IngestError(
                    f"{path}: variable {k!r} is a cell array (v7.3); give text metadata in a "
                    "side table (--metadata)."
                )
            a = np.asarray(v[()])
            if v.attrs.get("MATLAB_class", b"") == b"char":
                return np.array(["".join(map(chr, col)).strip() for col in a.T])
            return a.reshape(-1)

        return ArraySource(
            variables[key], _pick_meta(path, variables, keys, load), inp.transpose, hdf5_t=True
        )
    from scipy.io import loadmat

    m = loadmat(path)
    variables = {k: v for k, v in m.items() if not k.startswith("__")}
    key = _pick_features(path, variables, inp.features_key)
    return ArraySource(
        variables[key],
        _pick_meta(path, variables, keys, lambda k: _mat_strings(variables[k])),
        inp.transpose,
    )


def _read_side_table(path: Path, n_rows: int, keys: dict) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"metadata table {path} does not exist.")
    if path.suffix.lower() == ".csv":
        table = pd.read_csv(path, keep_default_na=False)
    elif path.suffix.lower() == ".parquet":
        table = pd.read_parquet(path)
    else:
        raise IngestError(f"{path}: metadata tables must be .csv or .parquet.")
    if len(table) != n_rows:
        raise IngestError(f"{path}: {len(table)} metadata rows for {n_rows} samples.")
    out = {}
    for field in META_FIELDS:
        col = keys.get(field) or next((c for c in DEFAULT_KEYS[field] if c in table), None)
        if col is not None and col not in table:
            raise IngestError(f"{path}: no column {col!r} for {field}; it has {list(table)}.")
        if col is not None:
            out[field] = table[col].to_numpy()
    if not out:
        raise IngestError(f"{path}: none of the columns {META_FIELDS} found; it has {list(table)}.")
    return out


def _stored_dtype(dtype: np.dtype, force: str | None) -> np.dtype:
    if force is not None:
        if force not in ("float32", "float64"):
            raise IngestError(f"dtype must be 'float32' or 'float64', got {force!r}.")
        return np.dtype(force)
    if dtype == np.float64:
        return np.dtype(np.float64)
    if dtype.kind == "f" and dtype.itemsize <= 4:
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def _class_names(meta: dict) -> np.ndarray | None:
    """Per-sample class names; a table shorter than the samples names the sorted labels."""
    names = meta.get("class_name")
    if names is None:
        return None
    names = np.asarray(names).astype(str)
    label = meta.get("label")
    if label is None or len(names) == len(label):
        return names
    classes = np.unique(label)
    if len(classes) != len(names):
        raise IngestError(
            f"{len(names)} class names for {len(classes)} distinct labels {classes[:10]}; give "
            "one name per class (for the sorted labels) or one per sample."
        )
    return names[np.searchsorted(classes, label)]


def ingest(
    out: str | os.PathLike,
    inputs: list[IngestInput],
    *,
    overwrite: bool = False,
    compression: str = "none",
    chunk_rows: int | None = None,
    dtype: str | None = None,
    progress: bool | None = None,
) -> FeatureStore:
    """Build a feature store from input files, atomically.

    Parameters
    ----------
    out : str or Path
        Directory of the new store.
    inputs : list of IngestInput
        One entry per (device, space).
    overwrite : bool
        Replace an existing store (only once the new one is complete).
    compression : {"none", "zstd"}
        Chunk compression (a CRC32C checksum is always stored).
    chunk_rows : int, optional
        Rows per chunk (default: 256, more for narrow arrays so that chunks are >= 1 MiB).
    dtype : {"float32", "float64"}, optional
        Force the stored dtype (default keeps float32/float64, see the module docstring).
    progress : bool or None
        Progress lines on stderr for large inputs; ``None``: when stderr is a terminal.

    Returns
    -------
    FeatureStore
        The new store, opened.
    """
    if not inputs:
        raise IngestError("give at least one input (-i DEVICE:SPACE:PATH).")
    sources = [open_source(inp) for inp in inputs]  # fail fast before writing anything
    with StoreWriter(out, overwrite=overwrite, compression=compression, progress=progress) as w:
        for inp, src in zip(inputs, sources, strict=True):
            stored = _stored_dtype(src.dtype, dtype)
            block_rows = max(1, _BLOCK_BYTES // (src.n_features * 8))
            blocks = (b.astype(stored, copy=False) for b in src.blocks(block_rows))
            aw = w.write_array(
                inp.device,
                inp.space,
                blocks,
                src.n_rows,
                src.n_features,
                dtype=stored,
                chunk_rows=chunk_rows,
                source=str(inp.path),
            )
            meta = dict(src.meta)
            aw.set_metadata(
                label=meta.get("label"),
                class_name=_class_names(meta),
                group=meta.get("group"),
                sample_id=meta.get("sample_id"),
            )
    return FeatureStore.open(out)
