"""Neighbour smoothing of target scores: one step of label propagation over the device.

Where the target device's unlabelled samples are known, the scores ``s(x)`` of a target
sample ``x`` are replaced by

    s̃(x) = (1 − α) s(x) + α · (1/k) Σ_{u ∈ N_k(x)} s(u),

``N_k(x)`` the ``k`` unlabelled targets most similar to ``x`` by the cosine of the
preprocessed features (``cos(x, u) = ⟨x̂, û⟩ / (‖x̂‖ ‖û‖)``, from the linear Gram, so it
needs no more than the Gram blocks the fit already has), ``x`` itself excluded, and
``s(u)`` the same fitted classifier's scores of the unlabelled sample ``u``. It is one
step of the propagation ``S ← (1 − α) S + α A S`` of Zhou et al. ("Learning with local
and global consistency", NIPS 2003), with ``A`` the row-normalised ``k``-nearest-neighbour
graph: samples close on the target device tend to share a class (the cluster assumption
of semi-supervised learning), so a sample's neighbours correct some of the classifier's
errors that the few labelled targets could not.

``k`` = :data:`NEIGHBOURS`, ``α`` = :data:`NEIGHBOUR_WEIGHT`, frozen on the development
split sets (BENCHMARKS.md, "Neighbour smoothing of the target scores (KNS)"). Applied on
every shift, it lost points near the ceiling on small target domains (DeCAF6 webcam → dslr: 157
images, about 16 a class); ``select="auto"`` smooths only on a shift its fold fits find
hard (:data:`~mmdtl2_dist.core.auto.HARD_HINGE`), as confirmed on new split sets
("Neighbour smoothing on hard shifts only (KNS-H)").

An unlabelled sample whose cosine to ``x`` is within :data:`SAME_SAMPLE` of 1 is ``x``
itself (or a copy of it, scaled or not): excluded, so that a scored sample that is also
unlabelled is smoothed by its neighbours only, however it is passed (by row in a Gram, or
again as features).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

NEIGHBOURS = 5
NEIGHBOUR_WEIGHT = 0.5
SAME_SAMPLE = 1e-12  # a cosine above 1 − this is the sample itself
# Scored samples smoothed at a time: their cosines to every unlabelled sample are formed
# block by block, so memory grows with the unlabelled samples, not with both counts.
BLOCK_ROWS = 1024


def cosines(K_qu: np.ndarray, sq_q: np.ndarray, sq_u: np.ndarray) -> np.ndarray:
    """Cosines (nq, nu) from the linear Gram block ``K_qu`` and the squared norms.

    A zero vector has cosine 0 with everything.
    """
    nq = np.sqrt(np.clip(np.asarray(sq_q, float), 0.0, None))
    nu = np.sqrt(np.clip(np.asarray(sq_u, float), 0.0, None))
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = K_qu / nq[:, None] / nu[None, :]
    return np.where(np.isfinite(cos), cos, 0.0)


def smoothed_scores(scores_q: np.ndarray, cos_qu: np.ndarray, scores_u: np.ndarray) -> np.ndarray:
    """``(1 − α) s(x) + α · mean of s over x's k nearest unlabelled samples`` (module doc).

    ``scores_q`` (nq, K) the scored samples', ``scores_u`` (nu, K) the unlabelled samples'
    scores, ``cos_qu`` (nq, nu) their cosines. A sample with fewer than ``k`` unlabelled
    samples other than itself is smoothed by those it has; with none, unchanged.
    """
    scores_q = np.asarray(scores_q, float)
    sim = np.where(cos_qu > 1.0 - SAME_SAMPLE, -np.inf, cos_qu)
    k = min(NEIGHBOURS, sim.shape[1])
    if k == 0:
        return scores_q.copy()
    nearest = np.argpartition(-sim, k - 1, axis=1)[:, :k]
    valid = np.isfinite(np.take_along_axis(sim, nearest, axis=1))
    counts = valid.sum(axis=1)
    total = np.where(valid[..., None], np.asarray(scores_u, float)[nearest], 0.0).sum(axis=1)
    mean = total / np.maximum(counts, 1)[:, None]
    alpha = np.where(counts > 0, NEIGHBOUR_WEIGHT, 0.0)[:, None]
    return (1.0 - alpha) * scores_q + alpha * mean


def smoothed_in_blocks(
    scores_q: np.ndarray,
    gram_of: Callable[[slice], np.ndarray],
    sq_q: np.ndarray,
    sq_u: np.ndarray,
    scores_u: np.ndarray,
) -> np.ndarray:
    """:func:`smoothed_scores` of every scored sample, :data:`BLOCK_ROWS` at a time.

    ``gram_of(rows)`` gives the linear Gram block of a slice of the scored samples × every
    unlabelled sample; ``sq_q``, ``sq_u`` are their squared norms (the cosines'
    denominators, :func:`cosines`).
    """
    scores_q, sq_q = np.asarray(scores_q, float), np.asarray(sq_q, float)
    out = np.empty_like(scores_q)
    for start in range(0, len(scores_q), BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        cos = cosines(gram_of(rows), sq_q[rows], sq_u)
        out[rows] = smoothed_scores(scores_q[rows], cos, scores_u)
    return out
