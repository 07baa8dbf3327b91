"""Running a Gram job's tasks: whole tiles, or a split tile's parts and its combine.

A job whose plan has one part per tile runs one task per unfinished tile. A job whose
tiles are split into ``parts`` (:mod:`mmdtl2_dist.engine.plan`) runs, per unfinished
tile, the part tasks that earlier runs did not finish (:func:`finished_parts` keeps
those whose file matches its marker) and a combine task that Ray starts once they are
done (it takes their results as arguments).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from mmdtl2_dist.engine import tasks
from mmdtl2_dist.engine.gram_store import TILES_DIR, GramStore
from mmdtl2_dist.engine.plan import plan_summary, task_memory_bytes
from mmdtl2_dist.engine.ray_session import task_runner
from mmdtl2_dist.engine.scheduling import run_tasks
from mmdtl2_dist.engine.statistics import load_stats, stats_pass
from mmdtl2_dist.engine.timing import summarize_timing
from mmdtl2_dist.engine.verify import report_damage
from mmdtl2_dist.progress import Progress
from mmdtl2_dist.store.atomic import remove_temporaries


class JobRunner:
    """Where a job's tasks run, started on first use (a reused Gram starts nothing).

    ``run`` is the job's :class:`~mmdtl2_dist.engine.driver.GramRun`.
    """

    def __init__(self, run):
        self.run = run
        self._ray = None
        self._owned = False

    def ray(self):
        """The task runner: Ray (connected or started here), or this process."""
        if self._ray is None:
            self._ray, self._owned = task_runner(
                self.run.address, self.run.num_cpus, self.run.gpus or None
            )
        return self._ray

    def workers(self) -> int:
        """Tasks that run at once: the cluster's CPUs (GPUs for GPU tiles), 1 in-process.

        Bounded by ``max_in_flight``; the plan splits tiles into parts to keep them busy.
        """
        ray = self.ray()
        if not hasattr(ray, "cluster_resources"):  # in this process: one task at a time
            return 1
        count = ray.cluster_resources().get("GPU" if self.run.on_gpu else "CPU", 1)
        if self.run.max_in_flight is not None:
            count = min(count, self.run.max_in_flight)
        return max(1, int(count))

    def close(self) -> None:
        """Stop what this runner started or connected, not a session it found.

        Ray: the session. In-process: the scratch buffers its tiles kept.
        """
        if self._owned:
            self._ray.shutdown()
        self._ray, self._owned = None, False


def task_options(job: dict, itemsize: int, run) -> dict:
    """Ray options of the job's tile and part tasks: one CPU (or GPU), memory, retries."""
    span = max(c1 - c0 for c0, c1 in job["col_blocks"])
    prep = job["preprocessing"] != "none"
    mem = task_memory_bytes(job["tile_rows"], span, itemsize, run.on_gpu, prep)
    opts = {"num_cpus": 1, "max_retries": run.max_retries, "memory": int(mem)}
    if run.on_gpu:
        opts["num_gpus"] = 1
    return opts


def finished_parts(out: Path, job: dict, tiles, done: set, progress) -> tuple[dict, list[str]]:
    """The parts earlier runs finished, checked; what was damaged (their files removed).

    A part counts as done when its marker reads and its file has the CRC32C the marker
    records; a file without a marker (its task was stopped before the marker) and a
    part whose file is missing or other is removed and recomputed, the latter named on
    stderr. The leftover parts of finished tiles are removed.

    Returns
    -------
    (dict, list of str)
        Markers by ``(tile key, part)``, and the damaged parts.
    """
    tiles_dir = out / TILES_DIR
    kept, damaged = {}, []
    for tile in tiles:
        for k in range(job["parts"]):
            _, marker_path = tasks.part_paths(tiles_dir, tile, k)
            if tile.key in done or not marker_path.exists():
                tasks.remove_parts(tiles_dir, tile, job["parts"], only=k)
                continue
            try:
                marker = json.loads(marker_path.read_text())
                tasks.load_part(tiles_dir, tile, k, marker)
            except (OSError, ValueError, tasks.DamagedPartError) as exc:
                damaged.append(f"part {tile.key}.{k} of tile {tile.key}: {exc}")
                tasks.remove_parts(tiles_dir, tile, job["parts"], only=k)
                continue
            kept[(tile.key, k)] = marker
    remove_temporaries(tiles_dir / tasks.PARTS_DIR)  # writes stopped before their rename
    report_damage(job, out, damaged)
    return kept, damaged


