"""Computation time of MMDTL2 and the scale envelope (the paper's Figure 8).

Usage (``make bench`` runs the quick subset)::

    python benchmarks/bench_scale.py --preset quick      # every study, < 5 min
    python benchmarks/bench_scale.py                     # full set, every study (~20 min)
    python benchmarks/bench_scale.py --only figure8      # one study
    python benchmarks/bench_scale.py --only wstep --threads 2

Seeded; each study prints a table and writes ``benchmarks/results/scale_<study>_<preset>.json``
(``figure8`` also ``scale_figure8_<preset>.png``). Four studies, each a function
returning a list of records (plain dicts, JSON-ready):

``figure8``
    Training time and peak memory versus the feature dimension ``L = Ls = Lt`` for the
    primal W-step QP (:func:`mmdtl2_dist.core.reference.fit_mmdtl2_features`, Clarabel),
    MMDT with an explicit ``W`` in Hoffman et al.'s reference-code form
    (:func:`mmdt_explicit_fit`) and the dual MMDTL2 on Grams (Grams from the features
    *included* in its time), with 10 and 40 labelled target samples per class.
``wstep``
    The W-step dual box QP (assembled from a real alternation) solved by every solver of
    :func:`mmdtl2_dist.core.qp.solve_box_qp`, time and KKT residual, K·M = 20 ... 4,000.
``svm``
    The SVM-step (one-vs-rest, per-sample costs, regularised bias) by our box-QP dual on the
    Gram against scikit-learn's liblinear (``LinearSVC``) and libsvm (``SVC``), on source
    samples plus *transformed* targets; accuracy as the gap of each solution in the
    objective of the one problem they all approximate.
``e2e``
    Paper scale end to end: a synthetic 64,896-d Zarr store (734 + 279 samples), Grams
    streamed from the store, fit, predict; and the same through the Ray Gram engine.

What is measured is the product's own code (the dual fit, the QP solvers, the feature
store, the Gram engine), on features of the product's synthetic generator
(:func:`mmdtl2_dist.store.synthetic.synthetic_features`). Two comparisons are against
deliberately independent references, written here or taken from scikit-learn:
:func:`mmdt_explicit_fit` is MMDT as Hoffman et al.'s reference code runs it (liblinear
SVMs, ``W`` formed explicitly; the method whose time and memory the paper's Figure 8
shows; only its Bregman W-step is the product's), and the ``svm`` study's liblinear and
libsvm solutions.

Every timed run executes in a fresh Python process (:func:`run_isolated`), so its peak
memory (``ru_maxrss``) is its own and an out-of-memory kill cannot take the driver down.
Runs whose memory estimate exceeds ``mem_limit_gb`` are not started; they are recorded
with ``status = "out of memory (estimate X GB)"``. BLAS threads are limited with
``threadpoolctl`` (``threads``, default 1): on a loaded 2-core machine multi-threaded
BLAS is many times slower on small matrices.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's package, installed or not
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from mmdtl2_dist.core.reference import augment  # noqa: E402

GB = 2**30
PAPER_DIMS = (10, 30, 100, 180, 1_000, 10_000, 64_896)
PRESETS = {
    # figure8: dims, targets per class, source samples, classes
    "tiny": {
        "dims": (10,),
        "per_class": (3,),
        "N": 40,
        "K": 2,
        "primal_max_dim": 30,
        "wstep_sizes": ((2, 10),),
        "svm_sizes": ((40, 6, 20),),
        "e2e": {"n_source": 60, "n_target": 40, "dim": 4_056, "N": 30, "M": 10},
        "e2e_threads": (1,),
        "e2e_warm": False,
        "engine": False,
    },
    "quick": {
        "dims": (10, 100, 180, 1_000, 10_000),
        "per_class": (10, 40),
        "N": 367,
        "K": 2,
        "primal_max_dim": 180,
        "primal_per_class": (10,),
        "wstep_sizes": ((2, 10), (10, 50), (10, 100), (10, 400)),
        "osqp_max_km": 1_000,  # OSQP takes minutes at K·M = 4,000 (see BENCHMARKS.md)
        "svm_sizes": ((367, 80, 800),),
        "e2e": {"n_source": 734, "n_target": 279, "dim": 64_896, "N": 367, "M": 80},
        "engine": False,
    },
    "full": {
        "dims": PAPER_DIMS,
        "per_class": (10, 40),
        "N": 367,
        "K": 2,
        "primal_max_dim": 1_000,
        "wstep_sizes": ((2, 10), (2, 40), (2, 100), (10, 50), (10, 100), (10, 200), (10, 400)),
        "svm_sizes": ((367, 80, 800), (367, 80, 4_096), (734, 279, 4_096), (2_000, 400, 800)),
        "e2e": {"n_source": 734, "n_target": 279, "dim": 64_896, "N": 367, "M": 80},
        "engine": True,
    },
}


# --------------------------------------------------------------------------- machinery


def _print(*args) -> None:
    print(*args, flush=True)


def machine_info() -> dict:
    """CPU count, memory, load and library versions of this machine."""
    import psutil
    import scipy

    return {
        "cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / GB, 1),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


_ISOLATE = True  # run every task in a fresh interpreter (see run_benchmarks(isolate=...))


def run_isolated(task: str, kwargs: dict, *, timeout: float = 900, threads: int = 1) -> dict:
    """Run ``TASKS[task](**kwargs)`` in a fresh interpreter; return its record.

    The child limits BLAS to ``threads`` threads, adds ``peak_rss_mb`` (its whole-life
    peak resident memory) and prints the record as the last line of stdout. A crash or a
    timeout becomes a record with ``status`` saying so.
    """
    payload = json.dumps({"task": task, "kwargs": kwargs, "threads": threads})
    if not _ISOLATE:  # smoke tests: same process, peak memory is the process's so far
        return _run_task(payload)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--task", payload]
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"task": task, **kwargs, "status": f"timeout after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"task": task, **kwargs, "status": f"failed (rc {proc.returncode})", "err": tail}
    return json.loads(lines[-1])


def _run_task(payload: str) -> dict:
    # Load every BLAS/LAPACK the tasks use *before* limiting threads: threadpoolctl only
    # limits libraries already loaded (scipy's own OpenBLAS would otherwise run with all
    # cores, many times slower on small matrices of a loaded machine).
    import scipy.linalg  # noqa: F401
    import sklearn.svm  # noqa: F401
    from threadpoolctl import threadpool_limits

    import mmdtl2_dist.core.methods  # noqa: F401

    spec = json.loads(payload)
    with threadpool_limits(spec["threads"]):
        rec = TASKS[spec["task"]](**spec["kwargs"])
    rec.update(task=spec["task"], threads=spec["threads"], peak_rss_mb=_maxrss() / 2**20)
    rec.setdefault("status", "ok")
    return json.loads(json.dumps(rec, default=float))


def _child(payload: str) -> None:
    print(json.dumps(_run_task(payload), default=float))


# --------------------------------------------------------------------------- data


def scale_data(L: int, N: int, M: int, K: int, seed: int = 0, Q: int = 0, **options):
    """Seeded features of the product's synthetic generator, as float64, in ``L`` dimensions.

    :func:`mmdtl2_dist.store.synthetic.synthetic_features` of a study with ``N`` source and
    ``M + Q`` target samples of ``K`` classes (``options``: more ``SyntheticSpec`` fields).
    The ``M`` labelled targets are balanced over the classes (one of each class in turn);
    the other ``Q`` are the test samples. Returns ``Xs, ys, Xt, yt, Xq, yq``.
    """
    from mmdtl2_dist.store.synthetic import SyntheticSpec, synthetic_features

    spec = SyntheticSpec(n_source=N, n_target=M + Q, n_classes=K, dim=L, seed=seed, **options)
    Xs, ys = synthetic_features(spec, 0, dtype=np.float64)
    X, y = synthetic_features(spec, 1, dtype=np.float64)
    labelled = balanced_first(y, M)
    test = np.setdiff1d(np.arange(len(y)), labelled)
    return Xs, ys, X[labelled], y[labelled], X[test], y[test]


def balanced_first(y: np.ndarray, m: int) -> np.ndarray:
    """Indices of ``m`` samples taken one of each class in turn, in order of appearance."""
    rank = np.zeros(len(y), dtype=int)
    for k in np.unique(y):
        members = np.flatnonzero(y == k)
        rank[members] = np.arange(len(members))
    return np.sort(np.lexsort((y, rank))[:m])


# --------------------------------------------------------------------------- figure 8


def primal_memory_estimate(L: int, M: int, K: int) -> float:
    """Bytes the primal W-step QP needs (Clarabel, sparse KKT), from its sizes.

    ``V = I ⊗ A`` has ``L (L+1)²`` non-zeros, the constraint block ``K·M × L(L+1)``
    dense rows; the KKT matrix, its LDL factor and the solver's copies take about 84 bytes
    per such non-zero: calibrated against the measured peaks at L = 100 and 180 (2.2 ×
    a first guess of 3 copies at 12 bytes, see BENCHMARKS.md).
    """
    nnz = L * (L + 1) ** 2 + 2 * K * M * L * (L + 1)
    return 84.0 * nnz


def mmdt_memory_estimate(L: int, N: int, M: int) -> float:
    """Bytes of explicit-W MMDT: ``W`` and one (L+1)² temporary, plus the features."""
    return 2 * 8.0 * (L + 1) ** 2 + 3 * 8.0 * (N + M) * (L + 1)


def _warm_up(method: str) -> None:
    """One fit on a tiny problem first, so that imports and first calls are not timed."""
    from mmdtl2_dist.core.mmdtl2 import MMDTL2Params, fit_mmdtl2_gram
    from mmdtl2_dist.core.reference import fit_mmdtl2_features

    Xs, ys, Xt, yt, _, _ = scale_data(5, 8, 4, 2, seed=99)
    if method == "dual":
        Kz = np.zeros((12, 12))
        Kz[:8, :8] = Xs @ Xs.T
        Xh = augment(Xt)
        fit_mmdtl2_gram(Kz, Xh @ Xh.T, ys, yt, 2, MMDTL2Params(max_iter=2))
    elif method == "primal":
        fit_mmdtl2_features(Xs, ys, Xt, yt, 2, MMDTL2Params(), n_iter=1)
    else:
        mmdt_explicit_fit(Xs, ys, Xt, yt, 2, n_iter=1)


def task_dual(L: int, N: int, M: int, K: int, seed: int = 0, repeat: int = 3) -> dict:
    """Dual MMDTL2 from features: the Grams ``Xs Xsᵀ`` and ``X̂t X̂tᵀ``, then the fit.

    Best of ``repeat`` runs (the machine is shared; the minimum is the least disturbed).
    """
    from mmdtl2_dist.core.mmdtl2 import MMDTL2Params, fit_mmdtl2_gram

    _warm_up("dual")
    Xs, ys, Xt, yt, Xq, yq = scale_data(L, N, M, K, seed, Q=200)
    rss0 = _rss()
    params = MMDTL2Params()
    t_total, times = float("inf"), []
    for _ in range(repeat):
        t0 = time.perf_counter()
        Kz = np.zeros((N + M, N + M))
        Kz[:N, :N] = Xs @ Xs.T
        Xh = augment(Xt)
        Kt = Xh @ Xh.T
        t_g = time.perf_counter() - t0
        fit_r = fit_mmdtl2_gram(Kz, Kt, ys, yt, K, params)
        times.append(time.perf_counter() - t0)
        if times[-1] < t_total:
            t_total, t_gram, fit = times[-1], t_g, fit_r
    acc = float(np.mean(np.argmax(fit.decision_function(Xh @ augment(Xq).T), 1) == yq))
    return {
        "method": "dual",
        "L": L,
        "N": N,
        "M": M,
        "K": K,
        "time_s": t_total,
        "times_s": times,
        "time_gram_s": t_gram,
        "time_wstep_s": fit.info["time_wstep_s"],
        "time_svm_s": fit.info["time_svm_s"],
        "n_iter": fit.info["n_iter"],
        "wstep_per_iter_s": fit.info["time_wstep_s"] / fit.info["n_iter"],
        "max_qp_kkt": float(max(fit.info["qp_kkt_residual"])),
        "test_accuracy": acc,
        "data_mb": (Xs.nbytes + Xt.nbytes) / 2**20,
        "fit_increment_mb": (_maxrss() - rss0) / 2**20,
    }


def task_primal(
    L: int, N: int, M: int, K: int, n_iter: int, seed: int = 0, repeat: int = 1
) -> dict:
    """The primal alternation (explicit ``W`` and Θ, Clarabel), ``n_iter`` alternations."""
    from mmdtl2_dist.core.mmdtl2 import MMDTL2Params
    from mmdtl2_dist.core.reference import fit_mmdtl2_features, svm_primal, wstep_primal

    _warm_up("primal")
    Xs, ys, Xt, yt, Xq, yq = scale_data(L, N, M, K, seed, Q=200)
    rss0 = _rss()
    params = MMDTL2Params()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        W, Theta, b = fit_mmdtl2_features(Xs, ys, Xt, yt, K, params, n_iter=n_iter)
        times.append(time.perf_counter() - t0)
    t_total = min(times)
    # One W-step alone (the QP the paper's comparison is about), at the source SVM.
    Th0, b0 = svm_primal(Xs, ys, K, np.full(N, params.c_s))
    t1 = time.perf_counter()
    wstep_primal(Xs, ys, Xt, yt, Th0, b0, params)
    t_w = time.perf_counter() - t1
    scores = augment(Xq) @ W.T @ Theta + b
    return {
        "method": "primal",
        "L": L,
        "N": N,
        "M": M,
        "K": K,
        "time_s": t_total,
        "n_iter": n_iter,
        "wstep_per_iter_s": t_w,
        "test_accuracy": float(np.mean(np.argmax(scores, 1) == yq)),
        "data_mb": (Xs.nbytes + Xt.nbytes) / 2**20,
        "fit_increment_mb": (_maxrss() - rss0) / 2**20,
        "estimate_gb": primal_memory_estimate(L, M, K) / GB,
    }


def mmdt_explicit_fit(Xs, ys, Xt, yt, K, *, c_s=0.05, c_t=1.0, gamma=1e-4, n_iter=2):
    """MMDT as Hoffman et al.'s reference code runs it, with an explicit ``W`` (L+1)².

    An independent reference, not the product: the product's MMDT baselines work on Grams
    (:mod:`mmdtl2_dist.core.mmdt_hoffman`) or in the paper's form (MMDTL2 with MMDT's
    settings, :data:`mmdtl2_dist.core.params.MMDT_FIXED`); this is the form whose time
    and memory the paper's Figure 8 reports, with liblinear as the reference calls it.

    Augmented features (a 1 appended, transformed by ``W``); ``W = I`` at first; each of
    ``n_iter`` alternations trains liblinear's default SVM (L2-regularised squared hinge,
    dual coordinate descent, ``-c 1``, per-sample weights ``c_s`` / ``c_t``, no liblinear
    bias, tolerance 0.1) one-vs-rest on source plus ``W``-mapped targets, then re-learns
    ``W = I + Θᵀ S X̂t`` from ``I`` by the reference's Bregman projections
    (:func:`mmdtl2_dist.core.mmdt_hoffman.bregman_wstep`, as coded). ``W`` is formed in
    place (one (L+1)² array and one temporary of the same size). Returns ``(W, Theta)``.
    """
    from sklearn.svm import LinearSVC

    from mmdtl2_dist.core.mmdt_hoffman import bregman_wstep

    Sh, Th = augment(Xs), augment(Xt)
    D = Sh.shape[1]
    W = np.eye(D)
    cost = np.r_[np.full(len(ys), c_s), np.full(len(yt), c_t)]
    y = np.r_[ys, yt]
    Theta = None
    for _ in range(n_iter):
        X = np.vstack([Sh, Th @ W.T])
        Theta = np.empty((K, D))
        for k in range(K):
            svc = LinearSVC(loss="squared_hinge", dual=True, fit_intercept=False, C=1.0, tol=0.1)
            svc.fit(X, np.where(y == k, 1, -1), sample_weight=cost)
            Theta[k] = svc.coef_.ravel()
        Un = Theta / np.linalg.norm(Theta, axis=1, keepdims=True)
        Tn = Th / np.linalg.norm(Th, axis=1, keepdims=True)
        same = yt[None, :] == np.arange(K)[:, None]
        S, _ = bregman_wstep(Un @ Un.T, Un @ Tn.T, Tn @ Tn.T, same, gamma)
        del W
        W = (Theta.T @ S) @ Th  # as coded: W = I + Θᵀ S X̂t with the raw vectors
        W.flat[:: D + 1] += 1.0
    return W, Theta


def task_mmdt(L: int, N: int, M: int, K: int, seed: int = 0, repeat: int = 1) -> dict:
    """Explicit-W MMDT (reference-code form), two alternations."""
    _warm_up("mmdt")
    Xs, ys, Xt, yt, Xq, yq = scale_data(L, N, M, K, seed, Q=200)
    rss0 = _rss()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        W, Theta = mmdt_explicit_fit(Xs, ys, Xt, yt, K)
        times.append(time.perf_counter() - t0)
    t_total = min(times)
    scores = augment(Xq) @ W.T @ Theta.T
    return {
        "method": "mmdt_explicit",
        "L": L,
        "N": N,
        "M": M,
        "K": K,
        "time_s": t_total,
        "n_iter": 2,
        "test_accuracy": float(np.mean(np.argmax(scores, 1) == yq)),
        "data_mb": (Xs.nbytes + Xt.nbytes) / 2**20,
        "fit_increment_mb": (_maxrss() - rss0) / 2**20,
        "estimate_gb": mmdt_memory_estimate(L, N, M) / GB,
    }


def figure8(preset: dict, *, mem_limit_gb: float = 10.0, threads: int = 1, log=_print) -> list:
    """Time and memory versus L for primal, explicit-W MMDT and dual MMDTL2 (see module)."""
    N, K = preset["N"], preset["K"]
    recs = []
    for L in preset["dims"]:
        iters = {}
        for pc in preset["per_class"]:
            rec = run_isolated("dual", {"L": L, "N": N, "M": pc * K, "K": K}, threads=threads)
            iters[pc] = rec.get("n_iter", 2)
            recs.append(rec)
            log(_fig8_line(rec))
        for pc in preset.get("primal_per_class", preset["per_class"]):
            est = primal_memory_estimate(L, pc * K, K) / GB
            kw = {"L": L, "N": N, "M": pc * K, "K": K}
            if L > preset["primal_max_dim"] or est > mem_limit_gb:
                why = f"out of memory (estimate {est:.1f} GB)" if est > mem_limit_gb else "skipped"
                rec = {"task": "primal", "method": "primal", **kw, "status": why}
                rec["estimate_gb"] = est
            else:
                rep = 3 if L <= 30 else 1
                rec = run_isolated(
                    "primal", {**kw, "n_iter": iters[pc], "repeat": rep}, threads=threads
                )
            recs.append(rec)
            log(_fig8_line(rec))
        for pc in preset["per_class"]:
            est = mmdt_memory_estimate(L, N, pc * K) / GB
            kw = {"L": L, "N": N, "M": pc * K, "K": K}
            if est > mem_limit_gb:
                rec = {"task": "mmdt", "method": "mmdt_explicit", **kw, "estimate_gb": est}
                rec["status"] = f"out of memory (estimate {est:.1f} GB)"
            else:
                rec = run_isolated("mmdt", {**kw, "repeat": 3 if L <= 1000 else 1}, threads=threads)
            recs.append(rec)
            log(_fig8_line(rec))
    return recs


def _fig8_line(r: dict) -> str:
    t = f"{r['time_s']:10.4f} s" if "time_s" in r else f"{'-':>12}"
    mem = f"{r['peak_rss_mb']:8.0f} MB" if "peak_rss_mb" in r else f"{'-':>11}"
    return (
        f"  {r.get('method', r['task']):14s} L={r['L']:>6} M={r['M']:>3}  {t}  peak {mem}  "
        f"{r.get('status', '')}"
    )


def figure8_table(recs: list) -> str:
    """Markdown table: one row per L, time and peak memory per method, dual speed-ups."""
    Ms = sorted({r["M"] for r in recs})
    cols = [(m, M) for m in ("primal", "mmdt_explicit", "dual") for M in Ms]
    by = {(r.get("method"), r["M"], r["L"]): r for r in recs}
    head = ["L"] + [f"{m} M={M}" for m, M in cols]
    head += [f"primal/dual M={M}" for M in Ms] + [f"W-step primal/dual M={M}" for M in Ms]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for L in sorted({r["L"] for r in recs}):
        row = [f"{L:,}"]
        for m, M in cols:
            r = by.get((m, M, L))
            if r is None:
                row.append("")
            elif r.get("status", "ok") != "ok":
                row.append(r["status"])
            else:
                row.append(f"{_fmt_t(r['time_s'])}, {r['peak_rss_mb']:.0f} MB")
        for M in Ms:
            p, d = by.get(("primal", M, L)), by.get(("dual", M, L))
            ok = p and d and p.get("status") == "ok" and d.get("status") == "ok"
            row.append(f"{p['time_s'] / d['time_s']:,.0f}×" if ok else "")
        for M in Ms:
            p, d = by.get(("primal", M, L)), by.get(("dual", M, L))
            ok = p and d and p.get("status") == "ok" and d.get("status") == "ok"
            row.append(f"{p['wstep_per_iter_s'] / d['wstep_per_iter_s']:,.0f}×" if ok else "")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _fmt_t(t: float) -> str:
    return f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.2f} s"


def plot_figure8(recs: list, path: str | os.PathLike) -> None:
    """Log-log training time (and peak memory) versus L, like the paper's Figure 8."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = {"primal": ("o-", "primal QP"), "mmdt_explicit": ("s-", "MMDT (explicit W)")}
    styles["dual"] = ("^-", "dual MMDTL2")
    for (method, M), grp in _groups(recs).items():
        fmt, label = styles[method]
        ok = [r for r in grp if r.get("status", "ok") == "ok"]
        lab = f"{label} ({M // grp[0]['K']})"
        if ok:
            line = axes[0].loglog([r["L"] for r in ok], [r["time_s"] for r in ok], fmt, label=lab)
            color = line[0].get_color()
            axes[1].loglog(
                [r["L"] for r in ok],
                [r["peak_rss_mb"] / 1024 for r in ok],
                fmt,
                color=color,
                label=lab,
            )
            oom = [r for r in grp if r.get("status", "").startswith("out of memory")]
            if oom:
                axes[1].loglog(
                    [r["L"] for r in oom], [r["estimate_gb"] for r in oom], "x", color=color, ms=9
                )
    axes[0].set(xlabel="feature dimension L = Ls = Lt", ylabel="training time [s]")
    axes[1].set(xlabel="feature dimension L = Ls = Lt", ylabel="peak memory [GB]")
    axes[1].set_title("× = estimate of a run not started (out of memory)", fontsize=9)
    axes[0].set_title("training time (targets per class in braces)", fontsize=9)
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _groups(recs):
    out: dict = {}
    for r in sorted(recs, key=lambda r: r["L"]):
        if r.get("method") in ("primal", "mmdt_explicit", "dual"):
            out.setdefault((r["method"], r["M"]), []).append(r)
    return out


