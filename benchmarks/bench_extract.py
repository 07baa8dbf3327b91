"""Images per second of ``mmdtl2 extract`` against a plain single-process torch loop.

One run, on the same machine and cores:

- *plain loop*: one process, one torch thread, batches of ``--batch-size``: decode with
  Pillow, the ImageNet transform, AlexNet cut at the layer, float32 out (no Ray, no store);
  run before and after the extract runs, since the load of a shared machine moves;
- *shard in this process*: :func:`mmdtl2_dist.extract.shards.run_shard` on all the
  images as one shard, one torch thread (its next batch prepared on a second thread),
  no Ray: the shard's own code against the plain loop;
- *extract*: :func:`mmdtl2_dist.extract.job.extract` with ``--workers`` 1, then with every
  core (``--max-workers``), on a local Ray: the whole call (Ray start, model loads, shards,
  the store), the rate inside the shards (images / worker-seconds x workers), and the
  seconds spent writing the store, in all and after the last shard finished (the store
  is filled while the shards run);
- *memory* (``--memory-images``, e.g. 20000): the peak resident memory of the extract
  process and every process it started (Ray, workers), sampled every 0.2 s, for a small
  and a large image set of the same small images, to show that it does not grow with the
  number of images.

Weights are random (``random:0``): throughput does not depend on their values. The
machine's load is recorded over the throughput runs (the 1-minute load average and the
CPU used by processes outside the benchmark's tree); a run in which other processes took
more than a quarter of a core on average is flagged ``NOISY``: its ratios are not a
measurement.

    python benchmarks/bench_extract.py --images 600 --memory-images 20000 --json out.json
    python benchmarks/bench_extract.py --images 3000 --gpus 1   # where a GPU is lent

With ``--gpus N`` the plain loop and the shard also run on the first GPU and ``extract``
on N GPU actors; the GPU/CPU ratio is the GPU figure over the CPU plain loop of the same
run. ``--no-ray`` leaves out the ``extract`` runs (on a machine without Ray).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from bench_gram import LoadMonitor

from mmdtl2_dist.extract.inputs import read_images
from mmdtl2_dist.extract.job import ExtractOptions, extract
from mmdtl2_dist.extract.model import Extractor, ModelSpec, Preprocessing
from mmdtl2_dist.extract.synthetic import ImageSetSpec, make_image_set

REPO = Path(__file__).resolve().parents[1]


def image_set(folder: Path, n: int, size: int) -> Path:
    """About ``n`` synthetic images (two devices, two classes) of ``size`` pixels."""
    per = max(1, n // 4)
    return make_image_set(folder, ImageSetSpec(n_source=per, n_target=per, n_classes=2, size=size))


def plain_loop(
    paths: list[str], spec: ModelSpec, pre: Preprocessing, batch: int, device: str = "cpu"
) -> float:
    """Images per second of a single-process torch loop (one CPU thread) on ``device``.

    The model runs once on a blank image before the clock starts, as the extractor's probe
    does before its shards: the device's one-time start (on a GPU its context, cuDNN and
    the kernels' loading, up to seconds) is in neither rate.
    """
    import torch
    from PIL import Image
    from torchvision import models
    from torchvision.models.feature_extraction import create_feature_extractor

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = models.get_model(spec.model, weights=None).eval()
    cut = create_feature_extractor(net, {spec.node(spec.layers[0]): "f"}).to(device)
    tf = pre.transform()
    with torch.no_grad():
        cut(torch.zeros(1, 3, pre.crop, pre.crop, device=device))
        t0 = time.perf_counter()
        for b0 in range(0, len(paths), batch):
            x = torch.stack([tf(Image.open(p).convert("RGB")) for p in paths[b0 : b0 + batch]])
            cut(x.to(device))["f"].reshape(len(x), -1).float().cpu().numpy()
    return len(paths) / (time.perf_counter() - t0)


def shard_in_process(
    paths: list[str], spec, pre, batch: int, work: Path, device: str = "cpu"
) -> float:
    """Images per second of ``run_shard`` on all ``paths`` as one shard, one torch thread."""
    import torch

    from mmdtl2_dist.extract.shards import run_shard

    torch.set_num_threads(1)
    ex = Extractor(spec, "random:0", pre, device)
    task = {"paths": paths, "rows": range(len(paths)), "batch_size": batch, "skip_bad": False}
    seconds = run_shard(ex, {**task, "file": str(work / "shard.npz")})["seconds"]
    for f in work.glob("shard.*"):  # 5 GB at 20,000 images: not kept beside the store runs
        f.unlink()
    return len(paths) / seconds


def run_extract(images: Path, out: Path, spec, pre, workers: int, batch: int, gpus=0) -> dict:
    t0 = time.perf_counter()
    opts = ExtractOptions(
        batch_size=batch, workers=workers, gpus=gpus, progress=False, overwrite=True
    )
    fs = extract(out, read_images(images), spec, "random:0", pre, opts)
    wall = time.perf_counter() - t0
    run = fs.last_run
    n = run["images_computed"]
    return {
        "workers": workers,
        "gpus": gpus,
        "images": n,
        "wall_s": wall,
        "images_per_s_wall": n / wall,
        "images_per_s_in_shards": n / run["worker_seconds"] * workers,
        "store_s": run["store_seconds"],
        "store_after_workers_s": run["store_after_workers_seconds"],
    }


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def gpu_runs(paths, images: Path, work: Path, spec, pre, args) -> dict:
    """The plain loop and the shard on one GPU, ``extract`` on ``args.gpus`` GPU actors."""
    import torch

    res = {"card": torch.cuda.get_device_name(0)}
    res["plain_loop_images_per_s"] = plain_loop(paths, spec, pre, args.batch_size, "cuda")
    print(f"plain loop on {res['card']}: {res['plain_loop_images_per_s']:.1f} images/s", flush=True)
    res["shard_in_process_images_per_s"] = shard_in_process(
        paths, spec, pre, args.batch_size, work, "cuda"
    )
    print(
        f"shard on {res['card']}: {res['shard_in_process_images_per_s']:.1f} images/s", flush=True
    )
    if args.no_ray:
        return res
    res["extract"] = run_extract(
        images, work / "g.zarr", spec, pre, args.gpus, args.batch_size, args.gpus
    )
    print(f"extract on {args.gpus} GPU(s): {json.dumps(res['extract'])}", flush=True)
    return res


def peak_memory(cmd: list[str], env: dict) -> dict:
    """Run ``cmd``; the peak summed RSS of it and its descendants (MiB), and its time."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak, peak_driver, stop = [0], [0], threading.Event()

    def sample():
        p = psutil.Process(proc.pid)
        while not stop.wait(0.2):
            try:
                procs = [p, *p.children(recursive=True)]
                rss = 0
                for q in procs:
                    try:
                        rss += q.memory_info().rss
                    except psutil.Error:
                        pass
                peak[0] = max(peak[0], rss)
                peak_driver[0] = max(peak_driver[0], p.memory_info().rss)
            except psutil.Error:
                return

    t = threading.Thread(target=sample, daemon=True)
    t0 = time.perf_counter()
    t.start()
    _, err = proc.communicate()
    stop.set()
    t.join()
    if proc.returncode:
        raise RuntimeError(err.decode())
    return {
        "peak_rss_all_mib": peak[0] / 2**20,
        "peak_rss_driver_mib": peak_driver[0] / 2**20,
        "seconds": time.perf_counter() - t0,
    }


