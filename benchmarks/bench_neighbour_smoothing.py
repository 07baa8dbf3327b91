"""Neighbour smoothing of the rule's target scores (KNS): a dev study, not in the product.

    python benchmarks/bench_neighbour_smoothing.py --office DIR --pixels DIR
        [--labels 1 3 10] [--splits 10] [--office-seed 2027] [--pixels-seed 2040]
        [--source-per-class N] [--workers 2] [--out benchmarks/results/kns.json]

The variant (BENCHMARKS.md, "Neighbour smoothing of the target scores (KNS)"): after the
frozen rule's final fit (``select="auto"`` as the product runs it), each scored target
sample's decision scores become ``(1 − α) s(x) + α · mean of s over its k nearest
unlabelled targets`` (cosine of the target Gram, the sample itself excluded), ``k = 5``,
``α = 0.5``: one step of label propagation over the target device's samples, which the
cluster assumption of semi-supervised learning favours. The unlabelled targets are the
scored ones in both protocols run here (transductive), so no new fit is needed. The
product's rule smooths as KNS-H does since version ``auto-2026-11-29-knsh``: the "rule"
column is its final fit's scores before smoothing, ``product`` what it returns. KNS-H
(BENCHMARKS.md, "... on hard shifts only (KNS-H)"): KNS where the rule's pick has a mean
held-out hinge loss of at least the rule's ``HARD_HINGE`` (0.25), the rule's scores
elsewhere.

Office-Caltech10 (SURF, GoogLeNet-1024, DeCAF6; ``bench_rule_dev.split_problem``, whose
seeds and draws it reuses) and the raw-pixel shifts of ``bench_rule_pixels`` (COIL20,
MNIST ↔ USPS, ``l2_zscore``, through the estimator). For every split: the rule's
accuracy, the smoothed accuracy and the source and target SVMs'.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

K_NEIGHBOURS, ALPHA = 5, 0.5


def smoothed(scores: np.ndarray, cosine: np.ndarray) -> np.ndarray:
    """``(1 − α) s + α · mean of s over the k most cosine-similar other rows``."""
    sim = cosine.copy()
    np.fill_diagonal(sim, -np.inf)
    nn = np.argpartition(-sim, K_NEIGHBOURS, axis=1)[:, :K_NEIGHBOURS]
    return (1 - ALPHA) * scores + ALPHA * scores[nn].mean(axis=1)


def gram_cosine(K: np.ndarray) -> np.ndarray:
    d = np.sqrt(np.clip(np.diag(K), 1e-300, None))
    return K / d[:, None] / d[None, :]


def office_split(job) -> dict:
    from bench_rule_dev import split_problem

    from mmdtl2_dist.core.auto_fit import fit_predict_auto
    from mmdtl2_dist.core.methods import fit_predict

    data, vary, seed = job[-3:]
    key = (*job[:5], *([vary] if vary else []))
    pool, base, yq = split_problem(key, data, seed)
    res, choice = fit_predict_auto(pool, base.ys, base.yt)
    q = pool.target_test
    scores = fit_predict(choice.method, choice.params, choice.problem).scores[: len(q)]
    smooth = smoothed(scores, gram_cosine(pool.Ktt[np.ix_(q, q)]))
    out = {"data": job[0], "shift": f"{job[1]}-{job[2]}", "labels": job[4], "split": job[3]}
    out.update(rule=acc(res.classes[scores.argmax(1)], yq))
    out.update(kns=acc(res.classes[smooth.argmax(1)], yq), product=acc(res.y_pred, yq))
    for m in ("source_svm", "target_svm"):
        out[m] = acc(fit_predict(m, {}, base).y_pred, yq)
    return with_hard_variant({**out, "pick": choice.pick}, choice.record())


def pixels_split(job) -> dict:
    from bench_rule_pixels import pixel_split
    from threadpoolctl import threadpool_limits

    from mmdtl2_dist.estimators import MMDTL2, SourceSVM, TargetSVM

    _, shift, split, n, data, _, seed = job
    Xs, ys, Xt, yt, lab, rest = pixel_split(data, shift, n, split, seed)
    out = {"data": "pixels", "shift": shift, "labels": n, "split": split}
    with threadpool_limits(1):
        rule = MMDTL2(select="auto", preprocessing="l2_zscore")
        rule.fit_domains(Xs, ys, Xt[lab], yt[lab], Xt_unlabelled=Xt[rest])
        Z = rule.target_preprocessing_.transform(Xt[rest])
        scores = rule.adapter_.fitted_scores(Z)  # before the product's smoothing
        smooth = smoothed(scores, gram_cosine(Z @ Z.T))
        out.update(rule=acc(rule.classes_[scores.argmax(1)], yt[rest]))
        out.update(product=100 * float(rule.score(Xt[rest], yt[rest])))
        out.update(kns=acc(rule.classes_[smooth.argmax(1)], yt[rest]), pick=rule.auto_["pick"])
        for name, est in (("source_svm", SourceSVM), ("target_svm", TargetSVM)):
            m = est(preprocessing="l2_zscore")
            m.fit_domains(Xs, ys, Xt[lab], yt[lab], Xt_unlabelled=Xt[rest])
            out[name] = 100 * float(m.score(Xt[rest], yt[rest]))
    return with_hard_variant(out, rule.auto_)


def with_hard_variant(out: dict, record: dict) -> dict:
    """``out`` with KNS-H's accuracy: KNS's on a hard shift (the pick's mean held-out
    hinge loss at least the rule's ``HARD_HINGE``), else the rule's; and that hinge."""
    from mmdtl2_dist.core.auto import HARD_HINGE

    hinge = pick_hinge(record)
    hard = hinge is not None and hinge >= HARD_HINGE
    return {**out, "pick_hinge": hinge, "knsh": out["kns"] if hard else out["rule"]}


def pick_hinge(record: dict) -> float | None:
    """The mean held-out hinge loss of the rule's pick (None without folds)."""
    return next(r["cv_hinge"] for r in record["table"] if r["candidate"] == record["pick"])


def acc(pred, truth) -> float:
    return 100 * float(np.mean(np.asarray(pred) == np.asarray(truth)))


def by_shift(runs: list[dict]) -> dict:
    shifts = defaultdict(list)
    for r in runs:
        shifts[r["data"], r["shift"]].append(r)
    return shifts


def compared(shifts: dict, variant: str) -> tuple[dict, dict, tuple, float]:
    """The rule against ``variant`` over ``shifts``: their means over the shifts, the
    shifts each loses (:func:`lost_shift`), and the shift where ``variant − rule`` is
    lowest with that gap."""
    cols = ("rule", variant)
    mean = {c: np.mean([np.mean([r[c] for r in s]) for s in shifts.values()]) for c in cols}
    lost = {c: sum(lost_shift(s, c) for s in shifts.values()) for c in cols}
    gaps = {k: np.mean([r[variant] - r["rule"] for r in s]) for k, s in shifts.items()}
    worst = min(gaps, key=gaps.get)
    return mean, lost, worst, gaps[worst]


def summary(runs: list[dict]) -> str:
    """Per data set and budget: means over shifts, KNS − rule, shifts lost, worst shift."""
    groups = defaultdict(list)
    for r in runs:
        groups[r["data"] if r["data"] == "pixels" else "office", r["labels"]].append(r)
    lines = [
        "| data | labels | splits | variant | rule | variant's | variant − rule "
        "| shifts lost, rule / variant | worst shift, variant − rule |",
        "|---|---:|---:|---|---:|---:|---:|---|---|",
    ]
    for (data, n), rs in sorted(groups.items()):
        for v in ("kns", "knsh"):
            mean, lost, worst, gap = compared(by_shift(rs), v)
            lines.append(
                f"| {data} | {n} | {len(rs)} | {v.upper()} | {mean['rule']:.2f} | "
                f"{mean[v]:.2f} | {mean[v] - mean['rule']:+.2f} | {lost['rule']} / {lost[v]} | "
                f"{' '.join(worst)} {gap:+.2f} |"
            )
    return "\n".join(lines)


def pixel_fits(job):
    """One pixel split of ``jobs``: ``fitted(est)`` fits an estimator on it (the split's
    unlabelled targets given) and returns it with its test accuracy; the record's keys;
    the source labels."""
    from bench_rule_pixels import pixel_split

    _, shift, split, n, data, _, seed = job
    Xs, ys, Xt, yt, lab, rest = pixel_split(data, shift, n, split, seed)

    def fitted(est):
        est.fit_domains(Xs, ys, Xt[lab], yt[lab], Xt_unlabelled=Xt[rest])
        return est, 100 * float(est.score(Xt[rest], yt[rest]))

    return fitted, {"data": "pixels", "shift": shift, "labels": n, "split": split}, ys


def data_group(r: dict) -> str:
    return {"surf": "surf", "pixels": "pixels"}.get(r["data"], "deep")


def variant_summary(runs: list[dict], name: str) -> str:
    """Per data group and budget: the rule against the runs' ``variant`` column (named
    ``name``): means over shifts, their difference, shifts lost, the worst shift."""
    groups = defaultdict(list)
    for r in runs:
        groups[data_group(r), r["labels"]].append(r)
    lines = [
        f"| data | labels | splits | changed | rule | {name} | {name} − rule "
        f"| shifts lost, rule / {name} | worst shift, {name} − rule |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for (data, n), rs in sorted(groups.items()):
        mean, lost, worst, gap = compared(by_shift(rs), "variant")
        changed = sum(r["variant"] != r["rule"] for r in rs)
        lines.append(
            f"| {data} | {n} | {len(rs)} | {changed} | {mean['rule']:.2f} | "
            f"{mean['variant']:.2f} | {mean['variant'] - mean['rule']:+.2f} | "
            f"{lost['rule']} / {lost['variant']} | {' '.join(worst)} {gap:+.2f} |"
        )
    return "\n".join(lines)


def lost_shift(runs: list[dict], column: str) -> bool:
    """More than one standard error below max(source SVM, target SVM) on the shift."""
    best = max(np.mean([r[m] for r in runs]) for m in ("source_svm", "target_svm"))
    vals = np.array([r[column] for r in runs])
    se = vals.std(ddof=1) / np.sqrt(len(vals)) if len(vals) > 1 else 0.0
    return bool(vals.mean() < best - se)


def jobs(args) -> list[tuple]:
    from bench_rule_dev import jobs_for
    from bench_rule_pixels import SHIFTS

    vary = {"source_per_class": args.source_per_class} if args.source_per_class else None
    out = []
    if args.office:
        datasets = ["surf", "googlenet1024", "decaf6"]
        office = jobs_for(datasets, str(args.office), args.labels, args.splits)
        out += [(*j, str(args.office), vary, args.office_seed) for j in office]
    if args.pixels:
        out += [("pixels", s, k, n, str(args.pixels), None, args.pixels_seed)
                for s in SHIFTS for n in args.labels for k in range(args.splits)]  # fmt: skip
    return out


def one(job) -> dict:
    return pixels_split(job) if job[0] == "pixels" else office_split(job)


def study_arguments(description: str, labels, office_seed: int, out: str):
    """The command line of a dev study of the rule on Office-Caltech10 and the pixels."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--office", type=Path, default=None, help="the Office-Caltech10 data folder")
    ap.add_argument("--pixels", type=Path, default=None, help="COIL_1.mat, MNIST_vs_USPS.mat")
    ap.add_argument("--labels", type=int, nargs="+", default=labels)
    ap.add_argument("--splits", type=int, default=10)
    ap.add_argument("--office-seed", type=int, default=office_seed, help="bench_rule_dev's seed")
    ap.add_argument("--pixels-seed", type=int, default=2040, help="bench_rule_pixels' dev seed")
    ap.add_argument("--source-per-class", type=int, default=None, help="Office source draw")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path(out))
    args = ap.parse_args()
    if args.out.is_dir():
        ap.error(f"--out {args.out} is a folder: give the JSON file to write (its .md beside it)")
    return args


def one_blas_thread() -> None:
    """A worker process's BLAS pools held to one thread (numpy is imported by then)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)


def run_study(args, one, summary, script: str, **meta) -> None:
    """Every split of ``jobs(args)`` through ``one`` on ``args.workers`` processes (one BLAS
    thread each); the ``summary`` table printed and written beside the JSON of the runs."""
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.workers, initializer=one_blas_thread) as pool:
        runs = list(pool.map(one, jobs(args)))
    table = summary(runs)
    print(table)
    meta = {
        "command": f"python benchmarks/{script} " + " ".join(os.sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "seconds": time.perf_counter() - t0,
        **meta,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    args.out.with_suffix(".md").write_text(f"# `{meta['command']}`\n\n{table}\n")


def main() -> None:
    args = study_arguments(__doc__.split("\n")[0], [1, 3, 10], 2027, "benchmarks/results/kns.json")
    run_study(args, one, summary, "bench_neighbour_smoothing.py", k=K_NEIGHBOURS, alpha=ALPHA)


if __name__ == "__main__":
    main()
