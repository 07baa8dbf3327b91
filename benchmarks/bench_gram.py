"""Benchmarks of the Gram engine (seeded; prints a table, writes JSON to benchmarks/results/).

Modes
-----
``throughput`` (default): a synthetic 2,000 x 64,896 float32 store; in the same run,
    ``X @ X.T`` in memory (float32 and float64, numpy on the engine's 2 cores, timed before and
    after the engine's runs, the faster of the two kept) versus the engine reading the
    Zarr store on a local Ray, with 1 worker (one task in flight) and with 2 workers,
    in each ``--precision`` (float64 exact, mixed). Writes ``results/gram_throughput.json``.
``big``: a synthetic 20,000 x 64,896 float32 store (5.2 GB) written shard by shard, then
    its Gram through the engine in each precision, with the peak memory of the whole job
    (driver + Ray processes, summed RSS sampled every 0.2 s). Writes
    ``results/gram_big.json``.

Every engine run prints where its time went (per phase, per worker:
:mod:`mmdtl2_dist.engine.timing`) and its wall time predicted by the cost model
(:mod:`mmdtl2_dist.engine.cost`) from calibrated rates (the products' with as many
processes multiplying at once as the run has workers, ``--node-workers``). The load of the
machine is sampled over the whole run (:class:`LoadMonitor`); a run that other processes
competed with is flagged ``NOISY`` and its ratios are not a measurement. The throughput
run is also flagged when numpy's own times moved by more than :data:`MAX_SPEED_DRIFT`
between its start and its end (:func:`speed_drift`: a virtual machine's neighbours or a
changed clock, which the load does not show).

Usage::

    python benchmarks/bench_gram.py throughput
    python benchmarks/bench_gram.py throughput --gpus 1      # tiles on a GPU (torch)
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


def tree_total(measure) -> float:
    """``measure(process)`` summed over this process and its descendants (Ray's)."""
    me = psutil.Process()
    total = 0
    for p in [me, *me.children(recursive=True)]:
        try:
            total += measure(p)
        except psutil.Error:
            pass  # a process that exited meanwhile
    return total


class _Sampler:
    """Calls :meth:`sample` in a thread every ``interval`` s while its block runs."""

    def __init__(self, interval: float):
        self.interval, self._stop = interval, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self):
        self.sample()
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


class PeakMemory(_Sampler):
    """Summed RSS of this process and all its descendants (Ray's), sampled in a thread."""

    def __init__(self, interval: float = 0.2):
        super().__init__(interval)
        self.peak = 0

    def sample(self) -> None:
        self.peak = max(self.peak, tree_total(lambda p: p.memory_info().rss))


def _cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


class LoadMonitor(_Sampler):
    """The machine's load over a whole run, sampled in a thread every ``interval`` s.

    Records the 1-minute load average and the CPU used by processes outside this one's
    tree (``foreign_cores``: busy cores of the machine minus this tree's), the measure
    that says whether another job competed with the benchmark. A run whose mean foreign
    load exceeds :data:`NOISY_FOREIGN_CORES` is flagged ``noisy``: its ratios are not a
    measurement of the engine.
    """

    NOISY_FOREIGN_CORES = 0.25

    def __init__(self, interval: float = 1.0):
        super().__init__(interval)
        self.load, self.foreign = [], []
        self._last = None

    def sample(self) -> None:
        now = (psutil.cpu_times(), tree_total(_cpu_seconds), time.monotonic())
        if self._last is not None:
            (last_sys, last_tree, last_t), (now_sys, now_tree, now_t) = self._last, now
            busy = sum(now_sys) - now_sys.idle - (sum(last_sys) - last_sys.idle)
            busy -= getattr(now_sys, "iowait", 0.0) - getattr(last_sys, "iowait", 0.0)
            foreign = (busy - (now_tree - last_tree)) / max(now_t - last_t, 1e-9)
            self.foreign.append(max(0.0, min(psutil.cpu_count(), foreign)))
            self.load.append(os.getloadavg()[0])
        self._last = now

    def summary(self) -> dict:
        mean = float(np.mean(self.foreign)) if self.foreign else 0.0
        return {
            "load_avg_1min": {
                "min": min(self.load, default=None),
                "mean": float(np.mean(self.load)) if self.load else None,
                "max": max(self.load, default=None),
            },
            "foreign_cores_mean": mean,
            "foreign_cores_max": max(self.foreign, default=0.0),
            "samples": len(self.load),
            "noisy": mean > self.NOISY_FOREIGN_CORES,
        }


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": _blas_name(),
        "load_avg_at_start": os.getloadavg(),
    }