# --------------------------------------------------------------------------- W-step QP


OVERLAPPING = {"class_sep": 0.1, "noise": 2.0}  # a second W-step with free constraints


def wstep_problem(K: int, M: int, *, L: int = 800, per_class_source: int = 20, seed: int = 0):
    """The W-step dual QP ``(H, f, c_t)`` of the *second* alternation of a real fit.

    K classes, M labelled targets, 20 source samples per class in ``L = 800`` dimensions
    (SURF-like), overlapping classes (:data:`OVERLAPPING`). The second W-step is the
    realistic one: after an SVM-step on transformed targets many constraints hold with
    margin and many are free (the first, after a source-only SVM, has nearly every
    variable at its upper bound).
    """
    from mmdtl2_dist.core.mmdtl2 import (
        MMDTL2Params,
        fit_mmdtl2_gram,
        similarity_weights,
        transfer_operators,
    )
    from mmdtl2_dist.core.svm import one_vs_rest
    from mmdtl2_dist.core.wstep import wstep_dual, wstep_hessian

    N = per_class_source * K
    Xs, ys, Xt, yt, _, _ = scale_data(L, N, M, K, seed, **OVERLAPPING)
    p = MMDTL2Params(max_iter=1)
    Xh = augment(Xt)
    Kz = np.zeros((N + M, N + M))
    Kz[:N, :N] = Xs @ Xs.T
    fit = fit_mmdtl2_gram(Kz, Xh @ Xh.T, ys, yt, K, p)
    S = similarity_weights(ys, yt, p.c_d)
    s_m = S.sum(axis=0)
    ops = transfer_operators(Xh @ Xh.T, s_m, p.c_f)
    R_c = np.vstack([S, -np.diag(s_m)])
    TT, f = wstep_dual(Kz, fit.beta, fit.b, one_vs_rest(yt, K), R_c, ops.G, N)
    H = wstep_hessian(TT, ops.G, one_vs_rest(yt, K), solver=None)  # built, for every solver
    return H, f, p.c_t