def memory_runs(work: Path, sizes: list[int], workers: int) -> list[dict]:
    """Peak memory of `mmdtl2 extract` (alexnet:conv3 at 64 x 64) on image sets of ``sizes``."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    rows = []
    for n in sizes:
        images = image_set(work / f"mem{n}", n, 32)
        cmd = [sys.executable, "-m", "mmdtl2_dist.cli", "extract", str(images),
               str(work / f"mem{n}.zarr"), "--model", "alexnet:conv3", "--weights", "random:0",
               "--resize", "64", "--crop", "64", "--workers", str(workers), "--quiet"]  # fmt: skip
        n_real = len(read_images(images).frame)
        rows.append({"images": n_real, **peak_memory(cmd, env)})
        print(f"memory: {rows[-1]}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=600, help="images for the throughput runs")
    ap.add_argument("--model", default="alexnet:conv3")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-workers", type=int, default=os.cpu_count())
    ap.add_argument("--memory-images", type=int, default=0, help="large set for memory (0: skip)")
    ap.add_argument("--gpus", type=int, default=0, help="also the plain loop and extract on GPUs")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument(
        "--no-ray", action="store_true", help="only the runs in this process (no extract on Ray)"
    )
    args = ap.parse_args(argv)
    if args.gpus and not cuda_available():
        raise SystemExit("--gpus: torch sees no CUDA device here; leave --gpus out on CPU.")
    spec, pre = ModelSpec.parse(args.model), Preprocessing()
    res = {"load_start": os.getloadavg(), "cpus": os.cpu_count(), "model": str(spec)}
    print(f"load average at start: {res['load_start']}, {res['cpus']} CPUs", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-extract-") as tmp:
        work = Path(tmp)
        images = image_set(work / "images", args.images, 64)
        paths = read_images(images).frame["path"].tolist()
        with LoadMonitor() as load:
            res["plain_loop_images_per_s"] = plain_loop(paths, spec, pre, args.batch_size)
            print(
                f"plain loop, 1 thread: {res['plain_loop_images_per_s']:.1f} images/s", flush=True
            )
            res["shard_in_process_images_per_s"] = shard_in_process(
                paths, spec, pre, args.batch_size, work
            )
            print(
                f"shard in this process: {res['shard_in_process_images_per_s']:.1f} images/s",
                flush=True,
            )
            res["extract"] = []
            for workers in [] if args.no_ray else sorted({1, args.max_workers}):
                r = run_extract(images, work / "s.zarr", spec, pre, workers, args.batch_size)
                res["extract"].append(r)
                print(f"extract: {json.dumps(r)}", flush=True)
            if args.gpus:
                res["gpu"] = gpu_runs(paths, images, work, spec, pre, args)
            # the load moves: the plain loop again, after (compare with the mean of both)
            res["plain_loop_after_images_per_s"] = plain_loop(paths, spec, pre, args.batch_size)
            print(
                f"plain loop again: {res['plain_loop_after_images_per_s']:.1f} images/s", flush=True
            )
        res["load"] = load.summary()
        if res["load"]["noisy"]:
            print("NOISY RUN: other processes competed for the cores; do not use its ratios.")
        if args.memory_images:
            res["memory"] = memory_runs(work, [args.memory_images // 10, args.memory_images],
                                        args.max_workers)  # fmt: skip
    res["load_end"] = os.getloadavg()
    print(f"load average at end: {res['load_end']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
