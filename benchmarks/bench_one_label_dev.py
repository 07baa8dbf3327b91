"""One labelled target per class: can the rule validate anything? A dev study.

    python benchmarks/bench_one_label_dev.py --data DIR --splits 20
    python benchmarks/bench_one_label_dev.py --data DIR --splits 5 --source-per-class 1000

With one labelled target per class no per-class fold exists, so ``select="auto"`` up to
version ``auto-2026-11-28-stv`` fitted its fold-free prior **F** (shared PCA, ``d = 2C``,
weight 1) and nothing else; version ``auto-2026-11-28-g1`` is "F guarded by N′" of this
study (N′ is the product's candidate ``N``). On the whole
source domain F loses up to 7 points to the source SVM on webcam ↔ dslr (BENCHMARKS.md,
"The rule off its design protocol"). This study asks whether **leave-classes-out folds**
can see that: the classes are split into three groups (sorted labels, group ``j`` =
every third class from the ``j``-th); fold ``j`` holds out the labelled targets of group
``j``, so each held-out target is a class the fold's fit has no target label of, which is
what the source has to carry when labels are that few. Every candidate is fitted on the
split (its test accuracy) and on each fold (the held-out multiclass hinge loss and
correctness); the guarded rules (the rule's own guard: an alternative replaces F when its
mean paired hinge gain exceeds one standard error) are scored on those records.

Candidates: F; S (identity prior, weight 1); S½ (identity, weight 0.5); D (shared PCA
``d = 4C``, weight 0.5); N (the source SVM on source and labelled targets); N′ (identity
prior, weight 1, ``c_f = 100``: ``W`` held near ``I``). ``--pixels`` runs the same on the
raw-pixel shifts of ``bench_rule_pixels.py`` (``DIR`` holds its data). Splits: ``--set``
names a split seed of ``bench_rule_dev.py`` (Office) or of ``bench_rule_pixels.py``
(``--pixels``), ``dev`` by default, at one label per class; Hoffman's splits are not
read. One process per core, one BLAS thread each. Writes
``benchmarks/results/one_label_dev[_source_N][_pixels][_SET].{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from bench_priors_dev import DATASETS
from bench_rule_dev import SEEDS, jobs_for, split_problem
from threadpoolctl import threadpool_limits

from mmdtl2_dist.core.auto import pool_problem
from mmdtl2_dist.core.methods import fit_predict
from mmdtl2_dist.core.priors import learnt_pca_map
from mmdtl2_dist.core.selection import multiclass_hinge, sub_problem

_PCA, _ID = {"prior": "matrix", "c_f": 1.0}, {"prior": "identity", "c_f": 1.0}
# name: (core method, parameters, shared-PCA d in units of the class count or None)
CANDIDATES = {
    "F": ("mmdtl2", {**_PCA, "prior_weight": 1.0}, 2),
    "S": ("mmdtl2", {**_ID, "prior_weight": 1.0}, None),
    "S½": ("mmdtl2", {**_ID, "prior_weight": 0.5}, None),
    "D": ("mmdtl2", {**_PCA, "prior_weight": 0.5}, 4),
    "N": ("source_svm", {}, None),
    "N'": ("mmdtl2", {**_ID, "prior_weight": 1.0, "c_f": 100.0}, None),
}
GROUPS = 3
RULES = {  # name: (default, alternatives, signal)
    "F (rule stv)": ("F", (), "hinge"),
    "F guarded by S": ("F", ("S",), "hinge"),
    "F guarded by N": ("F", ("N",), "hinge"),
    "F guarded by S, N": ("F", ("S", "N"), "hinge"),
    "F guarded by S, N, D": ("F", ("S", "N", "D"), "hinge"),
    "F guarded by S, N (accuracy)": ("F", ("S", "N"), "hit"),
    "F guarded by N'": ("F", ("N'",), "hinge"),
}


def class_folds(yt: np.ndarray) -> list[np.ndarray]:
    """Rows of ``yt`` held out by each fold: the labelled targets of one class group."""
    classes = np.unique(yt)
    groups = min(GROUPS, len(classes))
    return [np.flatnonzero(np.isin(yt, classes[j::groups])) for j in range(groups)]


def collect(job, data_dir: str, seed: int) -> dict:
    """Every candidate's test accuracy and leave-classes-out losses on one split."""
    with threadpool_limits(1):
        return candidate_records(job, *split_problem(job, data_dir, seed))


