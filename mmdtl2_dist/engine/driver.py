"""The driver of a Gram job: plan, resume, run tasks on Ray, finish the store."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import zarr
from zarr.codecs import Crc32cCodec

from mmdtl2_dist.core.preprocessing import PREPROCESSING, PreprocessStats
from mmdtl2_dist.engine import tasks
from mmdtl2_dist.engine.gram_store import (
    GRAM_FORMAT,
    INDEX_FILE,
    JOB_FILE,
    TILES_DIR,
    GramStore,
)
from mmdtl2_dist.engine.in_process import IN_PROCESS, InProcessTasks
from mmdtl2_dist.engine.location import gram_location, gram_lock, make_gram_dir
from mmdtl2_dist.engine.plan import (
    DEFAULT_TASK_MEMORY_MB,
    choose_tile_rows,
    feature_blocks,
    gram_tile_plan,
    plan_summary,
    task_memory_bytes,
)
from mmdtl2_dist.progress import Progress, say
from mmdtl2_dist.store.feature_store import FeatureStore
from mmdtl2_dist.store.outputs import OutputKind, StagedOutput, claim_output

#: What a Gram's values depend on: a complete Gram that matches them is used as it is.
_GRAM_KEYS = ("store_fingerprint", "space", "devices", "n_rows", "n_features", "preprocessing")
#: A partial Gram is resumed only with the same tiles and feature blocks as well.
_JOB_KEYS = (*_GRAM_KEYS, "tile_rows", "col_blocks")


def _gram_identity(fs: FeatureStore, space: str, devices: list, preprocessing: str) -> dict:
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
    }


def _job_spec(fs: FeatureStore, space, devices, preprocessing, tile_rows, col_blocks) -> dict:
    return {
        "format": GRAM_FORMAT,
        "store": str(fs.path),
        **_gram_identity(fs, space, devices, preprocessing),
        "tile_rows": int(tile_rows),
        "col_blocks": [list(b) for b in col_blocks],
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
        tasks.write_json_atomic(tmp / JOB_FILE, job)


def _check_resumable(out: Path, job: dict) -> dict:
    old = json.loads((out / JOB_FILE).read_text())
    diff = {k: (old.get(k), job[k]) for k in _JOB_KEYS if old.get(k) != job[k]}
    if diff:
        shown = {k: v for k, v in diff.items() if k != "col_blocks"}
        raise ValueError(
            f"{out} holds a Gram job with other parameters ({shown or sorted(diff)}: stored vs "
            "requested); pass the same arguments to resume it, or another out_path (or delete "
            "it) to start anew."
        )
    return old


def _task_runner(address: str | None, num_cpus: int | None):
    """Where the Gram's tasks run: this process (``address=IN_PROCESS``), else Ray.

    Returns ``(runner, owned)`` as :func:`ensure_ray` does; the in-process runner answers
    the same calls (:mod:`mmdtl2_dist.engine.in_process`).
    """
    if address == IN_PROCESS:
        return InProcessTasks(), False
    return ensure_ray(address, num_cpus)


def ensure_ray(address: str | None, num_cpus: int | None):
    """Connect to Ray (a running session, the given cluster or a new local one).

    Returns ``(ray, owned)``: ``owned`` is True when this call connected or started Ray,
    so the caller shuts it down when done. A new local Ray is guarded by the watchdog of
    :mod:`mmdtl2_dist.engine.ray_watchdog`.
    """
    import ray

    if ray.is_initialized():
        return ray, False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Workers must import this package even when it is not installed (a source checkout).
    pkg_root = str(Path(__file__).resolve().parents[2])
    env = {
        "env_vars": {
            "PYTHONPATH": os.pathsep.join(
                p for p in (pkg_root, os.environ.get("PYTHONPATH", "")) if p
            )
        }
    }
    if address is None:
        watchdog = _start_watchdog(ray)
        try:
            ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                runtime_env=env,
            )
        except BaseException:
            _dismiss_watchdog()  # it stops whatever the failed start left running
            raise
        _announce_session(watchdog)
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    return ray, True


_WATCHDOG_SCRIPT = Path(__file__).with_name("ray_watchdog.py")
_watchdog: subprocess.Popen | None = None


def _start_watchdog(ray) -> subprocess.Popen | None:
    """Start the process that stops this local Ray's processes if this process dies.

    See :mod:`mmdtl2_dist.engine.ray_watchdog`. It runs in a session of its own and is
    dismissed (its input closed) when the next local Ray starts or this process exits.
    Returns None (and Ray starts unguarded) if it cannot start.
    """
    global _watchdog
    _dismiss_watchdog()  # the previous local Ray, if any, has been shut down
    cmd = [sys.executable, "-I", str(_WATCHDOG_SCRIPT), str(os.getpid())]
    proc = subprocess.Popen(
        [*cmd, str(Path(ray.__file__).parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    # Wait until it knows this process's existing children: Ray's must come after.
    ready, _, _ = select.select([proc.stdout], [], [], 30.0)
    if not ready or proc.stdout.readline().strip() != b"ready":
        proc.kill()
        proc.wait()
        return None
    proc.stdout.close()
    _watchdog = proc
    return proc


def _dismiss_watchdog() -> None:
    """Close the watchdog's input: it stops what is left of its session and exits."""
    global _watchdog
    if _watchdog is not None:
        _watchdog.stdin.close()
        _watchdog = None


