"""The inputs of :func:`mmdtl2_dist.store.ingest.ingest`, read in row blocks.

:class:`ArraySource` reads a 2-D array (a memory-mapped ``.npy``, an HDF5 dataset of a
v7.3 ``.mat``, an in-memory array); :class:`TableSource` a CSV or Parquet file whose
columns are features and metadata (the rules for headers and row indexes are in the
module docstring of :mod:`mmdtl2_dist.store.ingest`).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pandas as pd

#: The metadata columns of a store, and the names each is looked for under.
META_FIELDS = ("label", "class_name", "group", "sample_id")
DEFAULT_KEYS = {
    "label": ("label", "labels", "y", "Y", "labs"),
    "class_name": ("class_name", "class_names", "classnames"),
    "group": ("group", "groups"),
    "sample_id": ("sample_id", "sample_ids", "id", "ids"),
}


class IngestError(ValueError):
    """An input file is malformed or inconsistent (the message names the file and the fix)."""


#: Column names that mean labels to a user but are not read as labels: without a label
#: column they would silently become a feature, and every sample unlabelled.
LABEL_LIKE = ("label", "labels", "class", "classes", "target", "targets", "y", "labs")


def refuse_label_like_columns(path, feature_cols) -> None:
    """Refuse a table without labels whose labels would be ingested as a feature column.

    Called when neither the table nor its side table gave labels.
    """
    like = [c for c in feature_cols if str(c).strip().lower() in LABEL_LIKE]
    if like:
        raise IngestError(
            f"{path}: column {like[0]!r} looks like the labels, but labels are read from a "
            f"column named one of {list(DEFAULT_KEYS['label'])}; as it is, it would be "
            f"ingested as a feature and every sample left unlabelled. Pass --labels-key "
            f"{like[0]!r} (labels_key= in Python), or rename the column."
        )


class Source:
    """A readable input: shape, dtype, row blocks and metadata columns."""

    n_rows: int
    n_features: int
    dtype: np.dtype
    meta: dict[str, np.ndarray]

    def blocks(self, block_rows: int):
        raise NotImplementedError


class ArraySource(Source):
    """A 2-D array (or its transpose), read in row blocks; metadata given."""

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


class TableSource(Source):
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
            cands = [want] if want else [c for c in DEFAULT_KEYS[field] if c in names]
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