def collect_pixels(job, data_dir: str, seed: int) -> dict:
    """:func:`collect` on a split of ``bench_rule_pixels.py`` (job ``["pixels", shift,
    split]``): every source image, one random labelled target per class, the other
    targets unlabelled and scored, ``l2_zscore`` per device."""
    from bench_rule_pixels import SHIFTS as PIXEL_SHIFTS
    from bench_rule_pixels import labelled_rows, load_shift

    from mmdtl2_dist.core.pool import SamplePool
    from mmdtl2_dist.core.preprocessing import fit_preprocessing

    _, shift, split = job
    with threadpool_limits(1):
        Xs, ys, Xt, yt = load_shift(Path(data_dir), shift)
        rng = np.random.default_rng([seed, list(PIXEL_SHIFTS).index(shift), 1, split])
        lab = labelled_rows(yt, 1, rng)
        rest = np.setdiff1d(np.arange(len(yt)), lab)
        Zs = fit_preprocessing(Xs, "l2_zscore").transform(Xs)
        Zt = fit_preprocessing(Xt, "l2_zscore").transform(Xt)
        pool = SamplePool(Zs @ Zs.T, Zt @ Zt.T, Zs @ Zt.T, np.arange(len(Zs)), lab, rest)
        return candidate_records(job, pool, pool.problem(ys, yt[lab]), yt[rest])


def candidate_records(job, pool, base, yq) -> dict:
    """Each candidate's test accuracy on the split and its leave-classes-out losses."""
    n_classes, p = len(np.unique(np.r_[base.ys, base.yt])), pool.Kyy.shape[0]
    idx, folds = np.arange(len(base.yt)), class_folds(base.yt)
    rec = {"job": list(job), "acc": {}, "hinge": {}, "hit": {}, "ref": {}}
    for name, (method, params, per_class) in CANDIDATES.items():
        d = None if per_class is None else min(per_class * n_classes, p - 1)
        pmap = learnt_pca_map(pool, d, np.ones(p, bool))
        prob = pool_problem(pool, base.ys, base.yt, pmap)
        rec["acc"][name] = float(np.mean(fit_predict(method, params, prob).y_pred == yq))
        rec["hinge"][name], rec["hit"][name] = [], []
        for held in folds:
            fit = fit_predict(method, params, sub_problem(prob, np.setdiff1d(idx, held), held))
            y = base.yt[held]
            rec["hinge"][name] += multiclass_hinge(fit.scores, fit.classes, y).tolist()
            rec["hit"][name] += (fit.y_pred == y).astype(int).tolist()
    for m in ("source_svm", "target_svm"):
        rec["ref"][m] = float(np.mean(fit_predict(m, {}, base).y_pred == yq))
    return rec


def pick(rec: dict, default: str, alternatives, signal: str) -> str:
    """The rule's guard on a record: an alternative whose mean paired gain over the
    default exceeds its standard error, the larger gain first; else the default."""
    best, best_gain = default, 0.0
    for alt in alternatives:
        d, a = np.array(rec[signal][default], float), np.array(rec[signal][alt], float)
        diff = (d - a) if signal == "hinge" else (a - d)
        gain, se = diff.mean(), diff.std(ddof=1) / np.sqrt(diff.size)
        if gain > se and gain > best_gain:
            best, best_gain = alt, gain
    return best


