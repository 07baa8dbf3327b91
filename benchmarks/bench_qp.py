"""The product's box-QP solvers against the dense QP solvers of ``qpsolvers``, on real QPs.

The QPs are captured from real fits, inside the product's own solve calls (the names
``solve_box_qp`` and ``solve_scaled_box_qp`` that :mod:`mmdtl2_dist.core.mmdtl2` calls are
wrapped from here while the fits run): the W-step duals and the SVM-step duals of

- MMDTL2 (paper defaults) on Office-Caltech10, Hoffman et al.'s split 0 of three shifts,
  3 labelled targets per class (K·M = 300), linear and RBF target kernels;
- the synthetic problems of ``bench_scale.py --only wstep`` (800-d Gaussian classes, 20
  source samples per class, overlapping classes), K·M = 200 ... 4,000.

From each fit: the W-steps of alternations 1 (no warm start), 2 and the last, and the
SVM-steps of the initial SVM (no warm start), of alternation 1 and of the last, each the
class whose product solve took longest. Every QP is solved cold, and warm from the
product's own warm start where the fit had one and the solver takes one:

- ``product``: the product's solver on the scaled problem
  (``solve_scaled_box_qp(solver="dcd")``: coordinate descent with OSQP behind it);
- ``solve_box_qp`` (W-step only): what the fit calls, the same behind the front end
  that checks, symmetrises and scales the unscaled Hessian (the SVM-step assembles its
  scaled Hessian itself and has no such front end);
- ``dcd``: coordinate descent with polishing alone (no fallback);
- DAQP, ProxQP and PIQP (dense back-ends), quadprog, HiGHS, Clarabel and OSQP through
  ``qpsolvers``, at tolerances chosen to reach the product's target (``SETTINGS``).

Ratios are to ``product``. The solvers other than ours are not run on a QP once one of
their solves of that kind took over 5 s, or where their time at the largest size so far
scaled by n² predicts it (up to 30 s they still get the first QP of each size). All
solvers get the same Jacobi-scaled problem (``x = d ⊙ y``, ``d = diag(H)^-½``, as the
product solves it); times run from the dense problem in memory to the solution (the
sparse solvers' conversion included). One function, :func:`kkt_residual`, measures every
returned point (clipped to the box): the relative projected-gradient residual that the
product's ``qp_tol = 1e-8`` bounds. A point above it counts as a miss, an exception or no
point as a failure. One BLAS/OpenMP thread. The load average is sampled during the run:
on a shared machine absolute times are upper bounds; compare ratios within one run.

Usage::

    pip install -e '.[bench]'
    python benchmarks/bench_qp.py            # 138 s CPU (336 s wall on a loaded machine)
    python benchmarks/bench_qp.py --quick    # two Office fits and K·M ≤ 1,000

Writes ``benchmarks/results/qp_solvers.json`` (``qp_solvers_quick.json``) and prints the
tables of BENCHMARKS.md's section "QP solvers against the dense solvers of qpsolvers"
(``--report benchmarks/results/qp_solvers.json`` prints them again from the file).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy: one thread for every solver

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from importlib import metadata  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import mmdtl2_dist.core.mmdtl2 as mm  # noqa: E402
from mmdtl2_dist.core import qp  # noqa: E402
from mmdtl2_dist.core.dcd import dcd_box_qp  # noqa: E402

HERE = Path(__file__).resolve().parent
TARGET = 1e-8  # the product's qp_tol (MMDTL2Params)
QPSOLVERS = ("daqp", "proxqp", "quadprog", "piqp", "highs", "clarabel", "osqp")
OURS = ("solve_box_qp", "product", "dcd")  # always run, never skipped
VARIANTS = (*OURS, *QPSOLVERS)
WARM = {*OURS, "daqp", "proxqp", "osqp"}  # take a warm start
SPARSE = {"highs", "clarabel", "osqp"}  # take the Hessian as a sparse matrix
# Tolerances: tight enough that each solver's own stopping test implies KKT <= 1e-8 here.
SETTINGS = {
    # active set; eps_prox < 0 (its default) regularises a singular H only, and
    # proximal iterations down to eta_prox remove the bias (its default stops at ~3e-7)
    "daqp": {"eta_prox": 1e-12},
    "proxqp": {"backend": "dense", "eps_abs": 1e-10, "eps_rel": 0.0},
    "quadprog": {},  # dual active set: exact, needs a positive definite H
    "piqp": {"backend": "dense", "eps_abs": 1e-12, "eps_rel": 1e-12},
    # its default regularisation 1e-7 leaves KKT ~1e-8; 0 fails on singular H
    "highs": {
        "qp_regularization_value": 1e-12,
        "dual_feasibility_tolerance": 1e-12,
        "primal_feasibility_tolerance": 1e-12,
    },
    # the settings of the product's own Clarabel fallback (core/qp.py)
    "clarabel": {"tol_gap_abs": 1e-12, "tol_gap_rel": 1e-12, "tol_feas": 1e-12, "max_iter": 400},
    "osqp": {"eps_abs": 1e-9, "eps_rel": 1e-9, "polishing": True, "max_iter": 200_000},
}
# A solver is not run on a QP when one of its solves of that kind already took longer
# than SKIP_S, or when its time at the largest size so far, scaled by n², predicts more;
# a prediction up to PROBE_S still gets one solve per size (its first QP).
SKIP_S = 5.0
PROBE_S = 30.0
OFFICE_SHIFTS = (("amazon", "webcam"), ("webcam", "dslr"), ("caltech", "amazon"))
SYNTHETIC_SIZES = ((2, 100), (10, 100), (10, 200), (10, 400))  # (K, M)


@dataclass
class CapturedQP:
    """One box QP ``min ½yᵀHy − fᵀy, l ≤ y ≤ u`` of a fit, Jacobi-scaled.

    ``raw`` keeps the W-step's unscaled ``(H, f, l, u, x0)`` for the product's front end.
    ``step``: alternation (0 = the initial SVM); ``cls``: class of an SVM-step QP; ``d``:
    the Jacobi scale (``x = d ⊙ y``).
    """

    kind: str
    origin: str
    step: int
    cls: int
    H: np.ndarray
    f: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    y0: np.ndarray | None
    product_used: str
    product_s: float
    d: np.ndarray
    raw: tuple | None = None
    label: str = ""


def kkt_residual(H, f, y, lb, ub) -> float:
    """``‖y − clip(y − (Hy − f), l, u)‖∞ / max(1, ‖f‖∞)``: the product's accuracy measure."""
    pg = y - np.clip(y - (H @ y - f), lb, ub)
    return float(np.max(np.abs(pg), initial=0.0) / max(1.0, float(np.max(np.abs(f)))))


