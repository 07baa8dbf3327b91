"""The feature store: Zarr arrays of features with a Parquet table of per-sample metadata.

See :mod:`mmdtl2_dist.store.layout` for the layout on disk. :class:`StoreWriter` builds a
store atomically (everything goes to a hidden sibling directory that is renamed into
place only when complete); :class:`FeatureStore` reads one. The array-level pieces are in
:mod:`.array_writer` (writing, fingerprint) and :mod:`.blocks` (reading, damaged chunks).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from mmdtl2_dist.progress import Progress
from mmdtl2_dist.store.array_writer import ArrayWriter, check_consistency, store_fingerprint
from mmdtl2_dist.store.blocks import CorruptChunkError, array_dtype, read_array_block
from mmdtl2_dist.store.layout import (
    FEATURES_GROUP,
    FORMAT_VERSION,
    METADATA_COLUMNS,
    METADATA_FILE,
    ROOT_ATTR,
    SIDE_FILES,
    array_key,
    check_name,
    choose_chunks,
)
from mmdtl2_dist.store.outputs import FEATURE_STORE, StagedOutput, claim_output

__all__ = ["CorruptChunkError", "FeatureStore", "StoreWriter", "array_dtype", "read_array_block"]

COMPRESSION = ("none", "zstd")
PROGRESS_MIN_BYTES = 256 << 20  # arrays at least this large report progress


class StoreWriter:
    """Build a feature store atomically.

    Everything is written under a hidden sibling directory, which is renamed to ``path``
    only when :meth:`commit` succeeds (the ``with`` block exits normally). A failure
    leaves nothing at ``path``; what a killed writer left is cleaned up by the next
    writer of the same path (:class:`~mmdtl2_dist.store.outputs.StagedOutput`).

    Parameters
    ----------
    path : str or Path
        Directory of the new store: missing, an empty directory, or (with ``overwrite``)
        a feature store. Anything else there is refused, never replaced
        (:func:`~mmdtl2_dist.store.outputs.claim_output`).
    overwrite : bool
        Replace an existing feature store at ``path`` (only once the new one is complete).
    compression : {"none", "zstd"}
        Chunk compression; a CRC32C checksum is always added.
    progress : bool or None
        Progress lines on stderr for large arrays (:mod:`mmdtl2_dist.progress`); ``None``:
        when stderr is a terminal.

    Examples
    --------
    >>> with StoreWriter("study.zarr") as w:                      # doctest: +SKIP
    ...     a = w.create_array("cam_a", "conv3", n_rows=734, n_features=64896)
    ...     a.append(X)
    ...     a.set_metadata(label=y)
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        overwrite: bool = False,
        compression: str = "none",
        progress: bool | None = False,
    ):
        self.path = Path(path).absolute()
        if compression not in COMPRESSION:
            raise ValueError(f"compression must be one of {COMPRESSION}, got {compression!r}.")
        self._stage = StagedOutput(self.path, replace=overwrite)
        claim_output(self.path, FEATURE_STORE, overwrite=overwrite)
        self.overwrite = overwrite
        self.compression = compression
        self.progress = progress
        self._tmp = self._stage.tmp
        self._writers: list[ArrayWriter] = []
        self._root = None
        #: How the features were made (e.g. the extractor and its weights), recorded as
        #: the root attribute's ``provenance`` (:attr:`FeatureStore.provenance`).
        self.provenance: dict = {}
        self._files: dict[str, bytes] = {}

    def __enter__(self) -> StoreWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._root = zarr.open_group(str(self._tmp), mode="w-")
        self._root.create_group(FEATURES_GROUP)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.commit()
        finally:
            self._stage.discard()

    def create_array(
        self,
        device: str,
        space: str,
        n_rows: int,
        n_features: int,
        *,
        dtype=np.float32,
        chunk_rows: int | None = None,
        source: str = "",
    ) -> ArrayWriter:
        """Add the feature array of one device in one space and return its writer."""
        check_name("device", device)
        check_name("space", space)
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"feature dtype must be float32 or float64, got {dtype}.")
        if any(w.device == device and w.space == space for w in self._writers):
            raise ValueError(f"{device}/{space} is given twice; give each device/space once.")
        chunks = choose_chunks(n_rows, n_features, dtype.itemsize, chunk_rows)
        compressors = (
            [ZstdCodec(level=1), Crc32cCodec()] if self.compression == "zstd" else [Crc32cCodec()]
        )
        self._root.require_group(f"{FEATURES_GROUP}/{device}")
        arr = zarr.create_array(
            store=str(self._tmp / array_key(device, space)),
            shape=(n_rows, n_features),
            chunks=chunks,
            dtype=dtype,
            compressors=compressors,
            fill_value=np.nan,
            zarr_format=3,
        )
        writer = ArrayWriter(arr, device, space, source or f"{device}/{space}")
        self._writers.append(writer)
        return writer

    def write_array(
        self,
        device: str,
        space: str,
        blocks: Iterator[np.ndarray],
        n_rows: int,
        n_features: int,
        **kwargs,
    ) -> ArrayWriter:
        """Create an array and fill it from an iterator of row blocks, with progress."""
        dtype = kwargs.pop("dtype", np.float32)
        w = self.create_array(device, space, n_rows, n_features, dtype=dtype, **kwargs)
        large = n_rows * n_features * w._band.itemsize >= PROGRESS_MIN_BYTES
        bar = Progress(
            f"ingest {device}/{space}",
            n_rows,
            unit="rows",
            enabled=self.progress if large else False,
        )
        for block in blocks:
            w.append(block)
            bar.update(w.rows_written)
        return w

    def add_file(self, name: str, data: bytes) -> None:
        """Add a side file at the store's top level (e.g. the list of skipped images)."""
        if name not in SIDE_FILES:
            raise ValueError(f"{name!r} is not a side file of a feature store: {SIDE_FILES}.")
        self._files[name] = bytes(data)

    def commit(self) -> None:
        """Validate, write the metadata table and fingerprint, and move into place."""
        if not self._writers:
            raise ValueError("a feature store needs at least one array; none was given.")
        tables, hashes = [], []
        for w in self._writers:
            table, digest = w.finish()
            tables.append(table)
            hashes.append((w.device, w.space, w.n_rows, w.n_features, str(w._arr.dtype), digest))
        check_consistency(self._writers, tables)
        metadata = pd.concat(tables, ignore_index=True)
        metadata = metadata.sort_values(["device", "space", "row"], kind="stable")
        metadata = metadata.reset_index(drop=True)
        metadata.to_parquet(self._tmp / METADATA_FILE, index=False)
        fingerprint = store_fingerprint(sorted(hashes), metadata)
        self._root.attrs[ROOT_ATTR] = {
            "format": FORMAT_VERSION,
            "fingerprint": fingerprint,
            "arrays": [
                {"device": d, "space": s, "n_rows": n, "n_features": L, "dtype": t}
                for d, s, n, L, t, _ in sorted(hashes)
            ],
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **({"files": sorted(self._files)} if self._files else {}),
            **({"provenance": self.provenance} if self.provenance else {}),
        }
        for name, data in self._files.items():
            (self._tmp / name).write_bytes(data)
        claim_output(self.path, FEATURE_STORE, overwrite=self.overwrite)  # still ours?
        self._stage.commit()


