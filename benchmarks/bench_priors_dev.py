"""Transductive priors of MMDTL2 on development data only, every configuration fixed.

    python benchmarks/bench_priors_dev.py --data DIR [--datasets surf googlenet1024 decaf6]

``DIR`` holds the folders ``office-caltech10-googlenet1024`` (``amazon.mat``,
``dslr.mat``, ``webcam.mat``: keys ``fts``, ``labels``) and ``office-caltech10-decaf6``
(``dslr_decaf.mat``, ``Webcam_decaf.mat``: keys ``fea``, ``gnd``); the SURF features are
the bundled ones. Without ``--data`` only ``surf`` runs.

Development splits only (Hoffman's 20 fixed splits are the final evaluation set and are
never read here): the ``dev`` split set of ``benchmarks/bench_selection.py`` (seed 2027,
20 random splits per shift, or ``--seed`` for another draw, with Hoffman's sizes: 20
source samples per class, 8 from webcam or dslr; 3 labelled target samples per class; the
rest of the target domain is the test set), drawn the same way for the 12 SURF shifts, the
6 GoogLeNet-1024 shifts (amazon, dslr, webcam) and the 2 DeCAF6 shifts (dslr, webcam).
Features are L2-normalised then z-scored per domain over all its samples.

Transductive protocol, as published for this benchmark: the pool a prior learns from is the
split's source training samples and *every* sample of the target domain (labelled and
unlabelled; the unlabelled ones are also the test samples). No label outside the training
samples is read.

Columns: source SVM, target SVM, the paper-form MMDTL2 (``mmdtl2`` defaults, zero prior),
the identity prior ``W0 = λI`` with ``λ ∈ {0.5, 1}``, the subspace-alignment prior and the
shared-PCA prior with ``d ∈ {20, 40, 80}``, the CORAL prior (``reg = 1``), all priors with
weight 1 and ``c_f = 1`` (the identity prior's setting of ``mmdtl2 office``), and MMDT in
Hoffman's code form (PCA to 20 dims). ``SA d`` needs ``d`` below the number of source
samples: ``d = 80`` is n/a for webcam and dslr sources (80 samples). Prints per-shift mean
± standard error (%) over the 20 splits, per-dataset and overall means, and for every
column the shifts where it is more than one standard error below max(source SVM, target
SVM). One process, one BLAS thread: 400 splits took 24 min wall on the 2 shared cores here
(load about 10), most of it in the Caltech and Amazon targets (pools of 1123 and 958
samples); ``--datasets``, ``--splits`` cut it. Writes ``benchmarks/results/priors_dev.json``
(the printed tables also in ``priors_dev.md``). ``--explore`` runs the :data:`EXPLORE`
columns instead (prior weight 0.5 for SA and shared PCA, and SA with the identity outside
the subspaces), into ``priors_dev_explore.json``; ``--ot`` the :data:`OT_COLUMNS` (the
optimal-transport map beside the identity, shared-PCA and CORAL priors), into
``priors_dev_ot.json``; ``--purity`` prints, per shift, the share of the OT plan's mass
between samples of one class (mean over ``--splits`` splits; labels read for that
measurement only), into ``priors_dev_purity.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from functools import cache
from pathlib import Path

import numpy as np
import scipy.io as sio
from bench_selection import SEEDS, random_split_rows
from threadpoolctl import threadpool_limits

from mmdtl2_dist.core.gram_pca import pca_basis
from mmdtl2_dist.core.methods import fit_predict
from mmdtl2_dist.core.pool import SamplePool
from mmdtl2_dist.core.preprocessing import fit_preprocessing
from mmdtl2_dist.core.priors import (
    coral_map,
    ot_map,
    shared_pca_map,
    subspace_alignment_map,
    transport_plan,
)
from mmdtl2_dist.datasets.office_caltech import SHIFTS, load_domain

DATASETS = {
    "surf": ("amazon", "webcam", "dslr", "caltech"),
    "googlenet1024": ("amazon", "webcam", "dslr"),
    "decaf6": ("webcam", "dslr"),
}
DEEP_FILES = {
    "googlenet1024": ("office-caltech10-googlenet1024", "{}.mat", "fts", "labels"),
    "decaf6": ("office-caltech10-decaf6", "{}_decaf.mat", "fea", "gnd"),
}
DIMS = (20, 40, 80)
PRIOR = {"prior": "matrix", "prior_weight": 1.0, "c_f": 1.0}
IDENTITY = {"prior": "identity", "c_f": 1.0}
# (label, method, fixed parameters, transductive prior or None, its d)
COLUMNS = (
    [
        ("source SVM", "source_svm", {}, None, None),
        ("target SVM", "target_svm", {}, None, None),
        ("MMDTL2 paper", "mmdtl2", {}, None, None),
        ("identity λ=0.5", "mmdtl2", {**IDENTITY, "prior_weight": 0.5}, None, None),
        ("identity λ=1", "mmdtl2", {**IDENTITY, "prior_weight": 1.0}, None, None),
    ]
    + [(f"SA d={d}", "mmdtl2", PRIOR, "sa", d) for d in DIMS]
    + [(f"shared PCA d={d}", "mmdtl2", PRIOR, "shared_pca", d) for d in DIMS]
    + [
        ("CORAL", "mmdtl2", PRIOR, "coral", None),
        ("MMDT Hoffman", "mmdt_hoffman", {}, None, None),
    ]
)
HALF = {**PRIOR, "prior_weight": 0.5}
# ``--explore``: the weights and the SA variant the main table suggested, on the same splits.
EXPLORE = (
    COLUMNS[:2]
    + [
        ("SA d=40 λ=0.5", "mmdtl2", HALF, "sa", 40),
        ("shared PCA d=20 λ=0.5", "mmdtl2", HALF, "shared_pca", 20),
        ("shared PCA d=40 λ=0.5", "mmdtl2", HALF, "shared_pca", 40),
    ]
    + [(f"SA+I d={d}", "mmdtl2", PRIOR, "sa+I", d) for d in (20, 40, 79)]
    + [("SA+I d=40 λ=0.5", "mmdtl2", HALF, "sa+I", 40)]
)

# ``--ot``: the optimal-transport map (ridge ``reg`` 0.1, 1 and 10; weight 1 and 0.5) beside
# the identity prior, CORAL and the shared-PCA prior, on the same splits.
OT_REGS = (0.1, 1.0, 10.0)
OT_COLUMNS = (
    COLUMNS[:2]
    + [COLUMNS[4], (f"shared PCA d={DIMS[0]}", "mmdtl2", PRIOR, "shared_pca", DIMS[0])]
    + [("CORAL", "mmdtl2", PRIOR, "coral", None)]
    + [(f"OT reg={r:g}", "mmdtl2", PRIOR, "ot", r) for r in OT_REGS]
    + [(f"OT reg={r:g} λ=0.5", "mmdtl2", HALF, "ot", r) for r in OT_REGS[1:]]
)


@cache
def domain(dataset: str, name: str, data_dir: str | None):
    """Preprocessed features and labels (1..10) of one domain."""
    if dataset == "surf":
        dom = load_domain(name)
        X, y = dom.X, dom.y
    else:
        folder, pattern, xkey, ykey = DEEP_FILES[dataset]
        fname = pattern.format("Webcam" if (dataset, name) == ("decaf6", "webcam") else name)
        m = sio.loadmat(Path(data_dir) / folder / fname)
        X, y = m[xkey].astype(np.float64), m[ykey].reshape(-1).astype(np.int64)
    return fit_preprocessing(X, "l2_zscore").transform(X), y


@cache
def shift_grams(dataset: str, source: str, target: str, data_dir: str | None):
    """The whole-domain Grams of one shift and the target pool's PCA bases.

    The target pool is the whole target domain in every split, so its bases (the top
    ``max(DIMS)`` axes for subspace alignment, all of them for CORAL) are computed once.
    """
    Xs, ys = domain(dataset, source, data_dir)
    Xt, yt = domain(dataset, target, data_dir)
    Kt = Xt @ Xt.T
    bases = {"sa": pca_basis(Kt, max(DIMS)), "coral": pca_basis(Kt)}
    return Xs @ Xs.T, Kt, Xs @ Xt.T, ys, yt, bases


def prior_maps(pool: SamplePool, target_bases: dict, keys) -> dict:
    """The transductive priors ``keys`` (name, d), each basis computed once per split.

    ``"sa"`` needs ``d`` below the number of source samples: larger ones are left out.
    """
    ns = pool.Kss.shape[0]
    names = {name for name, _ in keys}
    src_sa = pca_basis(pool.Kss, min(max(DIMS), ns - 1)) if names & {"sa", "sa+I"} else None
    shared = pca_basis(pool.Kyy, max(DIMS)) if "shared_pca" in names else None
    maps = {}
    for name, d in keys:
        if name == "ot":  # ``d`` holds the map's ridge ``reg``
            maps[name, d] = ot_map(pool, d)
        elif name == "coral":
            maps[name, d] = coral_map(pool, 1.0, target_basis=target_bases["coral"])
        elif name == "shared_pca":
            maps[name, d] = shared_pca_map(pool, d, basis=shared)
        elif d < ns:
            maps[name, d] = subspace_alignment_map(
                pool, d, source_basis=src_sa, target_basis=target_bases["sa"],
                complement=name == "sa+I",
            )  # fmt: skip
    return maps


def split_pool(job, data_dir):
    """The split's prior pool (its source samples and the whole target domain), the source
    samples' labels, every target label and the target bases of :func:`shift_grams`."""
    dataset, source, target, k, seed = job
    Ks, Kt, Kst, ys_all, yt_all, bases = shift_grams(dataset, source, target, data_dir)
    src, lab, test = random_split_rows(ys_all, yt_all, source, target, k, seed)
    pool = SamplePool(Ks[np.ix_(src, src)], Kt, Kst[src], np.arange(len(src)), lab, test)
    return pool, ys_all[src], yt_all, bases