def objective(H, f, y) -> float:
    return float(0.5 * y @ (H @ y) - f @ y)


# ----------------------------------------------------------------------- capture


class Recorder:
    """Wraps the solve calls of ``core/mmdtl2.py`` while it watches a fit.

    Counts which path of the product's chain answered every QP (``paths``) and keeps the
    QPs that :func:`select` picks from each fit (``qps``).
    """

    def __init__(self) -> None:
        self.qps: list[CapturedQP] = []
        self.paths: dict[str, dict[str, int]] = {}
        self.origin = ""
        self._fit: list[CapturedQP] = []
        self._step = 0
        self._cls = 0

    @contextlib.contextmanager
    def watching(self, origin: str):
        self.origin, self._fit, self._step, self._cls = origin, [], 0, 0
        saved = mm.solve_box_qp, mm.solve_scaled_box_qp
        mm.solve_box_qp, mm.solve_scaled_box_qp = self._wstep, self._svm
        try:
            yield
        finally:
            mm.solve_box_qp, mm.solve_scaled_box_qp = saved
        for q in self._fit:
            by = self.paths.setdefault(q.kind, {})
            by[q.product_used] = by.get(q.product_used, 0) + 1
        self.qps += select(self._fit)

    def _wstep(self, H, f, lb, ub, **kw):
        self._step, self._cls = self._step + 1, 0
        res = qp.solve_box_qp(H, f, lb, ub, **kw)
        Hsym = 0.5 * (H + H.T)
        d = qp.jacobi_scale(np.diag(Hsym))
        n = f.shape[0]
        lo, hi = np.broadcast_to(lb, (n,)) / d, np.broadcast_to(ub, (n,)) / d
        x0 = kw.get("x0")
        y0 = None if x0 is None else x0 / d
        Hs = np.ascontiguousarray(Hsym * np.outer(d, d))
        raw = (H, f, lb, ub, x0)
        self._keep("wstep", Hs, f * d, lo, hi, y0, res, d, raw)
        return res

    def _svm(self, Hs, fs, lbs, ubs, **kw):
        res = qp.solve_scaled_box_qp(Hs, fs, lbs, ubs, **kw)
        n = fs.shape[0]
        lo = np.array(np.broadcast_to(lbs, (n,)), dtype=float)
        hi = np.array(np.broadcast_to(ubs, (n,)), dtype=float)
        self._keep("svm", Hs, fs, lo, hi, kw.get("y0"), res, np.ones(n), None)
        self._cls += 1
        return res

    def _keep(self, kind, H, f, lb, ub, y0, res, d, raw):
        self._fit.append(
            CapturedQP(
                kind, self.origin, self._step, self._cls, H, np.asarray(f, float),
                np.asarray(lb, float), np.asarray(ub, float),
                None if y0 is None else np.asarray(y0, float), res.solver, res.time_s, d, raw,
            )
        )  # fmt: skip


