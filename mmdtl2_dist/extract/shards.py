"""One shard of an extraction job: consecutive images of one device -> its files.

:func:`run_shard` decodes the shard's images one batch at a time (the next batch on a
second thread while the model runs on the current one), runs the extractor and writes
the features of each layer to ``<index>.f_<layer>.npy``, then the rows it kept and the
images it could not read to ``<index>.npz`` in the job's shard folder. Each file
is written under a hidden temporary name and renamed when complete, the ``.npz`` last, so
a shard whose ``.npz`` exists is a finished shard: a job killed at any moment keeps its
finished shards and redoes only the others. The features are plain ``.npy`` files (not
members of the ``.npz``) so that writing them needs no zip checksum and the store is
filled from them memory-mapped, without a copy; the worker writes them through memory
maps as its batches finish (:class:`FeatureFiles`).
:class:`ShardWorker` is the Ray actor around it (one model load per worker).
"""

from __future__ import annotations

import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mmdtl2_dist.extract.model import BadImageError, Extractor, ModelSpec, Preprocessing
from mmdtl2_dist.store.atomic import atomic_file
from mmdtl2_dist.store.outputs import NO_ROOM


def shard_file(folder: Path, index: int) -> Path:
    return Path(folder) / f"{index:06d}.npz"


def feature_file(path: Path, layer: str) -> Path:
    """The ``.npy`` file of one layer's features beside the shard file ``path``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.f_{layer}.npy")


def temporary_sibling(path: Path) -> Path:
    """A hidden name beside ``path`` that no other process or call uses."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def write_atomic(path: Path, save, data) -> None:
    """``save(file, data)`` (``np.save`` or ``np.savez``) under a temporary sibling, renamed."""
    with atomic_file(path, temporary_sibling(path)) as fh:
        save(fh, data)


def _savez(fh, arrays: dict) -> None:
    np.savez(fh, **arrays)


def reserved_memmap(path: Path, shape: tuple[int, int]) -> np.memmap:
    """A new float32 ``.npy`` file at ``path``, memory-mapped, its disk blocks reserved.

    A write through a map into a file with no room left kills the process (SIGBUS); with
    the blocks reserved up front, a full disk is an :class:`OSError` here instead, naming
    the folder and what to do.
    """
    rows = np.lib.format.open_memmap(path, "w+", np.float32, shape)
    if not hasattr(os, "posix_fallocate"):
        return rows
    with open(path, "r+b") as fh:
        try:
            os.posix_fallocate(fh.fileno(), 0, os.fstat(fh.fileno()).st_size)
        except OSError as exc:
            if exc.errno not in NO_ROOM:
                return rows  # a file system that cannot reserve: written as it comes
            mib = rows.nbytes / 2**20
            del rows  # the map is not kept alive by the error's traceback
            raise OSError(
                exc.errno,
                f"no room for {mib:.1f} MiB of features in {path.parent} "
                f"({exc.strerror}); free space there (or choose an output on a larger disk) "
                "and run again: finished shards are kept",
            ) from None
    return rows


class FeatureFiles:
    """A shard's feature files, filled batch by batch as the model produces them.

    Each layer's rows go straight into a memory map of a hidden ``.npy`` file sized (and
    its space reserved, :func:`reserved_memmap`) for every image of the shard, which
    :meth:`commit` renames into place: the features are never held a second time nor
    copied at the end of the shard. When images were skipped (``--skip-bad``), the kept
    rows are written to the final file instead. Until then the final names do not exist;
    :meth:`discard` removes the hidden files (the constructor too, if it fails).
    """

    def __init__(self, file: Path, dims: dict[str, int], n: int):
        self.final = {layer: feature_file(file, layer) for layer in dims}
        self.tmp = {layer: temporary_sibling(path) for layer, path in self.final.items()}
        self.maps = {}
        try:
            for layer, width in dims.items():
                self.maps[layer] = reserved_memmap(self.tmp[layer], (n, width))
        except BaseException:
            self.discard()
            raise

    def write(self, start: int, feats: dict[str, np.ndarray]) -> None:
        for layer, rows in feats.items():
            self.maps[layer][start : start + len(rows)] = rows

    def commit(self, kept: int) -> None:
        for layer, rows in self.maps.items():
            if kept == len(rows):
                rows.flush()
                os.replace(self.tmp[layer], self.final[layer])
            else:
                write_atomic(self.final[layer], np.save, rows[:kept])

    def discard(self) -> None:
        self.maps = {}
        for tmp in self.tmp.values():
            tmp.unlink(missing_ok=True)


def read_shard(path: Path, key: str) -> np.ndarray:
    """One array of a shard: ``kept``, ``bad_rows``, ``bad_reasons``, or ``f_<layer>``.

    Features come memory-mapped (read-only) from their ``.npy`` file.
    """
    if key.startswith("f_"):
        return np.load(feature_file(path, key[2:]), mmap_mode="r", allow_pickle=False)
    with np.load(path, allow_pickle=False) as z:
        return z[key]