def _blas_name() -> str:
    from threadpoolctl import threadpool_info

    info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return ", ".join(f"{i['internal_api']} {i.get('version')}" for i in info) or "unknown"


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


def calibrate(store, tile_rows: int, span: int, device: str | None = None) -> dict:
    """One worker's rates: products of a tile-sized block (one BLAS thread) and reads.

    ``flops_per_s_<precision>``: the engine's own block product
    (:func:`mmdtl2_dist.engine.products.tile_product`) of two ``tile_rows x span``
    blocks, accumulation included; ``read_bytes_per_s``: a feature block read and
    decoded as a tile task does (the store's files are then in the page cache, as in the
    runs). ``device_flops_per_s_<precision>``: the torch device's own matmul.
    """
    from mmdtl2_dist.store import FeatureStore
    from mmdtl2_dist.store.feature_store import read_array_block

    fs = FeatureStore.open(store)
    path = fs.array_path("source", "conv3")
    t = min(tile_rows, fs.shape("source", "conv3")[0])
    t_read = _timed(lambda: read_array_block(path, 0, t, 0, span, check_finite=False), 3)
    A = read_array_block(path, 0, t, 0, span)
    out = {"read_bytes_per_s": A.nbytes / t_read, "tile_rows": t, "span": span}
    out |= {f"flops_per_s_{p}": rate for p, rate in _product_rates(str(store), t, span).items()}
    if device is not None:
        out.update(_calibrate_torch(A, device))
    return out


def calibrate_loaded(store, tile_rows: int, span: int, workers: int) -> dict:
    """Each worker's product rate while ``workers`` processes multiply at once.

    ``loaded_flops_per_s_<precision>``: over ``workers`` processes (one BLAS thread
    each), the mean rate of three products that all start together (a barrier before
    each), against :func:`calibrate`'s best of three alone. Workers of one node share
    its memory bandwidth and caches, so on a busy node each multiplies more slowly than
    alone; the cost model of a run with several workers per node takes this rate.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(workers) as pool:
        barrier = manager.Barrier(workers)
        rates = pool.starmap(_product_rates, [(str(store), tile_rows, span, barrier)] * workers)
    loaded = {f"loaded_flops_per_s_{p}": float(np.mean([r[p] for r in rates])) for p in rates[0]}
    return {**loaded, "loaded_workers": workers}


def _product_rates(store: str, tile_rows: int, span: int, barrier=None) -> dict:
    """This process's block product rate per precision (one BLAS thread); with a
    ``barrier``, timed once every process waiting on it is ready."""
    from threadpoolctl import threadpool_limits

    from mmdtl2_dist.engine.products import tile_product
    from mmdtl2_dist.engine.timing import PhaseTimer
    from mmdtl2_dist.store import FeatureStore
    from mmdtl2_dist.store.feature_store import read_array_block

    path = FeatureStore.open(store).array_path("source", "conv3")
    A = read_array_block(path, 0, tile_rows, 0, span)
    rates = {}
    with threadpool_limits(1, user_api="blas"):
        for precision in ("float64", "mixed"):
            product = tile_product((tile_rows, tile_rows), precision, PhaseTimer(), None)
            a = product.cast(A)
            b = a[::-1].copy()
            if barrier is None:
                seconds = _timed(lambda p=product, a=a, b=b: p.add(a, b), 3)
            else:  # every repetition starts together: none runs alone
                product.add(a, b)  # warm-up
                seconds = float(np.mean([_together(barrier, product, a, b) for _ in range(3)]))
            rates[precision] = 2.0 * tile_rows * tile_rows * span / seconds
    return rates


def _together(barrier, product, a, b) -> float:
    """Seconds of one product, started when every process waiting on ``barrier`` is ready."""
    barrier.wait(timeout=600)
    t0 = time.perf_counter()
    product.add(a, b)
    return time.perf_counter() - t0


def _calibrate_torch(A: np.ndarray, device: str) -> dict:
    """The device's own matmul throughput on the same blocks (float64 and float32)."""
    import torch

    out = {}
    for name, dtype in (("float64", torch.float64), ("mixed", torch.float32)):
        a = torch.from_numpy(A).to(device).to(dtype)
        b = a.flip(0).contiguous()

        def mm(a=a, b=b):
            a @ b.T
            if str(device).startswith("cuda"):
                torch.cuda.synchronize()

        mm()  # warm-up (kernel selection)
        out[f"device_flops_per_s_{name}"] = 2.0 * a.shape[0] ** 2 * a.shape[1] / _timed(mm, 3)
    return out


