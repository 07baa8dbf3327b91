"""The source first where it needs no correction (SF): a dev study of the rule, not in the product.

    python benchmarks/bench_source_first.py --office DIR --pixels DIR
        [--labels 3 10] [--splits 10] [--office-seed 2049] [--pixels-seed 2040]
        [--source-per-class N] [--workers 2] [--out benchmarks/results/sf.json]

The variant (BENCHMARKS.md, "The source first where it needs no correction (SF)"): the
rule as the product runs it (``select="auto"``), except where D is the guard's default
(2 to ``MANY_LABELS`` labelled targets a class) and the source SVM, fitted on the labelled
source samples alone, predicts **every labelled target's class** right. There the default
becomes S (MMDTL2 with the identity prior, trusting the source) with D, O and D0 as its
alternatives: adaptation must show a held-out gain over trusting the source, instead of
the source showing one over adaptation. Folds, candidates, the guard's test,
self-training and smoothing are the product's. The test costs one SVM fit on the source
rows. SF is applied by wrapping the rule's ``default_and_alternatives`` in this process,
so everything else is the product's code.

A second variant, **SF-N** (column ``sfn``): where the same test holds, no selection at
all: the pick is N (MMDTL2 with the identity prior at weight 1 and ``c_f = 100``, which
holds ``W`` near ``I``: nearly the source SVM on source and labelled targets; the rule's
candidate at one label a class), fitted once on the labelled targets, without
self-training or smoothing.

Office-Caltech10 (SURF, GoogLeNet-1024, DeCAF6; ``bench_rule_dev.split_problem``, whose
seeds and draws it reuses) and the raw-pixel shifts of ``bench_rule_pixels`` (COIL20,
MNIST ↔ USPS, ``l2_zscore``, through the estimator). For every split: the rule's
accuracy, SF's (``variant``), SF-N's (``sfn``), the source and target SVMs', and whether
the source SVM was right on every labelled target. The variants are fitted only where
they can differ.

SF-N was confirmed and is the product's rule since version ``auto-2026-11-29-sfn``, which
runs the test itself (``source_alone_right``, recorded as ``source_alone_right``): this
script reads the test's outcome from the rule's record, so its "rule" column is now
SF-N's own. The stored results compare SF-N with the version before
(``auto-2026-11-29-knsh``): they were run with this script and the product as of
``0d13675``.
"""

from __future__ import annotations

from contextlib import contextmanager

from bench_neighbour_smoothing import (
    acc,
    pick_hinge,
    pixel_fits,
    run_study,
    study_arguments,
    variant_summary,
)


@contextmanager
def source_first():
    """The rule with S as the guard's default where D would be, D among its alternatives
    (entered only where the source test held)."""
    from mmdtl2_dist.core import auto

    default_of = auto.default_and_alternatives

    def default_and_alternatives(fewest, covers=True, *, no_pull):
        default, alternatives = default_of(fewest, covers, no_pull=no_pull)
        if default != auto.DEFAULT:
            return default, alternatives
        return "S", (auto.DEFAULT, *(a for a in alternatives if a != "S"))

    auto.default_and_alternatives = default_and_alternatives
    try:
        yield
    finally:
        auto.default_and_alternatives = default_of


def office_split(job) -> dict:
    from bench_rule_dev import split_problem

    from mmdtl2_dist.core.auto import rule_params, rule_pull
    from mmdtl2_dist.core.auto_fit import fit_predict_auto
    from mmdtl2_dist.core.methods import fit_predict
    from mmdtl2_dist.core.pool import pool_problem

    data, vary, seed = job[-3:]
    key = (*job[:5], *([vary] if vary else []))
    pool, base, yq = split_problem(key, data, seed)
    res, choice = fit_predict_auto(pool, base.ys, base.yt)
    out = {"data": job[0], "shift": f"{job[1]}-{job[2]}", "labels": job[4], "split": job[3]}
    out["rule"] = out["variant"] = acc(res.y_pred, yq)
    out["clean"] = choice.source_right is True
    out["variant_pick"], out["sfn"] = choice.pick, out["rule"]
    if out["clean"]:
        with source_first():
            res_v, choice_v = fit_predict_auto(pool, base.ys, base.yt)
        out.update(variant=acc(res_v.y_pred, yq), variant_pick=choice_v.pick)
        near_source = rule_params("N", rule_pull({}, base.ys))
        n_fit = fit_predict("mmdtl2", near_source, pool_problem(pool, base.ys, base.yt, None))
        out["sfn"] = acc(n_fit.y_pred, yq)
    for m in ("source_svm", "target_svm"):
        out[m] = acc(fit_predict(m, {}, base).y_pred, yq)
    return {**out, "pick": choice.pick, "pick_hinge": pick_hinge(choice.record())}


def pixels_split(job) -> dict:
    from threadpoolctl import threadpool_limits

    from mmdtl2_dist.core.auto import rule_params, rule_pull
    from mmdtl2_dist.estimators import MMDTL2, SourceSVM, TargetSVM

    fitted, out, ys = pixel_fits(job)
    with threadpool_limits(1):
        rule, out["rule"] = fitted(MMDTL2(select="auto", preprocessing="l2_zscore"))
        out["variant"], out["variant_pick"] = out["rule"], rule.auto_["pick"]
        out["clean"], out["sfn"] = rule.auto_["source_alone_right"] is True, out["rule"]
        if out["clean"]:
            with source_first():
                variant, out["variant"] = fitted(MMDTL2(select="auto", preprocessing="l2_zscore"))
            out["variant_pick"] = variant.auto_["pick"]
            near_source = rule_params("N", rule_pull({}, ys))
            out["sfn"] = fitted(MMDTL2(preprocessing="l2_zscore", **near_source))[1]
        out["source_svm"] = fitted(SourceSVM(preprocessing="l2_zscore"))[1]
        out["target_svm"] = fitted(TargetSVM(preprocessing="l2_zscore"))[1]
    return {**out, "pick": rule.auto_["pick"], "pick_hinge": pick_hinge(rule.auto_)}


def summary(runs: list[dict]) -> str:
    """SF's table, then SF-N's (its ``sfn`` column as the variant)."""
    sfn = [{**r, "variant": r["sfn"]} for r in runs]
    return variant_summary(runs, "SF") + "\n\n" + variant_summary(sfn, "SF-N")


def one(job) -> dict:
    return pixels_split(job) if job[0] == "pixels" else office_split(job)


def main() -> None:
    args = study_arguments(__doc__.split("\n")[0], [3, 10], 2049, "benchmarks/results/sf.json")
    run_study(args, one, summary, "bench_source_first.py")


if __name__ == "__main__":
    main()
