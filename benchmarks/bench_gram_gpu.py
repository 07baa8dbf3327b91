"""The Gram engine's tiles on one GPU, against that GPU's own matmul (seeded; writes JSON).

One run, in one process, on one torch device (``--device``, default ``cuda``), tiles
run by the engine's in-process executor (:data:`mmdtl2_dist.engine.IN_PROCESS`: the same
tile tasks a GPU worker of a Ray cluster runs, one at a time, as one GPU does; no Ray):

1. a synthetic ``--n`` x ``--dim`` float32 store (default 20,000 x 64,896, 5.2 GB);
2. the host's read rate of feature blocks, with one thread and with the tiles' read pool;
3. the reference Gram ``X Xᵀ`` in float64 on the device (cuBLAS, one product);
4. the device's own matmul on tile-sized blocks resident on it (float64 and float32,
   ``a aᵀ`` of ``tile_rows x span``; CUDA events, median of 5) and its host-to-device
   copy rate from page-locked memory;
5. the engine in each precision with the default plan (the default 1 GB task budget)
   and the process's GPU memory capped below the store's size (``--cap-gb``,
   ``torch.cuda.set_per_process_memory_fraction``): out of core; then with
   the larger tiles of ``--max-task-memory-mb`` (default 8 GB: two tiles of 10,240
   rows) or ``--tile-rows``.

For each engine run: wall time, where the tiles' time went (phases; ``product`` and
``transfer`` are device times), the rate in useful flops (the symmetric product's
``n² L``) against the device's matmul, the product phase's own rate, the peak GPU
memory, and the error against the reference. The load of the host is recorded
(:class:`bench_gram.LoadMonitor`).

    python benchmarks/bench_gram_gpu.py                         # on a machine with a GPU
    python benchmarks/bench_gram_gpu.py --device cpu --n 600 --dim 9000 --tile-rows 256
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import time
import traceback
from pathlib import Path

import numpy as np
from bench_gram import HERE, LoadMonitor, machine

from mmdtl2_dist.engine import IN_PROCESS, compute_gram
from mmdtl2_dist.engine.plan import DEFAULT_TASK_MEMORY_MB, GPU_TILE_ROWS
from mmdtl2_dist.engine.timing import format_timing
from mmdtl2_dist.engine.torch_products import read_pool
from mmdtl2_dist.store import FeatureStore, SyntheticSpec, make_synthetic_store
from mmdtl2_dist.store.feature_store import read_array_block


def device_seconds(torch, device: str, fn, repeat: int = 5) -> float:
    """Median seconds of ``fn()`` on the device (CUDA events; host clock on the CPU)."""
    fn()  # warm-up: kernel selection, allocation
    times = []
    for _ in range(repeat):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def read_rates(path: str, rows: int, span: int, n_features: int) -> dict:
    """GB/s of reading ``rows`` rows in blocks of ``span`` features: one thread, the pool."""
    out = np.empty((rows, span), dtype=np.float32)
    rates = {}
    for name, pool in (("one_thread", None), ("read_pool", read_pool())):
        t0 = time.perf_counter()
        for c0 in range(0, n_features - span + 1, span):
            read_array_block(path, 0, rows, c0, c0 + span, check_finite=False, out=out, pool=pool)
        seconds = time.perf_counter() - t0
        rates[f"{name}_gb_per_s"] = rows * (n_features // span) * span * 4 / seconds / 1e9
    rates["read_pool_threads"] = read_pool()._max_workers
    return rates


def reference_gram(torch, X: np.ndarray, device: str) -> np.ndarray:
    """``X Xᵀ`` in float64 on the device, as one cuBLAS product (the reference)."""
    Xd = torch.from_numpy(X).to(device).double()
    G = (Xd @ Xd.T).cpu().numpy()
    del Xd
    return G


def device_ceilings(torch, X: np.ndarray, device: str, tile_rows: int, span: int) -> dict:
    """The device's matmul on a resident ``tile_rows x span`` block, and its copy rate."""
    block = np.ascontiguousarray(X[:tile_rows, :span])
    out = {"block": list(block.shape)}
    for name, dtype in (("float64", torch.float64), ("mixed", torch.float32)):
        a = torch.from_numpy(block).to(device).to(dtype)
        seconds = device_seconds(torch, device, lambda a=a: a @ a.T)
        out[f"matmul_flops_per_s_{name}"] = 2.0 * block.shape[0] ** 2 * span / seconds
        del a
    if device.startswith("cuda"):
        host = torch.from_numpy(block).pin_memory()
        seconds = device_seconds(torch, device, lambda: host.to(device, non_blocking=True))
        out["copy_gb_per_s_pinned"] = block.nbytes / seconds / 1e9
        out["tf32_allowed"] = bool(torch.backends.cuda.matmul.allow_tf32)
    return out


