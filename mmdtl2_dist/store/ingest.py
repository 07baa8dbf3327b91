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
  other column is a feature, in file order. A Parquet list column can hold the whole
  feature vector instead. A CSV's first row names the columns unless all its fields are
  numbers: then it is a sample (a file without a header; its columns are all features,
  metadata comes from a side table). A first row ``0,1,...,L-1`` is ambiguous (pandas
  writes it for unnamed columns) and needs ``header=True`` or ``False``
  (``--header`` / ``--no-header``); so every row of the file is a sample in the store.
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

import csv
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from mmdtl2_dist.store.feature_store import FeatureStore, StoreWriter

FORMATS = (".npy", ".npz", ".mat", ".csv", ".parquet")
META_FIELDS = ("label", "class_name", "group", "sample_id")
_DEFAULT_KEYS = {
    "label": ("label", "labels", "y", "Y", "labs"),
    "class_name": ("class_name", "class_names", "classnames"),
    "group": ("group", "groups"),
    "sample_id": ("sample_id", "sample_ids", "id", "ids"),
}
_BLOCK_BYTES = 64 << 20


class IngestError(ValueError):
    """An input file is malformed or inconsistent (the message names the file and the fix)."""


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


class _Source:
    """A readable input: shape, dtype, row blocks and metadata columns."""

    n_rows: int
    n_features: int
    dtype: np.dtype
    meta: dict[str, np.ndarray]

    def blocks(self, block_rows: int):
        raise NotImplementedError


class _ArraySource(_Source):
    def __init__(self, array, meta, transpose: bool = False, hdf5_t: bool = False):
        # ``hdf5_t``: the dataset is the transpose of the logical (n, L) matrix.
        self._a, self._t = array, transpose != hdf5_t
        shape = array.shape
        self.n_rows, self.n_features = (shape[1], shape[0]) if self._t else shape
        self.dtype = np.dtype(array.dtype)
        self.meta = meta

    def blocks(self, block_rows):
        for r0 in range(0, self.n_rows, block_rows):
            r1 = min(r0 + block_rows, self.n_rows)
            yield np.asarray(self._a[:, r0:r1]).T if self._t else np.asarray(self._a[r0:r1])