def _announce_session(watchdog: subprocess.Popen | None) -> None:
    """Tell the watchdog the Ray session directory (it finds the session's orphans)."""
    if watchdog is None:
        return
    try:
        import ray._private.worker as ray_worker

        session_dir = ray_worker._global_node.get_session_dir_path()
        watchdog.stdin.write(f"session {session_dir}\n".encode())
        watchdog.stdin.flush()
    except (AttributeError, OSError):
        pass  # a Ray without this private API: the watchdog still tracks the processes


def _run_tasks(ray, submits: list, on_done, max_in_flight: int | None = None) -> list:
    """Run tasks, at most ``max_in_flight`` at once; results in submission order.

    ``submits`` are zero-argument callables that submit one task and return its ref. A
    task's own error is re-raised (not Ray's wrapper) after the others are cancelled.
    """
    limit = len(submits) if max_in_flight is None else max(1, int(max_in_flight))
    results: list = [None] * len(submits)
    queue = list(enumerate(submits))
    pending: dict = {}
    try:
        while queue or pending:
            while queue and len(pending) < limit:
                k, submit = queue.pop(0)
                pending[submit()] = k
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=2.0)
            for ref in ready:
                k = pending.pop(ref)
                results[k] = ray.get(ref)
                on_done(results[k])
            if not ready:
                on_done(None)
    except ray.exceptions.RayTaskError as exc:
        for ref in pending:
            ray.cancel(ref)
        cause = getattr(exc, "cause", None)
        if isinstance(cause, Exception):
            raise cause from None
        raise
    return results


