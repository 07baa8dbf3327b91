"""BLAS threads: the README's first estimator fit with the library's limit, without it, and
with ``OMP_NUM_THREADS=1``, on an idle and on a loaded machine; plus the largest in-memory
products (kernel of a scoring batch, a Gram of 2,000 samples) with 1 thread and all cores.

The fit is ``MMDTL2(kernel="rbf", preprocessing="l2_zscore").fit(X, y, sample_domain=...)``
on the bundled Office-Caltech10 amazon → webcam split 0: 200 source and 30 labelled
target samples (230 rows, 800-d SURF). Variants:

- ``library``: as shipped (``mmdtl2_dist.core.threads`` limits BLAS/OpenMP to one thread
  inside the fit), no thread variable set;
- ``no limit``: the limit replaced by a no-op in the child (``threads._limited`` set to
  ``contextlib.nullcontext``: the behaviour before the library limited threads);
- ``OMP_NUM_THREADS=1``: the library as shipped, the variable set by the user.

Each timing runs in a fresh subprocess (imports and data loading excluded; the timed fit
is the child's first). "loaded" runs one CPU-burning process per core, started and
stopped by this script. The 1-minute load average is recorded before and after each
timing: on a shared machine "idle" means "no burner of ours", not an idle machine.

    python benchmarks/bench_threads.py [--repeats 2] [--timeout 600]
        [--out benchmarks/results/threads.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
VARIANTS = ("library", "no limit", "OMP_NUM_THREADS=1")
# (name, rows of A, rows of B or None for A Aᵀ, feature dimension)
PRODUCTS = [
    ("scoring kernel 30 x 4,000 (L = 4,096)", 30, 4000, 4096),
    ("Gram 2,000 x 2,000 (L = 4,096)", 2000, None, 4096),
]


def child_fit(variant: str) -> dict:
    """Time one README fit in this (fresh) process."""
    import contextlib

    import numpy as np
    from threadpoolctl import threadpool_info

    import mmdtl2_dist.core.threads as threads
    from mmdtl2_dist.datasets.office_caltech import load_domain, load_hoffman_splits
    from mmdtl2_dist.estimators import MMDTL2

    if variant == "no limit":
        threads._limited = contextlib.nullcontext
    src, tgt = load_domain("amazon"), load_domain("webcam")
    sp = load_hoffman_splits("amazon", "webcam")[0]
    X = np.vstack([src.X[sp.source_train], tgt.X[sp.target_train]])
    y = np.r_[src.y[sp.source_train], tgt.y[sp.target_train]]
    domains = np.r_[np.ones(len(sp.source_train)), -np.ones(len(sp.target_train))]
    t0 = time.perf_counter()
    model = MMDTL2(kernel="rbf", preprocessing="l2_zscore").fit(X, y, sample_domain=domains)
    fit_s = time.perf_counter() - t0
    acc = float(np.mean(model.predict(tgt.X[sp.target_test]) == tgt.y[sp.target_test]))
    blas = sorted({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})
    return {"fit_s": fit_s, "n_samples": int(len(y)), "accuracy": acc, "blas_threads": blas}


def child_product(index: int, n_threads: int) -> dict:
    """Best of 3 timings of one product of :data:`PRODUCTS` with ``n_threads`` BLAS threads."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    _, m, n, L = PRODUCTS[index]
    rng = np.random.default_rng(0)
    A = rng.random((m, L))
    B = A if n is None else rng.random((n, L))
    with threadpool_limits(n_threads, user_api="blas"):
        A @ B.T
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            A @ B.T
            times.append(time.perf_counter() - t0)
    return {"s": min(times)}


def run_child(args: list[str], env: dict, timeout: float) -> dict:
    """Run one timing in a fresh process; a child past ``timeout`` s is killed and noted."""
    load0 = os.getloadavg()[0]
    cmd = [sys.executable, __file__, "--child", *args]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        res = {"fit_s": None, "timed_out_s": timeout}
    else:
        if out.returncode != 0:
            raise RuntimeError(f"child {args} failed:\n{out.stderr}")
        res = json.loads(out.stdout.strip().splitlines()[-1])
    res.update(load_before=load0, load_after=os.getloadavg()[0])
    return res


def seconds(r: dict) -> str:
    return f"> {r['timed_out_s']:.0f}" if r.get("fit_s") is None else f"{r['fit_s']:.2f}"


def base_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH")) if p
    )
    return env


def start_burners() -> list[subprocess.Popen]:
    n = os.cpu_count() or 1
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def measure(condition: str, repeats: int, timeout: float) -> list[dict]:
    rows = []
    for variant in VARIANTS:
        env = base_env()
        if variant == "OMP_NUM_THREADS=1":
            env["OMP_NUM_THREADS"] = "1"
        for r in range(repeats):
            res = run_child(["fit", variant], env, timeout)
            rows.append(
                {"what": "fit", "condition": condition, "variant": variant, "run": r, **res}
            )
            print(
                f"{condition:6s} {variant:18s} fit {seconds(res):>7s} s  "
                f"(BLAS threads after {res.get('blas_threads')}, load "
                f"{res['load_before']:.1f} -> {res['load_after']:.1f})",
                flush=True,
            )
    cores = os.cpu_count() or 1
    for i, (name, *_) in enumerate(PRODUCTS):
        for n_threads in sorted({1, cores}):
            res = run_child(["product", str(i), str(n_threads)], base_env(), timeout)
            rows.append(
                {"what": name, "condition": condition, "variant": f"{n_threads} thread(s)", **res}
            )
            print(f"{condition:6s} {name:40s} {n_threads} thread(s) {res['s'] * 1e3:8.1f} ms")
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| condition | variant | README fit (s), each run | 1-min load before → after |",
        "|---|---|---|---|",
    ]
    for cond in ("idle", "loaded"):
        for variant in VARIANTS:
            rs = [
                r
                for r in rows
                if r["what"] == "fit" and (r["condition"], r["variant"]) == (cond, variant)
            ]  # noqa: E501
            fits = ", ".join(seconds(r) for r in rs)
            loads = ", ".join(f"{r['load_before']:.1f} → {r['load_after']:.1f}" for r in rs)
            lines.append(f"| {cond} | {variant} | {fits} | {loads} |")
    lines += ["", "| condition | product | threads | best of 3 (ms) |", "|---|---|---|---|"]
    for r in rows:
        if r["what"] != "fit":
            lines.append(
                f"| {r['condition']} | {r['what']} | {r['variant']} | {r['s'] * 1e3:.1f} |"
            )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, *rest = sys.argv[2:]
        res = child_fit(rest[0]) if kind == "fit" else child_product(int(rest[0]), int(rest[1]))
        print(json.dumps(res))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2, help="fresh processes per cell")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "threads.json")
    ap.add_argument(
        "--timeout", type=float, default=600.0, help="seconds before a timing is cut off"
    )
    args = ap.parse_args()
    rows = measure("idle", args.repeats, args.timeout)
    burners = start_burners()
    try:
        time.sleep(2.0)
        rows += measure("loaded", args.repeats, args.timeout)
    finally:
        stop(burners)
    md = table(rows)
    print(md)
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared with other jobs)",
        "python": platform.python_version(),
        "repeats": args.repeats,
        "timeout_s": args.timeout,
        "burners": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    args.out.with_suffix(".md").write_text(md + "\n")


if __name__ == "__main__":
    main()
