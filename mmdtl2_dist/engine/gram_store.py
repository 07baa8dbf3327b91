"""The Gram store: the linear Gram of one feature space, with what is needed to use it.

Layout (a directory)::

    GRAM/
      zarr.json            Zarr group
      job.json             the job (store, fingerprint, space, devices, preprocessing,
                           precision, and its plan: tile size, feature blocks, parts
                           per tile) and its state; written
                           atomically. A job without ``precision`` is exact (float64).
                           ``store`` records where the features were read from; a Gram
                           is matched to a store by ``store_fingerprint`` only, so moving
                           either keeps it in use
      gram/                float64 (n, n), chunks (tile_rows, tile_rows), CRC32C; only
                           chunks (i, j) with i <= j are written (upper triangle);
                           diagonal chunks hold the full symmetric block
      sq_norms/            float64 (n,): the Gram diagonal (squared norms)
      row_norms/           float64 (n,): norms of the raw rows (L2 methods only)
      stats/<device>/mean, stats/<device>/scale   float64 (L,) (z-score methods only)
      index.parquet        Gram row -> device, row, label, class_name, group, sample_id
      tiles/<i>_<j>.json   completion marker of each tile (resume skips these)
      tiles/parts/         partial tiles of tiles split into feature parts, while their
                           tile is not combined: <i>_<j>.<k>.npy and its marker
                           <i>_<j>.<k>.json (its CRC32C); removed by the tile's combine

Rows are the devices' rows concatenated, devices in sorted order. A Gram computed for a
store is kept in the store's Gram folder under its key (:mod:`mmdtl2_dist.engine.location`).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pandas as pd
import zarr

from mmdtl2_dist.core.kernels import KernelSpec, kernel_from_gram
from mmdtl2_dist.core.preprocessing import PreprocessStats
from mmdtl2_dist.engine.location import gram_key
from mmdtl2_dist.store.feature_store import CorruptChunkError, read_array_block
from mmdtl2_dist.store.layout import check_name

GRAM_FORMAT = 1
JOB_FILE = "job.json"
INDEX_FILE = "index.parquet"
TILES_DIR = "tiles"


class GramStore:
    """Read access to a computed Gram (see the module docstring for the layout).

    Parameters
    ----------
    path : Path
        Directory of the Gram store.
    cache_mb : float
        Decoded Gram chunks kept in memory between calls (least recently used first out).

    Attributes
    ----------
    last_run : dict or None
        Tiles ``computed`` and ``skipped`` and ``seconds`` of the run that finished the
        Gram; as returned by :func:`~mmdtl2_dist.engine.compute_gram`, of that call.
    reused : bool
        True when :func:`~mmdtl2_dist.engine.compute_gram` found the Gram complete.
    """

    def __init__(self, path: Path, job: dict, index: pd.DataFrame, cache_mb: float = 512):
        self.path = path
        self.job = job
        self.index = index
        self._cache: OrderedDict = OrderedDict()
        self._cache_bytes = 0
        self._cache_limit = int(cache_mb * 2**20)
        self._sq = None
        self.last_run: dict | None = job.get("last_run")
        self.reused = False

    @classmethod
    def open(cls, path: str | os.PathLike, *, cache_mb: float = 512) -> GramStore:
        """Open a Gram store written by :func:`~mmdtl2_dist.engine.compute_gram`."""
        path = Path(path).absolute()
        if not (path / JOB_FILE).exists():
            raise FileNotFoundError(
                f"no Gram store at {path}; compute one with `mmdtl2 gram` or compute_gram()."
            )
        job = json.loads((path / JOB_FILE).read_text())
        if job.get("format") != GRAM_FORMAT:
            raise ValueError(
                f"{path}: Gram store format {job.get('format')}, expected {GRAM_FORMAT}."
            )
        try:  # device names become paths of the statistics arrays
            for device in job.get("devices", []):
                check_name("device", device)
        except ValueError as exc:
            raise ValueError(f"{path / JOB_FILE} is damaged or crafted: {exc}") from None
        index = pd.read_parquet(path / INDEX_FILE)
        return cls(path, job, index, cache_mb)

    # -- description -------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        return bool(self.job.get("complete"))

    @property
    def key(self) -> str:
        """The Gram's name in a Gram folder (store content, space, preprocessing, precision)."""
        fp = self.job["store_fingerprint"]
        return gram_key(fp, self.space, self.preprocessing, self.precision)

    @property
    def n(self) -> int:
        return int(self.job["n_rows"])

    @property
    def space(self) -> str:
        return self.job["space"]

    @property
    def devices(self) -> list[str]:
        return list(self.job["devices"])

    @property
    def preprocessing(self) -> str:
        return self.job["preprocessing"]

    @property
    def precision(self) -> str:
        """``"float64"`` (exact) or ``"mixed"`` (float32 products, float64 sums)."""
        return self.job.get("precision", "float64")

    @property
    def tile_rows(self) -> int:
        return int(self.job["tile_rows"])

    def rows(self, device: str, local_rows=None) -> np.ndarray:
        """Gram rows of ``device``'s samples (all, or the given device-local rows)."""
        if device not in self.devices:
            raise ValueError(f"device {device!r} is not in this Gram; it has {self.devices}.")
        d = self.devices.index(device)
        start, stop = self.job["offsets"][d], self.job["offsets"][d + 1]
        if local_rows is None:
            return np.arange(start, stop)
        local = np.asarray(local_rows, dtype=np.int64)
        if local.size and (local.min() < 0 or local.max() >= stop - start):
            raise ValueError(f"rows of {device} must lie in [0, {stop - start}).")
        return start + local

    # -- data --------------------------------------------------------------------------
    def _rows_arg(self, rows) -> np.ndarray:
        if rows is None:
            return np.arange(self.n)
        if isinstance(rows, slice):
            return np.arange(self.n)[rows]
        rows = np.asarray(rows)
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        rows = rows.astype(np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= self.n):
            raise ValueError(
                f"Gram rows must lie in [0, {self.n}), got [{rows.min()}, {rows.max()}]; "
                "map device rows with GramStore.rows(device, rows)."
            )
        return rows

    def _chunk(self, i: int, j: int) -> np.ndarray:
        key = (i, j)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        if not self.complete:
            raise ValueError(
                f"the Gram at {self.path} is incomplete; re-run compute_gram() (or "
                "`mmdtl2 gram`) with the same arguments to finish it."
            )
        t = self.tile_rows
        a0, a1 = i * t, min((i + 1) * t, self.n)
        b0, b1 = j * t, min((j + 1) * t, self.n)
        try:
            block = read_array_block(str(self.path / "gram"), a0, a1, b0, b1)
        except CorruptChunkError as exc:
            raise CorruptChunkError(
                exc.array_path, exc.chunks, "of the Gram are damaged or missing (recompute it)"
            ) from exc
        self._cache[key] = block
        self._cache_bytes += block.nbytes
        while self._cache_bytes > self._cache_limit and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= old.nbytes
        return block

    def block(self, rows_a=None, rows_b=None) -> np.ndarray:
        """The Gram block ``G[rows_a][:, rows_b]`` in float64 (global Gram rows).

        Parameters
        ----------
        rows_a, rows_b : array of int, slice or None
            Gram rows (``None``: all). Use :meth:`rows` or :attr:`index` to map device
            rows to Gram rows.
        """
        ra, rb = self._rows_arg(rows_a), self._rows_arg(rows_b)
        out = np.empty((ra.size, rb.size))
        t = self.tile_rows
        ta, tb = ra // t, rb // t
        for i in np.unique(ta):
            pa = np.flatnonzero(ta == i)
            for j in np.unique(tb):
                pb = np.flatnonzero(tb == j)
                la, lb = ra[pa] - i * t, rb[pb] - j * t
                if i <= j:
                    out[np.ix_(pa, pb)] = self._chunk(i, j)[np.ix_(la, lb)]
                else:  # lower triangle: the transpose of the stored upper chunk
                    out[np.ix_(pa, pb)] = self._chunk(j, i)[np.ix_(lb, la)].T
        return out

    def to_numpy(self) -> np.ndarray:
        """The whole Gram (n x n float64) in memory."""
        return self.block(None, None)

    def sq_norms(self, rows=None) -> np.ndarray:
        """Squared norms of the (preprocessed) samples: the Gram diagonal."""
        if self._sq is None:
            if not self.complete:
                self._chunk(0, 0)  # raises the "incomplete" error
            self._sq = np.asarray(zarr.open_array(str(self.path / "sq_norms"), mode="r")[:])
        return self._sq[self._rows_arg(rows)]

    def kernel(self, rows_a, rows_b, spec: KernelSpec) -> np.ndarray:
        """Kernel block between Gram rows from the stored linear Gram.

        ``spec`` follows :func:`mmdtl2_dist.core.kernels.kernel_from_gram` (the linear
        kernel is ``x·x' + 1``); ``rbf``/``poly`` need a resolved ``gamma``, e.g.
        ``spec.resolve(store.block(train, train))``.
        """
        G = self.block(rows_a, rows_b)
        if spec.kernel != "rbf":
            return kernel_from_gram(G, spec)
        return kernel_from_gram(G, spec, self.sq_norms(rows_a), self.sq_norms(rows_b))

    def stats(self, device: str) -> PreprocessStats:
        """The frozen preprocessing of ``device`` (to apply to its new samples)."""
        self.rows(device)  # validates the name
        method = self.preprocessing
        if method not in ("zscore", "l2_zscore"):
            return PreprocessStats(method)
        grp = self.path / "stats" / device
        mean = np.asarray(zarr.open_array(str(grp / "mean"), mode="r")[:])
        scale = np.asarray(zarr.open_array(str(grp / "scale"), mode="r")[:])
        return PreprocessStats(method, mean, scale)

    def finished_tiles(self) -> dict[str, dict]:
        """Completion markers by tile key (``"i_j"``)."""
        out = {}
        for p in sorted((self.path / TILES_DIR).glob("*.json")):
            try:
                out[p.stem] = json.loads(p.read_text())
            except (OSError, ValueError):
                continue  # unreadable marker: the tile counts as not done
        return out

    def __repr__(self) -> str:
        state = "complete" if self.complete else "incomplete"
        return (
            f"GramStore({str(self.path)!r}: space {self.space!r}, n={self.n}, devices "
            f"{self.devices}, preprocessing {self.preprocessing!r}, precision "
            f"{self.precision!r}, {state})"
        )