def _stats_pass(ray, fs, job, out: Path, remote_opts: dict, progress, max_in_flight) -> None:
    """Row norms and per-device z-score statistics, streamed; stored in the Gram store."""
    method = job["preprocessing"]
    blocks = [tuple(b) for b in job["col_blocks"]]
    t = job["tile_rows"]
    fn = ray.remote(tasks.moments_task).options(**remote_opts)
    submits, owners = [], []
    for d, dev in enumerate(job["devices"]):
        n_d = job["offsets"][d + 1] - job["offsets"][d]
        path = fs.array_path(dev, job["space"])
        for r0 in range(0, n_d, t):
            args = (path, r0, min(r0 + t, n_d), blocks, method)
            submits.append(lambda args=args: fn.remote(*args))
            owners.append(d)
    say(progress, f"gram {job['space']}: statistics pass ({method}), {len(submits)} tasks")
    # Results come back in submission order: the sums below have a fixed order.
    results = _run_tasks(ray, submits, lambda r: None, max_in_flight)
    root = zarr.open_group(str(out), mode="r+")
    norms = np.concatenate([r["norms"] for r in results])
    root.create_array(
        "row_norms",
        data=norms,
        chunks=(max(1, norms.size),),
        compressors=[Crc32cCodec()],
        overwrite=True,
    )
    if method in tasks.ZSCORE_METHODS:
        for d, dev in enumerate(job["devices"]):
            mine = [r for r, o in zip(results, owners, strict=True) if o == d]
            s1, s2 = np.zeros_like(mine[0]["s1"]), np.zeros_like(mine[0]["s2"])
            for r in mine:
                s1 += r["s1"]
                s2 += r["s2"]
            n_d = job["offsets"][d + 1] - job["offsets"][d]
            st = PreprocessStats.from_moments(method, n_d, s1, s2)
            for name, value in (("mean", st.mean), ("scale", st.scale)):
                root.create_array(
                    f"stats/{dev}/{name}",
                    data=value,
                    chunks=(value.size,),
                    compressors=[Crc32cCodec()],
                    overwrite=True,
                )
    job["stats_done"] = True
    tasks.write_json_atomic(out / JOB_FILE, job)


def _load_stats(out: Path, job: dict):
    method = job["preprocessing"]
    norms = stats = None
    if method in tasks.L2_METHODS:
        norms = np.asarray(zarr.open_array(str(out / "row_norms"), mode="r")[:])
    if method in tasks.ZSCORE_METHODS:
        stats = []
        for dev in job["devices"]:
            grp = out / "stats" / dev
            stats.append(
                (
                    np.asarray(zarr.open_array(str(grp / "mean"), mode="r")[:]),
                    np.asarray(zarr.open_array(str(grp / "scale"), mode="r")[:]),
                )
            )
    return stats, norms


