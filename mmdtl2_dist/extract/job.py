"""``mmdtl2 extract``: images -> CNN features -> a feature store, on Ray.

The job (:func:`extract`):

1. reads the image table (:mod:`.inputs`), loads the model once in the driver for the
   weights' identity and the feature widths, and checks the output path
   (:func:`~mmdtl2_dist.store.outputs.claim_output`) before any work;
2. splits each device's images into *shards* of consecutive images and keeps its work in
   ``<store>.extracting/`` beside the store: ``job.json`` (what is being extracted),
   ``images.parquet`` (the table) and the files of each finished shard (:mod:`.shards`);
3. runs the missing shards on Ray actors (:class:`~.shards.ShardWorker`: one per CPU,
   one thread each; with ``gpus`` one per GPU), each given the driver's model cut after
   the layers once (through Ray's object store), with progress lines (images done,
   images/s);
4. fills the store from the shard files (memory-mapped, a band in memory at a time),
   atomically (:class:`~mmdtl2_dist.store.feature_store.StoreWriter`), with the
   extraction's provenance (model, layers, weights name and SHA-256, preprocessing,
   versions) in its root attribute, then deletes the work folder. Without ``skip_bad``
   every image is kept, so the store's arrays are created up front and filled by a
   background thread while the shards run (:class:`~.store_fill.StreamedStore`); with
   ``skip_bad`` the rows kept are known only at the end, and the store is written after
   the shards (:class:`~.store_fill.StoreAfter`). Both give the same bytes.

A job killed at any point is resumed by running the same command again: finished shards
are kept (a shard file is written atomically), the others are computed. The work folder
must describe the same images (paths, labels, sizes and modification times), model,
weights and preprocessing; otherwise the run is refused with the differences, and
``restart=True`` (``--restart``) discards the unfinished work. Two runs for the same
store exclude each other (an advisory lock in the work folder).

Results are deterministic on CPU: each worker runs torch with one thread and
deterministic algorithms, and a shard's features are the same bits as a plain
single-process loop over the same images gives.

Unreadable images (missing, truncated, not an image) stop the job with the path and the
reason, unless ``skip_bad``: then they are left out of the store and listed in its side
file ``skipped_images.csv`` (path, device, reason) and counted in its provenance.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mmdtl2_dist.extract.inputs import ImageTable
from mmdtl2_dist.extract.model import BadImageError, Extractor, ModelSpec, Preprocessing
from mmdtl2_dist.extract.shards import feature_file, shard_file
from mmdtl2_dist.extract.store_fill import StoreAfter, StoreJob, StreamedStore
from mmdtl2_dist.progress import Progress, say
from mmdtl2_dist.store.feature_store import FeatureStore
from mmdtl2_dist.store.layout import check_name
from mmdtl2_dist.store.locks import lock_at
from mmdtl2_dist.store.outputs import FEATURE_STORE, OutputKind, claim_output, make_output_folder

JOB_FORMAT = "mmdtl2-extract/1"
JOB_FILE = "job.json"
LOCK_FILE = ".lock"
IMAGES_FILE = "images.parquet"
SHARDS_DIR = "shards"
WORK_SUFFIX = ".extracting"
#: A shard holds at most this many bytes of features (and at most MAX_SHARD_ROWS images).
SHARD_BYTES = 64 << 20
MAX_SHARD_ROWS = 1024
#: What a shard's bits depend on: a resumed job must agree on all of them.
_JOB_KEYS = ("images", "model", "layers", "weights_sha256", "preprocessing", "shard_rows")


def _is_work_folder(path: Path) -> bool:
    """A work folder: its job file, or only the lock of a run killed before writing it."""
    try:
        return json.loads((path / JOB_FILE).read_text()).get("format") == JOB_FORMAT
    except (OSError, ValueError, AttributeError):
        pass
    try:
        return {p.name for p in path.iterdir()} == {LOCK_FILE}
    except OSError:
        return False


EXTRACT_WORK = OutputKind(
    "unfinished extraction", is_dir=True, recognise=_is_work_folder, replace_hint="--restart"
)


@dataclass(frozen=True)
class ExtractOptions:
    """How to run an extraction (see :func:`extract`)."""

    batch_size: int = 32
    shard_rows: int | None = None
    skip_bad: bool = False
    workers: int | None = None
    gpus: int = 0
    address: str | None = None
    space: str | None = None
    overwrite: bool = False
    restart: bool = False
    compression: str = "none"
    progress: bool | None = None


def work_folder(out: Path) -> Path:
    """Where the unfinished work of the store ``out`` is kept."""
    return out.with_name(out.name + WORK_SUFFIX)


def choose_shard_rows(dims: dict, batch_size: int, given: int | None) -> int:
    """Images per shard: whole batches, at most :data:`SHARD_BYTES` of features."""
    if given is not None:
        if given < 1:
            raise ValueError(f"shard size must be positive, got {given}.")
        return given
    per_image = 4 * sum(dims.values())
    rows = min(MAX_SHARD_ROWS, max(1, SHARD_BYTES // per_image))
    return max(batch_size, rows // batch_size * batch_size)


def space_names(spec: ModelSpec, space: str | None) -> dict[str, str]:
    """The store's space name of each layer (the layer's name, or ``space`` for one layer)."""
    if space is not None and len(spec.layers) != 1:
        raise ValueError("--space renames a single layer; leave it out with several layers.")
    names = {layer: space or layer for layer in spec.layers}
    for name in names.values():
        check_name("space", name)
    return names


def _job_spec(table: ImageTable, spec, ex: Extractor, pre: Preprocessing, shard_rows) -> dict:
    return {
        "format": JOB_FORMAT,
        "images": table.digest(),
        "model": spec.model,
        "layers": list(spec.layers),
        "weights": ex.identity.name,
        "weights_sha256": ex.identity.sha256,
        "preprocessing": pre.as_dict(),
        "shard_rows": int(shard_rows),
    }


def _open_work(work: Path, job: dict, table: ImageTable, restart: bool) -> tuple[bool, int]:
    """Claim and lock the work folder, then check its job or write it.

    Returns (resumed, the lock's file descriptor). The lock is taken before the job
    file is read or written, so a second run for the same store changes nothing.
    """
    claim_output(work, EXTRACT_WORK, overwrite=None)  # refuses a folder of other files
    work.mkdir(parents=True, exist_ok=True)
    fd = _lock(work)
    try:
        return _resume_or_start(work, job, table, restart), fd
    except BaseException:
        os.close(fd)
        raise


def _resume_or_start(work: Path, job: dict, table: ImageTable, restart: bool) -> bool:
    """True if ``work`` holds this job; else start it there (refused: other inputs)."""
    if (work / JOB_FILE).exists():
        old = json.loads((work / JOB_FILE).read_text())
        diff = sorted(k for k in _JOB_KEYS if old.get(k) != job[k])
        if not diff:
            return True
        if not restart:
            shown = {k: (old.get(k), job[k]) for k in diff if k != "images"}
            said = "the images (paths, labels, sizes or modification times)" * ("images" in diff)
            raise ValueError(
                f"{work} holds an unfinished extraction of other inputs ({said}"
                f"{'; ' if said and shown else ''}{shown or ''}: stored vs requested); run "
                "the same command to resume it, or pass --restart to discard it and start anew."
            )
        shutil.rmtree(work / SHARDS_DIR, ignore_errors=True)
    (work / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
    table.frame.to_parquet(work / IMAGES_FILE, index=False)
    tmp = work / f".{JOB_FILE}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(job, indent=1))
    os.replace(tmp, work / JOB_FILE)
    return False


def _lock(work: Path) -> int:
    """Lock the work folder for this run (:mod:`mmdtl2_dist.store.locks`); its descriptor."""
    path = work / LOCK_FILE
    return lock_at(
        path, "one store", "choose another output path, in a folder you can write.",
        busy=f"another `mmdtl2 extract` is writing this store (it holds {path}); wait for "
        "it to finish, or choose another output path.",
    )  # fmt: skip


def _plan(table: ImageTable, shard_rows: int, folder: Path) -> list[dict]:
    """Shards: consecutive images of one device, in device order."""
    frame, shards = table.frame, []
    for device in table.devices:
        rows = table.rows_of(device)
        for r0 in range(0, len(rows), shard_rows):
            part = rows[r0 : r0 + shard_rows]
            shards.append(
                {
                    "device": device,
                    "rows": part.tolist(),
                    "paths": frame["path"].to_numpy()[part].tolist(),
                    "file": str(shard_file(folder, len(shards))),
                    "index": len(shards),
                }
            )
    return shards


def _finished(shard: dict, layers) -> bool:
    """A shard whose ``.npz`` opens is finished (renamed into place whole, after its features)."""
    path = Path(shard["file"])
    if not path.exists():
        return False
    try:
        with np.load(path, allow_pickle=False) as z:
            return "kept" in z.files and all(feature_file(path, x).is_file() for x in layers)
    except Exception:  # noqa: BLE001 - a damaged file: redo the shard
        path.unlink(missing_ok=True)
        return False


def _clear_temporaries(folder: Path) -> None:
    """Delete half-written shard files of killed runs (this run holds the lock)."""
    for p in folder.glob(".*.tmp-*"):
        p.unlink(missing_ok=True)


def _missing_files(table: ImageTable) -> list[str]:
    return [p for p in table.frame["path"] if not os.path.isfile(p)]


def _refuse_missing(missing: list[str]) -> None:
    listed = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    raise ValueError(
        f"{len(missing)} image(s) do not exist: {listed}; correct the paths (a manifest's "
        "relative paths start at its folder), or pass --skip-bad to leave them out."
    )


def _checked_request(out: Path, table: ImageTable, spec: ModelSpec, opt) -> dict[str, str]:
    """The space name of each layer, once the request is checked before any work.

    Refused: a batch size below 1, fewer than one worker or GPU when they are counted
    (Ray would wait forever for a worker it cannot place), names the store cannot hold,
    an output path that is not ours to write, missing images (unless ``skip_bad``).
    """
    if opt.batch_size < 1:
        raise ValueError(f"batch size must be positive, got {opt.batch_size}.")
    if opt.workers is not None and opt.workers < 1:
        raise ValueError(
            f"--workers must be at least 1, got {opt.workers}; leave it out for one worker "
            "per CPU of the cluster."
        )
    if opt.gpus < 0:
        raise ValueError(
            f"--gpus must be a number of GPUs, got {opt.gpus}; leave it out (or 0) to run "
            "on CPU workers."
        )
    spaces = space_names(spec, opt.space)
    for device in table.devices:
        check_name("device", device)
    claim_output(out, FEATURE_STORE, overwrite=opt.overwrite)
    missing = _missing_files(table)
    if missing and not opt.skip_bad:
        _refuse_missing(missing)
    return spaces


def extract(
    out: str | os.PathLike,
    table: ImageTable,
    spec: ModelSpec,
    weights: str,
    preprocessing: Preprocessing | None = None,
    options: ExtractOptions | None = None,
) -> FeatureStore:
    """Extract features of ``table``'s images into a new feature store at ``out``.

    Parameters
    ----------
    out : str or Path
        Directory of the store (claimed as :class:`StoreWriter` does).
    table : ImageTable
        The images (:func:`~mmdtl2_dist.extract.inputs.read_images`).
    spec : ModelSpec
        Model and layers; each layer becomes a feature space.
    weights : str
        ``imagenet``, ``random:SEED`` or a state-dict path
        (:func:`~mmdtl2_dist.extract.model.load_model`).
    preprocessing : Preprocessing, optional
        Default: resize 256, centre crop 224, ImageNet normalisation.
    options : ExtractOptions, optional
        Batch and shard sizes, workers, GPUs, Ray address, ``skip_bad``...

    Returns
    -------
    FeatureStore
        The new store; its ``last_run`` attribute says how many shards were computed and
        how many resumed, the seconds of the run, those the workers spent in shards, those
        spent writing the store (``store_seconds``) and, of these, those after the last
        shard finished (``store_after_workers_seconds``).
    """
    pre = preprocessing or Preprocessing()
    opt = options or ExtractOptions()
    out = Path(out).expanduser().absolute()
    spaces = _checked_request(out, table, spec, opt)
    ex = Extractor(spec, weights, pre)  # fails early on a bad model, layer or weights file
    _warn_if_random(ex)
    shard_rows = choose_shard_rows(ex.dims, opt.batch_size, opt.shard_rows)
    job = _job_spec(table, spec, ex, pre, shard_rows)
    work = work_folder(out)
    make_output_folder(work.parent, out)
    resumed, fd = _open_work(work, job, table, opt.restart)
    try:
        _clear_temporaries(work / SHARDS_DIR)
        shards = _plan(table, shard_rows, work / SHARDS_DIR)
        todo = [s for s in shards if not _finished(s, spec.layers)]
        if resumed:
            say(
                opt.progress,
                f"extract: resuming {work}: {len(shards) - len(todo)} of "
                f"{len(shards)} shards already done",
            )
        t0 = time.monotonic()
        target = StoreJob(
            out, table, shards, spaces, ex, pre, opt.overwrite, opt.compression, opt.progress
        )
        with _store_fill(target, todo, opt) as fill:
            busy = _run_shards(todo, shards, spec, pre, ex, opt, fill.shard_done) if todo else 0.0
            fs = fill.finish()
        shutil.rmtree(work, ignore_errors=True)  # under the lock: no run finds it half gone
    finally:
        os.close(fd)
    fs.last_run = {
        "shards": len(shards),
        "computed": len(todo),
        "resumed": len(shards) - len(todo),
        "seconds": time.monotonic() - t0,
        "images_computed": sum(len(s["rows"]) for s in todo),
        "worker_seconds": busy,
        "store_seconds": fill.seconds,
        "store_after_workers_seconds": fill.after_workers_seconds,
    }
    return fs


def _warn_if_random(ex: Extractor) -> None:
    """Say, whatever the progress setting, that random weights make a store of noise."""
    if not ex.identity.meaningful:
        warnings.warn(
            f"weights {ex.identity.name} are random: the features mean nothing (for tests "
            "and demos only; pass --weights imagenet or a state-dict path for real features)",
            UserWarning,
            stacklevel=3,
        )


def _store_fill(job: StoreJob, todo: list[dict], opt: ExtractOptions):
    """The store is filled while the shards run, unless ``skip_bad`` leaves its size open."""
    if opt.skip_bad:
        return StoreAfter(job)
    finished = sorted({s["index"] for s in job.shards} - {s["index"] for s in todo})
    return StreamedStore(job, finished)


def _workers(ray, opt: ExtractOptions, n_todo: int) -> tuple[int, dict, str]:
    """How many actors, their resource options and their torch device."""
    if opt.gpus:
        have = int(ray.cluster_resources().get("GPU", 0))
        if have < opt.gpus:
            raise ValueError(
                f"--gpus {opt.gpus} asks for {opt.gpus} GPU(s) but the Ray cluster has {have}; "
                "leave --gpus out to run on CPU workers, or connect to a cluster with GPUs "
                "(--address)."
            )
        return min(opt.gpus, n_todo), {"num_cpus": 1, "num_gpus": 1}, "cuda"
    cpus = opt.workers or int(ray.cluster_resources().get("CPU", 1))
    return max(1, min(cpus, n_todo)), {"num_cpus": 1}, "cpu"


def _run_shards(todo, shards, spec, pre, ex, opt: ExtractOptions, on_done) -> float:
    """Run the shards ``todo`` on Ray actors; return the seconds the workers spent in them.

    ``on_done(index)`` is called with each shard's index as soon as it is finished.
    """
    from mmdtl2_dist.engine import ensure_ray
    from mmdtl2_dist.extract.shards import ShardWorker

    ray, owned = ensure_ray(opt.address, opt.workers)
    try:
        n, resources, device = _workers(ray, opt, len(todo))
        cls = ray.remote(ShardWorker).options(**resources)
        state = ray.put(ex.cut_state())
        actors = [cls.remote(str(spec), pre.as_dict(), state, device) for _ in range(n)]
        total = sum(len(s["rows"]) for s in shards)
        before = total - sum(len(s["rows"]) for s in todo)
        bar = Progress("extract", total, unit="images", done=before, enabled=opt.progress)
        bar.say(
            f"extract: {len(todo)} shard(s) of up to {len(todo[0]['rows'])} images on {n} "
            f"{device.upper()} worker(s)"
        )
        return _dispatch(ray, actors, todo, opt, bar, before, on_done)
    finally:
        if owned:
            ray.shutdown()


def _dispatch(ray, actors, todo, opt: ExtractOptions, bar: Progress, before: int, on_done):
    """Give each idle actor the next shard until all are done; a task's error is raised.

    Each finished shard's index goes to ``on_done``, which must not wait (a write would
    keep the idle actors waiting for their next shard).

    Returns the seconds the actors spent in the shards (decoding, model, writing).
    """
    queue, idle, pending, busy = list(todo), list(actors), {}, 0.0
    task = {"batch_size": opt.batch_size, "skip_bad": opt.skip_bad}
    while queue or pending:
        while queue and idle:
            actor, shard = idle.pop(), queue.pop(0)
            pending[actor.run.remote({**task, **shard})] = actor, shard["index"]
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=2.0)
        for ref in ready:
            actor, index = pending.pop(ref)
            idle.append(actor)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, BadImageError):
                    raise ValueError(
                        f"{cause}; replace or remove it, or pass --skip-bad to leave unreadable "
                        "images out (finished shards are kept: the next run resumes)."
                    ) from None
                raise (cause if isinstance(cause, Exception) else exc) from None
            on_done(index)
            busy += result["seconds"]
            done = bar.done + result["n"]
            rate = (done - before) / max(bar.elapsed(), 1e-9)
            bar.update(done, f"{rate:.1f} images/s")
        if not ready:
            bar.update(bar.done)
    return busy
