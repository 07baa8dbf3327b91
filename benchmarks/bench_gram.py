"""Benchmarks of the Gram engine (seeded; prints a table, writes JSON to benchmarks/results/).

Modes
-----
``throughput`` (default): a synthetic 2,000 x 64,896 float32 store; in the same run,
    ``X @ X.T`` in memory (float32 and float64, numpy with all cores) versus the engine
    reading the Zarr store on a local Ray, with 1 worker (one task in flight) and with
    2 workers. Writes ``results/gram_throughput.json``.
``big``: a synthetic 20,000 x 64,896 float32 store (5.2 GB) written shard by shard, then
    its Gram through the engine, with the peak memory of the whole job (driver + Ray
    processes, summed RSS sampled every 0.2 s). Writes ``results/gram_big.json``.

Usage::

    python benchmarks/bench_gram.py throughput
    python benchmarks/bench_gram.py big --n 20000 --workdir /tmp/mmdtl2_bench
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from mmdtl2_dist.engine import compute_gram  # noqa: E402
from mmdtl2_dist.engine.plan import gram_tile_plan  # noqa: E402
from mmdtl2_dist.store import SyntheticSpec, make_synthetic_store  # noqa: E402

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


class PeakMemory:
    """Summed RSS of this process and all its descendants (Ray's), sampled in a thread."""

    def __init__(self, interval: float = 0.2):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        me = psutil.Process()
        total = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            time.sleep(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "load_avg_at_start": os.getloadavg(),
    }


def _timed(fn, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _engine(store, out, **kw) -> tuple[float, dict]:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    gs = compute_gram(store, "conv3", out, progress=False, **kw)
    return time.perf_counter() - t0, gs


def throughput(args) -> dict:
    import ray

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    store = work / f"synth_{args.n}.zarr"
    spec = SyntheticSpec(n_source=args.n, n_target=0, dim=args.dim, seed=args.seed)
    if not store.exists():
        make_synthetic_store(store, spec)
    from mmdtl2_dist.store import FeatureStore

    X = FeatureStore.open(store).read("source", "conv3")
    n, L = X.shape
    flops = float(n) * n * L  # symmetric product: n(n+1)/2 dot products of 2L flops
    X64 = X.astype(np.float64)
    t32 = _timed(lambda: X @ X.T, args.repeat)
    t64 = _timed(lambda: X64 @ X64.T, args.repeat)
    ref = X64 @ X64.T

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        _engine(store, work / "warm", tile_rows=256, max_in_flight=2)  # start workers
        runs = {}
        for label, inflight in (("1 worker", 1), ("2 workers", 2)):
            best, gs = float("inf"), None
            for _ in range(args.repeat):
                t, gs = _engine(store, work / "gram", max_in_flight=inflight)
                best = min(best, t)
            err = float(np.abs(gs.to_numpy() - ref).max() / np.abs(ref).max())
            runs[label] = {
                "seconds": best,
                "tile_rows": gs.tile_rows,
                "tiles": len(gram_tile_plan(n, gs.tile_rows)),
                "max_rel_err": err,
            }
    finally:
        ray.shutdown()
    e2 = runs["2 workers"]["seconds"]
    result = {
        "benchmark": "gram_throughput",
        "shape": [n, L],
        "machine": machine(),
        "numpy_f32_seconds": t32,
        "numpy_f64_seconds": t64,
        "engine": runs,
        "gflops": {
            "numpy_f32": flops / t32 / 1e9,
            "numpy_f64": flops / t64 / 1e9,
            "engine_1_worker": flops / runs["1 worker"]["seconds"] / 1e9,
            "engine_2_workers": flops / e2 / 1e9,
        },
        "ratio_engine_vs_numpy_f64": t64 / e2,
        "ratio_engine_vs_numpy_f32": t32 / e2,
        "scaling_2_vs_1_worker": runs["1 worker"]["seconds"] / e2,
    }
    print(f"\nGram of {n} x {L} float32 ({os.cpu_count()} cores), best of {args.repeat}")
    print(f"{'method':34s} {'seconds':>9s} {'GFLOP/s':>9s}")
    rows = [
        ("numpy X @ X.T float32 (in memory)", t32),
        ("numpy X @ X.T float64 (in memory)", t64),
        ("engine, Zarr, 1 worker (float64)", runs["1 worker"]["seconds"]),
        ("engine, Zarr, 2 workers (float64)", e2),
    ]
    for name, t in rows:
        print(f"{name:34s} {t:9.2f} {flops / t / 1e9:9.1f}")
    print(
        f"engine / numpy float64 throughput: {result['ratio_engine_vs_numpy_f64']:.0%}; "
        f"/ numpy float32: {result['ratio_engine_vs_numpy_f32']:.0%}; "
        f"2 vs 1 worker speed-up {result['scaling_2_vs_1_worker']:.2f}x"
    )
    result["cost_model"] = cost_model(result)
    return result


def cost_model(result: dict) -> dict:
    """Projected cluster cost from the measured per-worker rate (see BENCHMARKS.md)."""
    rate = result["gflops"]["engine_1_worker"] * 1e9  # flop/s of one single-threaded worker
    n, L = result["shape"]
    t1 = result["engine"]["1 worker"]["seconds"]
    io_rate = 0.5e9  # bytes/s a worker reads from shared storage (assumption, see notes)
    proj = {}
    for N in (20_000, 50_000, 100_000):
        T = 2048
        tiles = (N // T + 1) * (N // T + 2) // 2
        flops = float(N) * N * L
        read_bytes = tiles * 2 * T * L * 4
        for W in (16, 64, 256):
            busy = min(W, tiles)  # a tile is the unit of parallelism
            seconds = flops / (busy * rate) + read_bytes / (busy * io_rate)
            proj[f"n={N},workers={W}"] = {
                "hours": seconds / 3600,
                "core_hours": seconds * W / 3600,
            }
    return {
        "formula": "t = n^2 L / (W' r) + n_tiles 2 T L b / (W' s), W' = min(W, n_tiles)",
        "tile_rows": 2048,
        "r_flops_per_worker": rate,
        "s_read_bytes_per_worker": io_rate,
        "measured_1_worker_seconds": t1,
        "projections": proj,
    }


def big(args) -> dict:
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    store = work / f"synth_{args.n}.zarr"
    spec = SyntheticSpec(n_source=args.n, n_target=0, dim=args.dim, seed=args.seed)
    t0 = time.perf_counter()
    if not store.exists():
        with PeakMemory() as gen_mem:
            make_synthetic_store(store, spec, progress=True)
        gen_peak = gen_mem.peak
    else:
        gen_peak = None
    t_gen = time.perf_counter() - t0
    out = work / f"gram_{args.n}"
    if not args.resume:
        shutil.rmtree(out, ignore_errors=True)
    with PeakMemory() as mem:
        t, gs = _engine_keep(store, out, args)
    G = gs.block(np.arange(0, args.n, 997), np.arange(0, args.n, 1009))
    from mmdtl2_dist.store import FeatureStore

    fs = FeatureStore.open(store)
    ra, rb = np.arange(0, args.n, 997), np.arange(0, args.n, 1009)
    Xa = fs.read("source", "conv3", ra).astype(np.float64)
    Xb = fs.read("source", "conv3", rb).astype(np.float64)
    err = float(np.abs(G - Xa @ Xb.T).max() / np.abs(G).max())
    result = {
        "benchmark": "gram_big",
        "shape": [args.n, args.dim],
        "feature_bytes": args.n * args.dim * 4,
        "machine": machine(),
        "generate_seconds": t_gen,
        "generate_peak_rss_gb": None if gen_peak is None else gen_peak / 2**30,
        "gram_seconds": t,
        "gram_peak_rss_gb": mem.peak / 2**30,
        "tile_rows": gs.tile_rows,
        "last_run": gs.last_run,
        "spot_check_max_rel_err": err,
        "gflops": float(args.n) ** 2 * args.dim / t / 1e9,
    }
    print(
        f"\nGram of {args.n} x {args.dim} float32 ({result['feature_bytes'] / 1e9:.1f} GB): "
        f"{t:.0f} s, {result['gflops']:.1f} GFLOP/s, peak RSS of the job (driver + Ray) "
        f"{result['gram_peak_rss_gb']:.2f} GB, spot-check rel. err {err:.1e}"
    )
    return result


def _engine_keep(store, out, args):
    t0 = time.perf_counter()
    gs = compute_gram(
        store, "conv3", out, progress=True, num_cpus=2, max_task_memory_mb=args.max_task_memory_mb
    )
    return time.perf_counter() - t0, gs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", nargs="?", choices=["throughput", "big"], default="throughput")
    p.add_argument("--n", type=int, help="samples (2000 for throughput, 20000 for big)")
    p.add_argument("--dim", type=int, default=64_896)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--workdir", default="/tmp/mmdtl2_bench")
    p.add_argument("--max-task-memory-mb", type=float, default=1024)
    p.add_argument("--resume", action="store_true", help="big: resume a partial Gram")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args()
    args.n = args.n or (2000 if args.mode == "throughput" else 20_000)
    result = throughput(args) if args.mode == "throughput" else big(args)
    result["command"] = "python benchmarks/bench_gram.py " + " ".join(sys.argv[1:])
    out = HERE / "results" / f"gram_{args.mode}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