def evaluate(job, data_dir, columns=COLUMNS):
    """Accuracy of every column on one split; ``None`` where a column is not defined."""
    pool, ys, yt_all, bases = split_pool(job, data_dir)
    lab, test = pool.target_train, pool.target_test
    maps = prior_maps(pool, bases, {(c[3], c[4]) for c in columns if c[3] is not None})
    base = pool.problem(ys, yt_all[lab])
    yq = yt_all[test]
    out = {}
    for label, method, params, prior, d in columns:
        if prior is not None and (prior, d) not in maps:
            out[label] = None
            continue
        prob = (
            base if prior is None else pool.problem(base.ys, base.yt, maps[prior, d].blocks(pool))
        )
        out[label] = float(np.mean(fit_predict(method, params, prob).y_pred == yq))
    return out


def same_class_mass(job, data_dir) -> float:
    """The share of the OT plan's mass between a target and a source sample of one class."""
    pool, ys, yt_all, _ = split_pool(job, data_dir)
    plan = transport_plan(pool)
    return float(plan[yt_all[:, None] == ys[None, :]].sum())


def write_purity(jobs, data_dir, args) -> None:
    """Print each shift's mean :func:`same_class_mass` and write the lines beside the JSONs."""
    lines = []
    for job in jobs:
        if job[3] == 0:
            key = f"{job[0]}:{job[1][0].upper()}→{job[2][0].upper()}"
            mass = [same_class_mass((*job[:3], k, job[4]), data_dir) for k in range(args.splits)]
            lines.append(f"- {key}: {np.mean(mass):.3f}")
            print(lines[-1], flush=True)
    title = f"# Same-class mass of the OT plan, {args.splits} dev splits (seed {args.seed})"
    args.out.with_suffix(".md").write_text(title + "\n\n" + "\n".join(lines) + "\n")


