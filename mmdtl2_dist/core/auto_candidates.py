"""The candidate configurations of ``select="auto"`` and which of them the rule weighs when.

:mod:`mmdtl2_dist.core.auto` documents the rule and why each candidate is there; this
module only names them: the core method, its parameters and the shared-PCA prior's
dimension ``d = min(k C, p − 1)`` of each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """One configuration of the rule: core method, parameters, ``k`` of ``d = min(k C, p − 1)``."""

    name: str
    label: str
    params: Mapping
    pca_per_class: int | None
    method: str = "mmdtl2"


_PCA, _IDENTITY = {"prior": "matrix", "c_f": 1.0}, {"prior": "identity", "c_f": 1.0}
CANDIDATES = {
    "D": Candidate("D", "shared PCA d=4C λ=0.5", {**_PCA, "prior_weight": 0.5}, 4),
    "O": Candidate("O", "target SVM", {"c_t": 1.0}, None, method="target_svm"),
    "S": Candidate("S", "identity λ=1", {**_IDENTITY, "prior_weight": 1.0}, None),
    "D0": Candidate(
        "D0", "shared PCA d=4C λ=0.5 c_d=0", {**_PCA, "prior_weight": 0.5, "c_d": 0.0}, 4
    ),
    "F": Candidate("F", "shared PCA d=2C", {**_PCA, "prior_weight": 1.0}, 2),
    "N": Candidate(
        "N", "identity λ=1 c_f=100", {**_IDENTITY, "prior_weight": 1.0, "c_f": 100.0}, None
    ),
}
DEFAULT, ALTERNATIVES = "D", ("O", "S", "D0")
#: The pick, without folds, where D is the default and the source alone is right.
SOURCE_RIGHT_PICK = "N"
#: The default and its alternatives at one labelled target in some class.
ONE_LABEL_DEFAULT, ONE_LABEL_ALTERNATIVES = "F", ("N",)
#: The default and its alternatives when every class has more than
#: :data:`mmdtl2_dist.core.auto.MANY_LABELS` labelled targets.
MANY_LABELS_DEFAULT, MANY_LABELS_ALTERNATIVES = "O", ("D", "S", "D0")
#: The parameters of the caller's that the target SVM (candidate O) takes.
TARGET_SVM_KEYS = ("qp_solver", "qp_tol")
