"""A selection rule for MMDTL2's transductive prior, designed on development data only.

    python benchmarks/bench_rule_dev.py --data DIR [--labels 1 3 10] [--splits 5]
    python benchmarks/bench_rule_dev.py --data DIR --set fresh --datasets surf   # confirmation

Two phases in one script, so the rule is judged on the same records it was chosen from:

1. **Collect** (one process, one BLAS thread): for every split, every candidate of
   :data:`CANDIDATES` is fitted once on the split (its test accuracy, the ground truth)
   and on each per-class fold of the labelled targets (its held-out correctness and
   multiclass hinge loss, one entry per held-out sample), plus two signals from the
   unlabelled target samples that cost no fit: the **reverse nearest-neighbour
   accuracy** (each labelled *source* sample classified by the majority pseudo-label of
   its 5 most similar unlabelled target samples, linear kernel, pseudo-labels from the
   candidate) and the entropy of the candidate's predicted class histogram on the
   unlabelled targets. Source and target SVM are fitted for the reference columns.
2. **Rules** (no fit): every rule of :data:`RULES` picks one candidate per split from
   those records; its accuracy is the picked candidate's test accuracy, and its cost the
   number of fits the rule needs (folds × compared candidates + the final fit).

Split sets: ``dev`` (seed 2027, the development set of ``benchmarks/bench_selection.py``,
extended to other label budgets: the same source rows, ``n`` labelled target rows per
class drawn by the same generator) and ``fresh`` (seed 2026, kept for the confirmation of
the frozen rule). Hoffman's 20 fixed splits are never read here. Datasets and the
transductive pool are those of ``benchmarks/bench_priors_dev.py`` (the pool: the split's
source samples and every sample of the target domain). A shift is left out of a label
budget when a target class has no more than ``n`` samples (dslr has 8 in one class, so
``n = 10`` has no dslr target).

Subspace dimensions are set in units of the number of classes ``C`` (``d = 2C``, ``4C``),
not as an absolute number or an explained-variance fraction: on dev the explained
variance of the best ``d = 20`` ranges from 20 % (SURF) to 67 % (GoogLeNet dslr), so a
fraction of the spectrum does not carry the best dimension from one feature type to the
other, while ``2C``-``4C`` was best or near it on all three feature types.

Writes ``benchmarks/results/rule_<set>.json`` (records and tables) and the tables to
``rule_<set>.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
from bench_priors_dev import DATASETS, prior_maps, shift_grams
from bench_selection import SEEDS
from threadpoolctl import threadpool_limits

from mmdtl2_dist.core.methods import fit_predict
from mmdtl2_dist.core.priors import SamplePool
from mmdtl2_dist.core.selection import _multiclass_hinge, canonical_order, cv_folds, sub_problem
from mmdtl2_dist.datasets.office_caltech import SHIFTS

N_CLASSES = 10
# (label, fixed parameters, transductive prior or None, d in units of the class count C)
CANDIDATES = (
    ("λ=0", {"prior": "identity", "prior_weight": 0.0, "c_f": 1.0}, None, None),
    ("identity λ=0.5", {"prior": "identity", "prior_weight": 0.5, "c_f": 1.0}, None, None),
    ("identity λ=1", {"prior": "identity", "prior_weight": 1.0, "c_f": 1.0}, None, None),
    ("SA d=4C", {"prior": "matrix", "prior_weight": 1.0, "c_f": 1.0}, "sa", 4),
    ("shared PCA d=2C", {"prior": "matrix", "prior_weight": 1.0, "c_f": 1.0}, "shared_pca", 2),
    ("shared PCA d=2C λ=0.5", {"prior": "matrix", "prior_weight": 0.5, "c_f": 1.0}, "shared_pca", 2),
    ("shared PCA d=4C λ=0.5", {"prior": "matrix", "prior_weight": 0.5, "c_f": 1.0}, "shared_pca", 4),
)  # fmt: skip
LABELS = [c[0] for c in CANDIDATES]
MAX_FOLDS = 3  # per-class folds: 3 candidates × 3 folds + 1 final fit = 10 fits at most
KNN = 5


def split_rows(ys_all, yt_all, source, target, k, seed, n_lab):
    """Source rows (20 per class, 8 from webcam/dslr), ``n_lab`` labelled target rows per
    class and the rest of the target domain; for ``n_lab = 3`` exactly the rows of
    ``bench_selection.random_split_rows``, and the same source rows for every ``n_lab``."""
    rng = np.random.default_rng([seed, SHIFTS.index((source, target)), k])
    ns = 8 if source in ("webcam", "dslr") else 20
    src = np.concatenate(
        [rng.choice(np.flatnonzero(ys_all == c), ns, replace=False) for c in np.unique(ys_all)]
    )
    lab = np.concatenate(
        [rng.choice(np.flatnonzero(yt_all == c), n_lab, replace=False) for c in np.unique(yt_all)]
    )
    return src, lab, np.setdiff1d(np.arange(len(yt_all)), lab)


def reverse_knn_accuracy(Kst_q: np.ndarray, pseudo: np.ndarray, ys: np.ndarray) -> float:
    """Source samples classified by the majority pseudo-label of their ``KNN`` most similar
    unlabelled targets (rows of ``Kst_q``: source × unlabelled target, linear kernel)."""
    near = np.argsort(-Kst_q, axis=1)[:, :KNN]
    votes = pseudo[near]
    pred = np.array([np.bincount(v).argmax() for v in votes])
    return float(np.mean(pred == ys))


def label_entropy(pred: np.ndarray) -> float:
    """Entropy of the predicted class histogram, divided by log of the class count."""
    p = np.bincount(pred, minlength=N_CLASSES + 1)[1:] / len(pred)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum() / np.log(N_CLASSES))


def collect(job, data_dir, seed):
    """Every candidate's test accuracy and selection signals on one split."""
    dataset, source, target, k, n_lab = job
    Ks, Kt, Kst, ys_all, yt_all, bases = shift_grams(dataset, source, target, data_dir)
    src, lab, test = split_rows(ys_all, yt_all, source, target, k, seed, n_lab)
    pool = SamplePool(Ks[np.ix_(src, src)], Kt, Kst[src], np.arange(len(src)), lab, test)
    keys = {(p, d * N_CLASSES) for _, _, p, d in CANDIDATES if p is not None}
    maps = prior_maps(pool, bases, keys)
    base = pool.problem(ys_all[src], yt_all[lab])
    yq, ys = yt_all[test], ys_all[src]
    rec = {"ref": {}, "acc": {}, "cv_hit": {}, "cv_hinge": {}, "rknn": {}, "entropy": {}}
    for m in ("source_svm", "target_svm"):
        rec["ref"][m] = float(np.mean(fit_predict(m, {}, base).y_pred == yq))
    perm = canonical_order(base.Ktt)
    folds = cv_folds(base.yt, MAX_FOLDS, "per_class", order=perm)
    all_idx = np.arange(len(base.yt))
    for label, params, prior, d in CANDIDATES:
        prob = base if prior is None else pool.problem(
            base.ys, base.yt, maps[prior, d * N_CLASSES].blocks(pool)
        )  # fmt: skip
        res = fit_predict("mmdtl2", params, prob)
        rec["acc"][label] = float(np.mean(res.y_pred == yq))
        rec["rknn"][label] = reverse_knn_accuracy(Kst[np.ix_(src, test)], res.y_pred, ys)
        rec["entropy"][label] = label_entropy(res.y_pred)
        hits, hinge = [], []
        for held in folds:
            sp = sub_problem(prob, np.setdiff1d(all_idx, held), held)
            r = fit_predict("mmdtl2", params, sp)
            hits += (r.y_pred == prob.yt[held]).astype(int).tolist()
            hinge += _multiclass_hinge(r.scores, r.classes, prob.yt[held]).tolist()
        rec["cv_hit"][label], rec["cv_hinge"][label] = hits, hinge
    return rec