def engine_run(torch, args, store: Path, ref, ceilings, plan: tuple) -> dict:
    """One engine run on the device, timed, checked against the reference.

    ``plan``: precision, tile rows (None: the engine's choice), the task memory budget
    (MB) and the cap on this process's GPU memory (GB, None: none).
    """
    precision, tile_rows, budget_mb, cap_gb = plan
    cuda = args.device.startswith("cuda")
    if cuda:
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(args.device).total_memory
        index = torch.device(args.device).index
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, cap_gb * 2**30 / total) if cap_gb else 1.0,
            torch.cuda.current_device() if index is None else index,
        )
        torch.cuda.reset_peak_memory_stats(args.device)
    out = Path(args.workdir) / "gram_gpu"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    gs = compute_gram(
        store, "conv3", out, address=IN_PROCESS, device=args.device, precision=precision,
        tile_rows=tile_rows, max_task_memory_mb=budget_mb, progress=False,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    G = gs.to_numpy()
    err = np.abs(G - ref)
    positive = ref > 0
    run = gs.last_run
    matmul = ceilings[f"matmul_flops_per_s_{precision}"]
    result = {
        "precision": precision,
        "tile_rows": gs.tile_rows,
        "gpu_memory_cap_gb": cap_gb,
        "seconds": seconds,
        "useful_flops": run["flops"],
        "rows_read": run["rows_read"],
        "tiles": run["tiles"],
        "rate_flops_per_s": run["flops"] / seconds,
        "rate_vs_device_matmul": run["flops"] / seconds / matmul,
        "phases": run["timing"]["phases"],
        "max_rel_err_vs_largest": float(err.max() / np.abs(ref).max()),
        "max_rel_err_worst_entry": float((err[positive] / ref[positive]).max()),
        "peak_gpu_memory_gb": torch.cuda.max_memory_allocated(args.device) / 2**30
        if cuda
        else None,
        "timing_text": format_timing(run["timing"]),
    }
    product_s = run["timing"]["phases"].get("product")
    if product_s:
        result["product_phase_vs_device_matmul"] = run["flops"] / product_s / matmul
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=64_896)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tile-rows", type=int, help="rows per tile (default: the engine's choice)")
    p.add_argument("--max-task-memory-mb", type=float, default=8192)
    p.add_argument("--cap-gb", type=float, default=4.0, help="GPU memory of the out-of-core runs")
    p.add_argument("--workdir", default="/tmp/mmdtl2_bench_gpu")
    p.add_argument("--out", default=str(HERE / "results" / "gram_gpu.json"))
    args = p.parse_args(argv)
    import torch

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    store = work / f"synth_{args.n}x{args.dim}.zarr"
    t0 = time.perf_counter()
    if not store.exists():
        make_synthetic_store(store, SyntheticSpec(args.n, 0, dim=args.dim, seed=args.seed))
    res = {
        "benchmark": "gram_gpu",
        "command": "python benchmarks/bench_gram_gpu.py " + " ".join(argv or sys.argv[1:]),
        "machine": machine(),
        "card": torch.cuda.get_device_name(args.device)
        if args.device.startswith("cuda")
        else "cpu",
        "torch": torch.__version__,
        "shape": [args.n, args.dim],
        "feature_gb": args.n * args.dim * 4 / 1e9,
        "store_seconds": time.perf_counter() - t0,
        "runs": [],
    }
    print(
        f"{res['card']}, torch {res['torch']}: store ready in {res['store_seconds']:.0f} s",
        flush=True,
    )
    fs = FeatureStore.open(store)
    path = fs.array_path("source", "conv3")
    span = 2 * fs.array("source", "conv3").chunks[1]
    with LoadMonitor() as load:
        rows = min(args.tile_rows or GPU_TILE_ROWS, args.n)
        res["read"] = read_rates(path, rows, span, args.dim)
        print(f"read: {json.dumps(res['read'])}", flush=True)
        X = fs.read("source", "conv3")
        t0 = time.perf_counter()
        ref = reference_gram(torch, X, args.device)
        res["reference_seconds"] = time.perf_counter() - t0
        res["device"] = device_ceilings(torch, X, args.device, rows, span)
        print(f"device: {json.dumps(res['device'])}", flush=True)
        del X
        big, default = (args.tile_rows, args.max_task_memory_mb), (None, DEFAULT_TASK_MEMORY_MB)
        # capped first: the caching allocator keeps what the large tiles reserved
        plans = [(p, *default, args.cap_gb) for p in ("float64", "mixed")]
        plans += [(p, *big, None) for p in ("float64", "mixed")]
        for plan in plans:
            try:
                run = engine_run(torch, args, store, ref, res["device"], plan)
            except Exception as exc:  # noqa: BLE001 - one failed plan must not lose the others
                traceback.print_exc()
                res["runs"].append({"plan": list(plan), "error": repr(exc)})
                continue
            res["runs"].append(run)
            _print_run(run)
    res["load"] = load.summary()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out}")
    return 1 if any("error" in run for run in res["runs"]) else 0


def _print_run(run: dict) -> None:
    cap = (
        f", GPU memory capped at {run['gpu_memory_cap_gb']} GB" if run["gpu_memory_cap_gb"] else ""
    )
    peak = run["peak_gpu_memory_gb"]
    print(
        f"\n{run['precision']}, tiles of {run['tile_rows']} rows{cap}: {run['seconds']:.2f} s, "
        f"{run['rate_flops_per_s'] / 1e12:.2f} TFLOP/s useful = "
        f"{run['rate_vs_device_matmul']:.0%} of the device's matmul; product phase "
        f"{run.get('product_phase_vs_device_matmul', float('nan')):.0%}; "
        f"max rel err {run['max_rel_err_vs_largest']:.1e} (worst entry "
        f"{run['max_rel_err_worst_entry']:.1e})"
        + (f"; peak GPU memory {peak:.2f} GB" if peak is not None else "")
        + "\n"
        + run["timing_text"],
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
