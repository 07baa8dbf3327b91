"""A selection rule for MMDTL2's transductive prior, designed on development data only.

    python benchmarks/bench_rule_dev.py --data DIR [--labels 1 3 10] [--splits 5]  # records
    python benchmarks/bench_rule_dev.py --rules benchmarks/results/rule_dev.json   # score rules
    python benchmarks/bench_rule_dev.py --data DIR --splits 20 --frozen            # frozen rule
    python benchmarks/bench_rule_dev.py --data DIR --datasets surf --splits 20 --set fresh --frozen
    python benchmarks/bench_rule_dev.py --data DIR --splits 20 --variants           # extensions
    python benchmarks/bench_rule_dev.py --data DIR --datasets surf --labels 3 --splits 20 \
        --set fresh2 --variants                                                     # confirmation
    python benchmarks/bench_rule_dev.py --data DIR --splits 20 --variants STF       # STF only
    python benchmarks/bench_rule_dev.py --data DIR --splits 20 --variants STF STF2 STF2A
    python benchmarks/bench_rule_dev.py --variant-tables benchmarks/results/rule_dev_variants.json
    python benchmarks/bench_rule_dev.py --data DIR --labels 1 3 10 20 40 --splits 10 \
        --classes 2 3 5 --frozen                                  # fewer classes per shift
    python benchmarks/bench_rule_dev.py --data DIR --labels 1 3 10 20 40 \
        --source-per-class 1000 --frozen                          # every source sample

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
class drawn by the same generator), ``fresh`` (seed 2026, kept for the confirmation of
the frozen rule), ``fresh2`` (seed 2029, for the confirmation of its extensions),
``fresh3`` (seed 2030, for the confirmation of STF, self-training from the fold fits) and
``fresh4`` (seed 2031, for the confirmation of STF2 / STF2A, STF's stronger strengths, and
of STFH), ``fresh5`` (seed 2032, for the guard's knife edge, PT) and ``fresh6`` (seed 2034,
for the target SVM as the rule's alternative, O) and ``fresh7`` (seed 2035, for the
target SVM as the default with many labels, O2) and ``fresh8`` (seed 2036, for self-training
validated on the folds, STV).
Hoffman's 20 fixed splits are never read here. Datasets and the
transductive pool are those of ``benchmarks/bench_priors_dev.py`` (the pool: the split's
source samples and every sample of the target domain). A shift is left out of a label
budget when a target class has no more than ``n`` samples (dslr has 8 in one class, so
``n = 10`` has no dslr target).

Subspace dimensions are set in units of the number of classes ``C`` (``d = 2C``, ``4C``),
not as an absolute number or an explained-variance fraction: on dev the explained
variance of the best ``d = 20`` ranges from 20 % (SURF) to 67 % (GoogLeNet dslr), so a
fraction of the spectrum does not carry the best dimension from one feature type to the
other, while ``2C``-``4C`` was best or near it on all three feature types.

Writes ``benchmarks/results/rule_<set>.json`` (the records); ``--rules`` writes the
per-budget summary of every rule to ``rule_<set>_rules.md``; ``--frozen`` runs the frozen
rule (BENCHMARKS.md, "Selection rule, frozen 2026-11-26 on dev data") as the product
runs it (``select="auto"``, :func:`mmdtl2_dist.core.auto.fit_predict_auto`) into
``rule_<set>_frozen.json`` and its per-shift tables, picks and cost into
``rule_<set>_frozen.md``; ``--variants`` runs the frozen rule and its self-training and
ensemble extensions (:func:`collect_variants`; BENCHMARKS.md, "Two extensions of the
frozen rule, studied on dev data") on the same splits into ``rule_<set>_variants.json``
and ``.md`` (``--variant-tables`` rewrites the ``.md`` from the ``.json``).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from bench_priors_dev import DATASETS, prior_maps, shift_grams
from bench_selection import SEEDS as SELECTION_SEEDS
from threadpoolctl import threadpool_limits

from mmdtl2_dist.core.auto import (
    default_and_alternatives,
    pca_dim,
    pool_problem,
    pseudo_labels_per_labelled,
    rule_params,
    rule_pull,
)
from mmdtl2_dist.core.auto_candidates import CANDIDATES as CANDIDATES_AUTO
from mmdtl2_dist.core.auto_candidates import DEFAULT, ONE_LABEL_DEFAULT
from mmdtl2_dist.core.auto_fit import fit_predict_auto
from mmdtl2_dist.core.methods import fit_predict
from mmdtl2_dist.core.pool import SamplePool
from mmdtl2_dist.core.priors import learnt_pca_map
from mmdtl2_dist.core.selection import (
    canonical_order,
    cv_folds,
    multiclass_hinge,
    sub_problem,
)
from mmdtl2_dist.core.self_training import confident_pseudo_labels
from mmdtl2_dist.datasets.office_caltech import SHIFTS

# ``fresh`` confirmed the frozen rule itself, ``fresh2`` (seed 2029) its ST/ENS variants,
# ``fresh3`` (seed 2030) self-training from the fold fits (``--variants STF``) and ``fresh4``
# (seed 2031) its two stronger strengths (``--variants STF STF2 STF2A``) and then STFH;
# ``fresh5`` (seed 2032) the guard's deterministic knife edge (PT); ``fresh6`` (seed 2034)
# the target SVM as the rule's alternative (O) at 3, 10, 20 and 40 labels per class, and
# ``fresh7`` (seed 2035) the target SVM as the default with many labels (O2), ``fresh8``
# (seed 2036) self-training validated on the folds (STV), ``fresh9`` (seed 2037) the
# one-label guard (G1), ``fresh10`` (seed 2038) the pull validated by the guard (PA),
# ``fresh11`` (seed 2039) the pull held to its design strength (PS), ``fresh12`` (seed
# 2046) PA again, after its W-step was made fast.
SEEDS = {
    **SELECTION_SEEDS, "fresh2": 2029, "fresh3": 2030, "fresh4": 2031, "fresh5": 2032,
    "fresh6": 2034, "fresh7": 2035, "fresh8": 2036, "fresh9": 2037, "fresh10": 2038,
    "fresh11": 2039, "fresh12": 2046,
}  # fmt: skip
N_CLASSES = 10
HALF = {"prior": "matrix", "prior_weight": 0.5, "c_f": 1.0}
# (label, fixed parameters, transductive prior or None, d in units of the class count C)
CANDIDATES = (
    ("λ=0", {"prior": "identity", "prior_weight": 0.0, "c_f": 1.0}, None, None),
    ("identity λ=0.5", {"prior": "identity", "prior_weight": 0.5, "c_f": 1.0}, None, None),
    ("identity λ=1", {"prior": "identity", "prior_weight": 1.0, "c_f": 1.0}, None, None),
    ("SA d=4C", {"prior": "matrix", "prior_weight": 1.0, "c_f": 1.0}, "sa", 4),
    ("shared PCA d=2C", {"prior": "matrix", "prior_weight": 1.0, "c_f": 1.0}, "shared_pca", 2),
    ("shared PCA d=2C λ=0.5", {**HALF}, "shared_pca", 2),
    ("shared PCA d=4C λ=0.5", {**HALF}, "shared_pca", 4),
)  # fmt: skip
LABELS = [c[0] for c in CANDIDATES]
# The target SVM (``c_t = 1``, source ignored) as a candidate of a rule: ``collect``
# records its held-out losses on the same folds (:func:`svm_cv`); ``--add-target-svm
# RECORDS --svm source_svm`` adds those of the source SVM (source and labelled targets
# together).
TARGET_ONLY = "target SVM"
SOURCE_AND_TARGET = "source SVM"
SVM_LABELS = {"target_svm": TARGET_ONLY, "source_svm": SOURCE_AND_TARGET}
MAX_FOLDS = 3  # per-class folds: 3 candidates × 3 folds + 1 final fit = 10 fits at most
KNN = 5


def split_rows(ys_all, yt_all, source, target, k, seed, n_lab, source_per_class=None):
    """Source rows (20 per class, 8 from webcam/dslr, or ``source_per_class``: all of a
    class with fewer), ``n_lab`` labelled target rows per class and the rest of the target
    domain; for ``n_lab = 3`` exactly the rows of ``bench_selection.random_split_rows``, and
    the same source rows for every ``n_lab``."""
    rng = np.random.default_rng([seed, SHIFTS.index((source, target)), k])
    ns = source_per_class or (8 if source in ("webcam", "dslr") else 20)
    src = per_class_draw(rng, ys_all, ns)
    lab = per_class_draw(rng, yt_all, n_lab)
    return src, lab, np.setdiff1d(np.arange(len(yt_all)), lab)


def per_class_draw(rng, labels, most: int) -> np.ndarray:
    """``most`` rows of every class (all of a class with fewer), drawn without replacement
    class by class in label order."""
    return np.concatenate([
        rng.choice(rows, min(most, len(rows)), replace=False)
        for rows in (np.flatnonzero(labels == c) for c in np.unique(labels))
    ])  # fmt: skip


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
    assert not variation(job), "collect runs the design protocol only"
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
            hinge += multiclass_hinge(r.scores, r.classes, prob.yt[held]).tolist()
        rec["cv_hit"][label], rec["cv_hinge"][label] = hits, hinge
    for key, value in svm_cv(base, folds, "target_svm").items():
        rec[key][TARGET_ONLY] = value
    rec["acc"][TARGET_ONLY] = rec["ref"]["target_svm"]
    return rec


def svm_cv(base, folds, method: str) -> dict:
    """A reference SVM (``"target_svm"`` or ``"source_svm"``, :data:`SVM_LABELS`) as one
    more candidate: on the same per-class folds as the MMDTL2 candidates, its held-out
    correctness and multiclass hinge loss (the record's ``"cv_hit"`` and ``"cv_hinge"``;
    its test accuracy is ``rec["ref"]``'s)."""
    hits, hinge, idx = [], [], np.arange(len(base.yt))
    for held in folds:
        r = fit_predict(method, {}, sub_problem(base, np.setdiff1d(idx, held), held))
        hits += (r.y_pred == base.yt[held]).astype(int).tolist()
        hinge += multiclass_hinge(r.scores, r.classes, base.yt[held]).tolist()
    return {"cv_hit": hits, "cv_hinge": hinge}


def with_svm_cv(rec: dict, data_dir, seed, method: str = "target_svm") -> dict:
    """A ``collect`` record completed by :func:`svm_cv` of ``method``."""
    _, base, _ = split_problem(rec["job"], data_dir, seed)
    folds = cv_folds(base.yt, MAX_FOLDS, "per_class", order=canonical_order(base.Ktt))
    for key, value in svm_cv(base, folds, method).items():
        rec[key][SVM_LABELS[method]] = value
    rec["acc"][SVM_LABELS[method]] = rec["ref"][method]
    return rec


def split_problem(job, data_dir, seed):
    """``(pool, base, yq)`` of one split: its pool (source rows, the whole target domain),
    the problem of its labelled samples and the test labels. A job's sixth entry, a dict,
    varies the protocol: ``"classes"`` keeps only that many classes of the shift
    (:func:`class_subset`), ``"source_per_class"`` draws that many source samples per class
    (all of a class that has fewer)."""
    dataset, source, target, k, n_lab = job[:5]
    vary = variation(job)
    Ks, Kt, Kst, ys_all, yt_all, _ = shift_grams(dataset, source, target, data_dir)
    if vary.get("classes"):
        keep_s, keep_t = class_subset(ys_all, yt_all, source, target, k, seed, vary["classes"])
        Ks, Kt = Ks[np.ix_(keep_s, keep_s)], Kt[np.ix_(keep_t, keep_t)]
        Kst, ys_all, yt_all = Kst[np.ix_(keep_s, keep_t)], ys_all[keep_s], yt_all[keep_t]
    src, lab, test = split_rows(
        ys_all, yt_all, source, target, k, seed, n_lab, vary.get("source_per_class")
    )
    pool = SamplePool(Ks[np.ix_(src, src)], Kt, Kst[src], np.arange(len(src)), lab, test)
    base = pool.problem(ys_all[src], yt_all[lab])
    return pool, base, yt_all[test]


def class_subset(ys_all, yt_all, source, target, k, seed, n_classes):
    """Rows of the source and target domains of ``n_classes`` classes drawn per split.

    The rule's class-count check (BENCHMARKS.md, "The rule off its design protocol"): every dev
    dataset has 10 classes, and the rule sets its subspace dimensions in units of the class
    count, so shifts restricted to 2 or 5 of their classes test that scaling on dev data.
    """
    rng = np.random.default_rng([seed, SHIFTS.index((source, target)), k, 1000 + n_classes])
    kept = rng.choice(np.unique(ys_all), n_classes, replace=False)
    return np.flatnonzero(np.isin(ys_all, kept)), np.flatnonzero(np.isin(yt_all, kept))


def paired_gain(rec, alt: str, default: str, signal: str = "cv_hit") -> tuple[float, float]:
    """Mean and standard error of ``alt``'s per-held-out-sample gain over ``default``
    (held-out correctness, or the hinge loss with the sign turned so that higher is better)."""
    a, b = np.array(rec[signal][alt], float), np.array(rec[signal][default], float)
    diff = (a - b) if signal == "cv_hit" else (b - a)
    if diff.size < 2:
        return 0.0, np.inf
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(diff.size))