def task_wstep(K: int, M: int, solvers: list, tol: float = 1e-8, seed: int = 0) -> dict:
    """Solve one W-step QP with every solver in ``solvers``; time, KKT residual, objective."""
    from mmdtl2_dist.core.qp import kkt_residual, solve_box_qp

    H, f, c_t = wstep_problem(K, M, seed=seed)
    out = {"K": K, "M": M, "KM": K * M, "tol": tol, "solvers": {}}
    for s in solvers:

        def fn(H, f, lb, ub, tol, s=s):
            return solve_box_qp(H, f, lb, ub, solver=s, tol=tol)

        fn(H, f, 0.0, c_t, tol=tol)  # warm-up (imports, allocator)
        best, res = float("inf"), None
        for _ in range(2):
            t0 = time.perf_counter()
            res = fn(H, f, 0.0, c_t, tol=tol)
            best = min(best, time.perf_counter() - t0)
        x = res.x
        out["solvers"][s] = {
            "time_s": best,
            "kkt_scaled": float(res.kkt_residual),
            "kkt_unscaled": kkt_residual(H, f, x, np.zeros_like(f), np.full_like(f, c_t)),
            "objective": float(0.5 * x @ H @ x - f @ x),
            "used": res.solver,
            "iterations": int(res.iterations),
            "n_free": int(np.sum((x > 1e-9 * c_t) & (x < c_t * (1 - 1e-9)))),
        }
    best_obj = min(v["objective"] for v in out["solvers"].values())
    for v in out["solvers"].values():
        v["objective_gap"] = (v["objective"] - best_obj) / max(1.0, abs(best_obj))
    return out