def compute_gram(
    store_path: str | os.PathLike,
    space: str,
    out_path: str | os.PathLike | None = None,
    *,
    gram_dir: str | os.PathLike | None = None,
    preprocessing: str = "none",
    tile_rows: int | None = None,
    address: str | None = None,
    max_task_memory_mb: float = DEFAULT_TASK_MEMORY_MB,
    progress: bool | None = None,
    num_cpus: int | None = None,
    max_retries: int = 3,
    max_in_flight: int | None = None,
) -> GramStore:
    """Compute the linear Gram of one feature space over all its samples, on Ray.

    ``G = Z Zᵀ`` where ``Z`` stacks the preprocessed rows of every device that has
    features in ``space`` (devices in sorted order). Tiles of the upper triangle are Ray
    tasks that read row ranges of the Zarr arrays, accumulate in float64 over feature
    blocks in a fixed order, and each write one whole Gram chunk and a completion marker.
    Results are bit-identical whatever the number of workers and retries.

    Parameters
    ----------
    store_path : str or Path
        Feature store.
    space : str
        Feature space.
    out_path : str or Path, optional
        The Gram store's exact folder. Default: ``<gram_dir>/<key>``
        (:func:`~mmdtl2_dist.engine.location.gram_location`), where every study on the
        same store content, space and preprocessing finds it. A missing path or an empty
        directory is created; a Gram store there is resumed or re-checked: finished tiles
        are verified (checksums and the hash recorded when written) and skipped, damaged
        ones are recomputed and named on stderr and in ``last_run["repaired"]``. Anything
        else at the path is refused.
    gram_dir : str or Path, optional
        The Gram folder (default ``<store>.grams`` beside the store); not with ``out_path``.
    preprocessing : {"none", "l2", "zscore", "l2_zscore"}
        Applied per device with statistics over all that device's samples
        (:mod:`mmdtl2_dist.core.preprocessing`); the statistics are stored.
    tile_rows : int, optional
        Rows per tile. Default: up to 2,048, aligned to the store's chunks, fitting
        ``max_task_memory_mb``.
    address : str, optional
        Ray cluster address (``"auto"``, ``"ray://host:10001"``); default: the running
        Ray session if any, else a new local one (stopped on return).
        :data:`~mmdtl2_dist.engine.in_process.IN_PROCESS` runs the tasks in this process
        without Ray (small data; same bits).
    max_task_memory_mb : float
        Memory bound of one task; sets the feature block width and is requested from Ray
        as the task's ``memory`` resource.
    progress : bool or None
        Progress lines on stderr (:mod:`mmdtl2_dist.progress`); ``None``: when stderr is a
        terminal.
    num_cpus : int, optional
        CPUs of a new local Ray (default: all).
    max_retries : int
        Retries of a task whose worker died.
    max_in_flight : int, optional
        Most tasks submitted at once (default: all); bounds the cluster's concurrent
        memory use and lets one job share a cluster.

    Returns
    -------
    GramStore
        The finished store; ``last_run`` says how many tiles this call computed, skipped
        and repaired, and ``reused`` is true when it found the Gram complete and intact.

    Notes
    -----
    A complete Gram of the same store content, space, devices and preprocessing is
    verified and used as it is, whatever its tile size; a partial one is resumed with its
    own tiles and feature blocks (other ``tile_rows`` are refused). The call holds the
    Gram's lock (:func:`~mmdtl2_dist.engine.location.gram_lock`) throughout: a second
    call for the same Gram waits for it, then uses the finished Gram.
    """
    if preprocessing not in PREPROCESSING:
        raise ValueError(f"preprocessing must be one of {PREPROCESSING}, got {preprocessing!r}.")
    if out_path is not None and gram_dir is not None:
        raise ValueError("give out_path (an exact Gram folder) or gram_dir, not both.")
    fs = FeatureStore.open(store_path)
    if out_path is None:
        out = gram_location(fs, space, preprocessing, gram_dir)
    else:
        out = Path(out_path).expanduser().absolute()
    claim_output(out, GRAM_OUTPUT, overwrite=None)  # resume our own Gram, touch nothing else
    make_gram_dir(out.parent)
    with gram_lock(out, progress):
        return _compute(
            fs,
            space,
            out,
            preprocessing=preprocessing,
            tile_rows=tile_rows,
            address=address,
            max_task_memory_mb=max_task_memory_mb,
            progress=progress,
            num_cpus=num_cpus,
            max_retries=max_retries,
            max_in_flight=max_in_flight,
        )


def _complete_gram_of(stored: dict | None, fs: FeatureStore, space, devices, preprocessing):
    """Whether ``stored`` (a job.json) is a complete Gram of these values, any tile size."""
    if not stored or not stored.get("complete"):
        return False
    want = _gram_identity(fs, space, devices, preprocessing)
    return all(stored.get(k) == want[k] for k in _GRAM_KEYS)


