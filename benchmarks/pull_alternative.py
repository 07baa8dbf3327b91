"""A dev variant of the rule: D without the L2 pull (``c_d = 0``) as one more alternative.

BENCHMARKS.md, "The L2 pull's weight ``c_d`` with more labels": the pull costs MMDTL2 up
to 22 points with many labelled targets and a large source on the pixel dev data, and
helps on near-ceiling deep features. This variant lets the rule's guard validate it:
candidate **D0** is D (shared PCA ``d = 4C``, weight 0.5) with ``c_d = 0``, added to the
alternatives of both defaults (D and, with many labels, the target SVM). Applied by
patching :mod:`mmdtl2_dist.core.auto` in the benchmark's process, so that everything else
(folds, guard, self-training and its check, the final fit) is the product's own code.
Dev only; not in the product.
"""

from __future__ import annotations

from mmdtl2_dist.core import auto

D0 = auto.Candidate(
    "D0", "shared PCA d=4C λ=0.5 c_d=0", {**auto.CANDIDATES["D"].params, "c_d": 0.0}, 4
)


def add_pull_alternative() -> None:
    """Patch the rule of this process: D0 among the alternatives of both defaults."""
    auto.CANDIDATES.setdefault("D0", D0)
    if "D0" not in auto.ALTERNATIVES:
        auto.ALTERNATIVES = (*auto.ALTERNATIVES, "D0")
        auto.MANY_LABELS_ALTERNATIVES = (*auto.MANY_LABELS_ALTERNATIVES, "D0")