def _damaged(path: Path, problem: str) -> ValueError:
    return ValueError(
        f"{path} is not a valid feature store: {problem}. It was not written by `mmdtl2 "
        "ingest` / `mmdtl2 synth` or was modified since; re-create it with `mmdtl2 ingest`."
    )


def _checked_array_entries(path: Path, entries) -> list[dict]:
    """The store's list of arrays, each checked against the array really on disk.

    Device and space names become path components, so they obey the rule applied when
    writing (:func:`~mmdtl2_dist.store.layout.check_name`) and every array must resolve
    inside the store; the recorded shape and dtype must be the array's own.
    """
    if not isinstance(entries, list) or not entries:
        raise _damaged(path, f"its attribute {ROOT_ATTR!r} lists no arrays")
    root = path.resolve()
    seen = set()
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise _damaged(path, f"array entry {k} is {entry!r}, not a mapping")
        try:
            device = check_name("device", entry.get("device"))
            space = check_name("space", entry.get("space"))
        except ValueError as exc:
            raise _damaged(path, f"array entry {k}: {exc}") from None
        if (device, space) in seen:
            raise _damaged(path, f"{device}/{space} is listed twice")
        seen.add((device, space))
        where = path / array_key(device, space)
        if not where.resolve().is_relative_to(root):
            raise _damaged(path, f"array {device}/{space} resolves outside the store")
        _check_array_entry(path, entry, where)
    return entries