def _engine_runs(args, store, work, ref, n) -> dict:
    """Best-of-``repeat`` engine runs per precision and worker count, with their timing."""
    runs = {}
    for precision in args.precisions:
        for workers in (1, 2):
            label = f"{precision}, {workers} worker{'s' * (workers > 1)}"
            best, gs = float("inf"), None
            for _ in range(args.repeat):
                t, gs_k = _engine(
                    store,
                    work / "gram",
                    max_in_flight=workers,
                    precision=precision,
                    device=args.device,
                )
                if t < best:
                    best, gs = t, gs_k
            err = float(np.abs(gs.to_numpy() - ref).max() / np.abs(ref).max())
            runs[label] = {
                "precision": precision,
                "workers": workers,
                "seconds": best,
                "tile_rows": gs.tile_rows,
                "tiles": len(gram_tile_plan(n, gs.tile_rows)),
                "parts": gs.job.get("parts", 1),
                "feature_blocks": len(gs.job["col_blocks"]),
                "max_rel_err": err,
                "timing": gs.last_run["timing"],
            }
    return runs


def throughput(args) -> dict:
    import ray

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    store = work / f"synth_{args.n}x{args.dim}.zarr"
    spec = SyntheticSpec(n_source=args.n, n_target=0, dim=args.dim, seed=args.seed)
    if not store.exists():
        make_synthetic_store(store, spec)
    from mmdtl2_dist.store import FeatureStore

    X = FeatureStore.open(store).read("source", "conv3")
    n, L = X.shape
    flops = float(n) * n * L  # symmetric product: n(n+1)/2 dot products of 2L flops
    with LoadMonitor() as load:
        X64 = X.astype(np.float64)
        before = _numpy_seconds(X, X64, args.repeat)
        ref = X64 @ X64.T
        ray.init(
            address="local",
            num_cpus=BENCH_CPUS,
            num_gpus=args.gpus or None,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
        try:
            # Start the workers (and import torch and open the device in them).
            _engine(store, work / "warm", tile_rows=256, max_in_flight=2, device=args.device)
            runs = _engine_runs(args, store, work, ref, n)
        finally:
            ray.shutdown()
        after = _numpy_seconds(X, X64, args.repeat)
        first = next(iter(runs.values()))
        cal = calibrate(store, first["tile_rows"], _span_of(work / "gram"), args.device)
        if args.device is None:
            cal |= calibrate_loaded(store, cal["tile_rows"], cal["span"], args.node_workers)
    result = {
        "benchmark": "gram_throughput",
        "shape": [n, L],
        "machine": machine(),
        "load": with_speed_drift(load.summary(), before, after),
        "numpy_f32_seconds": min(before[0], after[0]),
        "numpy_f64_seconds": min(before[1], after[1]),
        "numpy_threads": _numpy_threads(),
        "engine": runs,
        "calibration": cal,
    }
    _ratios(result, flops)
    result["cost_model"] = cost_model(result)
    _print_throughput(result, flops, args.repeat)
    return result


#: Cores of the throughput benchmark's Ray workers, and BLAS threads of numpy's baseline.
BENCH_CPUS = 2


def _numpy_seconds(X: np.ndarray, X64: np.ndarray, repeat: int) -> tuple[float, float]:
    """Best-of-``repeat`` seconds of numpy's ``X @ X.T`` in float32 and in float64.

    On :data:`BENCH_CPUS` BLAS threads, the engine's cores, whatever ``OMP_NUM_THREADS``
    says (set to 1, it would halve numpy's side of the ratio).
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(BENCH_CPUS, user_api="blas"):
        return _timed(lambda: X @ X.T, repeat), _timed(lambda: X64 @ X64.T, repeat)


def _numpy_threads() -> int:
    """The BLAS threads numpy's baseline runs on (:func:`_numpy_seconds`)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    with threadpool_limits(BENCH_CPUS, user_api="blas"):
        blas = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    return max(blas, default=1)


#: Largest change of numpy's own times between the start and the end of a run that
#: still counts as a quiet machine.
MAX_SPEED_DRIFT = 0.10


def with_speed_drift(load: dict, before: tuple[float, ...], after: tuple[float, ...]) -> dict:
    """The load summary with the speed drift added, ``noisy`` when either says so."""
    drift = speed_drift(before, after)
    return {**load, **drift, "noisy": load["noisy"] or drift["speed_noisy"]}


def speed_drift(before: tuple[float, ...], after: tuple[float, ...]) -> dict:
    """How much numpy's times moved between the start and the end of the run.

    The load monitor sees other processes of this machine, not a virtual machine's
    neighbours or a changed clock: numpy's own product, timed before and after the
    engine's runs, does. A run where it moved by more than :data:`MAX_SPEED_DRIFT` is
    ``noisy``: the engine's runs in between met another machine speed than either.
    """
    drift = max(max(a, b) / min(a, b) - 1.0 for a, b in zip(before, after, strict=True))
    return {
        "numpy_seconds_before_after": [list(before), list(after)],
        "speed_drift": drift,
        "speed_noisy": drift > MAX_SPEED_DRIFT,
    }


def _span_of(gram_path: Path) -> int:
    """The feature block width of a Gram job (what one product multiplies)."""
    from mmdtl2_dist.engine import GramStore

    return max(c1 - c0 for c0, c1 in GramStore.open(gram_path).job["col_blocks"])


def _ratios(result: dict, flops: float) -> None:
    """GFLOP/s of every run and the ratios the targets are stated in."""
    runs, t32, t64 = result["engine"], result["numpy_f32_seconds"], result["numpy_f64_seconds"]
    result["gflops"] = {"numpy_f32": flops / t32 / 1e9, "numpy_f64": flops / t64 / 1e9}
    for label, r in runs.items():
        result["gflops"][f"engine {label}"] = flops / r["seconds"] / 1e9
    ratios = {}
    for precision, base in (("float64", t64), ("mixed", t32)):
        one, two = runs.get(f"{precision}, 1 worker"), runs.get(f"{precision}, 2 workers")
        if one and two:
            ratios[precision] = {
                "engine_2_workers_vs_numpy": base / two["seconds"],
                "scaling_2_vs_1_worker": one["seconds"] / two["seconds"],
            }
            device_rate = result["calibration"].get(f"device_flops_per_s_{precision}")
            if device_rate:  # tiles on a torch device: against its own matmul
                ratios[precision]["engine_1_worker_vs_device_matmul"] = (
                    flops / one["seconds"] / device_rate
                )
    result["ratios"] = ratios


def _print_throughput(result: dict, flops: float, repeat: int) -> None:
    from mmdtl2_dist.engine.timing import format_timing

    n, L = result["shape"]
    print(f"\nGram of {n} x {L} float32 ({os.cpu_count()} cores), best of {repeat}")
    print(f"{'method':40s} {'seconds':>9s} {'GFLOP/s':>9s} {'predicted':>10s}")
    rows = [
        (f"numpy X @ X.T float32 ({result['numpy_threads']} threads)", result["numpy_f32_seconds"]),
        (f"numpy X @ X.T float64 ({result['numpy_threads']} threads)", result["numpy_f64_seconds"]),
    ]
    for name, t in rows:
        print(f"{name:40s} {t:9.2f} {flops / t / 1e9:9.1f}")
    for label, r in result["engine"].items():
        pred = result["cost_model"]["runs"][label]["seconds"]
        print(
            f"{'engine ' + label:40s} {r['seconds']:9.2f} {flops / r['seconds'] / 1e9:9.1f}"
            f" {pred:10.2f}"
        )
    for precision, q in result["ratios"].items():
        base = "float64" if precision == "float64" else "float32"
        print(
            f"{precision}: engine (2 workers) / numpy {base}: "
            f"{q['engine_2_workers_vs_numpy']:.0%}; 2 vs 1 worker {q['scaling_2_vs_1_worker']:.2f}x"
            + (
                f"; engine (1 worker) / the device's own matmul on the same blocks: "
                f"{q['engine_1_worker_vs_device_matmul']:.0%}"
                if "engine_1_worker_vs_device_matmul" in q
                else ""
            )
        )
    for label, r in result["engine"].items():
        print(f"where the time goes, {label}:\n{format_timing(r['timing'])}")
    load = result["load"]
    print(
        f"load average (1 min) over the run {load['load_avg_1min']['min']:.2f}-"
        f"{load['load_avg_1min']['max']:.2f}; other processes used "
        f"{load['foreign_cores_mean']:.2f} cores on average (max {load['foreign_cores_max']:.2f});"
        f" numpy's times moved by {load['speed_drift']:.0%} from start to end"
        + (
            "\nNOISY RUN: other processes competed for the cores; do not use its ratios."
            if load["foreign_cores_mean"] > LoadMonitor.NOISY_FOREIGN_CORES
            else ""
        )
        + (
            "\nNOISY RUN: the machine's speed changed during the run (numpy's times moved by"
            f" more than {MAX_SPEED_DRIFT:.0%}); do not use its ratios."
            if load["speed_noisy"]
            else ""
        )
    )


def product_rate(cal: dict, precision: str, workers: int) -> float:
    """The calibrated product rate of one worker of a run with ``workers`` workers.

    A device's own matmul on GPUs; on CPU workers, with more than one, the rate each
    has while a node's workers all multiply (:func:`calibrate_loaded`), else alone.
    """
    if f"device_flops_per_s_{precision}" in cal:
        return cal[f"device_flops_per_s_{precision}"]
    if workers > 1 and f"loaded_flops_per_s_{precision}" in cal:
        return cal[f"loaded_flops_per_s_{precision}"]
    return cal[f"flops_per_s_{precision}"]


def cost_model(result: dict) -> dict:
    """Predicted against measured wall time, and projections for a cluster.

    The rates are the calibration's, measured after the engine's runs (:func:`product_rate`
    picks the products' rate of a run's worker count);
    :func:`mmdtl2_dist.engine.cost.predict_gram_seconds` is the model. The projections
    take the rate of a node whose workers all multiply, and a quarter of the read rate.
    """
    from mmdtl2_dist.engine.cost import predict_gram_seconds

    n, L = result["shape"]
    cal = result["calibration"]
    runs = {}
    for label, r in result["engine"].items():
        precision = r["precision"]
        rate = product_rate(cal, precision, r["workers"])
        pred = predict_gram_seconds(
            n,
            L,
            r["workers"],
            rate,
            cal["read_bytes_per_s"],
            tile_rows=r["tile_rows"],
            parts=r.get("parts", 1),
        )
        runs[label] = {
            **pred,
            "measured_seconds": r["seconds"],
            "ratio_measured_vs_predicted": r["seconds"] / pred["seconds"],
        }
    proj = {}
    for N in (20_000, 50_000, 100_000):
        for W in (16, 64, 256):
            p = predict_gram_seconds(
                N, L, W, product_rate(cal, "float64", W), cal["read_bytes_per_s"] / 4
            )
            proj[f"n={N},workers={W}"] = {
                "hours": p["seconds"] / 3600,
                "core_hours": p["seconds"] * W / 3600,
            }
    return {
        "model": "mmdtl2_dist.engine.cost.predict_gram_seconds",
        "runs": runs,
        "projection_assumptions": "float64, tile 2048, calibrated flop rate, a quarter of "
        "the calibrated read rate per worker (shared storage)",
        "projections": proj,
    }


def big(args) -> dict:
    """The out-of-core Gram: time and peak memory of the whole job, per precision."""
    from mmdtl2_dist.engine.cost import predict_gram_seconds
    from mmdtl2_dist.engine.timing import format_timing
    from mmdtl2_dist.store import FeatureStore

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    store = work / f"synth_{args.n}.zarr"
    spec = SyntheticSpec(n_source=args.n, n_target=0, dim=args.dim, seed=args.seed)
    t0 = time.perf_counter()
    gen_peak = None
    if not store.exists():
        with PeakMemory() as gen_mem:
            make_synthetic_store(store, spec, progress=True)
        gen_peak = gen_mem.peak
    t_gen = time.perf_counter() - t0
    fs = FeatureStore.open(store)
    ra, rb = np.arange(0, args.n, 997), np.arange(0, args.n, 1009)
    ref = fs.read("source", "conv3", ra).astype(np.float64) @ (
        fs.read("source", "conv3", rb).astype(np.float64).T
    )
    result = {
        "benchmark": "gram_big",
        "shape": [args.n, args.dim],
        "feature_bytes": args.n * args.dim * 4,
        "machine": machine(),
        "generate_seconds": t_gen,
        "generate_peak_rss_gb": None if gen_peak is None else gen_peak / 2**30,
        "runs": {},
    }
    for precision in args.precisions:
        out = work / f"gram_{args.n}_{precision}"
        if not args.resume:
            shutil.rmtree(out, ignore_errors=True)
        with LoadMonitor() as load, PeakMemory() as mem:
            t, gs = _engine_keep(store, out, args, precision)
        err = float(np.abs(gs.block(ra, rb) - ref).max() / np.abs(ref).max())
        cal = calibrate(store, gs.tile_rows, _span_of(out), args.device)
        workers = args.gpus or 2
        if args.device is None:
            cal |= calibrate_loaded(store, cal["tile_rows"], cal["span"], workers)
        pred = predict_gram_seconds(
            args.n,
            args.dim,
            workers,
            product_rate(cal, precision, workers),
            cal["read_bytes_per_s"],
            tile_rows=gs.tile_rows,
            parts=gs.job.get("parts", 1),
        )
        run = {
            "gram_seconds": t,
            "tile_phase_seconds": gs.last_run["timing"]["wall_seconds"],
            "predicted_seconds": pred["seconds"],
            "gram_peak_rss_gb": mem.peak / 2**30,
            "tile_rows": gs.tile_rows,
            "last_run": gs.last_run,
            "spot_check_max_rel_err": err,
            "gflops": float(args.n) ** 2 * args.dim / t / 1e9,
            "calibration": cal,
            "load": load.summary(),
        }
        result["runs"][precision] = run
        print(
            f"\nGram of {args.n} x {args.dim} float32 ({result['feature_bytes'] / 1e9:.1f} GB), "
            f"{precision}: {t:.0f} s, of which tiles {run['tile_phase_seconds']:.0f} s (predicted "
            f"{pred['seconds']:.0f} s; the rest is starting Ray), "
            f"{run['gflops']:.1f} GFLOP/s, peak RSS of the job (driver + Ray) "
            f"{run['gram_peak_rss_gb']:.2f} GB, spot-check rel. err {err:.1e}\n"
            + format_timing(gs.last_run["timing"])
            + (
                "\nNOISY RUN: other processes competed for the cores."
                if run["load"]["noisy"]
                else ""
            )
        )
    return result


def _engine_keep(store, out, args, precision):
    t0 = time.perf_counter()
    gs = compute_gram(
        store,
        "conv3",
        out,
        progress=True,
        num_cpus=2,
        gpus=args.gpus,
        device=args.device,
        precision=precision,
        max_task_memory_mb=args.max_task_memory_mb,
    )
    return time.perf_counter() - t0, gs


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", nargs="?", choices=["throughput", "big"], default="throughput")
    p.add_argument("--n", type=int, help="samples (2000 for throughput, 20000 for big)")
    p.add_argument("--dim", type=int, default=64_896)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--workdir", default="/tmp/mmdtl2_bench")
    p.add_argument("--max-task-memory-mb", type=float, default=1024)
    p.add_argument("--resume", action="store_true", help="big: resume a partial Gram")
    p.add_argument(
        "--precision",
        default="float64,mixed",
        help="comma-separated precisions to run (float64, mixed; default both)",
    )
    p.add_argument("--gpus", type=int, default=0, help="GPUs of the local Ray (tiles on cuda)")
    p.add_argument("--device", help="torch device of the tiles (default: numpy on the CPU)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument(
        "--node-workers",
        type=int,
        default=BENCH_CPUS,
        help="processes multiplying at once for the cost model's product rate (a node's "
        f"workers; default {BENCH_CPUS})",
    )
    p.add_argument("--out", default=str(HERE / "results"), help="folder of the JSON result")
    args = p.parse_args(argv)
    args.n = args.n or (2000 if args.mode == "throughput" else 20_000)
    args.precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
    if args.gpus and args.device is None:
        args.device = "cuda"
    result = throughput(args) if args.mode == "throughput" else big(args)
    shown = sys.argv[1:] if argv is None else argv
    result["command"] = "python benchmarks/bench_gram.py " + " ".join(shown)
    out = Path(args.out) / f"gram_{args.mode}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