def summary(records: list[dict]) -> str:
    """Per rule: mean over shifts, worst shift and shifts lost against max(source SVM,
    target SVM) (lost: more than one standard error below it), fits, picks."""
    shift = lambda r: (  # noqa: E731
        f"pixels:{r['job'][1]}" if r["job"][0] == "pixels"
        else f"{r['job'][0]}:{r['job'][1][0].upper()}→{r['job'][2][0].upper()}"
    )  # fmt: skip
    by_shift: dict = {}
    for r in records:
        by_shift.setdefault(shift(r), []).append(r)
    best = {
        k: 100 * max(np.mean([r["ref"][m] for r in rs]) for m in ("source_svm", "target_svm"))
        for k, rs in by_shift.items()
    }
    lines = [
        f"max(source SVM, target SVM), mean over {len(by_shift)} shifts: "
        f"{np.mean(list(best.values())):.2f}\n",
        "| rule | mean | worst shift | shifts lost | fits | picks |",
        "|---|---:|---:|---|---:|---|",
    ]
    for name, (default, alts, signal) in RULES.items():
        means, lost, picks = [], [], {}
        for k, rs in by_shift.items():
            chosen = [pick(r, default, alts, signal) for r in rs]
            acc = 100 * np.array([r["acc"][c] for r, c in zip(rs, chosen, strict=True)])
            means.append(acc.mean())
            if acc.mean() - best[k] < -acc.std(ddof=1) / np.sqrt(acc.size):
                lost.append(f"{k} {acc.mean() - best[k]:+.1f}")
            for c in chosen:
                picks[c] = picks.get(c, 0) + 1
        worst = min(m - best[k] for m, k in zip(means, by_shift, strict=True))
        fits = 1 + GROUPS * (1 + len(alts)) if alts else 1
        lines.append(
            f"| {name} | {np.mean(means):.2f} | {worst:+.1f} | {len(lost)}: {', '.join(lost)} "
            f"| {fits} | {', '.join(f'{c} {n}' for c, n in sorted(picks.items()))} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--source-per-class", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pixels", action="store_true", help="DIR holds bench_rule_pixels' data")
    ap.add_argument("--set", default="dev", help="the split seed's name (default dev)")
    args = ap.parse_args()
    data_dir = str(args.data.resolve())
    vary = {"source_per_class": args.source_per_class} if args.source_per_class else None
    if args.pixels:
        from bench_rule_pixels import SEEDS as PIXEL_SEEDS
        from bench_rule_pixels import SHIFTS as PIXEL_SHIFTS

        seed, run = PIXEL_SEEDS[args.set], collect_pixels
        jobs = [["pixels", s, k] for s in PIXEL_SHIFTS for k in range(args.splits)]
    else:
        seed, run = SEEDS[args.set], collect
        jobs = jobs_for(list(DATASETS), data_dir, [1], args.splits, [vary])
    t0 = time.perf_counter()
    with Pool(args.workers) as workers:
        records = workers.starmap(run, [(j, data_dir, seed) for j in jobs])
    command = f"python benchmarks/bench_one_label_dev.py --data DIR --splits {args.splits}"
    if args.source_per_class:
        command += f" --source-per-class {args.source_per_class}"
    if args.pixels:
        command += " --pixels"
    if args.set != "dev":
        command += f" --set {args.set}"
    meta = {
        "command": command,
        "machine": f"{platform.machine()}, {args.workers} processes, 1 BLAS thread each",
        "wall_s": time.perf_counter() - t0,
        "split_set": f"{args.set} (seed {seed}), 1 labelled target per class",
    }
    stem = "one_label_dev" + (f"_source_{args.source_per_class}" if args.source_per_class else "")
    stem += "_pixels" if args.pixels else ""
    stem += "" if args.set == "dev" else f"_{args.set}"
    out = Path(__file__).parent / "results" / stem
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "records": records}))
    text = f"# `{command}` ({len(jobs)} splits, {meta['wall_s']:.0f} s)\n\n{summary(records)}\n"
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
