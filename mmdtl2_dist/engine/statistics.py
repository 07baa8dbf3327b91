"""The statistics pass of a Gram job: row norms and per-device z-score moments, streamed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec

from mmdtl2_dist.core.preprocessing import PreprocessStats
from mmdtl2_dist.engine import tasks
from mmdtl2_dist.engine.gram_store import JOB_FILE
from mmdtl2_dist.engine.scheduling import run_tasks
from mmdtl2_dist.progress import say
from mmdtl2_dist.store.atomic import write_json_atomic


def stats_pass(ray, fs, job, out: Path, remote_opts: dict, progress, max_in_flight) -> None:
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
    results = run_tasks(ray, submits, lambda r: None, max_in_flight)
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
    write_json_atomic(out / JOB_FILE, job)


def load_stats(out: Path, job: dict):
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