def _compute(
    fs: FeatureStore,
    space: str,
    out: Path,
    *,
    preprocessing: str,
    tile_rows: int | None,
    address: str | None,
    max_task_memory_mb: float,
    progress: bool,
    num_cpus: int | None,
    max_retries: int,
    max_in_flight: int | None,
) -> GramStore:
    """Create, resume or re-check the Gram job at ``out`` and run its missing tiles.

    The caller holds the Gram's lock.
    """
    devices = fs.devices_in(space)
    arr0 = fs.array(devices[0], space)
    itemsize = arr0.dtype.itemsize
    n_rows = sum(fs.shape(d, space)[0] for d in devices)
    n_features = fs.shape(devices[0], space)[1]
    chunk_rows, chunk_cols = arr0.chunks
    stored = json.loads((out / JOB_FILE).read_text()) if (out / JOB_FILE).exists() else None
    if _complete_gram_of(stored, fs, space, devices, preprocessing):
        tile_rows = stored["tile_rows"]  # used as it is, whatever tile size was asked for
    if tile_rows is None:
        tile_rows = (
            stored["tile_rows"]
            if stored
            else choose_tile_rows(n_rows, chunk_rows, chunk_cols, max_task_memory_mb, itemsize)
        )
    if stored:  # resume with the stored feature blocks (same summation order, same bits)
        col_blocks = [tuple(b) for b in stored["col_blocks"]]
        span = max(c1 - c0 for c0, c1 in col_blocks)
        need = task_memory_bytes(tile_rows, span, itemsize)
        if need > max_task_memory_mb * 2**20 and stored.get("tile_rows") == tile_rows:
            raise ValueError(
                f"resuming {out} needs {need / 2**20:.0f} MB per task (its feature blocks of "
                f"{span}); raise max_task_memory_mb or start anew in another out_path."
            )
    else:
        col_blocks = feature_blocks(n_features, chunk_cols, tile_rows, max_task_memory_mb, itemsize)
    job = _job_spec(fs, space, devices, preprocessing, tile_rows, col_blocks)
    if stored:
        job = _check_resumable(out, job)
    else:
        _create_skeleton(out, job, fs)
    t_start = time.monotonic()
    tiles = gram_tile_plan(job["n_rows"], job["tile_rows"])
    repaired = _forget_damaged(out, job, tiles, progress) if stored else []
    if job.get("complete"):
        gs = GramStore.open(out)
        gs.reused = True
        gs.last_run = {"computed": 0, "skipped": len(tiles), "verified": len(tiles)}
        gs.last_run["seconds"] = time.monotonic() - t_start
        return gs

    ray, owned = _task_runner(address, num_cpus)
    try:
        mem = task_memory_bytes(tile_rows, max(c1 - c0 for c0, c1 in col_blocks), itemsize)
        opts = {"num_cpus": 1, "max_retries": max_retries, "memory": int(mem)}
        if not job["stats_done"]:
            _stats_pass(ray, fs, job, out, opts, progress, max_in_flight)
        stats, norms = _load_stats(out, job)
        gs = GramStore.open(out)
        done = set(gs.finished_tiles())
        todo = [t for t in tiles if t.key not in done]
        summary = plan_summary(job["n_rows"], job["n_features"], tiles, col_blocks)
        task_job = {
            "arrays": [fs.array_path(d, space) for d in devices],
            "offsets": job["offsets"],
            "col_blocks": [tuple(b) for b in col_blocks],
            "method": preprocessing,
            "gram_path": str(out / "gram"),
            "tiles_dir": str(out / TILES_DIR),
        }
        stats_ref = ray.put(stats)
        norms_ref = ray.put(norms)
        fn = ray.remote(tasks.gram_tile_task).options(**opts)
        submits = [lambda t=t: fn.remote(task_job, t, stats_ref, norms_ref) for t in todo]
        skipped = len(tiles) - len(todo)
        bar = Progress(f"gram {space}", len(tiles), unit="tiles", done=skipped, enabled=progress)
        flops_per_tile = summary["flops"] / len(tiles)

        def on_done(result):
            done = bar.done + (result is not None)
            rate = flops_per_tile * (done - skipped) / max(bar.elapsed(), 1e-9) / 1e9
            bar.update(done, f"{rate:.1f} GFLOP/s" + (f", {skipped} resumed" if skipped else ""))

        _run_tasks(ray, submits, on_done, max_in_flight)
    finally:
        if owned:
            ray.shutdown()

    _finish(out, job, tiles)
    job["complete"] = True
    job["last_run"] = {
        "computed": len(todo),
        "skipped": len(tiles) - len(todo),
        "seconds": time.monotonic() - t_start,
        "repaired": repaired,
        **summary,
    }
    tasks.write_json_atomic(out / JOB_FILE, job)
    return GramStore.open(out)