def jobs_for(datasets, data_dir, labels, splits):
    """(dataset, source, target, split, n_lab) of every split, skipping infeasible budgets."""
    out = []
    for ds in datasets:
        for s, t in SHIFTS:
            if s not in DATASETS[ds] or t not in DATASETS[ds]:
                continue
            yt = shift_grams(ds, s, t, data_dir)[4]
            smallest = np.bincount(yt)[np.unique(yt)].min()
            out += [(ds, s, t, k, n) for n in labels if n < smallest for k in range(splits)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--datasets", nargs="+", default=None, choices=list(DATASETS))
    ap.add_argument("--labels", nargs="+", type=int, default=[1, 3, 10])
    ap.add_argument("--splits", type=int, default=5)
    ap.add_argument("--set", choices=list(SEEDS), default="dev")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    datasets = args.datasets or (list(DATASETS) if args.data else ["surf"])
    data_dir = None if args.data is None else str(args.data.resolve())
    args.out = args.out or Path(__file__).parent / "results" / f"rule_{args.set}.json"
    jobs = jobs_for(datasets, data_dir, args.labels, args.splits)
    t0 = time.perf_counter()
    records = []
    with threadpool_limits(1):
        for i, job in enumerate(jobs, 1):
            rec = collect(job, data_dir, SEEDS[args.set])
            rec["job"] = list(job)
            records.append(rec)
            if i % 10 == 0:
                print(f"  {i}/{len(jobs)} splits, {time.perf_counter() - t0:.0f} s", flush=True)
    meta = {
        "machine": f"{platform.machine()}, 1 process, 1 BLAS thread (2 shared cores)",
        "wall_s": time.perf_counter() - t0,
        "split_set": f"{args.set} (seed {SEEDS[args.set]})",
        "datasets": datasets,
        "labels": args.labels,
        "splits": args.splits,
        "candidates": [{"label": c[0], "params": c[1], "prior": c[2], "d/C": c[3]} for c in CANDIDATES],
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "records": records}, ensure_ascii=False))
    print(f"{len(jobs)} splits, {meta['wall_s']:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
