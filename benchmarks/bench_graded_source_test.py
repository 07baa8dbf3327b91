"""Graded source tests: trust the source with a few errors too? A dev study, not in the product.

    python benchmarks/bench_graded_source_test.py --office DIR [--labels 3] [--splits 10]
        [--office-seed 2049] [--workers 2] [--out benchmarks/results/graded_source_dev.json]

The rule (``select="auto"``) picks N (the identity prior at weight 1, ``c_f = 100``) without
folds where D is the default and the source SVM, fitted on the labelled source alone,
predicts every labelled target right (SF-N). DeCAF6 webcam → dslr stays below the source
SVM on the evaluation data: there the source SVM is 98 % right, so with 30 labelled
targets its test fails on many splits by one to three errors. Three graded tests
extend it to such splits; where the test holds the pick is N, elsewhere the rule's:

- ``R1``: the source alone makes no more errors on the labelled targets than D makes on
  them held out in the rule's folds (the same samples, D fitted without each);
- ``R2``: the source alone's mean multiclass hinge loss on the labelled targets is at most
  D's mean held-out hinge loss in the folds;
- ``R3``: the source alone makes at most one error.

Office-Caltech10 only (SURF, GoogLeNet-1024, DeCAF6; ``bench_rule_dev.split_problem``).
For every split the rule's accuracy and pick, N's accuracy, the source and target SVMs',
and the statistics of the three tests; the table compares each variant with the rule
(``bench_neighbour_smoothing.variant_summary``).
"""

from __future__ import annotations

import numpy as np
from bench_neighbour_smoothing import acc, run_study, study_arguments, variant_summary

VARIANTS = {
    "R1": lambda r: r["d_errors"] is not None and r["source_errors"] <= r["d_errors"],
    "R2": lambda r: r["d_hinge"] is not None and r["source_hinge"] <= r["d_hinge"],
    "R3": lambda r: r["source_errors"] <= 1,
}


def office_split(job) -> dict:
    from bench_rule_dev import split_problem

    from mmdtl2_dist.core import auto
    from mmdtl2_dist.core.auto import rule_params, rule_pull
    from mmdtl2_dist.core.auto_candidates import DEFAULT
    from mmdtl2_dist.core.auto_fit import fit_predict_auto
    from mmdtl2_dist.core.methods import fit_predict
    from mmdtl2_dist.core.pool import pool_problem
    from mmdtl2_dist.core.selection import multiclass_hinge, sub_problem

    if job[0] == "pixels":
        raise SystemExit("bench_graded_source_test.py runs on Office-Caltech10 only (--office).")
    data, vary, seed = job[-3:]
    pool, base, yq = split_problem((*job[:5], *([vary] if vary else [])), data, seed)
    ys, yt = base.ys, base.yt
    held_out, guard = {}, auto.guarded_pick

    def keep_hinge(hinge, default, alternatives):
        held_out.update(hinge)
        return guard(hinge, default, alternatives)

    auto.guarded_pick = keep_hinge
    try:
        res, choice = fit_predict_auto(pool, ys, yt)
    finally:
        auto.guarded_pick = guard
    if choice.n_folds and not held_out:
        raise RuntimeError("the rule's guard was not seen: auto.guarded_pick moved; update this.")
    labelled = np.arange(len(yt))
    alone = pool_problem(pool.with_rows(target_test=pool.target_train[:0]), ys, yt, None)
    source = fit_predict("source_svm", {}, sub_problem(alone, labelled[:0], labelled))
    d_hinge = held_out.get(DEFAULT)
    n_fit = fit_predict(
        "mmdtl2", rule_params("N", rule_pull({}, ys)), pool_problem(pool, ys, yt, None)
    )
    return {
        "data": job[0], "shift": f"{job[1]}-{job[2]}", "labels": job[4], "split": job[3],
        "rule": acc(res.y_pred, yq), "pick": choice.pick, "clean": choice.source_right,
        "N": acc(n_fit.y_pred, yq),
        "source_errors": int(np.sum(source.y_pred != yt)),
        "source_hinge": float(multiclass_hinge(source.scores, source.classes, yt).mean()),
        "d_errors": None if d_hinge is None else int(np.sum(d_hinge > 1)),
        "d_hinge": None if d_hinge is None else float(d_hinge.mean()),
        "source_svm": acc(fit_predict("source_svm", {}, base).y_pred, yq),
        "target_svm": acc(fit_predict("target_svm", {}, base).y_pred, yq),
    }  # fmt: skip


def summary(runs: list[dict]) -> str:
    """Each variant against the rule: N where the rule's test or the variant's holds."""
    tables = []
    for name, holds in VARIANTS.items():
        picked = [{**r, "variant": r["N"] if r["clean"] or holds(r) else r["rule"]} for r in runs]
        tables.append(f"### {name}\n\n" + variant_summary(picked, name))
    return "\n\n".join(tables)


def main() -> None:
    args = study_arguments(
        __doc__.split("\n")[0], [3], 2049, "benchmarks/results/graded_source_dev.json"
    )
    run_study(args, office_split, summary, "bench_graded_source_test.py")


if __name__ == "__main__":
    main()
