"""Office-Caltech10 splits as in-memory Gram problems, for the benchmarks.

Each domain's features are preprocessed once per process (L2 then z-score over all its
images, as the bundled study does) and a split's :class:`GramProblem` is formed from
them with ``GramProblem.from_features`` (:func:`split_problem`), or its
:class:`SamplePool` with the whole target domain, as ``select="auto"`` learns from it in
the study (:func:`split_pool`): no feature store, no Gram store. The product's
``mmdtl2 office`` runs the same protocol as a study (``mmdtl2_dist.office``).
"""

from __future__ import annotations

import numpy as np

from mmdtl2_dist.core.methods import GramProblem
from mmdtl2_dist.core.pool import SamplePool
from mmdtl2_dist.core.preprocessing import fit_preprocessing
from mmdtl2_dist.datasets.office_caltech import SHIFTS, load_domain, load_hoffman_splits

SHORT = {"amazon": "A", "webcam": "W", "dslr": "D", "caltech": "C"}

__all__ = ["SHIFTS", "SHORT", "domain_features", "split_pool", "split_problem"]

_DOMAINS: dict = {}


def domain_features(name: str, preprocessing: str = "l2_zscore"):
    """A domain's preprocessed features and labels (cached per process)."""
    key = (name, preprocessing)
    if key not in _DOMAINS:
        dom = load_domain(name)
        _DOMAINS[key] = (fit_preprocessing(dom.X, preprocessing).transform(dom.X), dom.y)
    return _DOMAINS[key]


def split_problem(source: str, target: str, k: int, preprocessing: str = "l2_zscore"):
    """The :class:`GramProblem` of Hoffman's split ``k`` of a shift, and its test labels."""
    Xs_all, ys_all = domain_features(source, preprocessing)
    Xt_all, yt_all = domain_features(target, preprocessing)
    sp = load_hoffman_splits(source, target)[k]
    prob = GramProblem.from_features(
        Xs_all[sp.source_train],
        ys_all[sp.source_train],
        Xt_all[sp.target_train],
        yt_all[sp.target_train],
        Xt_all[sp.target_test],
    )
    return prob, yt_all[sp.target_test]


def split_pool(source: str, target: str, k: int):
    """Hoffman's split ``k`` as the study's pool: its source rows, the whole target domain."""
    Xs, ys = domain_features(source)
    Xt, yt = domain_features(target)
    sp = load_hoffman_splits(source, target)[k]
    Xs, ys = Xs[sp.source_train], ys[sp.source_train]
    pool = SamplePool(Xs @ Xs.T, Xt @ Xt.T, Xs @ Xt.T, np.arange(len(ys)),
                      np.asarray(sp.target_train), np.asarray(sp.target_test))  # fmt: skip
    return pool, ys, yt[sp.target_train], yt[sp.target_test]