def guarded(default: str, alternatives, signal: str = "cv_hit", z: float = 1.0):
    """The rule: ``default`` unless an alternative's paired CV gain over it exceeds ``z``
    standard errors (then the alternative with the largest gain). Without folds (one
    labelled sample per class) it is ``default``. Cost: folds × (1 + alternatives) + 1."""

    def rule(rec):
        n_folds = len(rec["cv_hit"][default]) // N_CLASSES
        best, best_gain = default, 0.0
        for alt in alternatives:
            gain, se = paired_gain(rec, alt, default, signal)
            if gain > z * se and gain > best_gain:
                best, best_gain = alt, gain
        cost = 1 + (n_folds * (1 + len(alternatives)) if n_folds else 0)
        return best, cost

    return rule


def argmax_rule(signal: str, among=None):
    """The candidate with the best ``signal`` (CV accuracy with hinge ties, or reverse-kNN)."""

    def rule(rec):
        cands = among or LABELS
        n_folds = len(rec["cv_hit"][cands[0]]) // N_CLASSES
        if signal == "cv":
            if not n_folds:
                return cands[0], 1
            key = {c: (np.mean(rec["cv_hit"][c]), -np.mean(rec["cv_hinge"][c])) for c in cands}
            return max(cands, key=key.get), 1 + n_folds * len(cands)
        return max(cands, key=lambda c: rec[signal][c]), 1 + len(cands)

    return rule