def run_job(ray, fs, job: dict, out: Path, tiles, run) -> dict:
    """Run the statistics pass if needed and every unfinished tile (or part).

    Returns ``computed`` (tiles), ``parts_computed``, ``parts_resumed``, ``repaired``
    (damaged parts found) and ``timing`` (:func:`~mmdtl2_dist.engine.timing.summarize_timing`).
    """
    itemsize = fs.array(job["devices"][0], job["space"]).dtype.itemsize
    opts = task_options(job, itemsize, run)
    if not job["stats_done"]:
        cpu_opts = {k: v for k, v in opts.items() if k != "num_gpus"}
        stats_pass(ray, fs, job, out, cpu_opts, run.progress, run.max_in_flight)
    stats, norms = load_stats(out, job)
    done = set(GramStore.open(out).finished_tiles())
    todo = [t for t in tiles if t.key not in done]
    parts = int(job.get("parts", 1))
    kept, damaged = finished_parts(out, job, tiles, done, run.progress) if parts > 1 else ({}, [])
    task_job = {
        "arrays": [fs.array_path(d, job["space"]) for d in job["devices"]],
        "offsets": job["offsets"],
        "col_blocks": [tuple(b) for b in job["col_blocks"]],
        "parts": parts,
        "method": job["preprocessing"],
        "precision": job["precision"],
        "device": run.device,
        "gram_path": str(out / "gram"),
        "tiles_dir": str(out / TILES_DIR),
    }
    stats_ref, norms_ref = ray.put(stats), ray.put(norms)
    tile_fn = ray.remote(tasks.gram_tile_task).options(**opts)
    cpu = {k: v for k, v in opts.items() if k != "num_gpus"}
    combine_fn = ray.remote(tasks.gram_combine_task).options(**cpu)
    submitted: dict[str, float] = {}

    def submit(key, call):
        def go():
            submitted[key] = time.time()
            return call()

        return go

    def tile_task(t, k=None):
        return tile_fn.remote(task_job, t, stats_ref, norms_ref, k)

    submits = _submissions(todo, parts, kept, tile_task, combine_fn, task_job, submit)
    total = plan_summary(job["n_rows"], job["n_features"], tiles, job["col_blocks"], parts)
    on_done = _progress_line(job, total, total["tasks"] - len(submits), run.progress)
    t0 = time.monotonic()
    markers = run_tasks(ray, submits, on_done, run.max_in_flight)
    records = [{**m["timing"], "submitted": submitted[_task_key(m)]} for m in markers if m]
    return {
        "computed": len(todo),
        "parts_computed": sum(1 for m in markers if m and "part" in m),
        "parts_resumed": len(kept),
        "repaired": damaged,
        "timing": summarize_timing(records, time.monotonic() - t0),
    }


def _submissions(todo, parts: int, kept: dict, tile_task, combine_fn, task_job, submit) -> list:
    """The submit calls of the unfinished tiles: a tile, or its missing parts and combine.

    A combine is listed after its parts, so their refs exist when it is submitted;
    finished parts go to it as their markers.
    """
    submits, refs = [], {}

    def part_call(t, k):
        def call():
            refs[(t.key, k)] = tile_task(t, k)
            return refs[(t.key, k)]

        return call

    def combine_call(t):
        def call():
            args = [
                kept[(t.key, k)] if (t.key, k) in kept else refs[(t.key, k)] for k in range(parts)
            ]
            return combine_fn.remote(task_job, t, *args)

        return call

    for t in todo:
        if parts == 1:
            submits.append(submit(t.key, lambda t=t: tile_task(t)))
            continue
        for k in range(parts):
            if (t.key, k) not in kept:
                submits.append(submit(f"{t.key}.{k}", part_call(t, k)))
        submits.append(submit(t.key, combine_call(t)))
    return submits


def _task_key(marker: dict) -> str:
    """``i_j`` for a tile (or its combine), ``i_j.k`` for a part."""
    return marker["tile"] + (f".{marker['part']}" if "part" in marker else "")


def _progress_line(job: dict, summary: dict, skipped: int, progress):
    """The callback that updates the progress bar (tasks done, GFLOP/s) per result."""
    unit = "tiles" if summary["parts"] == 1 else "tasks"
    flops_per_task = summary["flops"] / summary["tasks"]
    bar = Progress(
        f"gram {job['space']}", summary["tasks"], unit=unit, done=skipped, enabled=progress
    )

    def on_done(result):
        done = bar.done + (result is not None)
        rate = flops_per_task * (done - skipped) / max(bar.elapsed(), 1e-9) / 1e9
        bar.update(done, f"{rate:.1f} GFLOP/s" + (f", {skipped} resumed" if skipped else ""))

    return on_done