def summarise(acc: dict, columns) -> dict:
    """Per-shift mean and standard error (%), dataset and overall means, and the losses."""
    labels = [c[0] for c in columns]
    summary = {"shifts": {}, "means": {}, "below_best_svm": {}}
    by_dataset: dict = {}
    for key, cols in acc.items():
        cell = {}
        for c in labels:
            a = np.array([v for v in cols[c] if v is not None]) * 100
            se = a.std(ddof=1) / np.sqrt(a.size) if a.size > 1 else 0.0
            cell[c] = None if a.size == 0 else (a.mean(), se)
        summary["shifts"][key] = cell
        by_dataset.setdefault(key.split(":")[0], []).append(cell)
        best = max(cell["source SVM"][0], cell["target SVM"][0])
        for c in labels:
            if cell[c] is not None and cell[c][0] < best - cell[c][1]:
                summary["below_best_svm"].setdefault(c, []).append(
                    f"{key} ({cell[c][0] - best:+.1f})"
                )
    groups = {**by_dataset, "all": [c for cells in by_dataset.values() for c in cells]}
    for g, cells in groups.items():
        m = {}
        for c in labels + ["max(source, target SVM)"]:
            vals = [
                max(x["source SVM"][0], x["target SVM"][0])
                if c.startswith("max(")
                else None
                if x[c] is None
                else x[c][0]
                for x in cells
            ]
            m[c] = None if None in vals else float(np.mean(vals))
        summary["means"][g] = m
    return summary


