"""The driver of a Gram job: plan, resume, run tasks on Ray, finish the store.

:func:`compute_gram` checks its arguments, claims the Gram's folder, then, holding the
Gram's lock (:func:`~mmdtl2_dist.engine.location.gram_lock`; a second call for the same
Gram waits for it, then uses the finished Gram), plans the job (:func:`_plan_job`), runs
its missing tiles (:func:`_run_job`) and records the run's summary (:func:`_compute`).

A complete Gram of the same store content, space, devices, preprocessing and precision
is verified and used as it is, whatever its tile size or the device that computed it; a
partial one is resumed with its own tiles and feature blocks (other ``tile_rows`` are
refused).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import zarr
from zarr.codecs import Crc32cCodec

from mmdtl2_dist.core.preprocessing import PREPROCESSING
from mmdtl2_dist.engine.gram_store import (
    GRAM_FORMAT,
    INDEX_FILE,
    JOB_FILE,
    TILES_DIR,
    GramStore,
)
from mmdtl2_dist.engine.in_process import IN_PROCESS
from mmdtl2_dist.engine.location import gram_location, gram_lock, make_gram_dir
from mmdtl2_dist.engine.plan import (
    DEFAULT_TASK_MEMORY_MB,
    choose_parts,
    choose_tile_rows,
    feature_blocks,
    gram_tile_plan,
    part_blocks,
    plan_summary,
    task_memory_bytes,
)
from mmdtl2_dist.engine.products import check_device, check_precision
from mmdtl2_dist.engine.running import JobRunner, run_job
from mmdtl2_dist.engine.timing import format_timing
from mmdtl2_dist.engine.verify import finish, forget_damaged
from mmdtl2_dist.progress import say
from mmdtl2_dist.store.atomic import write_json_atomic
from mmdtl2_dist.store.feature_store import FeatureStore
from mmdtl2_dist.store.outputs import OutputKind, StagedOutput, claim_output

#: What a Gram's values depend on: a complete Gram that matches them is used as it is.
_GRAM_KEYS = (
    "store_fingerprint",
    "space",
    "devices",
    "n_rows",
    "n_features",
    "preprocessing",
    "precision",
)
#: The value of a key that job.json files written without it hold.
_KEY_DEFAULTS = {"precision": "float64", "parts": 1}
#: A partial Gram is resumed only with the same plan (tiles, feature blocks, parts) as well.
_JOB_KEYS = (*_GRAM_KEYS, "tile_rows", "col_blocks", "parts")


def _gram_identity(
    fs: FeatureStore, space: str, devices: list, preprocessing: str, precision: str = "float64"
) -> dict:
    """The values of :data:`_GRAM_KEYS` for a Gram of ``fs`` (and the row offsets)."""
    sizes = [fs.shape(d, space)[0] for d in devices]
    return {
        "store_fingerprint": fs.fingerprint,
        "space": space,
        "devices": devices,
        "offsets": [int(x) for x in np.concatenate([[0], np.cumsum(sizes)])],
        "n_rows": int(sum(sizes)),
        "n_features": int(fs.shape(devices[0], space)[1]),
        "preprocessing": preprocessing,
        "precision": precision,
    }


def _stored(job: dict, key: str):
    """``job[key]`` of a stored job.json (the default for keys older stores lack)."""
    return job.get(key, _KEY_DEFAULTS.get(key))


def _job_spec(
    fs: FeatureStore,
    space,
    devices,
    preprocessing,
    tile_rows,
    col_blocks,
    precision="float64",
    parts=1,
) -> dict:
    """The job.json of a Gram job: its identity, its plan and its state."""
    return {
        "format": GRAM_FORMAT,
        "store": str(fs.path),
        **_gram_identity(fs, space, devices, preprocessing, precision),
        "tile_rows": int(tile_rows),
        "col_blocks": [list(b) for b in col_blocks],
        "parts": int(parts),
        "stats_done": preprocessing == "none",
        "complete": False,
    }


GRAM_OUTPUT = OutputKind(
    "Gram store", is_dir=True, recognise=lambda path: (path / JOB_FILE).is_file()
)


def _create_skeleton(out: Path, job: dict, fs: FeatureStore) -> None:
    """Create an empty Gram store atomically (a partial skeleton is never visible)."""
    with StagedOutput(out) as tmp:
        root = zarr.open_group(str(tmp), mode="w-")
        n, t = job["n_rows"], job["tile_rows"]
        root.create_array(
            "gram",
            shape=(n, n),
            chunks=(t, t),
            dtype=np.float64,
            compressors=[Crc32cCodec()],
            fill_value=np.nan,
        )
        (tmp / TILES_DIR).mkdir()
        meta = fs.metadata[fs.metadata["space"] == job["space"]]
        parts = [meta[meta["device"] == d].sort_values("row") for d in job["devices"]]
        index = pd.concat(parts, ignore_index=True).drop(columns=["space"])
        index.insert(0, "gram_row", np.arange(len(index), dtype=np.int64))
        index.to_parquet(tmp / INDEX_FILE, index=False)
        write_json_atomic(tmp / JOB_FILE, job)


def _check_resumable(out: Path, job: dict) -> dict:
    old = json.loads((out / JOB_FILE).read_text())
    for key, value in _KEY_DEFAULTS.items():
        old.setdefault(key, value)
    diff = {k: (_stored(old, k), job[k]) for k in _JOB_KEYS if _stored(old, k) != job[k]}
    if diff:
        shown = {k: v for k, v in diff.items() if k != "col_blocks"}
        raise ValueError(
            f"{out} holds a Gram job with other parameters ({shown or sorted(diff)}: stored vs "
            "requested); pass the same arguments to resume it, or another out_path (or delete "
            "it) to start anew."
        )
    return old


@dataclass(frozen=True)
class GramRun:
    """How a Gram job's tasks run (the execution arguments of :func:`compute_gram`).

    Attributes
    ----------
    address : str or None
        Ray cluster address (``"auto"``, ``"ray://host:10001"``); ``None``: the running
        Ray session if any, else a new local one (stopped on return).
        :data:`~mmdtl2_dist.engine.in_process.IN_PROCESS` runs the tasks in this process
        without Ray (small data; same bits).
    num_cpus : int or None
        CPUs of a new local Ray (default: all).
    gpus : int
        GPUs to run tiles on: each tile task asks Ray for one GPU and runs its products
        with torch on ``"cuda"``; a new local Ray is started with this many GPUs.
    device : str or None
        The torch device of the tiles (``"cuda"``, ``"cuda:1"``, or ``"cpu"``: torch on
        the CPU, the GPU code path without a GPU); ``None``: numpy on the CPU.
        :meth:`checked` sets ``"cuda"`` with ``gpus``. Torch is imported only for these.
    max_task_memory_mb : float
        Memory bound of one task; sets the feature block width and is requested from Ray
        as the task's ``memory`` resource.
    max_retries : int
        Retries of a task whose worker died.
    max_in_flight : int or None
        Most tasks submitted at once (default: all); bounds the cluster's concurrent
        memory use and lets one job share a cluster.
    progress : bool or None
        Progress lines on stderr (:mod:`mmdtl2_dist.progress`); ``None``: when stderr is a
        terminal.
    """

    address: str | None = None
    num_cpus: int | None = None
    gpus: int = 0
    device: str | None = None
    max_task_memory_mb: float = DEFAULT_TASK_MEMORY_MB
    max_retries: int = 3
    max_in_flight: int | None = None
    progress: bool | None = None

    @property
    def on_gpu(self) -> bool:
        """Whether the tiles run on a CUDA device (sizes the tiles and their memory)."""
        return self.device is not None and self.device.startswith("cuda")

    @classmethod
    def checked(cls, **options) -> GramRun:
        """The options with the tiles' device resolved and checked (:func:`_tile_device`)."""
        run = cls(**options)
        device = _tile_device(run.gpus, run.device, run.address)
        return replace(run, gpus=int(run.gpus), device=device)


