"""Neighbour smoothing computed the slow way, one sample at a time (the tests' reference)."""

from __future__ import annotations

import numpy as np

from mmdtl2_dist.core.neighbours import NEIGHBOUR_WEIGHT, NEIGHBOURS


def smoothed_by_loop(Xq, Sq, Xu, Su, k=NEIGHBOURS, alpha=NEIGHBOUR_WEIGHT):
    """Each query's k most cosine-similar rows of ``Xu`` that are not the query itself
    (an equal row), sorted one query at a time; their mean score mixed in at ``alpha``."""
    out = []
    for x, s in zip(Xq, Sq, strict=True):
        cos = [u @ x / (np.linalg.norm(u) * np.linalg.norm(x)) for u in Xu]
        others = [j for j in np.argsort(cos)[::-1] if not np.array_equal(Xu[j], x)][:k]
        out.append(s if not others else (1 - alpha) * s + alpha * Su[others].mean(axis=0))
    return np.array(out)