def _check_array_entry(path: Path, entry: dict, where: Path) -> None:
    name = f"{entry['device']}/{entry['space']}"
    try:
        arr = zarr.open_array(str(where), mode="r")
    except Exception as exc:  # noqa: BLE001 - any failure to open is a damaged store
        raise _damaged(path, f"array {name} cannot be opened ({exc})") from None
    dims = (entry.get("n_rows"), entry.get("n_features"))
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in dims):
        raise _damaged(path, f"array {name} has shape {dims}")
    if arr.shape != dims:
        raise _damaged(path, f"array {name} has shape {arr.shape}, its entry says {dims}")
    if entry.get("dtype") not in ("float32", "float64") or str(arr.dtype) != entry["dtype"]:
        raise _damaged(
            path, f"array {name} holds {arr.dtype}, its entry says {entry.get('dtype')!r}"
        )


def _checked_metadata(path: Path, arrays: list[dict]) -> pd.DataFrame:
    """The metadata table, checked to hold rows 0..n-1 of every listed array."""
    try:
        table = pd.read_parquet(path / METADATA_FILE)
    except Exception as exc:  # noqa: BLE001 - a missing or unreadable table
        raise _damaged(path, f"{METADATA_FILE} cannot be read ({exc})") from None
    missing = [c for c in METADATA_COLUMNS if c not in table.columns]
    if missing:
        raise _damaged(path, f"{METADATA_FILE} lacks the column(s) {missing}")
    table = table[list(METADATA_COLUMNS)]
    rows = {key: grp["row"].to_numpy() for key, grp in table.groupby(["device", "space"])}
    listed = {(a["device"], a["space"]): a["n_rows"] for a in arrays}
    extra = sorted(set(rows) - set(listed), key=str)
    if extra:
        raise _damaged(path, f"{METADATA_FILE} describes arrays the store lacks: {extra[:5]}")
    for (device, space), n in listed.items():
        got = rows.get((device, space), np.empty(0, np.int64))
        if not np.array_equal(np.sort(got), np.arange(n)):
            raise _damaged(
                path,
                f"{METADATA_FILE} has {got.size} rows for {device}/{space}, which has {n} "
                "samples (rows 0..n-1, each once)",
            )
    return table


def extraction_tags(provenance: dict) -> dict[str, str]:
    """Tags naming the extractor and weights a store's features came from (else none).

    Studies and registered adapters built on a store from ``mmdtl2 extract`` carry them,
    so that a result or a model names the weights (name and SHA-256) behind it.
    """
    ext = (provenance or {}).get("extraction")
    if not ext:
        return {}
    layers = ",".join(f"{k}->{v['space']}" for k, v in ext["layers"].items())
    return {
        "extractor": f"{ext['model']}:{layers}",
        "extractor_weights": str(ext["weights"]["name"]),
        "extractor_weights_sha256": str(ext["weights"]["sha256"]),
    }