def fixed(label: str):
    return lambda rec: (label, 1)


def rule_table(records, rules: dict) -> dict:
    """Per label budget and shift: accuracy (mean, SE over splits, %) of every rule, the
    reference SVMs, the mean cost of each rule and how often it picks each candidate."""
    out: dict = {}
    for rec in records:
        ds, s, t = rec["job"][:3]
        key = f"{ds}:{s[0].upper()}→{t[0].upper()}"
        cell = out.setdefault(budget(rec["job"]), {}).setdefault(
            key, {"source SVM": [], "target SVM": []}
        )
        cell["source SVM"].append(rec["ref"]["source_svm"])
        cell["target SVM"].append(rec["ref"]["target_svm"])
        for name, rule in rules.items():
            pick, cost = rule(rec)
            cell.setdefault(name, []).append(rec["acc"][pick])
            cell.setdefault(f"{name} #cost", []).append(cost)
            cell.setdefault(f"{name} #pick", []).append(pick)
    return out


def variation(job) -> dict:
    """The protocol's variation of a job (its sixth entry, :func:`split_problem`), or {}."""
    return job[5] if len(job) > 5 else {}


def budget(job):
    """A split's label budget: its labelled targets per class, and the protocol's
    variation when the job has one (``(variation, n)``)."""
    vary = variation(job)
    if not vary:
        return job[4]
    return (", ".join(f"{v} {k.replace('_', ' ')}" for k, v in sorted(vary.items())), job[4])


def budget_name(key) -> str:
    """Words for a :func:`budget` key."""
    return f"{key}" if not isinstance(key, tuple) else f"{key[1]}, {key[0]}"


def budget_order(key):
    """Sort key of :func:`budget` keys: plain budgets first, then by variation, then by
    labels per class (numbers compared as numbers)."""
    if not isinstance(key, tuple):
        return (0, (), key)
    words = tuple((0, int(w), "") if w.isdigit() else (1, 0, w) for w in key[0].split())
    return (1, words, key[1])