def format_tables(summary: dict, columns) -> str:
    """The per-shift table, the means and the losses against max(source, target SVM)."""
    labels = [c[0] for c in columns]
    lines = ["| shift | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for key, cell in summary["shifts"].items():
        cells = [
            "n/a" if cell[c] is None else f"{cell[c][0]:.1f} ± {cell[c][1]:.1f}" for c in labels
        ]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    for g, m in summary["means"].items():
        cells = ["n/a" if m[c] is None else f"**{m[c]:.1f}**" for c in labels]
        lines.append(f"| **mean {g}** | " + " | ".join(cells) + " |")
    lines.append("")
    for g, m in summary["means"].items():
        lines.append(f"max(source, target SVM) mean over {g}: {m['max(source, target SVM)']:.1f}")
    lines.append(
        "\nShifts where a column is more than one standard error below max(source, target SVM):"
    )
    for c in labels:
        lost = summary["below_best_svm"].get(c, [])
        lines.append(f"  {c}: {len(lost)}  {', '.join(lost)}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None, help="folder of the deep-feature sets")
    ap.add_argument("--datasets", nargs="+", default=None, choices=list(DATASETS))
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--seed", type=int, default=SEEDS["dev"], help="the split draw's seed")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--explore", action="store_true", help="the EXPLORE columns instead")
    mode.add_argument("--ot", action="store_true", help="the OT_COLUMNS instead")
    mode.add_argument(
        "--purity", action="store_true", help="print the OT plans' same-class mass, no fits"
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    columns = EXPLORE if args.explore else OT_COLUMNS if args.ot else COLUMNS
    mode = "_explore" if args.explore else "_ot" if args.ot else "_purity" if args.purity else ""
    name = "priors_dev" + mode + ("" if args.seed == SEEDS["dev"] else f"_{args.seed}")
    args.out = args.out or Path(__file__).parent / "results" / f"{name}.json"
    datasets = args.datasets or (list(DATASETS) if args.data else ["surf"])
    if args.data is None and set(datasets) - {"surf"}:
        ap.error("--data DIR is needed for the GoogLeNet-1024 and DeCAF6 features.")
    data_dir = None if args.data is None else str(args.data.resolve())
    jobs = [
        (ds, s, t, k, args.seed)
        for ds in datasets
        for s, t in SHIFTS
        if s in DATASETS[ds] and t in DATASETS[ds]
        for k in range(args.splits)
    ]
    if args.purity:
        write_purity(jobs, data_dir, args)
        return
    t0 = time.perf_counter()
    acc: dict = {}
    with threadpool_limits(1):
        for i, job in enumerate(jobs, 1):
            out = evaluate(job, data_dir, columns)
            cell = acc.setdefault(f"{job[0]}:{job[1][0].upper()}→{job[2][0].upper()}", {})
            for label, v in out.items():
                cell.setdefault(label, []).append(v)
            if i % 20 == 0:
                print(f"  {i}/{len(jobs)} splits, {time.perf_counter() - t0:.0f} s", flush=True)
    wall = time.perf_counter() - t0
    summary = summarise(acc, columns)
    tables = format_tables(summary, columns)
    print(tables)
    print(f"{len(jobs)} splits, {wall:.0f} s")
    meta = {
        "machine": f"{platform.machine()}, 1 process, 1 BLAS thread (2 shared cores)",
        "wall_s": wall,
        "command": "python benchmarks/bench_priors_dev.py"
        + (" --data DIR" if args.data else "")
        + " --datasets "
        + " ".join(datasets)
        + ("" if args.splits == 20 else f" --splits {args.splits}")
        + (" --explore" if args.explore else "")
        + (" --ot" if args.ot else "")
        + ("" if args.seed == SEEDS["dev"] else f" --seed {args.seed}"),
        "split_set": f"dev (seed {args.seed})",
        "columns": [
            {
                "label": c[0],
                "method": c[1],
                "params": c[2],
                "prior": c[3],
                "reg" if c[3] == "ot" else "d": c[4],
            }
            for c in columns
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"meta": meta, "summary": summary, "acc": acc}, indent=1, ensure_ascii=False)
    )
    title = f"# `{meta['command']}` ({meta['split_set']} splits; mean ± standard error, %)"
    args.out.with_suffix(".md").write_text(f"{title}\n\n{tables}\n")


if __name__ == "__main__":
    main()