def wstep_table(recs: list) -> str:
    solvers = list(dict.fromkeys(s for r in recs for s in r["solvers"]))
    head = ["K·M (K × M)"] + [f"{s}: time, KKT" for s in solvers] + ["osqp / dcd"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for r in recs:
        row = [f"{r['KM']:,} ({r['K']} × {r['M']})"]
        for s in solvers:
            v = r["solvers"].get(s)
            row.append(f"{_fmt_t(v['time_s'])}, {v['kkt_scaled']:.0e}" if v else "not run")
        sv = r["solvers"]
        ratio = sv["osqp"]["time_s"] / sv["dcd"]["time_s"] if {"osqp", "dcd"} <= set(sv) else 0
        row.append(f"{ratio:.1f}×" if ratio else "")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def wstep(preset: dict, *, threads: int = 1, tol: float = 1e-8, log=_print) -> list:
    """W-step QP solvers on problems of growing K·M (see module)."""
    recs = []
    for K, M in preset["wstep_sizes"]:
        solvers = ["dcd"] + (["osqp"] if K * M <= preset.get("osqp_max_km", 10**9) else [])
        rec = run_isolated(
            "wstep", {"K": K, "M": M, "solvers": solvers, "tol": tol}, threads=threads
        )
        recs.append(rec)
        if rec.get("status") == "ok":
            log(
                "  "
                + "  ".join(
                    f"{s}: {v['time_s']:.4f} s kkt {v['kkt_scaled']:.1e}"
                    for s, v in rec["solvers"].items()
                )
                + f"   (K·M = {K * M})"
            )
        else:
            log(f"  K·M = {K * M}: {rec.get('status')} {rec.get('err', '')}")
    return recs


# --------------------------------------------------------------------------- SVM-step


def svm_problem(N: int, M: int, L: int, K: int = 2, seed: int = 0):
    """Source samples plus MMDTL2-*transformed* targets (after one alternation), as features.

    Returns ``V`` (N+M, L), labels ``y`` and per-sample costs (``c_s`` source, ``c_t``
    target): the SVM-step problem of the second alternation.
    """
    from mmdtl2_dist.core.mmdtl2 import MMDTL2Params, fit_mmdtl2_gram

    Xs, ys, Xt, yt, _, _ = scale_data(L, N, M, K, seed)
    p = MMDTL2Params(max_iter=1)
    Kz = np.zeros((N + M, N + M))
    Kz[:N, :N] = Xs @ Xs.T
    Xh = augment(Xt)
    fit = fit_mmdtl2_gram(Kz, Xh @ Xh.T, ys, yt, K, p)
    Vt = fit.Omega[:N].T @ Xs  # W x̂_m = Xs ω_m (zero prior)
    V = np.vstack([Xs, Vt])
    cost = np.r_[np.full(N, p.c_s), np.full(M, p.c_t)]
    return V, np.r_[ys, yt], cost


def svm_objective(V, y, cost, theta, b) -> float:
    """``½(‖θ‖² + b²) + Σ c_i max(0, 1 − y_i(θᵀv_i + b))`` (y = ±1)."""
    return float(0.5 * (theta @ theta + b * b) + cost @ np.maximum(0.0, 1 - y * (V @ theta + b)))


def task_svm(N: int, M: int, L: int, K: int = 2, seed: int = 0) -> dict:
    """One-vs-rest SVM-step: ours (dcd, osqp) vs liblinear vs libsvm (see module)."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.svm import SVC, LinearSVC

    from mmdtl2_dist.core.svm import one_vs_rest, svm_step

    V, y, cost = svm_problem(N, M, L, K, seed)
    Y = one_vs_rest(y, K)
    out = {"N": N, "M": M, "L": L, "K": K, "n": N + M, "solvers": {}}

    def ours(solver):
        t0 = time.perf_counter()
        Kv = V @ V.T
        t_gram = time.perf_counter() - t0
        res = svm_step(Kv, Y, cost, solver=solver)
        theta = V.T @ res.coef  # (L, K)
        return time.perf_counter() - t0, t_gram, [(theta[:, k], res.b[k]) for k in range(K)]

    def liblinear(tol):
        t0 = time.perf_counter()
        sols = []
        for k in range(K):
            svc = LinearSVC(
                loss="hinge",
                dual=True,
                C=1.0,
                tol=tol,
                max_iter=1_000_000,
                fit_intercept=True,
                intercept_scaling=1.0,
            )
            svc.fit(V, Y[k], sample_weight=cost)
            sols.append((svc.coef_.ravel(), float(svc.intercept_[0])))
        return time.perf_counter() - t0, 0.0, sols

    def libsvm(tol):
        t0 = time.perf_counter()
        Kb = V @ V.T + 1.0  # the regularised bias as a constant feature
        t_gram = time.perf_counter() - t0
        sols = []
        for k in range(K):
            svc = SVC(kernel="precomputed", C=1.0, tol=tol, cache_size=1000)
            svc.fit(Kb, Y[k], sample_weight=cost)
            a = np.zeros(len(y))
            a[svc.support_] = svc.dual_coef_.ravel()  # α_i y_i
            # libsvm adds its own unregularised bias: fold it into b for our objective.
            sols.append((V.T @ a, float(a.sum() + svc.intercept_[0])))
        return time.perf_counter() - t0, t_gram, sols

    runs = {
        "ours (dcd)": lambda: ours("dcd"),
        "ours (osqp)": lambda: ours("osqp"),
        "liblinear tol 1e-4": lambda: liblinear(1e-4),
        "liblinear tol 1e-6": lambda: liblinear(1e-6),
        "libsvm tol 1e-3": lambda: libsvm(1e-3),
        "libsvm tol 1e-5": lambda: libsvm(1e-5),
    }
    for name, fn in runs.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            fn() if name.startswith("ours") else None  # warm-up of our path only (cheap)
            t, t_gram, sols = fn()
        objs = [svm_objective(V, Y[k], cost, th, b) for k, (th, b) in enumerate(sols)]
        out["solvers"][name] = {
            "time_s": t,
            "time_gram_s": t_gram,
            "objective": objs,
            "converged": not any(issubclass(w.category, ConvergenceWarning) for w in caught),
        }
    best = np.min([v["objective"] for v in out["solvers"].values()], axis=0)
    for v in out["solvers"].values():
        v["max_rel_gap"] = float(np.max((np.array(v["objective"]) - best) / best))
    return out


def svm(preset: dict, *, threads: int = 1, log=_print) -> list:
    """SVM-step solvers on source + transformed-target problems (see module)."""
    recs = []
    for N, M, L in preset["svm_sizes"]:
        rec = run_isolated("svm", {"N": N, "M": M, "L": L}, threads=threads)
        recs.append(rec)
        if rec.get("status") == "ok":
            for s, v in rec["solvers"].items():
                log(
                    f"  n={N + M:>5} L={L:>5}  {s:20s} {v['time_s']:9.4f} s  "
                    f"gap {v['max_rel_gap']:.1e}"
                )
        else:
            log(f"  n={N + M} L={L}: {rec.get('status')} {rec.get('err', '')}")
    return recs


def svm_table(recs: list) -> str:
    ok = [r for r in recs if r.get("status") == "ok"]
    solvers = list(ok[0]["solvers"]) if ok else []
    head = ["N + M, L"] + solvers
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for r in ok:
        row = [f"{r['N']} + {r['M']}, {r['L']:,}"]
        for s in solvers:
            v = r["solvers"][s]
            mark = "" if v["converged"] else " (not converged)"
            row.append(f"{_fmt_t(v['time_s'])}, gap {v['max_rel_gap']:.0e}{mark}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- end to end


def stream_grams(store_path, space: str, src_rows, tgt_rows, test_rows, *, block_cols=None):
    """The Grams of one split, streamed from a feature store column block by column block.

    Reads every column block of the source and target arrays once (whole device rows,
    so each Zarr chunk is decoded once), selects the split's rows, casts to float64 and
    accumulates ``Kss`` (N, N), ``Ktt`` (M, M), ``Ktq`` (M, Q) and the test squared norms.
    Memory holds one column block of the two devices.

    Returns ``(Kss, Ktt, Ktq, sq_q, bytes_read)``.
    """
    from mmdtl2_dist.store import FeatureStore

    fs = FeatureStore.open(store_path)
    src, tgt = _two_devices(fs, space)
    n_s, L = fs.shape(src, space)
    n_t, _ = fs.shape(tgt, space)
    width = block_cols or int(fs.array(src, space).chunks[1])
    N, M, Q = len(src_rows), len(tgt_rows), len(test_rows)
    Kss, Ktt, Ktq, sq_q = np.zeros((N, N)), np.zeros((M, M)), np.zeros((M, Q)), np.zeros(Q)
    nbytes = 0
    for c0 in range(0, L, width):
        cols = slice(c0, min(c0 + width, L))
        Xs_blk = fs.read(src, space, cols=cols)
        Xt_blk = fs.read(tgt, space, cols=cols)
        nbytes += Xs_blk.nbytes + Xt_blk.nbytes
        A = Xs_blk[src_rows].astype(np.float64)
        B = Xt_blk[tgt_rows].astype(np.float64)
        C = Xt_blk[test_rows].astype(np.float64)
        Kss += A @ A.T
        Ktt += B @ B.T
        Ktq += B @ C.T
        sq_q += np.einsum("ij,ij->i", C, C)
    return Kss, Ktt, Ktq, sq_q, nbytes


def _two_devices(fs, space):
    devs = fs.devices_in(space)
    if set(devs) >= {"source", "target"}:
        return "source", "target"
    if len(devs) != 2:
        raise ValueError(f"space {space!r} has devices {devs}; need exactly a source and a target.")
    return devs[0], devs[1]


def paper_split(store_path, space: str, N: int, M: int, seed: int = 0):
    """Source training rows (N), labelled target rows (M, balanced), target test rows."""
    from mmdtl2_dist.store import FeatureStore

    fs = FeatureStore.open(store_path)
    src, tgt = _two_devices(fs, space)
    meta = fs.metadata[fs.metadata.space == space]
    ys_all = meta[meta.device == src].sort_values("row")["label"].to_numpy()
    yt_all = meta[meta.device == tgt].sort_values("row")["label"].to_numpy()
    rng = np.random.default_rng(seed)
    src_rows = np.sort(rng.choice(len(ys_all), N, replace=False))
    classes = np.unique(yt_all)
    per = M // len(classes)
    tgt_rows = np.sort(
        np.concatenate(
            [rng.choice(np.flatnonzero(yt_all == c), per, replace=False) for c in classes]
        )
    )
    test_rows = np.setdiff1d(np.arange(len(yt_all)), tgt_rows)
    return src_rows, tgt_rows, test_rows, ys_all, yt_all


def task_e2e_stream(store: str, space: str, N: int, M: int, seed: int = 0) -> dict:
    """Features in Zarr → Grams (streamed, in process) → MMDTL2 fit → predict."""
    import pandas  # noqa: F401  (imported before the baseline is taken)
    import zarr  # noqa: F401

    from mmdtl2_dist.core.methods import GramProblem, fit_predict
    from mmdtl2_dist.store import FeatureStore  # noqa: F401

    rss0 = _rss()
    t0 = time.perf_counter()
    src_rows, tgt_rows, test_rows, ys_all, yt_all = paper_split(store, space, N, M, seed)
    Kss, Ktt, Ktq, sq_q, nbytes = stream_grams(store, space, src_rows, tgt_rows, test_rows)
    t_gram = time.perf_counter() - t0
    prob = GramProblem(ys_all[src_rows], yt_all[tgt_rows], Kss, Ktt, Ktq, sq_q)
    t1 = time.perf_counter()
    res = fit_predict("mmdtl2", {}, prob)
    t_fit = time.perf_counter() - t1
    L = int(_store_dim(store, space))
    return {
        "path": "stream",
        "N": N,
        "M": M,
        "Q": len(test_rows),
        "L": L,
        "time_s": time.perf_counter() - t0,
        "time_read_gram_s": t_gram,
        "time_fit_predict_s": t_fit,
        "n_iter": res.info["n_iter"],
        "test_accuracy": float(np.mean(res.y_pred == yt_all[test_rows])),
        "bytes_read_mb": nbytes / 2**20,
        "gram_gflop": (
            len(src_rows) ** 2
            + len(tgt_rows) ** 2
            + len(tgt_rows) * len(test_rows)
            + len(test_rows)
        )
        * L
        * 2
        / 1e9,
        "rss_baseline_mb": rss0 / 2**20,
        "fit_increment_mb": (_maxrss() - rss0) / 2**20,
    }


def _store_dim(store, space):
    from mmdtl2_dist.store import FeatureStore

    fs = FeatureStore.open(store)
    return fs.shape(_two_devices(fs, space)[0], space)[1]


def task_e2e_engine(store: str, space: str, N: int, M: int, out: str, seed: int = 0) -> dict:
    """Features in Zarr → Ray Gram engine (whole store, once) → slice → fit → predict."""
    import shutil

    from mmdtl2_dist.core.methods import GramProblem, fit_predict
    from mmdtl2_dist.engine import compute_gram, ensure_ray
    from mmdtl2_dist.engine.driver import GRAM_OUTPUT
    from mmdtl2_dist.store.outputs import claim_output

    t0 = time.perf_counter()
    ray, _ = ensure_ray(None, num_cpus=2)  # a new local Ray, as the product starts it
    t_ray = time.perf_counter() - t0
    try:
        if claim_output(out, GRAM_OUTPUT, overwrite=None):  # the Gram of an earlier run
            shutil.rmtree(out)
        t1 = time.perf_counter()
        gs = compute_gram(store, space, out, progress=False)
        t_gram = time.perf_counter() - t1
        src_rows, tgt_rows, test_rows, ys_all, yt_all = paper_split(store, space, N, M, seed)
        src, tgt = _two_devices(_open(store), space)
        gs_s, gs_t, gs_q = gs.rows(src, src_rows), gs.rows(tgt, tgt_rows), gs.rows(tgt, test_rows)
        t2 = time.perf_counter()
        prob = GramProblem(
            ys_all[src_rows],
            yt_all[tgt_rows],
            gs.block(gs_s, gs_s),
            gs.block(gs_t, gs_t),
            gs.block(gs_t, gs_q),
            gs.sq_norms(gs_q),
        )
        t_slice = time.perf_counter() - t2
        res = fit_predict("mmdtl2", {}, prob)
        t_fit = time.perf_counter() - t2 - t_slice
    finally:
        ray.shutdown()
    return {
        "path": "engine",
        "N": N,
        "M": M,
        "Q": len(test_rows),
        "time_ray_init_s": t_ray,
        "time_gram_s": t_gram,
        "time_slice_s": t_slice,
        "time_fit_predict_s": t_fit,
        "time_s": t_gram + t_slice + t_fit,
        "n_rows_gram": gs.n,
        "test_accuracy": float(np.mean(res.y_pred == yt_all[test_rows])),
    }


def _open(store):
    from mmdtl2_dist.store import FeatureStore

    return FeatureStore.open(store)


def task_make_store(path: str, n_source: int, n_target: int, dim: int, seed: int = 0) -> dict:
    """Write the synthetic two-class store of the end-to-end benchmark (if missing)."""
    from mmdtl2_dist.store import SyntheticSpec, make_synthetic_store

    # class_sep 1.5: the well-separated data the published end-to-end figures were measured on.
    spec = SyntheticSpec(
        n_source=n_source, n_target=n_target, n_classes=2, dim=dim, class_sep=1.5, seed=seed
    )
    t0 = time.perf_counter()
    try:
        fs, made = _open(path), False
    except (FileNotFoundError, ValueError):
        fs, made = make_synthetic_store(path, spec, overwrite=True), True
    nbytes = sum(int(np.prod(fs.shape(d, "conv3"))) * 4 for d in fs.devices_in("conv3"))
    return {"time_s": time.perf_counter() - t0, "made": made, "feature_mb": nbytes / 2**20}


def e2e(preset: dict, workdir: str | os.PathLike, *, threads_list=(1, 2), log=_print) -> list:
    """Paper-scale end-to-end runs (see module); the store is kept in ``workdir``."""
    cfg = preset["e2e"]
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    store = str(work / f"e2e_{cfg['n_source']}_{cfg['n_target']}_{cfg['dim']}.zarr")
    mk = run_isolated(
        "make_store",
        {
            "path": store,
            "n_source": cfg["n_source"],
            "n_target": cfg["n_target"],
            "dim": cfg["dim"],
        },
        threads=2,
    )
    log(
        f"  store {store}: {mk.get('feature_mb', 0):.0f} MB of features "
        f"({'written' if mk.get('made') else 'reused'} in {mk.get('time_s', 0):.1f} s)"
    )
    recs = [{**mk, "path": "make_store"}]
    kw = {"store": store, "space": "conv3", "N": cfg["N"], "M": cfg["M"]}
    for threads in preset.get("e2e_threads", threads_list):
        if preset.get("e2e_warm", True):
            run_isolated("e2e_stream", kw, threads=threads)  # page cache warm-up
        rec = run_isolated("e2e_stream", kw, threads=threads)
        rec["feature_mb"] = mk.get("feature_mb")
        recs.append(rec)
        log(_e2e_line(rec))
    if preset.get("engine"):
        rec = run_isolated("e2e_engine", {**kw, "out": str(work / "e2e_gram")}, threads=1)
        rec["feature_mb"] = mk.get("feature_mb")
        recs.append(rec)
        log(_e2e_line(rec))
    return recs


def _e2e_line(r: dict) -> str:
    if r.get("status") != "ok":
        return f"  {r.get('task')}: {r.get('status')} {r.get('err', '')}"
    mem = r.get("fit_increment_mb")
    extra = f", +{mem:.0f} MB over baseline" if mem is not None else ""
    return (
        f"  {r['path']:6s} threads={r['threads']}  total {r['time_s']:.2f} s  "
        f"peak {r['peak_rss_mb']:.0f} MB{extra}  accuracy {r['test_accuracy']:.3f}"
    )


# --------------------------------------------------------------------------- driver

TASKS = {
    "dual": task_dual,
    "primal": task_primal,
    "mmdt": task_mmdt,
    "wstep": task_wstep,
    "svm": task_svm,
    "e2e_stream": task_e2e_stream,
    "e2e_engine": task_e2e_engine,
    "make_store": task_make_store,
}
STUDIES = ("figure8", "wstep", "svm", "e2e")


def run_benchmarks(
    preset: str = "quick",
    *,
    studies=STUDIES,
    out_dir: str | os.PathLike = "benchmarks/results",
    workdir: str | os.PathLike | None = None,
    mem_limit_gb: float = 10.0,
    threads: int = 1,
    prefix: str = "scale",
    isolate: bool = True,
    log=_print,
) -> dict:
    """Run the chosen studies of a preset; print tables, write JSON (and the PNG plot).

    ``isolate=False`` runs every task in this process (fast smoke tests; peak memory is
    then this process's, not the run's). Each study's records go to
    ``<out_dir>/<prefix>_<study>_<preset>.json`` when it ends.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}.")
    unknown = set(studies) - set(STUDIES)
    if unknown:
        raise ValueError(f"unknown studies {sorted(unknown)}; choose from {STUDIES}.")
    cfg = PRESETS[preset]
    global _ISOLATE
    saved, _ISOLATE = _ISOLATE, isolate
    try:
        return _run_studies(
            cfg, preset, studies, out_dir, workdir, mem_limit_gb, threads, prefix, log
        )
    finally:
        _ISOLATE = saved


