"""Writing one feature array of a store: band by band, hashed, with its metadata table.

:class:`ArrayWriter` is what :meth:`StoreWriter.create_array
<mmdtl2_dist.store.feature_store.StoreWriter.create_array>` returns;
:func:`store_fingerprint` is the content hash a store records and
:meth:`~mmdtl2_dist.store.feature_store.FeatureStore.verify` recomputes.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import zarr

_MAX_ROWS_NAMED = 20  # bad rows named in an error


class ArrayWriter:
    """Sequential writer of one feature array inside a :class:`StoreWriter`.

    Rows are appended in order (:meth:`append`) and written to Zarr one chunk-row band
    at a time, so memory stays at one band whatever the array size.
    """

    def __init__(self, arr: zarr.Array, device: str, space: str, source: str):
        self._arr = arr
        self.device, self.space, self.source = device, space, source
        self.n_rows, self.n_features = arr.shape
        self._band = np.empty((arr.chunks[0], self.n_features), dtype=arr.dtype)
        self._fill = 0
        self.rows_written = 0
        self._hash = hashlib.blake2b(digest_size=16)
        self._bad_rows: list[int] = []
        self._n_bad = 0
        self.meta: dict[str, np.ndarray] = {}

    def append(self, block: np.ndarray) -> None:
        """Append rows (samples) in order; non-finite rows are recorded and refused."""
        block = np.asarray(block)
        if block.ndim == 1:
            block = block[None, :]
        if block.ndim != 2 or block.shape[1] != self.n_features:
            raise ValueError(
                f"{self.source}: rows of shape {block.shape} do not fit the array "
                f"{self.device}/{self.space} of {self.n_features} features."
            )
        if self.rows_written + block.shape[0] > self.n_rows:
            raise ValueError(
                f"{self.source}: {self.rows_written + block.shape[0]} rows given for "
                f"{self.device}/{self.space}, declared {self.n_rows}."
            )
        if not np.issubdtype(block.dtype, np.number) or np.iscomplexobj(block):
            raise ValueError(
                f"{self.source}: features must be real numbers, got dtype {block.dtype}."
            )
        finite = np.isfinite(block).all(axis=1)
        if not finite.all():
            rows = self.rows_written + np.flatnonzero(~finite)
            self._n_bad += rows.size
            self._bad_rows.extend(rows[: _MAX_ROWS_NAMED - len(self._bad_rows)].tolist())
        start = 0
        while start < block.shape[0]:
            take = min(block.shape[0] - start, self._band.shape[0] - self._fill)
            self._band[self._fill : self._fill + take] = block[start : start + take]
            self._fill += take
            start += take
            self.rows_written += take
            if self._fill == self._band.shape[0] or self.rows_written == self.n_rows:
                self._flush()

    def _flush(self) -> None:
        if self._fill == 0:
            return
        stop = self.rows_written
        band = self._band[: self._fill]
        if self._n_bad == 0:  # once refused, stop writing but keep scanning for rows to name
            self._arr[stop - self._fill : stop] = band
            self._hash.update(np.ascontiguousarray(band))  # hashed in place, not copied
        self._fill = 0

    def set_metadata(self, **columns) -> None:
        """Per-sample metadata: ``label``, ``class_name``, ``group``, ``sample_id``."""
        for name, values in columns.items():
            if values is None:
                continue
            if name not in ("label", "class_name", "group", "sample_id"):
                raise ValueError(f"unknown metadata column {name!r}.")
            values = np.asarray(values).reshape(-1)
            if values.shape[0] != self.n_rows:
                raise ValueError(
                    f"{self.source}: {name} has {values.shape[0]} entries for "
                    f"{self.n_rows} samples of {self.device}/{self.space}."
                )
            self.meta[name] = values

    def finish(self) -> tuple[pd.DataFrame, str]:
        """Check completeness and finiteness; return the metadata table and data hash."""
        if self._n_bad:
            listed = ", ".join(str(r) for r in self._bad_rows)
            more = (
                f" (and {self._n_bad - len(self._bad_rows)} more)"
                if self._n_bad > len(self._bad_rows)
                else ""
            )
            raise ValueError(
                f"{self.source}: {self._n_bad} sample(s) of {self.device}/{self.space} hold NaN "
                f"or Inf, rows {listed}{more} (0-based). Remove or repair them before ingest."
            )
        if self.rows_written != self.n_rows:
            raise ValueError(
                f"{self.source}: {self.rows_written} rows written to {self.device}/{self.space}, "
                f"declared {self.n_rows}."
            )
        n = self.n_rows
        label = self.meta.get("label")
        label = np.full(n, -1, np.int64) if label is None else _as_int_labels(label, self.source)
        class_name = self.meta.get("class_name")
        if class_name is None:
            class_name = np.where(label >= 0, label.astype(str), "")
        group = self.meta.get("group")
        sample_id = self.meta.get("sample_id")
        table = pd.DataFrame(
            {
                "device": self.device,
                "space": self.space,
                "row": np.arange(n, dtype=np.int64),
                "label": label,
                "class_name": np.asarray(class_name).astype(str),
                "group": np.full(n, "") if group is None else np.asarray(group).astype(str),
                "sample_id": (
                    np.array([f"{self.device}/{i}" for i in range(n)])
                    if sample_id is None
                    else np.asarray(sample_id).astype(str)
                ),
            }
        )
        return table, self._hash.hexdigest()


def _as_int_labels(label: np.ndarray, source: str) -> np.ndarray:
    if label.dtype.kind in "iu":
        return label.astype(np.int64)
    if label.dtype.kind == "f" and np.all(np.isfinite(label)) and np.all(label == np.round(label)):
        return label.astype(np.int64)
    raise ValueError(
        f"{source}: labels must be integers, got dtype {label.dtype} (e.g. {label[:3]!r}); "
        "give class names separately as class_name."
    )


def check_consistency(writers: list[ArrayWriter], tables: list[pd.DataFrame]) -> None:
    by_space: dict[str, int] = {}
    by_device: dict[str, tuple[ArrayWriter, pd.DataFrame]] = {}
    for w, t in zip(writers, tables, strict=True):
        if by_space.setdefault(w.space, w.n_features) != w.n_features:
            raise ValueError(
                f"space {w.space!r} has {by_space[w.space]} features on one device and "
                f"{w.n_features} on {w.device!r}; a space must have one dimension (name "
                "spaces of different dimension differently, e.g. conv3 and conv5)."
            )
        if w.device in by_device:
            w0, t0 = by_device[w.device]
            same = (
                w0.n_rows == w.n_rows
                and np.array_equal(t0["label"].to_numpy(), t["label"].to_numpy())
                and np.array_equal(t0["sample_id"].to_numpy(), t["sample_id"].to_numpy())
            )
            if not same:
                raise ValueError(
                    f"device {w.device!r} has spaces {w0.space!r} ({w0.n_rows} rows) and "
                    f"{w.space!r} ({w.n_rows} rows) with different samples, labels or ids; "
                    "the spaces of one device must describe the same samples in the same order."
                )
        else:
            by_device[w.device] = (w, t)


def store_fingerprint(hashes: list[tuple], metadata: pd.DataFrame) -> str:
    h = hashlib.blake2b(digest_size=16)
    for item in hashes:
        h.update(repr(item).encode())
    h.update(metadata.to_csv(index=False).encode())
    return h.hexdigest()