class FeatureStore:
    """Read access to a feature store (see :mod:`mmdtl2_dist.store.layout`).

    Open with :meth:`open`. ``metadata`` has one row per (device, space, row) with
    columns ``device, space, row, label, class_name, group, sample_id``.
    """

    def __init__(self, path: Path, attrs: dict, metadata: pd.DataFrame):
        self.path = path
        self._attrs = attrs
        self.metadata = metadata
        self._arrays = {(a["device"], a["space"]): a for a in attrs["arrays"]}

    @classmethod
    def open(cls, path: str | os.PathLike) -> FeatureStore:
        """Open an existing store.

        Raises
        ------
        FileNotFoundError
            If ``path`` does not exist.
        ValueError
            If ``path`` is not a complete feature store, or what it records disagrees
            with what it holds: a device or space name that is not allowed, an array
            outside the store, a shape, dtype or metadata row count that differs.
        """
        path = Path(path).absolute()
        if not path.exists():
            raise FileNotFoundError(
                f"no feature store at {path}; create one with `mmdtl2 ingest` or `mmdtl2 synth`."
            )
        try:
            attrs = dict(zarr.open_group(str(path), mode="r").attrs).get(ROOT_ATTR)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"{path} is not a Zarr feature store ({exc}).") from exc
        if not attrs or attrs.get("format") != FORMAT_VERSION:
            raise ValueError(
                f"{path} is not a feature store of format {FORMAT_VERSION} (attribute "
                f"{ROOT_ATTR!r} missing or of another version)."
            )
        arrays = _checked_array_entries(path, attrs.get("arrays"))
        metadata = _checked_metadata(path, arrays)
        return cls(path, attrs, metadata)

    @property
    def fingerprint(self) -> str:
        """Content hash of the features and metadata (computed at ingest)."""
        return self._attrs["fingerprint"]

    @property
    def provenance(self) -> dict:
        """How the features were made, when the writer recorded it (``mmdtl2 extract``)."""
        return dict(self._attrs.get("provenance") or {})

    @property
    def devices(self) -> list[str]:
        """Device names, sorted."""
        return sorted({d for d, _ in self._arrays})

    @property
    def spaces(self) -> list[str]:
        """Feature-space names, sorted."""
        return sorted({s for _, s in self._arrays})

    def devices_in(self, space: str) -> list[str]:
        """Devices that have features in ``space``, sorted (the Gram's row order)."""
        self._check_space(space)
        return sorted(d for d, s in self._arrays if s == space)

    def shape(self, device: str, space: str) -> tuple[int, int]:
        a = self._entry(device, space)
        return a["n_rows"], a["n_features"]

    def array_path(self, device: str, space: str) -> str:
        """Absolute path of a feature array (what engine tasks are given)."""
        self._entry(device, space)
        return str(self.path / array_key(device, space))

    def array(self, device: str, space: str) -> zarr.Array:
        return zarr.open_array(self.array_path(device, space), mode="r")

    def read(
        self,
        device: str,
        space: str,
        rows: slice | np.ndarray | list[int] | None = None,
        cols: slice | None = None,
    ) -> np.ndarray:
        """Read features of samples ``rows`` (all by default), in the stored dtype.

        Raises
        ------
        CorruptChunkError
            If a chunk read is damaged or missing.
        """
        n, L = self.shape(device, space)
        path = self.array_path(device, space)
        c0, c1, step = (cols or slice(None)).indices(L)
        if step != 1:
            raise ValueError("cols must be a contiguous slice.")
        if rows is None or isinstance(rows, slice):
            r0, r1, step = (rows or slice(None)).indices(n)
            block = read_array_block(path, r0, max(r0, r1), c0, c1)
            return block if step == 1 else block[::step]
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= n):
            raise ValueError(
                f"rows must lie in [0, {n}) for {device}/{space}, got range "
                f"[{rows.min()}, {rows.max()}]."
            )
        uniq, inverse = np.unique(rows, return_inverse=True)
        out = np.empty((uniq.size, c1 - c0), dtype=self.array(device, space).dtype)
        # Read contiguous runs (so each chunk is decoded once per run, checked for damage).
        breaks = np.flatnonzero(np.diff(uniq) != 1) + 1
        for run in np.split(np.arange(uniq.size), breaks):
            if run.size:
                out[run] = read_array_block(path, uniq[run[0]], uniq[run[-1]] + 1, c0, c1)
        return out[inverse]

    def verify(self) -> list[str]:
        """Read every chunk and recompute the fingerprint; return a list of problems."""
        problems = []
        hashes = []
        for (device, space), a in sorted(self._arrays.items()):
            arr = self.array(device, space)
            h = hashlib.blake2b(digest_size=16)
            ok = True
            for r0 in range(0, a["n_rows"], arr.chunks[0]):
                r1 = min(r0 + arr.chunks[0], a["n_rows"])
                try:
                    band = read_array_block(self.array_path(device, space), r0, r1, 0, arr.shape[1])
                    h.update(np.ascontiguousarray(band).tobytes())
                except CorruptChunkError as exc:
                    ok = False
                    problems.append(str(exc))
            hashes.append((device, space, a["n_rows"], a["n_features"], a["dtype"], h.hexdigest()))
            if not ok:
                continue
        if not problems and store_fingerprint(hashes, self.metadata) != self.fingerprint:
            problems.append(
                f"{self.path}: content does not match the stored fingerprint "
                f"{self.fingerprint}; the store was modified after ingest."
            )
        return problems

    def _check_space(self, space: str) -> None:
        if space not in self.spaces:
            raise ValueError(f"unknown space {space!r}; this store has spaces {self.spaces}.")

    def _entry(self, device: str, space: str) -> dict:
        try:
            return self._arrays[(device, space)]
        except KeyError:
            raise ValueError(
                f"no features for device {device!r} in space {space!r}; this store has "
                f"{sorted(self._arrays)}."
            ) from None

    def __repr__(self) -> str:
        arrays = ", ".join(
            f"{d}/{s}{(a['n_rows'], a['n_features'])}" for (d, s), a in sorted(self._arrays.items())
        )
        return f"FeatureStore({str(self.path)!r}: {arrays})"