class _TableSource(_Source):
    """CSV or Parquet: feature columns (or one list column) plus metadata columns."""

    def __init__(
        self,
        path: Path,
        kind: str,
        features_key,
        keys,
        header: bool | None = None,
        index: bool | None = None,
    ):
        self.path, self.kind = path, kind
        self.header = _csv_header_row(path, header) if kind == "csv" else 0
        names = self._columns()
        meta_cols = {}
        for field in META_FIELDS:
            want = keys.get(field)
            if want is not None and want not in names:
                unnamed = (
                    " (the file has no header row, so no column has a name: give metadata "
                    "in a side table, --metadata)"
                    if self.header is None
                    else ""
                )
                raise IngestError(
                    f"{path}: no column {want!r} for {field}; columns: {names[:20]}{unnamed}."
                )
            cands = [want] if want else [c for c in _DEFAULT_KEYS[field] if c in names]
            if cands:
                meta_cols[field] = cands[0]
        self.meta_cols = meta_cols
        self.list_col = None
        if kind == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            schema = pq.ParquetFile(path).schema_arrow
            lists = [
                f.name
                for f in schema
                if pa.types.is_list(f.type)
                or pa.types.is_large_list(f.type)
                or pa.types.is_fixed_size_list(f.type)
            ]
            if features_key:
                if features_key not in lists:
                    raise IngestError(
                        f"{path}: {features_key!r} is not a list column; lists: {lists}"
                    )
                self.list_col = features_key
            elif len(lists) == 1:
                self.list_col = lists[0]
            elif len(lists) > 1:
                raise IngestError(f"{path}: several list columns {lists}; pass features_key.")
        used = set(meta_cols.values())
        if kind == "csv":
            self.n_rows, counts_rows = _csv_rows(path, self.header)
            counts_rows = counts_rows and self.n_rows >= 3  # 0, 1 can be a feature by chance
            index_cols = _csv_index_columns(path, self.header, names, used, index, counts_rows)
            used |= set(index_cols)
        else:
            self.n_rows = pq.ParquetFile(path).metadata.num_rows
        self.feature_cols = [] if self.list_col else [c for c in names if c not in used]
        if self.n_rows == 0:
            raise IngestError(f"{path}: no samples (empty table).")
        first = next(self._raw_blocks(min(self.n_rows, 64)), None)
        feats, _ = first
        self.n_features = feats.shape[1]
        if self.n_features == 0:
            raise IngestError(f"{path}: no feature columns besides metadata {sorted(used)}.")
        self.dtype = feats.dtype
        self.meta = self._read_meta()

    def _columns(self) -> list[str]:
        if self.kind == "csv":
            return list(pd.read_csv(self.path, nrows=0, header=self.header).columns)
        import pyarrow.parquet as pq

        return list(pq.ParquetFile(self.path).schema_arrow.names)

    def _read_meta(self) -> dict:
        cols = list(self.meta_cols.values())
        if not cols:
            return {}
        if self.kind == "csv":
            table = pd.read_csv(self.path, usecols=cols, header=self.header, keep_default_na=False)
        else:
            table = pd.read_parquet(self.path, columns=cols)
        return {f: table[c].to_numpy() for f, c in self.meta_cols.items()}

    def _raw_blocks(self, block_rows):
        if self.kind == "csv":
            cols = self.feature_cols
            chunks = pd.read_csv(
                self.path, usecols=cols, header=self.header, chunksize=max(block_rows, 1)
            )
            for chunk in chunks:
                yield _numeric(chunk[cols], self.path), None
        else:
            import pyarrow.parquet as pq

            f = pq.ParquetFile(self.path)
            cols = [self.list_col] if self.list_col else self.feature_cols
            for batch in f.iter_batches(batch_size=max(block_rows, 1), columns=cols):
                if self.list_col:
                    values = batch.column(0).to_numpy(zero_copy_only=False)
                    lengths = {len(v) for v in values}
                    if len(lengths) > 1:
                        raise IngestError(
                            f"{self.path}: feature lists of unequal lengths {lengths}."
                        )
                    yield np.stack(values), None
                else:
                    yield _numeric(batch.to_pandas(), self.path), None

    def blocks(self, block_rows):
        for feats, _ in self._raw_blocks(block_rows):
            yield feats


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _csv_header_row(path: Path, header: bool | None) -> int | None:
    """Pandas' ``header`` for a CSV: 0 when its first row names the columns, else None.

    Detected unless given: a first row of numbers (empty fields allowed) is a sample,
    except ``0,1,...,L-1``, which could be either and must be said, and ``,0,1,...,L-1``,
    the header pandas writes for unnamed columns after the index (as a sample its empty
    field would be refused anyway).
    """
    if header is not None:
        return 0 if header else None
    with open(path, newline="") as fh:
        first = next((row for row in csv.reader(fh) if any(f.strip() for f in row)), [])
    fields = [f.strip() for f in first]
    if any(f and not _is_number(f) for f in fields):
        return 0
    if len(fields) > 1 and fields == ["", *(str(i) for i in range(len(fields) - 1))]:
        return 0
    if fields == [str(i) for i in range(len(fields))]:
        shown = ",".join(fields[:4]) + (",..." if len(fields) > 4 else "")
        raise IngestError(
            f"{path}: the first row {shown} may be column names (what pandas writes for "
            "unnamed columns) or a sample; say which: header=True (--header) if it names "
            "the columns, header=False (--no-header) if it is a sample."
        )
    return None


def _csv_rows(path: Path, header: int | None) -> tuple[int, bool]:
    """Samples in a CSV, and whether its first column holds exactly ``0, 1, ..., n-1``."""
    first = pd.read_csv(path, nrows=0, header=header).columns[0]
    n, counts_rows = 0, True
    for chunk in pd.read_csv(path, usecols=[first], header=header, chunksize=1 << 16):
        col = chunk[first]
        counts_rows = (
            counts_rows
            and pd.api.types.is_integer_dtype(col)
            and np.array_equal(col.to_numpy(), np.arange(n, n + len(col)))
        )
        n += len(col)
    return n, counts_rows