def office_fits(rec: Recorder, shifts, kernels=("linear", "rbf")) -> None:
    from office_splits import SHORT, split_problem  # benchmarks/ is on sys.path

    from mmdtl2_dist.core.methods import fit_predict

    for source, target in shifts:
        prob, _ = split_problem(source, target, 0)
        for kernel in kernels:
            name = f"Office {SHORT[source]}→{SHORT[target]} {kernel}"
            with rec.watching(name):
                fit_predict("mmdtl2", {"kernel": kernel}, prob)


def synthetic_fits(rec: Recorder, sizes) -> None:
    from bench_scale import scale_data  # benchmarks/ is on sys.path when run as a script

    for K, M in sizes:
        N = 20 * K
        Xs, ys, Xt, yt, _, _ = scale_data(800, N, M, K, 0, class_sep=0.7)
        Xh = np.hstack([Xt, np.ones((M, 1))])
        Kz = np.zeros((N + M, N + M))
        Kz[:N, :N] = Xs @ Xs.T
        with rec.watching(f"synthetic K={K} M={M}"):
            mm.fit_mmdtl2_gram(Kz, Xh @ Xh.T, ys, yt, K, mm.MMDTL2Params())


def select(fit: list[CapturedQP]) -> list[CapturedQP]:
    """W-steps 1, 2 and last; SVM-steps 0, 1 and last, each the class solved slowest."""
    chosen = []
    for kind, first in (("wstep", 1), ("svm", 0)):
        steps = sorted({q.step for q in fit if q.kind == kind})
        for step in sorted({first, first + 1, steps[-1]} & set(steps)):
            cands = [q for q in fit if q.kind == kind and q.step == step]
            chosen.append(max(cands, key=lambda q: q.product_s))
    for q in chosen:
        q.label = f"{q.origin}, {q.kind} {q.step}" + (f" class {q.cls}" if q.kind == "svm" else "")
    return chosen


# ----------------------------------------------------------------------- solvers


def _product(q: CapturedQP, y0):
    return qp.solve_scaled_box_qp(q.H, q.f, q.lb, q.ub, solver="dcd", tol=TARGET, y0=y0).x


def _solve_box_qp(q: CapturedQP, y0):
    """The W-step's front end: checks, symmetrises and scales the unscaled ``H``, then the chain."""
    H, f, lb, ub, x0 = q.raw
    res = qp.solve_box_qp(H, f, lb, ub, solver="dcd", tol=TARGET, x0=None if y0 is None else x0)
    return res.x / q.d


def _dcd(q: CapturedQP, y0):
    fscale = max(1.0, float(np.max(np.abs(q.f))))
    return dcd_box_qp(q.H, q.f, q.lb, q.ub, y0, TARGET * fscale).x