def _forget_damaged(out: Path, job: dict, tiles, progress: bool) -> list[str]:
    """Check what earlier runs stored and forget its damaged parts, so this run redoes them.

    Every finished tile's chunk is decoded (which checks its CRC32C) and hashed against
    the hash its task recorded in the marker: a chunk that fails, is missing, or holds
    other values loses its marker and is recomputed. Damaged statistics are recomputed
    too (same bits: their sums have a fixed order) and a damaged diagonal is rewritten.

    Returns
    -------
    list of str
        What was damaged (also printed to stderr); empty if everything is intact.
    """
    gram = zarr.open_array(str(out / "gram"), mode="r")
    markers = GramStore.open(out).finished_tiles()
    if progress and markers:
        print(f"gram {job['space']}: verifying {len(markers)} finished tiles", file=sys.stderr)
    found = []
    for tile in tiles:
        why = tile.key in markers and _tile_damage(gram, tile, markers[tile.key])
        if why:
            (out / TILES_DIR / f"{tile.key}.json").unlink()
            chunk_file = out / "gram" / "c" / str(tile.i) / str(tile.j)
            found.append(f"tile {tile.key} (chunk file {chunk_file}) {why}")
    bad_stats = [
        f"{name} {why}"
        for name in _stats_arrays(job)
        if job["stats_done"] and (why := _array_damage(out / name))
    ]
    if bad_stats:
        job["stats_done"] = False
    sq_why = job.get("complete") and _array_damage(out / "sq_norms")
    damaged = found + bad_stats + ([f"sq_norms {sq_why}"] if sq_why else [])
    if damaged:
        job["complete"] = False
        tasks.write_json_atomic(out / JOB_FILE, job)
        print(
            f"gram {job['space']}: {out} has damaged parts, recomputed in this run: "
            + "; ".join(damaged),
            file=sys.stderr,
            flush=True,
        )
    return damaged


def _tile_damage(gram: zarr.Array, tile, marker: dict) -> str | None:
    """Why a finished tile's stored chunk is not what its task wrote (None if it is)."""
    try:
        block = gram[tile.a0 : tile.a1, tile.b0 : tile.b1]
    except Exception as exc:  # noqa: BLE001 - any decode failure (checksum, truncation)
        return f"cannot be decoded ({type(exc).__name__}: {exc})"
    if tasks.tile_digest(block) == marker.get("blake2b"):
        return None
    if np.isnan(block).all():
        return "is missing"
    return "holds other values than its task wrote (hash recorded in its marker)"


def _stats_arrays(job: dict) -> list[str]:
    """The statistics arrays a Gram store holds for its preprocessing."""
    method = job["preprocessing"]
    names = ["row_norms"] if method in tasks.L2_METHODS else []
    if method in tasks.ZSCORE_METHODS:
        names += [f"stats/{dev}/{part}" for dev in job["devices"] for part in ("mean", "scale")]
    return names


def _array_damage(path: Path) -> str | None:
    """Why a small stored array cannot be used (None if it reads back whole)."""
    try:
        values = zarr.open_array(str(path), mode="r")[:]
    except Exception as exc:  # noqa: BLE001 - missing metadata or a failed decode
        return f"cannot be read ({type(exc).__name__}: {exc})"
    if values.size and np.isnan(values).all():
        return "is missing"
    return None


def _finish(out: Path, job: dict, tiles) -> None:
    """Check every tile is marked done and store the Gram diagonal (squared norms)."""
    markers = {p.stem for p in (out / TILES_DIR).glob("*.json")}
    missing = [t.key for t in tiles if t.key not in markers]
    if missing:
        raise RuntimeError(f"Gram job finished with tiles not done: {missing[:10]}.")
    gram = zarr.open_array(str(out / "gram"), mode="r")
    sq = np.empty(job["n_rows"])
    for t in tiles:
        if t.diagonal:
            sq[t.a0 : t.a1] = np.diag(gram[t.a0 : t.a1, t.a0 : t.a1])
    root = zarr.open_group(str(out), mode="r+")
    root.create_array(
        "sq_norms", data=sq, chunks=(max(1, sq.size),), compressors=[Crc32cCodec()], overwrite=True
    )