def compute_gram(
    store_path: str | os.PathLike,
    space: str,
    out_path: str | os.PathLike | None = None,
    *,
    gram_dir: str | os.PathLike | None = None,
    preprocessing: str = "none",
    precision: str = "float64",
    tile_rows: int | None = None,
    feature_parts: int | None = None,
    address: str | None = None,
    max_task_memory_mb: float = DEFAULT_TASK_MEMORY_MB,
    progress: bool | None = None,
    num_cpus: int | None = None,
    gpus: int = 0,
    device: str | None = None,
    max_retries: int = 3,
    max_in_flight: int | None = None,
) -> GramStore:
    """Compute the linear Gram of one feature space over all its samples, on Ray.

    ``G = Z Zᵀ`` where ``Z`` stacks the preprocessed rows of every device that has
    features in ``space`` (devices in sorted order). Tiles of the upper triangle are Ray
    tasks that read row ranges of the Zarr arrays, accumulate in float64 over feature
    blocks in a fixed order, and each write one whole Gram chunk and a completion marker.
    Results are bit-identical whatever the number of workers and retries (on one kind of
    device: numpy, or torch on one device type). Reuse, resumption and locking: the
    module docstring.

    Parameters
    ----------
    store_path : str or Path
        Feature store.
    space : str
        Feature space.
    out_path : str or Path, optional
        The Gram store's exact folder. Default: ``<gram_dir>/<key>``
        (:func:`~mmdtl2_dist.engine.location.gram_location`), where every study on the
        same store content, space, preprocessing and precision finds it. A missing path
        or an empty directory is created; a Gram store there is resumed or re-checked:
        finished tiles are verified (checksums, and the CRC32C recorded when written) and
        skipped, damaged ones are recomputed and named on stderr and in
        ``last_run["repaired"]``. Anything else at the path is refused.
    gram_dir : str or Path, optional
        The Gram folder (default ``<store>.grams`` beside the store); not with ``out_path``.
    preprocessing : {"none", "l2", "zscore", "l2_zscore"}
        Applied per device with statistics over all that device's samples
        (:mod:`mmdtl2_dist.core.preprocessing`); the statistics are stored.
    precision : {"float64", "mixed"}
        ``"float64"``: the exact Gram. ``"mixed"``: float32 block products accumulated in
        float64, with the error bound of :mod:`mmdtl2_dist.engine.products`; a mixed
        Gram has its own key and is never used where the exact one is asked for.
    tile_rows, feature_parts : int, optional
        The plan (:mod:`mmdtl2_dist.engine.plan`): rows per tile (default up to 2,048,
        fitting ``max_task_memory_mb``) and tasks per tile, each summing a part of the
        features (default 1, or enough for every worker when tiles are fewer). The last
        bits depend on the plan: give both for the same bits on any cluster.
    address, max_task_memory_mb, progress, num_cpus, gpus, device, max_retries, max_in_flight
        How the tasks run: the fields of :class:`GramRun` (``device`` defaults to
        ``"cuda"`` with ``gpus``).

    Returns
    -------
    GramStore
        The finished store; ``last_run`` says how many tiles this call computed, skipped
        and repaired, and where their time went (``timing``,
        :func:`~mmdtl2_dist.engine.timing.summarize_timing`); ``reused`` is true when it
        found the Gram complete and intact.
    """
    _check_gram_arguments(preprocessing, precision, out_path, gram_dir)
    run = GramRun.checked(
        address=address, num_cpus=num_cpus, gpus=gpus, device=device,
        max_task_memory_mb=max_task_memory_mb, max_retries=max_retries,
        max_in_flight=max_in_flight, progress=progress,
    )  # fmt: skip
    fs = FeatureStore.open(store_path)
    out = _gram_output(fs, space, out_path, gram_dir, preprocessing, precision)
    with gram_lock(out, progress):
        asked = (tile_rows, feature_parts)
        return _compute(fs, space, out, preprocessing, precision, asked, run)