def format_rule_tables(table: dict, rules: dict) -> str:
    """Per budget: per-shift mean ± SE, dataset means, worst gap to max(source, target SVM)
    and the shifts lost by more than one standard error."""
    lines = []
    names = ["source SVM", "target SVM", *rules]
    for n in sorted(table, key=budget_order):
        lines += [f"\n## {budget_name(n)} labelled target sample(s) per class\n"]
        lines += ["| shift | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        by_ds: dict = {}
        lost: dict = {}
        worst: dict = {}
        for key, cell in table[n].items():
            stats = {}
            for c in names:
                a = np.array(cell[c]) * 100
                se = a.std(ddof=1) / np.sqrt(a.size) if a.size > 1 else 0.0
                stats[c] = (a.mean(), se)
            best = max(stats["source SVM"][0], stats["target SVM"][0])
            by_ds.setdefault(key.split(":")[0], []).append((stats, best))
            for c in names:
                gap = stats[c][0] - best
                worst[c] = min(worst.get(c, np.inf), gap)
                if gap < -stats[c][1]:
                    lost.setdefault(c, []).append(f"{key} ({gap:+.1f})")
            lines.append(
                f"| {key} | " + " | ".join(f"{m:.1f} ± {e:.1f}" for m, e in stats.values()) + " |"
            )
        groups = {**by_ds, "all": [x for v in by_ds.values() for x in v]}
        for g, cells in groups.items():
            means = [np.mean([st[c][0] for st, _ in cells]) for c in names]
            lines.append(f"| **mean {g}** | " + " | ".join(f"**{m:.1f}**" for m in means) + " |")
            lines.append(
                f"| max(src, tgt SVM) {g} | {np.mean([b for _, b in cells]):.1f} |"
                + " |" * (len(names) - 1)
            )
        lines.append("| worst gap to max(src, tgt SVM) | " + " | ".join(
            f"{worst[c]:+.1f}" for c in names) + " |")  # fmt: skip
        costs = [
            np.mean([x for cell in table[n].values() for x in cell[f"{r} #cost"]]) for r in rules
        ]
        lines.append("| mean cost (fits) | | | " + " | ".join(f"{c:.0f}" for c in costs) + " |")
        lines.append("\nShifts lost by more than one standard error:")
        for c in names:
            lines.append(f"  {c}: {len(lost.get(c, []))}  {', '.join(lost.get(c, []))}")
    return "\n".join(lines)


def compact_summary(table: dict, rules: dict) -> str:
    """One row per rule and label budget: dataset means, overall mean, mean of the
    per-shift max(source, target SVM), worst per-shift gap to it, shifts lost by more than
    one standard error, mean cost in fits."""
    lines = [
        "| rule | labels/class | surf | googlenet1024 | decaf6 | all | max(src,tgt) all "
        "| worst gap | lost | cost |",
        "|---" * 10 + "|",
    ]
    for name in ["source SVM", "target SVM", *rules]:
        for n in sorted(table, key=budget_order):
            ds_means: dict = {}
            gaps, lost, best_all, costs = [], 0, [], []
            for key, cell in table[n].items():
                a = np.array(cell[name]) * 100
                se = a.std(ddof=1) / np.sqrt(a.size) if a.size > 1 else 0.0
                best = max(np.mean(cell["source SVM"]), np.mean(cell["target SVM"])) * 100
                ds_means.setdefault(key.split(":")[0], []).append(a.mean())
                gaps.append(a.mean() - best)
                best_all.append(best)
                lost += a.mean() - best < -se
                costs += cell.get(f"{name} #cost", [1])
            cols = [f"{np.mean(ds_means[d]):.1f}" if d in ds_means else "n/a" for d in DATASETS]
            overall = np.mean([x for v in ds_means.values() for x in v])
            lines.append(
                f"| {name} | {budget_name(n)} | " + " | ".join(cols) + f" | {overall:.1f}"
                f" | {np.mean(best_all):.1f} | {min(gaps):+.1f} | {lost} | {np.mean(costs):.1f} |"
            )
    return "\n".join(lines)


def explore_rules() -> dict:
    """The rules compared on dev: every candidate fixed, argmax rules, guarded defaults."""
    rules = {c: fixed(c) for c in LABELS}
    rules["CV argmax (all 7)"] = argmax_rule("cv")
    rules["rkNN argmax (all 7)"] = argmax_rule("rknn")
    for d in ("SA d=4C", "shared PCA d=4C λ=0.5", "shared PCA d=2C λ=0.5", "identity λ=0.5"):
        for alts in (("λ=0", "identity λ=1"), ("λ=0", "shared PCA d=2C")):
            if d in alts:
                continue
            for sig in ("cv_hit", "cv_hinge"):
                rules[f"G[{d}|{','.join(alts)}|{sig[3:]}]"] = guarded(d, alts, sig)
    return rules


# The rule frozen on dev (BENCHMARKS.md, "Selection rule, frozen 2026-11-26 on dev data"),
# in the product as ``mmdtl2_dist.core.auto``; here its candidates' labels, to score the
# rule on the records of ``collect`` (``--rules``) without a fit.
FROZEN = {
    "no_folds": CANDIDATES_AUTO[ONE_LABEL_DEFAULT].label,
    "default": CANDIDATES_AUTO[DEFAULT].label,
    "signal": "cv_hinge",
    "z": 1.0,
}


def frozen_pick(rec, also=()) -> tuple[str, int]:
    """The frozen rule on a record (its labelled targets per class ``rec["job"][4]``):
    without per-class folds its one-label default F (the records hold no leave-classes-out
    fits; ``bench_one_label_dev.py`` scores the one-label guard), else the default guarded
    against the alternatives (:func:`~mmdtl2_dist.core.auto.default_and_alternatives`)
    and the record labels ``also`` by the paired held-out hinge loss, among the candidates
    the record has fits of (not D0). Records need the target SVM's (:func:`svm_cv`)."""
    if not rec["cv_hit"].get(FROZEN["default"]):
        return FROZEN["no_folds"], 1
    default, alternatives = default_and_alternatives(rec["job"][4], no_pull=True)
    label = lambda c: CANDIDATES_AUTO[c].label  # noqa: E731
    held = rec["cv_hit"]  # records hold no fits of D without the pull (D0)
    alts = (*(label(c) for c in alternatives if label(c) in held), *also)
    return guarded(label(default), alts, FROZEN["signal"], FROZEN["z"])(rec)


def source_subsample(pool: SamplePool, ys, job):
    """The pool and labels with at most 20 source samples per class (the largest source
    the rule was designed with): a prototype. The draw depends on the shift and the split
    number only, so it is the same in every split set."""
    rng = np.random.default_rng([SHIFTS.index(tuple(job[1:3])), job[3], 20])
    keep = np.sort(per_class_draw(rng, ys, 20))
    sub = SamplePool(
        pool.Kss[np.ix_(keep, keep)], pool.Ktt, pool.Kst[keep], np.arange(len(keep)),
        pool.target_train, pool.target_test,
    )  # fmt: skip
    return sub, ys[keep]


def collect_frozen(job, data_dir, seed, params=None):
    """The frozen rule on one split, run by the product (``core/auto_fit.py``,
    :func:`~mmdtl2_dist.core.auto_fit.fit_predict_auto`, with the caller's MMDTL2 ``params``):
    its pick, its cost in fits and its wall time against one fit of the pick, beside the
    reference SVMs."""
    pool, base, yq = split_problem(job, data_dir, seed)
    rec = {"ref": {}, "acc": {}}
    for m in ("source_svm", "target_svm"):
        rec["ref"][m] = float(np.mean(fit_predict(m, {}, base).y_pred == yq))
    rule_pool, rule_ys = pool, base.ys
    if variation(job).get("rule_source") == "subsampled":
        rule_pool, rule_ys = source_subsample(pool, base.ys, job)
    t0 = time.perf_counter()
    res, choice = fit_predict_auto(rule_pool, rule_ys, base.yt, params)
    t2 = time.perf_counter()
    pick = CANDIDATES_AUTO[choice.pick].label
    rec["acc"][pick] = float(np.mean(res.y_pred == yq))
    plain = fit_predict(
        choice.method,
        choice.params,
        pool_problem(rule_pool, rule_ys, base.yt, choice.prior_map),
    )
    rec["acc_without_self_training"] = float(np.mean(plain.y_pred == yq))
    if len(choice.pseudo_rows):  # the pseudo-labelled rows are scored rows: their labels
        at = {int(r): i for i, r in enumerate(rule_pool.target_test)}
        truth = yq[[at[int(r)] for r in choice.pseudo_rows]]
        rec["pseudo_precision"] = float(np.mean(truth == choice.pseudo_labels))
    rec.update(
        pick=pick, cost=res.info["n_fits"], select_s=t2 - t0,
        final_fit_s=res.info["time_total_s"], auto=choice.record(),
    )  # fmt: skip
    return rec


# Two extensions of the frozen rule (BENCHMARKS.md, "Two extensions of the frozen rule,
# studied on dev data"), each the frozen rule plus one change, constants fixed before the run.
VARIANTS = ("frozen rule", "ST", "ST2", "ENS", "ENS+ST", "STF", "STF2", "STF2A", "STFH")
# Self-training from the pick's fold fits: name -> (pseudo-labels per labelled target,
# only rows on which the three fold fits agree). BENCHMARKS.md, "Self-training from the
# rule's fold fits (STF)" and "Two strengths of STF's self-training (STF2, STF2A)".
# STFH's strength is per split (:func:`hard_shift_times`).
FOLD_SELF_TRAINING = {
    "STF": (1, False),
    "STF2": (2, False),
    "STF2A": (2, True),
    "STFH": (None, False),
}
ENSEMBLE = ("D", "O", "S")  # refitted on all labelled targets (the dev variants ENS)


def hard_shift_times(choice, yt) -> int:
    """STFH's pseudo-labels per labelled target (BENCHMARKS.md, "Twice the pseudo-labels
    on hard shifts (STFH)"): the product's gate (``pseudo_labels_per_labelled``) on the
    pick's held-out hinge loss, STF2's 2 on a hard shift at ≤ 3 labels per class, 0 (no
    self-training) above 10, STF's 1 elsewhere; before the product's check on its folds,
    which STFH does not have."""
    hinge = next(r["cv_hinge"] for r in choice.table if r["candidate"] == choice.pick)
    most = int(np.unique(yt, return_counts=True)[1].max())
    return pseudo_labels_per_labelled(most, hinge)


def with_pseudo_labels(pool: SamplePool, yt, rows, labels):
    """The pool with the scored rows ``rows`` (positions in ``target_test``) added to the
    labelled targets with ``labels``; every scored row is still scored."""
    grown = pool.with_rows(target_train=np.r_[pool.target_train, pool.target_test[rows]])
    return grown, np.r_[yt, labels]


def refit(cand: str, pool: SamplePool, ys, yt, pmap):
    """Candidate ``cand`` of the frozen rule fitted on the pool's labelled targets, with
    its shared-PCA map ``pmap`` (None for the other candidates)."""
    prob = pool_problem(pool, ys, yt, pmap)
    return fit_predict(CANDIDATES_AUTO[cand].method, rule_params(cand, rule_pull(None, ys)), prob)


def pseudo_labelled(pool: SamplePool, ys, yt, scores, classes, times: int, eligible=None):
    """Self-training's labelled set: per class, ``times`` × its labelled target count of
    the scored rows predicted as that class with the largest margins (only rows where the
    boolean mask ``eligible`` is true, when given; fewer if fewer are eligible)."""
    per_class = {c: times * n for c, n in zip(*np.unique(yt, return_counts=True), strict=True)}
    among = np.arange(len(scores)) if eligible is None else np.flatnonzero(eligible)
    rows, labels = confident_pseudo_labels(scores[among], classes, per_class)
    rows = among[rows]
    return (*with_pseudo_labels(pool, yt, rows, labels), rows, labels)


def fold_trained(prob, train: np.ndarray):
    """``prob`` with only the labelled targets ``train``; its scored rows unchanged."""
    keep = lambda K: None if K is None else K[:, train]  # noqa: E731 - columns of train
    return replace(
        prob, yt=prob.yt[train], Ktt=prob.Ktt[np.ix_(train, train)], Ktq=prob.Ktq[train],
        Kst=keep(prob.Kst), Ksu=keep(prob.Ksu),
        Kuu=None if prob.Kuu is None else prob.Kuu[np.ix_(train, train)],
        Kuuq=None if prob.Kuuq is None else prob.Kuuq[train],
    )  # fmt: skip


def fold_scores(choice, pool, ys, yt):
    """The pick's fold fits (the rule's CV, same folds) scoring the split's scored rows:
    each fit's raw decision scores (one array per fold) and the classes. STF's
    pseudo-labeller averages them; refitted here as a reference for the product (whose CV
    fits score these rows in the same fits as the held-out ones)."""
    prob = pool_problem(pool, ys, yt, choice.prior_map)
    folds = cv_folds(yt, MAX_FOLDS, "per_class", order=canonical_order(prob.Ktt))
    idx = np.arange(len(yt))
    fits = [
        fit_predict(choice.method, choice.params, fold_trained(prob, np.setdiff1d(idx, held)))
        for held in folds
    ]
    return [r.scores for r in fits], fits[0].classes


def agreeing_rows(fold_scores_list) -> np.ndarray:
    """Rows on which every fold fit predicts the class that their averaged scores predict
    (argmax of each fold's raw scores equal to the argmax of the mean): a boolean mask."""
    per_fold = np.asarray(fold_scores_list, dtype=np.float64)
    consensus = per_fold.mean(axis=0).argmax(axis=1)
    return (per_fold.argmax(axis=2) == consensus).all(axis=0)


def averaged(results):
    """The ensemble of fits: their raw decision scores averaged, its predictions."""
    scores = np.mean([r.scores for r in results], axis=0)
    return scores, results[0].classes[scores.argmax(axis=1)]


def collect_variants(job, data_dir, seed, wanted=VARIANTS):
    """The frozen rule ``auto-2026-11-26`` and its variants on one split.

    The product's rule (``fit_predict_auto``, since STF's adoption ``auto-2026-11-26-stf``)
    gives the pick; the frozen rule is that pick refitted on the labelled targets, as the
    version without self-training ran it (the CV is the same), and ``acc_product`` the
    product's accuracy (STF's until version ``auto-2026-11-29-knsh``, which smooths the
    final scores on hard shifts).

    - **ST** / **ST2**: the frozen rule's pick refitted with the pseudo-labelled scored
      targets added (1× / 2× each class's labelled count, largest margins of the pick's
      final scores); one fit more than the frozen rule.
    - **ENS**: D, O and S refitted on all labelled targets, raw scores averaged (3 fits);
      the rule's own pick when a class has fewer than 2 labelled targets.
    - **ENS+ST**: pseudo-labels (1×) from the ensemble's scores, then D, T, S refitted
      with them and averaged (6 fits); ST when a class has fewer than 2.
    - **STF**: pseudo-labels (1×) from the averaged scores of the pick's fold fits (the
      rule's own CV), then the pick fitted with them instead of the rule's final fit: the
      frozen rule's cost. Where no per-class fold exists, the rule's own pick.
    - **STF2**: STF with 2× pseudo-labels; **STF2A**: STF2 among the rows on which the
      three fold fits and their average predict the same class (:func:`agreeing_rows`).

    ``wanted`` names the variants to compute (ST, ST2 and the frozen rule always are).

    The test labels are read only for the accuracies and the pseudo-labels' precision
    (a diagnostic), never by a variant.
    """
    pool, base, yq = split_problem(job, data_dir, seed)
    ys, yt = base.ys, base.yt
    rec = {"ref": {}, "acc": {}, "cost": {}, "pseudo_precision": {}, "wall_s": {}}
    for m in ("source_svm", "target_svm"):
        rec["ref"][m] = float(np.mean(fit_predict(m, {}, base).y_pred == yq))
    t0 = time.perf_counter()
    product, choice = fit_predict_auto(pool, ys, yt)  # the product's rule: STF since its adoption
    res = refit(choice.pick, pool, ys, yt, choice.prior_map)  # auto-2026-11-26: same pick
    rec["wall_s"]["frozen rule"] = time.perf_counter() - t0
    cost = product.info["n_fits"]
    rec.update(pick=CANDIDATES_AUTO[choice.pick].label, auto=choice.record())
    rec["acc_product"] = float(np.mean(product.y_pred == yq))
    rec["acc"]["frozen rule"], rec["cost"]["frozen rule"] = float(np.mean(res.y_pred == yq)), cost
    for name, times in (("ST", 1), ("ST2", 2)):
        t0 = time.perf_counter()
        grown, yt2, rows, labels = pseudo_labelled(pool, ys, yt, res.scores, res.classes, times)
        r = refit(choice.pick, grown, ys, yt2, choice.prior_map)
        rec["wall_s"][name] = time.perf_counter() - t0
        rec["acc"][name], rec["cost"][name] = float(np.mean(r.y_pred == yq)), cost + 1
        rec["pseudo_precision"][name] = float(np.mean(labels == yq[rows]))
    fold_variants = [v for v in FOLD_SELF_TRAINING if v in wanted]
    per_class = choice.fold_kind == "per_class"
    if per_class and fold_variants:
        t0 = time.perf_counter()
        per_fold, classes = fold_scores(choice, pool, ys, yt)
        scores, scoring_s = np.mean(per_fold, axis=0), time.perf_counter() - t0
        rec["pseudo_n"] = {}
        for name in fold_variants:
            t0 = time.perf_counter()
            times, agree = FOLD_SELF_TRAINING[name]
            times = hard_shift_times(choice, yt) if times is None else times
            eligible = agreeing_rows(per_fold) if agree else None
            grown, yt2, rows, labels = pseudo_labelled(
                pool, ys, yt, scores, classes, times, eligible
            )
            r = refit(choice.pick, grown, ys, yt2, choice.prior_map)
            rec["wall_s"][name] = (
                rec["wall_s"]["frozen rule"] + scoring_s + time.perf_counter() - t0
            )
            rec["acc"][name], rec["cost"][name] = float(np.mean(r.y_pred == yq)), cost
            rec["pseudo_precision"][name] = float(np.mean(labels == yq[rows]))
            rec["pseudo_n"][name] = len(rows)
    for name in [] if per_class else fold_variants:  # one label: the rule's own pick
        rec["acc"][name], rec["cost"][name] = rec["acc"]["frozen rule"], cost
    if not {"ENS", "ENS+ST"} & set(wanted):
        return rec
    if not per_class:
        for name, same in (("ENS", "frozen rule"), ("ENS+ST", "ST")):
            rec["acc"][name], rec["cost"][name] = rec["acc"][same], rec["cost"][same]
        return rec
    t0 = time.perf_counter()
    n_classes, learn = len(np.unique(np.r_[ys, yt])), np.ones(pool.Kyy.shape[0], bool)
    maps = {
        c: choice.prior_map if c == choice.pick else
        learnt_pca_map(pool, pca_dim(c, n_classes, len(learn)), learn)
        for c in ENSEMBLE
    }  # fmt: skip
    fits = [res if c == choice.pick else refit(c, pool, ys, yt, maps[c]) for c in ENSEMBLE]
    scores, pred = averaged(fits)
    rec["wall_s"]["ENS"] = time.perf_counter() - t0
    rec["acc"]["ENS"], rec["cost"]["ENS"] = float(np.mean(pred == yq)), len(ENSEMBLE)
    t0 = time.perf_counter()
    grown, yt2, rows, labels = pseudo_labelled(pool, ys, yt, scores, res.classes, 1)
    _, pred = averaged([refit(c, grown, ys, yt2, maps[c]) for c in ENSEMBLE])
    rec["wall_s"]["ENS+ST"] = rec["wall_s"]["ENS"] + time.perf_counter() - t0
    rec["acc"]["ENS+ST"], rec["cost"]["ENS+ST"] = float(np.mean(pred == yq)), 2 * len(ENSEMBLE)
    rec["pseudo_precision"]["ENS+ST"] = float(np.mean(labels == yq[rows]))
    return rec


# Defined after the 20-split dev table (post hoc, no fit of its own): ST where the rule
# validated its pick (n ≥ 2 labelled targets per class), the frozen rule's F alone where
# it could not (ST lost 2 more shifts than F at 1 label per class on dev).
POST_HOC = "ST where validated"


def st_where_validated(rec) -> tuple[float, int]:
    """The post-hoc variant's accuracy and cost on a record of :func:`collect_variants`."""
    auto = rec["auto"]
    validated = auto.get("folds", "per_class" if auto["n_folds"] else None) == "per_class"
    same = "ST" if validated else "frozen rule"
    return rec["acc"][same], rec["cost"][same]


def write_variant_tables(records, meta, path: Path) -> None:
    """The frozen rule and its variants on the same splits (and the post-hoc variant,
    derived from the same records): per-budget tables, summary, pseudo-label precision."""
    for rec in records:
        rec["acc"][POST_HOC], rec["cost"][POST_HOC] = st_where_validated(rec)
    shown = [v for v in (*VARIANTS, POST_HOC) if all(v in rec["acc"] for rec in records)]
    rules = {v: (lambda rec, v=v: (v, rec["cost"][v])) for v in shown}
    table = rule_table(records, rules)
    prec: dict = {}
    for r in records:
        for v, p in r["pseudo_precision"].items():
            prec.setdefault(r["job"][4], {}).setdefault(v, []).append(p)
    prec_text = "; ".join(
        f"{n} per class: " + ", ".join(f"{v} {100 * np.mean(p):.1f} %" for v, p in d.items())
        for n, d in sorted(prec.items())
    )
    text = (
        f"# `{meta['command']}` ({meta['split_set']}; mean ± standard error over splits, %)\n"
        + format_rule_tables(table, rules)
        + "\n\n"
        + compact_summary(table, rules)
        + f"\n\nPrecision of the pseudo-labels (mean over splits): {prec_text}\n"
    )
    print(text)
    path.write_text(text)


def jobs_for(datasets, data_dir, labels, splits, variations=(None,)):
    """(dataset, source, target, split, n_lab[, variation]) of every split, skipping
    infeasible budgets; a variation (:func:`split_problem`) only where one is given."""
    out = []
    for ds in datasets:
        for s, t in SHIFTS:
            if s not in DATASETS[ds] or t not in DATASETS[ds]:
                continue
            yt = shift_grams(ds, s, t, data_dir)[4]
            smallest = np.bincount(yt)[np.unique(yt)].min()
            out += [
                (ds, s, t, k, n, *([] if v is None else [v]))
                for v in variations for n in labels if n < smallest for k in range(splits)
            ]  # fmt: skip
    return out


def write_frozen_tables(records, meta, path: Path) -> None:
    """The frozen rule's per-budget tables, its cost and its picks, printed and written."""
    rules = {"frozen rule": lambda rec: (rec["pick"], rec["cost"])}
    table = rule_table(records, rules)
    ratio = [r["select_s"] / max(r["final_fit_s"], 1e-9) for r in records]
    picks: dict = {}
    for r in records:
        picks.setdefault(budget_name(budget(r["job"])), {}).setdefault(r["pick"], 0)
        picks[budget_name(budget(r["job"]))][r["pick"]] += 1
    text = (
        f"# `{meta['command']}` ({meta['split_set']}; mean ± standard error over splits, %)\n"
        + format_rule_tables(table, rules)
        + "\n\n"
        + compact_summary(table, rules)
        + f"\n\nPicks per label budget: {picks}\n"
        + f"Selection wall time / one fit of the pick: median {np.median(ratio):.1f}, "
        + f"90th percentile {np.percentile(ratio, 90):.1f}, max {np.max(ratio):.1f}\n"
    )
    print(text)
    path.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--datasets", nargs="+", default=None, choices=list(DATASETS))
    ap.add_argument("--labels", nargs="+", type=int, default=[1, 3, 10])
    ap.add_argument("--splits", type=int, default=5)
    ap.add_argument("--set", choices=list(SEEDS), default="dev")
    ap.add_argument(
        "--classes",
        nargs="+",
        type=int,
        default=None,
        help="keep only this many classes of every shift (drawn per split; --frozen only)",
    )
    ap.add_argument(
        "--source-per-class",
        type=int,
        default=None,
        help="source samples per class instead of 20 (8 from webcam/dslr); --frozen only",
    )
    ap.add_argument(
        "--rule-source", choices=("subsampled",), default=None,
        help="prototype: the rule's source subsampled to 20 samples per class (--frozen)",
    )  # fmt: skip
    ap.add_argument(
        "--c-d", type=float, default=None,
        help="the caller's c_d for the rule's MMDTL2 candidates (--frozen; default the core's)",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rules", type=Path, default=None, help="records to score rules on")
    ap.add_argument("--frozen", action="store_true", help="run only the frozen rule")
    ap.add_argument(
        "--variants", nargs="*", default=None, choices=VARIANTS[1:],
        help="the frozen rule and these of its variants (all when none is named)",
    )  # fmt: skip
    ap.add_argument("--variant-tables", type=Path, default=None, help="tables of a --variants run")
    ap.add_argument(
        "--add-target-svm",
        type=Path,
        default=None,
        help="records of an earlier collect run to complete with a reference SVM's CV (--svm)",
    )
    ap.add_argument(
        "--svm", choices=tuple(SVM_LABELS), default="target_svm",
        help="the reference SVM whose CV --add-target-svm adds (default: the target SVM)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.add_target_svm is not None:
        saved = json.loads(args.add_target_svm.read_text())
        data_dir = None if args.data is None else str(args.data.resolve())
        seed = SEEDS[saved["meta"]["split_set"].split()[0]]
        with threadpool_limits(1):
            saved["records"] = [with_svm_cv(r, data_dir, seed, args.svm) for r in saved["records"]]
        out = args.add_target_svm.with_name(f"{args.add_target_svm.stem}_{args.svm}.json")
        out.write_text(json.dumps(saved, ensure_ascii=False))
        print(f"{len(saved['records'])} records -> {out}")
        return
    if args.variant_tables is not None:
        saved = json.loads(args.variant_tables.read_text())
        write_variant_tables(
            saved["records"], saved["meta"], args.variant_tables.with_suffix(".md")
        )
        return
    if args.rules is not None:
        records = json.loads(args.rules.read_text())["records"]
        rules = {**explore_rules(), "frozen rule": frozen_pick}
        if any(SOURCE_AND_TARGET in r["cv_hinge"] for r in records):  # --svm source_svm
            rules["frozen rule + source SVM"] = lambda r: frozen_pick(r, (SOURCE_AND_TARGET,))
        text = f"# `python benchmarks/bench_rule_dev.py --rules {args.rules.name}`\n\n"
        text += compact_summary(rule_table(records, rules), rules) + "\n"
        print(text)
        args.rules.with_name(args.rules.stem + "_rules.md").write_text(text)
        return
    datasets = args.datasets or (list(DATASETS) if args.data else ["surf"])
    data_dir = None if args.data is None else str(args.data.resolve())
    only = "_" + "_".join(args.variants).lower().replace("+", "") if args.variants else ""
    suffix = f"_variants{only}" if args.variants is not None else "_frozen" if args.frozen else ""
    if args.classes:
        suffix += "_classes_" + "_".join(map(str, args.classes))
    if args.source_per_class:
        suffix += f"_source_{args.source_per_class}"
    if args.rule_source:
        suffix += f"_{args.rule_source}"
    if args.c_d is not None:
        suffix += f"_cd{args.c_d:g}"
    args.out = args.out or Path(__file__).parent / "results" / f"rule_{args.set}{suffix}.json"
    if args.out.is_dir():  # refused now, not after the run
        ap.error(f"--out {args.out} is a folder: give the JSON file to write (its .md beside it)")
    wanted = None if args.variants is None else tuple(args.variants or VARIANTS)
    caller = None if args.c_d is None else {"c_d": args.c_d}
    run = (
        (lambda job, d, seed: collect_variants(job, d, seed, wanted)) if wanted
        else (lambda job, d, seed: collect_frozen(job, d, seed, caller)) if args.frozen
        else collect
    )  # fmt: skip
    if (args.classes or args.source_per_class or args.rule_source or caller) and (
        not args.frozen or args.variants is not None
    ):
        ap.error(
            "--classes, --source-per-class, --rule-source and --c-d run the "
            "frozen rule only: add --frozen and leave out --variants"
        )
    variations = [
        {
            k: v
            for k, v in (
                ("classes", c),
                ("source_per_class", args.source_per_class),
                ("rule_source", args.rule_source),
            )
            if v
        }
        or None
        for c in (args.classes or [None])
    ]
    jobs = jobs_for(datasets, data_dir, args.labels, args.splits, variations)
    t0 = time.perf_counter()
    records = []
    with threadpool_limits(1):
        for i, job in enumerate(jobs, 1):
            rec = run(job, data_dir, SEEDS[args.set])
            rec["job"] = list(job)
            records.append(rec)
            if i % 10 == 0:
                print(f"  {i}/{len(jobs)} splits, {time.perf_counter() - t0:.0f} s", flush=True)
    meta = {
        "machine": f"{platform.machine()}, 1 process, 1 BLAS thread (2 shared cores)",
        "wall_s": time.perf_counter() - t0,
        "split_set": f"{args.set} (seed {SEEDS[args.set]})",
        "command": "python benchmarks/bench_rule_dev.py --data DIR --datasets "
        + " ".join(datasets)
        + f" --labels {' '.join(map(str, args.labels))} --splits {args.splits} --set {args.set}"
        + (" --frozen" if args.frozen else "")
        + ("" if not args.classes else " --classes " + " ".join(map(str, args.classes)))
        + ("" if not args.source_per_class else f" --source-per-class {args.source_per_class}")
        + (f" --rule-source {args.rule_source}" if args.rule_source else "")
        + (f" --c-d {args.c_d:g}" if caller else "")
        + ("" if args.variants is None else " --variants " + " ".join(args.variants)).rstrip(),
        "datasets": datasets,
        "labels": args.labels,
        "splits": args.splits,
        "candidates": [
            {"label": c[0], "params": c[1], "prior": c[2], "d/C": c[3]} for c in CANDIDATES
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "records": records}, ensure_ascii=False))
    if args.variants is not None:
        write_variant_tables(records, meta, args.out.with_suffix(".md"))
    elif args.frozen:
        write_frozen_tables(records, meta, args.out.with_suffix(".md"))
    print(f"{len(jobs)} splits, {meta['wall_s']:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