def _csv_index_columns(
    path: Path, header: int | None, names: list, used: set, index: bool | None, counts_rows: bool
) -> list:
    """The CSV's first column when it is a row index (not a feature), else nothing.

    ``index`` says it; otherwise a first column that looks like the index pandas'
    ``to_csv`` writes by default (no name in a header row, or ``0..n-1`` in a file
    without one) is refused: the user says which, ``index=True`` or ``index=False``.
    """
    if index is not None:
        return names[:1] if index else []
    first = names[0]
    fix = (
        "write the file with df.to_csv(path, index=False), or pass index=True (--index) "
        "to drop that column, or index=False (--no-index) to keep it as a feature."
    )
    if first in used:
        return []
    if header == 0 and first == "Unnamed: 0":
        values = " (its values are 0..n-1)" if counts_rows else ""
        raise IngestError(
            f"{path}: the first column has no name in the header row{values}: it looks like "
            "the row index that pandas' DataFrame.to_csv writes by default (index=True), not "
            f"a feature. Say what it is: {fix}"
        )
    if header is None and counts_rows and len(names) > 1:
        raise IngestError(
            f"{path}: the first column holds 0, 1, ..., n-1 in a file without a header row: it "
            "looks like the row index that pandas' DataFrame.to_csv writes by default "
            f"(index=True), not a feature. Say what it is: {fix}"
        )
    return []


def _numeric(frame: pd.DataFrame, path) -> np.ndarray:
    bad = [c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])]
    if bad:
        raise IngestError(
            f"{path}: non-numeric feature column(s) {bad[:5]}; name metadata columns "
            "label, class_name, group, sample_id (or pass their names) so they are not "
            "taken as features."
        )
    return frame.to_numpy()


def _pick_features(path, variables: dict, features_key):
    if features_key is not None:
        if features_key not in variables:
            raise IngestError(f"{path}: no variable {features_key!r}; it has {sorted(variables)}.")
        return features_key
    known = {k for ks in _DEFAULT_KEYS.values() for k in ks}
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
        cands = [want] if want else [k for k in _DEFAULT_KEYS[field] if k in variables]
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


def open_source(inp: IngestInput) -> _Source:
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
            src = _ArraySource(a, {}, inp.transpose)
        elif ext == ".npz":
            z = np.load(path, allow_pickle=False)
            variables = {k: z[k] for k in z.files}
            key = _pick_features(path, variables, inp.features_key)
            meta = _pick_meta(path, variables, keys, lambda k: np.asarray(variables[k]).reshape(-1))
            src = _ArraySource(variables[key], meta, inp.transpose)
        elif ext == ".mat":
            src = _open_mat(path, inp, keys)
        elif ext in (".csv", ".parquet"):
            if inp.transpose:
                raise IngestError(f"{path}: transpose is not supported for tables.")
            src = _TableSource(path, ext[1:], inp.features_key, keys, inp.header, inp.index)
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
    for field, values in src.meta.items():
        if len(values) != src.n_rows and field != "class_name":  # names may be per class
            raise IngestError(
                f"{path}: {field} has {len(values)} entries but there are {src.n_rows} samples "
                f"({src.n_rows} x {src.n_features}); if the features are stored features x "
                "samples, pass transpose (--transpose)."
            )
    return src


def _open_mat(path: Path, inp: IngestInput, keys: dict) -> _Source:
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

        return _ArraySource(
            variables[key], _pick_meta(path, variables, keys, load), inp.transpose, hdf5_t=True
        )
    from scipy.io import loadmat

    m = loadmat(path)
    variables = {k: v for k, v in m.items() if not k.startswith("__")}
    key = _pick_features(path, variables, inp.features_key)
    return _ArraySource(
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
        col = keys.get(field) or next((c for c in _DEFAULT_KEYS[field] if c in table), None)
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