def _check_gram_arguments(preprocessing: str, precision: str, out_path, gram_dir) -> None:
    """Refuse an unknown preprocessing or precision, or both ``out_path`` and ``gram_dir``."""
    if preprocessing not in PREPROCESSING:
        raise ValueError(f"preprocessing must be one of {PREPROCESSING}, got {preprocessing!r}.")
    check_precision(precision)
    if out_path is not None and gram_dir is not None:
        raise ValueError("give out_path (an exact Gram folder) or gram_dir, not both.")


def _gram_output(fs: FeatureStore, space, out_path, gram_dir, preprocessing, precision) -> Path:
    """The Gram store's folder, claimed (our own Gram is resumed, nothing else touched)."""
    if out_path is None:
        out = gram_location(fs, space, preprocessing, gram_dir, precision)
    else:
        out = Path(out_path).expanduser().absolute()
    claim_output(out, GRAM_OUTPUT, overwrite=None)
    make_gram_dir(out.parent)
    return out


def _tile_device(gpus: int, device: str | None, address: str | None) -> str | None:
    """The torch device of the tiles (None: numpy), checked where it can be here.

    On a local run torch must import here; a cluster's workers may have it when the
    driver does not (their tasks then name the missing package themselves).
    """
    if int(gpus) < 0:
        raise ValueError(f"gpus must be 0 or more, got {gpus}.")
    if gpus and device not in (None, "cuda", "cuda:0"):
        raise ValueError(
            f"with gpus, each tile task sees only the GPU Ray gives it (as 'cuda'); leave "
            f"device out or set it to 'cuda', not {device!r}."
        )
    if device is None and gpus:
        device = "cuda"
    if device is None:
        return None
    if address is None or address == IN_PROCESS:
        check_device(device)
    return str(device)


def _complete_gram_of(stored: dict | None, fs: FeatureStore, space, devices, prep, precision):
    """Whether ``stored`` (a job.json) is a complete Gram of these values, any tile size."""
    if not stored or not stored.get("complete"):
        return False
    want = _gram_identity(fs, space, devices, prep, precision)
    return all(_stored(stored, k) == want[k] for k in _GRAM_KEYS)