def _qpsolvers(name: str):
    def run(q: CapturedQP, y0):
        from qpsolvers import solve_qp

        P = sp.csc_matrix(q.H) if name in SPARSE else q.H
        x = solve_qp(P, -q.f, lb=q.lb, ub=q.ub, solver=name, initvals=y0, **SETTINGS[name])
        if x is None:
            raise RuntimeError(f"{name}: no solution")
        return x

    return run


SOLVE = {"solve_box_qp": _solve_box_qp, "product": _product, "dcd": _dcd}
SOLVE.update({name: _qpsolvers(name) for name in QPSOLVERS})


def time_solve(fn, q: CapturedQP, y0) -> tuple[float, np.ndarray]:
    """Median wall time over 5 runs below 50 ms, 3 below 0.5 s, else 1; and the point."""
    times, y = [], None
    while True:
        t0 = time.perf_counter()
        y = fn(q, y0)
        times.append(time.perf_counter() - t0)
        want = 5 if times[0] < 0.05 else 3 if times[0] < 0.5 else 1
        if len(times) >= want:
            return statistics.median(times), np.asarray(y, dtype=float)


@contextlib.contextmanager
def quiet_stdout():
    """Silence what compiled solvers print to file descriptor 1 (HiGHS' banner, OSQP)."""
    with open(os.devnull, "w") as null:
        saved = os.dup(1)
        os.dup2(null.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def measure(q: CapturedQP, variant: str, start: str) -> dict:
    y0 = q.y0 if start == "warm" else None
    t0 = time.perf_counter()
    try:
        with quiet_stdout():
            t, y = time_solve(SOLVE[variant], q, y0)
    except Exception as exc:  # noqa: BLE001 - a solver's failure is a result here
        error = f"{type(exc).__name__}: {exc}"[:200]
        return {"status": "failed", "error": error, "elapsed_s": time.perf_counter() - t0}
    violation = float(np.max(np.maximum(q.lb - y, 0) + np.maximum(y - q.ub, 0), initial=0.0))
    y = np.clip(y, q.lb, q.ub)
    kkt = kkt_residual(q.H, q.f, y, q.lb, q.ub)
    return {
        "status": "ok" if kkt <= TARGET else "missed",
        "time_s": t,
        "kkt": kkt,
        "objective": objective(q.H, q.f, y),
        "bound_violation": violation,
    }


def run_instances(qps: list[CapturedQP], log) -> list[dict]:
    """Every selected QP × start × solver, smaller QPs first; slow solvers drop out."""
    history: dict[tuple[str, str], list] = {}
    out = []
    for q in sorted(qps, key=lambda q: q.f.shape[0]):
        n = q.f.shape[0]
        for start in ("cold", "warm") if q.y0 is not None else ("cold",):
            rec = {"qp": q.label, "kind": q.kind, "origin": q.origin, "n": n, "start": start}
            rec["product_used_in_fit"], rec["results"] = q.product_used, {}
            for v in VARIANTS:
                if (start == "warm" and v not in WARM) or (v == "solve_box_qp" and not q.raw):
                    continue
                past = history.setdefault((q.kind, v), [])
                why = None if v in OURS else skip_reason(past, n)
                r = {"status": "skipped", "error": why} if why else measure(q, v, start)
                rec["results"][v] = r
                if not why:
                    past.append((n, r.get("time_s", r.get("elapsed_s", 0.0))))
            _objective_gaps(rec["results"])
            out.append(rec)
            log(_instance_line(rec))
    return out


def skip_reason(past: list[tuple[int, float]], n: int) -> str | None:
    """Why a solver with these (n, time) solves of one kind is not run at size ``n``."""
    if not past:
        return None
    n0, t0 = max(past)  # the largest size so far, its slowest solve
    slowest = max(t for _, t in past)
    if slowest > SKIP_S:
        return f"a solve took {slowest:.1f} s > {SKIP_S:g} s"
    predicted = t0 * (n / n0) ** 2
    if predicted > PROBE_S:
        return f"{t0:.2f} s at n = {n0} predicts {predicted:.0f} s"
    return None


def _objective_gaps(results: dict) -> None:
    objs = [r["objective"] for r in results.values() if "objective" in r]
    best = min(objs)
    for r in results.values():
        if "objective" in r:
            r["objective_gap"] = (r["objective"] - best) / max(1.0, abs(best))


def _instance_line(rec: dict) -> str:
    cells = [
        f"{v} {r['time_s'] * 1e3:.1f}ms" + ("!" if r["status"] == "missed" else "")
        if "time_s" in r
        else f"{v} {r['status']}"
        for v, r in rec["results"].items()
    ]
    return f"  {rec['qp']} n={rec['n']} {rec['start']}: " + ", ".join(cells)


# ----------------------------------------------------------------------- report


def group_key(rec: dict) -> tuple:
    family = "Office " + rec["origin"].split()[-1] if rec["origin"].startswith("Office") else ""
    family = family or "synthetic"
    return (rec["kind"], family, rec["n"], rec["start"])


def summarise(instances: list[dict]) -> list[dict]:
    """Per QP class, size and start: median time, worst KKT and gap, misses and failures."""
    groups: dict[tuple, list] = {}
    for rec in instances:
        groups.setdefault(group_key(rec), []).append(rec)
    rows = []
    for (kind, family, n, start), recs in groups.items():
        row = {"kind": kind, "family": family, "n": n, "start": start, "count": len(recs)}
        row["solvers"] = {v: _solver_summary([r["results"][v] for r in recs
                                              if v in r["results"]]) for v in VARIANTS}  # fmt: skip
        rows.append(row)
    return sorted(rows, key=lambda r: (r["kind"] != "wstep", r["family"], r["n"], r["start"]))


def _solver_summary(results: list[dict]) -> dict | None:
    if not results:
        return None
    timed = [r for r in results if "time_s" in r]
    return {
        "median_time_s": statistics.median(r["time_s"] for r in timed) if timed else None,
        "worst_kkt": max((r["kkt"] for r in timed), default=None),
        "worst_objective_gap": max((r["objective_gap"] for r in timed), default=None),
        "missed": sum(r["status"] == "missed" for r in results),
        "failed": sum(r["status"] == "failed" for r in results),
        "skipped": sum(r["status"] == "skipped" for r in results),
    }


def _fmt_time(t: float) -> str:
    if t < 0.1:
        return f"{t * 1e3:.2g} ms" if t < 0.01 else f"{t * 1e3:.0f} ms"
    return f"{t:.2f} s" if t < 10 else f"{t:.0f} s"


def _cell(s: dict | None, ref: float | None) -> str:
    if s is None:
        return "–"
    if s["median_time_s"] is None:
        return "skipped" if s["skipped"] else f"failed ×{s['failed']}"
    text = _fmt_time(s["median_time_s"])
    if ref:
        ratio = s["median_time_s"] / ref
        text += f" ({ratio:,.0f}×)" if ratio >= 10 else f" ({ratio:.2g}×)"
    bad = [f"{s[k]} {k}" for k in ("missed", "failed") if s[k]]
    return text + (f" [{', '.join(bad)}]" if bad else "")


def time_table(rows: list[dict]) -> str:
    head = ["QP", "n", "start", "#", *VARIANTS]
    lines = ["| " + " | ".join(head) + " |", "|---|---:|---|---:|" + "---:|" * len(VARIANTS)]
    for r in rows:
        ref = (r["solvers"]["product"] or {}).get("median_time_s")
        cells = [_cell(r["solvers"][v], ref) for v in VARIANTS]
        kind = "W-step" if r["kind"] == "wstep" else "SVM-step"
        lines.append(f"| {kind}, {r['family']} | {r['n']:,} | {r['start']} | {r['count']} | "
                     + " | ".join(cells) + " |")  # fmt: skip
    return "\n".join(lines)


def accuracy_table(instances: list[dict]) -> str:
    """Per solver over all instances: worst KKT, worst objective gap, misses, failures."""
    head = "| solver | solved | worst KKT | worst objective gap | missed | failed | skipped |"
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|"]
    for v in VARIANTS:
        s = _solver_summary([r["results"][v] for r in instances if v in r["results"]])
        timed = s["median_time_s"] is not None
        solved = sum(r["results"][v]["status"] == "ok" for r in instances if v in r["results"])
        total = sum(v in r["results"] for r in instances)
        kkt = f"{s['worst_kkt']:.0e}" if timed else "–"
        gap = f"{s['worst_objective_gap']:.0e}" if timed else "–"
        lines.append(f"| {v} | {solved}/{total} | {kkt} | {gap} | {s['missed']} | "
                     f"{s['failed']} | {s['skipped']} |")  # fmt: skip
    return "\n".join(lines)


# ----------------------------------------------------------------------- machine, load


@contextlib.contextmanager
def sampled_load(every_s: float = 10.0):
    """Yield a list that a daemon thread fills with ``(seconds, 1-min load average)``."""
    samples: list[tuple[float, float]] = []
    stop, t0 = threading.Event(), time.time()

    def sample() -> None:
        while not stop.is_set():
            samples.append((round(time.time() - t0, 1), os.getloadavg()[0]))
            stop.wait(every_s)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


def versions() -> dict:
    names = ("numpy", "scipy", "numba", "qpsolvers", "daqp", "proxsuite", "quadprog", "piqp",
             "highspy", "clarabel", "osqp")  # fmt: skip
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


# ----------------------------------------------------------------------- main


def run(quick: bool, log) -> dict:
    """Capture the QPs of the fits, solve them with every solver; the result record."""
    shifts = OFFICE_SHIFTS[:1] if quick else OFFICE_SHIFTS
    sizes = SYNTHETIC_SIZES[:2] if quick else SYNTHETIC_SIZES
    warnings.filterwarnings("ignore", module="qpsolvers")  # statuses are recorded
    load_before, t0 = os.getloadavg(), time.perf_counter()
    with sampled_load() as load, threadpool_limits(1):
        rec = Recorder()
        office_fits(rec, shifts)
        synthetic_fits(rec, sizes)
        log(f"captured {sum(sum(by.values()) for by in rec.paths.values())} QPs, "
            f"benchmarking {len(rec.qps)}")  # fmt: skip
        instances = run_instances(rec.qps, log)
    return {
        "command": "python benchmarks/bench_qp.py" + (" --quick" if quick else ""),
        "machine": {"cpus": os.cpu_count(), "cpu_model": cpu_model(), **versions()},
        "threads": 1,
        "target_kkt": TARGET,
        "settings": SETTINGS,
        "skip_s": SKIP_S,
        "probe_s": PROBE_S,
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "load_avg_1min_samples": load,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time(),
        "product_paths_in_fits": rec.paths,
        "summary": summarise(instances),
        "instances": instances,
    }


def report(result: dict) -> str:
    """The tables of BENCHMARKS.md, the product's paths and the load of one result record."""
    paths = result["product_paths_in_fits"]
    n_all = sum(sum(by.values()) for by in paths.values())
    loads = [s[1] for s in result["load_avg_1min_samples"]]
    return (
        f"{time_table(result['summary'])}\n\n{accuracy_table(result['instances'])}\n\n"
        f"the product's paths over all {n_all} QPs of the fits: {paths}\n"
        f"load average: before {result['load_avg_before'][0]:.1f}, during {min(loads):.1f}-"
        f"{max(loads):.1f}, after {result['load_avg_after'][0]:.1f}; "
        f"wall {result['wall_s']:.0f} s, CPU {result['cpu_s']:.0f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="two Office fits, K·M <= 1,000")
    ap.add_argument("--report", metavar="JSON", help="print the tables of a saved result")
    args = ap.parse_args()
    if args.report:
        print(report(json.loads(Path(args.report).read_text())))
        return
    result = run(args.quick, lambda *a: print(*a, flush=True))
    name = "qp_solvers_quick.json" if args.quick else "qp_solvers.json"
    (HERE / "results" / name).write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(report(result))


if __name__ == "__main__":
    main()
