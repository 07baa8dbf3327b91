"""Self-training on hard shifts only (STHO): a dev study of the rule, not in the product.

    python benchmarks/bench_easy_self_training.py --office DIR --pixels DIR
        [--labels 3 10] [--splits 10] [--office-seed 2049] [--pixels-seed 2040]
        [--source-per-class N] [--workers 2] [--out benchmarks/results/stho.json]

The variant (BENCHMARKS.md, "Self-training on hard shifts only (STHO)"): the rule as the
product runs it (``select="auto"``), except that an **easy** shift (the pick's mean
held-out hinge loss below the rule's ``HARD_HINGE``, 0.25) does not self-train: its final
fit uses the labelled targets alone, and the self-training check's fold refits are not
run. Hard shifts are unchanged (twice the pseudo-labels up to 3 labels a class, once up to
10, the check, the neighbour smoothing). It is applied by replacing the rule's
``pseudo_labels_per_labelled`` in this process, so everything else is the product's code.

Office-Caltech10 (SURF, GoogLeNet-1024, DeCAF6; ``bench_rule_dev.split_problem``, whose
seeds and draws it reuses) and the raw-pixel shifts of ``bench_rule_pixels`` (COIL20,
MNIST ↔ USPS, ``l2_zscore``, through the estimator). For every split: the rule's
accuracy, the variant's and the source and target SVMs'. The variant is fitted only where
it can differ (the product self-trained on an easy shift); elsewhere it is the rule.
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
def hard_shifts_only():
    """The rule with no self-training where the pick's held-out hinge is below HARD_HINGE."""
    from mmdtl2_dist.core import auto

    product = auto.pseudo_labels_per_labelled

    def variant(most_per_class: int, hinge: float) -> int:
        return product(most_per_class, hinge) if hinge >= auto.HARD_HINGE else 0

    auto.pseudo_labels_per_labelled = variant
    try:
        yield
    finally:
        auto.pseudo_labels_per_labelled = product


def differs(record: dict) -> bool:
    """Whether the variant can change this split: the product self-trained an easy shift."""
    from mmdtl2_dist.core.auto import HARD_HINGE

    hinge = pick_hinge(record)
    return bool(record["pseudo_per_labelled"]) and hinge is not None and hinge < HARD_HINGE


def office_split(job) -> dict:
    from bench_rule_dev import split_problem

    from mmdtl2_dist.core.auto_fit import fit_predict_auto
    from mmdtl2_dist.core.methods import fit_predict

    data, vary, seed = job[-3:]
    key = (*job[:5], *([vary] if vary else []))
    pool, base, yq = split_problem(key, data, seed)
    res, choice = fit_predict_auto(pool, base.ys, base.yt)
    record = choice.record()
    out = {"data": job[0], "shift": f"{job[1]}-{job[2]}", "labels": job[4], "split": job[3]}
    out["rule"] = out["variant"] = acc(res.y_pred, yq)
    if differs(record):
        with hard_shifts_only():
            out["variant"] = acc(fit_predict_auto(pool, base.ys, base.yt)[0].y_pred, yq)
    for m in ("source_svm", "target_svm"):
        out[m] = acc(fit_predict(m, {}, base).y_pred, yq)
    return {**out, "pick": choice.pick, "pick_hinge": pick_hinge(record),
            "pseudo_per_labelled": record["pseudo_per_labelled"]}  # fmt: skip


def pixels_split(job) -> dict:
    from threadpoolctl import threadpool_limits

    from mmdtl2_dist.estimators import MMDTL2, SourceSVM, TargetSVM

    fitted, out = pixel_fits(job)[:2]
    with threadpool_limits(1):
        rule, out["rule"] = fitted(MMDTL2(select="auto", preprocessing="l2_zscore"))
        out["variant"] = out["rule"]
        if differs(rule.auto_):
            with hard_shifts_only():
                out["variant"] = fitted(MMDTL2(select="auto", preprocessing="l2_zscore"))[1]
        for name, est in (("source_svm", SourceSVM), ("target_svm", TargetSVM)):
            out[name] = fitted(est(preprocessing="l2_zscore"))[1]
    record = rule.auto_
    return {**out, "pick": record["pick"], "pick_hinge": pick_hinge(record),
            "pseudo_per_labelled": record["pseudo_per_labelled"]}  # fmt: skip


def one(job) -> dict:
    return pixels_split(job) if job[0] == "pixels" else office_split(job)


def main() -> None:
    args = study_arguments(__doc__.split("\n")[0], [3, 10], 2049, "benchmarks/results/stho.json")
    run_study(args, one, lambda runs: variant_summary(runs, "STHO"), "bench_easy_self_training.py")


if __name__ == "__main__":
    main()
