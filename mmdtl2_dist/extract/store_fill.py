"""Filling an extraction's feature store from its shard files.

Two ways, with the same bytes and fingerprint for the same images:

- :class:`StreamedStore` (every image is kept: without ``skip_bad``): each device's row
  count is known before any shard runs, so the store's arrays are created up front and
  filled by one background thread while the workers run. The job hands it each shard
  that finishes (:meth:`StreamedStore.shard_done`, which never waits for a write); the
  thread appends each device's shards in shard order, as soon as the next one in order
  is finished (shards finished out of order wait, as indices, for their turn), starting
  with the shards an earlier run finished. After the last shard, only the metadata, the
  provenance and the commit remain. The driver is otherwise idle while the workers run.
- :class:`StoreAfter` (``skip_bad``): how many rows each device keeps is known only when
  all its shards are finished, so the store is written from the shard files after the
  workers (memory-mapped, a band in memory at a time), with the list of skipped images.

Either way the store is written by a :class:`~mmdtl2_dist.store.feature_store.StoreWriter`
under a hidden temporary sibling and renamed into place only when complete: an error (in
the job or in the writer thread) discards it, and what a killed run left is removed by
the next writer of the same store. Both record ``seconds`` (spent writing the store) and
``after_workers_seconds`` (of those, spent after the last shard finished).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from mmdtl2_dist.extract.inputs import ImageTable
from mmdtl2_dist.extract.model import Extractor, Preprocessing
from mmdtl2_dist.extract.shards import read_shard
from mmdtl2_dist.progress import say
from mmdtl2_dist.store.feature_store import FeatureStore, StoreWriter
from mmdtl2_dist.store.layout import SIDE_FILES

SKIPPED_FILE = SIDE_FILES[0]


@dataclass(frozen=True)
class StoreJob:
    """What goes into the store: the images, their shards (in order) and the extractor."""

    out: Path
    table: ImageTable
    shards: list[dict]
    spaces: dict[str, str]
    ex: Extractor
    pre: Preprocessing
    overwrite: bool = False
    compression: str = "none"
    progress: bool | None = None

    def writer(self) -> StoreWriter:
        return StoreWriter(self.out, overwrite=self.overwrite, compression=self.compression)

    def source(self, device: str) -> str:
        return f"{self.table.source} ({device})"

    def of_device(self, device: str) -> list[dict]:
        return [s for s in self.shards if s["device"] == device]


def bad_images(table: ImageTable, shards: list[dict]) -> pd.DataFrame:
    """The images the shards could not read: path, device, reason."""
    rows, reasons = [], []
    for s in shards:
        rows += read_shard(s["file"], "bad_rows").tolist()
        reasons += read_shard(s["file"], "bad_reasons").tolist()
    frame = table.frame.iloc[rows][["path", "device"]].reset_index(drop=True)
    return frame.assign(reason=reasons)


def refuse_bad(bad: pd.DataFrame) -> None:
    """Refuse shards with unreadable images (kept from a run with ``--skip-bad``)."""
    first = bad.iloc[0]
    raise ValueError(
        f"{len(bad)} image(s) cannot be read, e.g. {first.path} ({first.reason}); fix "
        "them, or pass --skip-bad to leave them out."
    )


def _set_metadata(aw, frame: pd.DataFrame, kept: np.ndarray) -> None:
    meta = frame.iloc[kept]
    aw.set_metadata(
        label=meta["label"].to_numpy(np.int64),
        class_name=meta["class_name"].to_numpy(str),
        group=meta["group"].to_numpy(str),
        sample_id=meta["sample_id"].to_numpy(str),
    )


def _add_provenance(w: StoreWriter, job: StoreJob, bad: pd.DataFrame) -> None:
    """The extraction's provenance, and the list of skipped images if any."""
    w.provenance = {"extraction": provenance(job.table, job.ex, job.pre, job.spaces, len(bad))}
    if len(bad):
        w.add_file(SKIPPED_FILE, bad.to_csv(index=False).encode())


class StoreAfter:
    """Write the store from the shard files once all are finished (see the module doc)."""

    def __init__(self, job: StoreJob):
        self.job = job
        self.seconds = self.after_workers_seconds = 0.0

    def __enter__(self) -> StoreAfter:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def shard_done(self, index: int) -> None:
        """Nothing to do until all shards are finished."""

    def finish(self) -> FeatureStore:
        t0 = time.perf_counter()
        fs = self._write()
        self.seconds = self.after_workers_seconds = time.perf_counter() - t0
        return fs

    def _write(self) -> FeatureStore:
        job, frame = self.job, self.job.table.frame
        bad = bad_images(job.table, job.shards)
        with job.writer() as w:
            for device in job.table.devices:
                parts = job.of_device(device)
                kept = np.concatenate([read_shard(s["file"], "kept") for s in parts])
                if kept.size == 0:
                    raise ValueError(
                        f"none of the {len(job.table.rows_of(device))} images of device "
                        f"{device!r} can be read (e.g. {bad[bad.device == device].iloc[0].path});"
                        " fix them and run again with --restart."
                    )
                for layer, space in job.spaces.items():
                    blocks = (read_shard(s["file"], f"f_{layer}") for s in parts)
                    aw = w.write_array(
                        device,
                        space,
                        blocks,
                        kept.size,
                        job.ex.dims[layer],
                        dtype=np.float32,
                        source=job.source(device),
                    )
                    _set_metadata(aw, frame, kept)
            _add_provenance(w, job, bad)
        if len(bad):
            say(
                job.progress,
                f"extract: skipped {len(bad)} unreadable image(s), listed in "
                f"{job.out / SKIPPED_FILE}",
            )
        return FeatureStore.open(job.out)