def _run_studies(cfg, preset, studies, out_dir, workdir, mem_limit_gb, threads, prefix, log):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(workdir) if workdir else Path(os.environ.get("TMPDIR", "/tmp")) / "mmdtl2_bench"
    machine = machine_info()
    results: dict = {"preset": preset, "threads": threads, "machine": machine}
    t0 = time.perf_counter()

    def save(study: str, recs: list) -> None:
        # One JSON per study, written as soon as it finishes.
        results[study] = recs
        doc = {"preset": preset, "threads": threads, "machine": machine, study: recs}
        (out / f"{prefix}_{study}_{preset}.json").write_text(
            json.dumps(doc, indent=1, default=float)
        )

    if "figure8" in studies:
        log(f"== Figure 8: training time and peak memory vs L (BLAS threads {threads})")
        recs = figure8(cfg, mem_limit_gb=mem_limit_gb, threads=threads, log=log)
        save("figure8", recs)
        log(figure8_table(recs))
        plot_figure8(recs, out / f"{prefix}_figure8_{preset}.png")
    if "wstep" in studies:
        log(f"== W-step QP solvers (BLAS threads {threads})")
        save("wstep", wstep(cfg, threads=threads, log=log))
        log(wstep_table([r for r in results["wstep"] if r.get("status") == "ok"]))
    if "svm" in studies:
        log(f"== SVM-step solvers (BLAS threads {threads})")
        save("svm", svm(cfg, threads=threads, log=log))
        log(svm_table(results["svm"]))
    if "e2e" in studies:
        log("== End to end: Zarr -> Grams -> fit -> predict")
        save("e2e", e2e(cfg, workdir, log=log))
    results["wall_s"] = time.perf_counter() - t0
    log(f"wrote {out}/{prefix}_<study>_{preset}.json ({results['wall_s']:.0f} s)")
    return results


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); ``--task`` is the isolated child."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="full")
    ap.add_argument("--only", help=f"comma-separated studies among {', '.join(STUDIES)}")
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads of each run (1)")
    ap.add_argument(
        "--mem-limit-gb", type=float, default=10.0, help="do not start runs estimated above this"
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="JSON and PNG")
    ap.add_argument("--workdir", help="folder of the synthetic Zarr store (default: $TMPDIR)")
    ap.add_argument("--prefix", default="scale", help="JSON/PNG name prefix (scale)")
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="run every task in this process (smoke test; peak memory is not per run)",
    )
    ap.add_argument("-q", "--quiet", action="store_true")
    ap.add_argument("--task", help=argparse.SUPPRESS)  # run_isolated's child: one task
    args = ap.parse_args(argv)
    if args.task:
        _child(args.task)
        return 0
    run_benchmarks(
        args.preset,
        studies=STUDIES if not args.only else tuple(s.strip() for s in args.only.split(",")),
        out_dir=args.out,
        workdir=args.workdir,
        mem_limit_gb=args.mem_limit_gb,
        threads=args.threads,
        prefix=args.prefix,
        isolate=not args.in_process,
        log=(lambda *a, **k: None) if args.quiet else _print,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
