"""``select="auto"`` on features: the rule of :mod:`mmdtl2_dist.core.auto` for the estimator.

The estimator holds preprocessed features, not Grams: :func:`select_auto_features` builds
the rule's pool from them and returns the pick's shared-PCA prior in feature form, as the
factors of :class:`~mmdtl2_dist.core.low_rank.LowRankMap` (a 64,896-d ``P Pᵀ`` would be
34 GB), so that the feature-form fit equals the Gram-form one.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from mmdtl2_dist.core.auto import select_auto
from mmdtl2_dist.core.low_rank import LowRankMap
from mmdtl2_dist.core.pool import SamplePool


def feature_pool(Xs: np.ndarray, Xt: np.ndarray, Xu: np.ndarray | None) -> SamplePool:
    """The pool of preprocessed features: labelled source rows and every target row given.

    Target rows: the labelled ``Xt`` first, then the unlabelled ``Xu``; nothing is scored.
    """
    Yt = Xt if Xu is None or len(Xu) == 0 else np.vstack([Xt, Xu])
    return SamplePool(
        Xs @ Xs.T, Yt @ Yt.T, Xs @ Yt.T, np.arange(len(Xs)), np.arange(len(Xt)), np.arange(0)
    )


def select_auto_features(Xs, ys, Xt, yt, Xu=None, params: Mapping | None = None):
    """:func:`select_auto` on preprocessed features, and the pick's prior in feature form.

    Returns ``(choice, W0, added)``: ``added`` are the rows of ``Xu`` self-training
    labelled (``choice.pseudo_labels``, in order); ``W0`` is ``None`` for the
    identity-prior picks (S, N) and the target SVM (O), and the shared-PCA projection ``P Pᵀ``
    as a :class:`~mmdtl2_dist.core.low_rank.LowRankMap` otherwise, with the basis
    ``P = Yᵀ A`` (``Y`` the pool's features, ``A`` the Gram-form coefficients of
    :func:`~mmdtl2_dist.core.gram_pca.pca_basis`), so that the feature-form fit equals the
    Gram-form one.
    """
    if Xs.shape[1] != Xt.shape[1]:
        raise ValueError(
            f"select='auto' needs source and target in one feature space (its priors compare "
            f"the two devices' features), got {Xs.shape[1]} and {Xt.shape[1]} dimensions; "
            "use select=None with prior='zero' or prior='matrix' and a map W0."
        )
    pool = feature_pool(Xs, Xt, Xu)
    choice = select_auto(pool, ys, yt, params)
    added = choice.pseudo_rows - len(Xt)  # the pool's target rows: Xt, then Xu
    if choice.prior_map is None:
        return choice, None, added
    parts = [Xs, Xt] + ([] if Xu is None or len(Xu) == 0 else [Xu])
    A, start = choice.prior_map.L, np.cumsum([0] + [len(X) for X in parts])
    P = sum(X.T @ A[a:b] for X, a, b in zip(parts, start[:-1], start[1:], strict=True))
    return choice, LowRankMap(P, P), added