@dataclass
class PreparedBatch:
    """One batch, decoded and preprocessed.

    ``tensor`` is None when every image was bad; ``where`` are the shard positions of its
    images, ``bad`` and ``reasons`` the table rows of the bad ones and why.
    """

    tensor: object
    where: list[int]
    bad: list[int]
    reasons: list[str]


def prepare_batch(extractor: Extractor, task: dict, positions: range) -> PreparedBatch:
    """Decode and preprocess the shard's images at ``positions``.

    An unreadable image raises :class:`BadImageError` unless ``task["skip_bad"]``.
    """
    from mmdtl2_dist.extract.model import decode_image

    images, batch = [], PreparedBatch(None, [], [], [])
    for k in positions:
        try:
            images.append(decode_image(task["paths"][k]))
            batch.where.append(k)
        except BadImageError as exc:
            if not task["skip_bad"]:
                raise
            batch.bad.append(int(task["rows"][k]))
            batch.reasons.append(exc.reason)
    batch.tensor = extractor.tensor(images) if images else None
    return batch


def prepared_ahead(extractor: Extractor, task: dict):
    """The shard's batches in order, each prepared on a second thread meanwhile.

    While the caller runs the model on one batch, the thread decodes and preprocesses the
    next: on CPU that is about a sixth of a batch's time, beside a GPU's forward pass most
    of it. No bit changes: the same images go through the same transform in the same
    batches. The thread uses the caller's torch thread count, so a one-thread worker
    stays at one thread per stage.
    """
    import torch

    size = int(task["batch_size"])
    starts = range(0, len(task["paths"]), size)
    spans = [range(b0, min(b0 + size, len(task["paths"]))) for b0 in starts]
    if not spans:
        return
    with ThreadPoolExecutor(1, initializer=torch.set_num_threads,
                            initargs=(torch.get_num_threads(),)) as pool:  # fmt: skip
        ahead = pool.submit(prepare_batch, extractor, task, spans[0])
        for following in [*spans[1:], None]:
            batch = ahead.result()
            if following is not None:
                ahead = pool.submit(prepare_batch, extractor, task, following)
            yield batch


def run_shard(extractor: Extractor, task: dict) -> dict:
    """Extract one shard (see the module docstring) and write its file.

    ``task``: ``paths`` and ``rows`` (table rows) of the images, ``file``, ``batch_size``,
    ``skip_bad``. An unreadable image raises :class:`BadImageError` unless ``skip_bad``.
    Returns a summary: ``file``, ``n``, ``kept``, ``bad`` and ``seconds``.
    """
    t0 = time.perf_counter()
    task = {**task, "paths": list(task["paths"]), "rows": np.asarray(task["rows"], np.int64)}
    n = len(task["paths"])
    dims = {layer: extractor.dims[layer] for layer in extractor.spec.layers}
    files = FeatureFiles(Path(task["file"]), dims, n)
    kept, bad, reasons = [], [], []
    try:
        for batch in prepared_ahead(extractor, task):
            bad += batch.bad
            reasons += batch.reasons
            if batch.tensor is not None:
                files.write(len(kept), extractor.forward(batch.tensor))
                kept += [int(task["rows"][k]) for k in batch.where]
        files.commit(len(kept))  # the .npz last: its existence marks the shard finished
    finally:
        files.discard()
    arrays = {
        "kept": np.asarray(kept, np.int64),
        "bad_rows": np.asarray(bad, np.int64),
        "bad_reasons": np.asarray(reasons, dtype=str),
    }
    write_atomic(Path(task["file"]), _savez, arrays)
    return {
        "file": task["file"],
        "n": n,
        "kept": len(kept),
        "bad": len(bad),
        "seconds": time.perf_counter() - t0,
    }


def deterministic_torch(device: str) -> None:
    """One thread per CPU worker and deterministic kernels: the same bits as a plain loop."""
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    if device == "cpu":
        torch.set_num_threads(1)
    else:
        torch.backends.cudnn.benchmark = False


class ShardWorker:
    """A Ray actor holding one extractor that runs shard after shard.

    It is given the driver's cut model (``state``, the tensors up to the last layer,
    through Ray's object store), not the weights' name: every worker computes with the
    very weights whose identity the driver recorded, no node needs the weights file or
    a download, and a worker holds only the layers it runs.
    """

    def __init__(self, spec: str, preprocessing: dict, state: dict, device: str):
        deterministic_torch(device)
        self.extractor = Extractor(
            ModelSpec.parse(spec), None, Preprocessing.from_dict(preprocessing), device, state
        )

    def run(self, task: dict) -> dict:
        return run_shard(self.extractor, task)