def _plan_job(fs: FeatureStore, space, out, preprocessing, precision, asked, run, workers):
    """The job of the Gram at ``out``: stored (resumed, re-checked) or new.

    ``asked`` is the plan asked for, ``(tile_rows, feature_parts)`` (None: chosen here;
    a stored job keeps its own). ``workers()`` says how many tasks run at once; it is
    called only to plan a new job. Returns ``(job, stored)``: the job to run and whether
    ``out`` held one already.
    """
    tile_rows, parts = asked
    devices = fs.devices_in(space)
    arr0 = fs.array(devices[0], space)
    itemsize = arr0.dtype.itemsize
    n_rows = sum(fs.shape(d, space)[0] for d in devices)
    n_features = fs.shape(devices[0], space)[1]
    chunk_rows, chunk_cols = arr0.chunks
    stored = json.loads((out / JOB_FILE).read_text()) if (out / JOB_FILE).exists() else None
    if _complete_gram_of(stored, fs, space, devices, preprocessing, precision):
        # used as it is, whatever plan was asked for
        tile_rows, parts = stored["tile_rows"], _stored(stored, "parts")
    budget, gpu, prep = run.max_task_memory_mb, run.on_gpu, preprocessing != "none"
    if stored:  # resume with the stored plan (same summation order, same bits)
        tile_rows = stored["tile_rows"] if tile_rows is None else tile_rows
        parts = _stored(stored, "parts") if parts is None else parts
        col_blocks = [tuple(b) for b in stored["col_blocks"]]
        span = max(c1 - c0 for c0, c1 in col_blocks)
        need = task_memory_bytes(tile_rows, span, itemsize, gpu, prep)
        if need > budget * 2**20 and stored.get("tile_rows") == tile_rows:
            raise ValueError(
                f"resuming {out} needs {need / 2**20:.0f} MB per task (its feature blocks of "
                f"{span}); raise max_task_memory_mb or start anew in another out_path."
            )
    else:
        if tile_rows is None:
            tile_rows = choose_tile_rows(
                n_rows, chunk_rows, chunk_cols, budget, itemsize, gpu, prep
            )
        col_blocks = feature_blocks(n_features, chunk_cols, tile_rows, budget, itemsize, gpu, prep)
        if parts is None:
            n_tiles = len(gram_tile_plan(n_rows, tile_rows))
            parts = choose_parts(n_tiles, len(col_blocks), workers())
        part_blocks(col_blocks, parts)  # refuses more parts than feature blocks
    job = _job_spec(fs, space, devices, preprocessing, tile_rows, col_blocks, precision, parts)
    if stored:
        return _check_resumable(out, job), True
    _create_skeleton(out, job, fs)
    return job, False


def _compute(fs: FeatureStore, space, out: Path, preprocessing, precision, asked, run):
    """Create, resume or re-check the Gram job at ``out`` and run its missing tiles.

    The caller holds the Gram's lock. Ray starts (or is connected) only when there is
    something to compute, or a new job to plan for the cluster's workers.
    """
    runner = JobRunner(run)
    try:
        job, stored = _plan_job(
            fs, space, out, preprocessing, precision, asked, run, runner.workers
        )
        t_start = time.monotonic()
        tiles = gram_tile_plan(job["n_rows"], job["tile_rows"])
        repaired = forget_damaged(out, job, tiles, run.progress) if stored else []
        if job.get("complete"):
            gs = GramStore.open(out)
            gs.reused = True
            gs.last_run = {"computed": 0, "skipped": len(tiles), "verified": len(tiles)}
            gs.last_run["seconds"] = time.monotonic() - t_start
            return gs
        result = run_job(runner.ray(), fs, job, out, tiles, run)
    finally:
        runner.close()
    finish(out, job, tiles)
    job["complete"] = True
    result["repaired"] = repaired + result["repaired"]
    job["last_run"] = _run_summary(job, tiles, result, run, time.monotonic() - t_start)
    write_json_atomic(out / JOB_FILE, job)
    say(run.progress, f"gram {space}: {format_timing(result['timing'])}")
    return GramStore.open(out)


def _run_summary(job: dict, tiles, result: dict, run: GramRun, seconds: float) -> dict:
    """The ``last_run`` record of a finished job.

    Tiles computed, skipped and repaired, parts computed and resumed, the wall time, the
    plan's size and the tasks' timing.
    """
    parts = _stored(job, "parts")
    return {
        "computed": result["computed"],
        "skipped": len(tiles) - result["computed"],
        "parts_computed": result["parts_computed"],
        "parts_resumed": result["parts_resumed"],
        "seconds": seconds,
        "repaired": result["repaired"],
        "device": run.device or "numpy",
        **plan_summary(job["n_rows"], job["n_features"], tiles, job["col_blocks"], parts),
        "timing": result["timing"],
    }