class StreamedStore:
    """Fill the store while the shards run, in a background thread (see the module doc).

    Use as a context manager around the shards' run: entering refuses finished shards
    with unreadable images, creates the arrays and starts the thread on the finished
    shards; :meth:`shard_done` hands it each new one; :meth:`finish` waits for it and
    commits. Leaving the block without :meth:`finish` (an error, an interrupt) stops
    the thread and discards the staged store. An error of the thread is raised in the
    job's thread, by the next :meth:`shard_done` or by :meth:`finish`.
    """

    def __init__(self, job: StoreJob, finished: list[int]):
        self.job, self._finished = job, finished
        self.seconds = self.after_workers_seconds = 0.0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._done: set[int] = set()
        devices = job.table.devices
        self._order = {d: [s["index"] for s in job.of_device(d)] for d in devices}
        self._next = dict.fromkeys(devices, 0)
        self._kept: dict[str, list[np.ndarray]] = {d: [] for d in devices}
        self._writer: StoreWriter | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> StreamedStore:
        job = self.job
        bad = bad_images(job.table, [job.shards[i] for i in self._finished])
        if len(bad):
            refuse_bad(bad)
        self._writer = job.writer().__enter__()
        try:
            self._arrays = {
                (device, layer): self._writer.create_array(
                    device,
                    space,
                    len(job.table.rows_of(device)),
                    job.ex.dims[layer],
                    dtype=np.float32,
                    source=job.source(device),
                )
                for device in job.table.devices
                for layer, space in job.spaces.items()
            }
        except BaseException as exc:
            self._writer.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self._thread = threading.Thread(target=self._run, name="mmdtl2-store-fill", daemon=True)
        self._thread.start()
        for index in self._finished:
            self._queue.put(index)
        return self

    def shard_done(self, index: int) -> None:
        """Hand the finished shard ``index`` to the writer thread (raises its error)."""
        if self._error is not None:
            raise self._error
        self._queue.put(index)

    def finish(self) -> FeatureStore:
        """Wait for the thread, write metadata and provenance, and commit the store."""
        t0 = time.perf_counter()
        self._join()
        if self._error is not None:
            raise self._error
        job, w = self.job, self._writer
        for device in job.table.devices:
            kept = np.concatenate(self._kept[device])
            for layer in job.spaces:
                _set_metadata(self._arrays[(device, layer)], job.table.frame, kept)
        _add_provenance(w, job, bad_images(job.table, []))
        self._writer = None
        w.__exit__(None, None, None)  # commits; discards the stage if the commit fails
        spent = time.perf_counter() - t0
        self.seconds += spent
        self.after_workers_seconds = spent
        return FeatureStore.open(job.out)

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._writer is None:  # finished (committed or discarded)
            return
        self._stop.set()
        self._join()
        w, self._writer = self._writer, None
        w.__exit__(exc_type or RuntimeError, exc, tb)  # discards the staged store

    def _join(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            index = self._queue.get()
            if index is None:
                return
            t0 = time.perf_counter()
            try:
                self._take(index)
            except BaseException as exc:  # noqa: BLE001 - raised in the job's thread
                self._error = exc
                return
            finally:
                self.seconds += time.perf_counter() - t0

    def _take(self, index: int) -> None:
        """Mark shard ``index`` finished; append its device's shards that are now in order."""
        self._done.add(index)
        device = self.job.shards[index]["device"]
        order = self._order[device]
        while self._next[device] < len(order) and order[self._next[device]] in self._done:
            if self._stop.is_set():
                return
            self._append(self.job.shards[order[self._next[device]]])
            self._next[device] += 1

    def _append(self, shard: dict) -> None:
        device = shard["device"]
        for layer in self.job.spaces:
            self._arrays[(device, layer)].append(read_shard(shard["file"], f"f_{layer}"))
        self._kept[device].append(read_shard(shard["file"], "kept"))


def provenance(table: ImageTable, ex: Extractor, pre: Preprocessing, spaces, n_bad) -> dict:
    """What a store's features were extracted from and with."""
    import torch
    import torchvision

    return {
        "model": ex.spec.model,
        "layers": {
            layer: {"node": ex.spec.node(layer), "space": space, "n_features": ex.dims[layer]}
            for layer, space in spaces.items()
        },
        "weights": {
            "name": ex.identity.name,
            "sha256": ex.identity.sha256,
            "meaningful": ex.identity.meaningful,
        },
        "preprocessing": pre.as_dict(),
        "images": table.source,
        "n_images": len(table.frame),
        "n_skipped": int(n_bad),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
    }
