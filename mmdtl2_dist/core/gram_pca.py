"""PCA bases of a set of samples from their Gram matrix alone (linear-kernel kernel PCA).

For samples ``X`` (n, L) with Gram ``K = X Xᵀ`` and the centring ``H = I − 11ᵀ/n``, let
``H K H = V Λ Vᵀ`` (top ``d`` eigenpairs). The principal axes are the right singular vectors
of ``H X``: ``P = Xᵀ A`` with ``A = H V Λ^{-1/2}`` (n, d), and ``PᵀP = Λ^{-1/2} Vᵀ H K H V
Λ^{-1/2} = I_d``. The coordinates of any sample in that basis are ``Pᵀ x = Aᵀ (X x)``: Gram
rows again. Uncentred PCA (``center=False``) drops ``H``. :func:`pca_basis`
computes ``A``.

**Centring.** The bases are computed from the centred Gram (``center=True``, the
default), as PCA, subspace alignment and Hoffman et al.'s code do, so they describe the
spread of each device's samples rather than their mean; the map is then applied to the
samples as they are, not re-centred, again as those codes do (a re-centring would make
``W0`` affine). With this product's preprocessing the difference is small: the z-score
statistics are per device over all its samples, so each device's samples are already
centred when the pool holds all of them.

Used by the transductive priors (:mod:`mmdtl2_dist.core.priors`) and the ``select="auto"``
rule (:mod:`mmdtl2_dist.core.auto`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg as sla

EIG_RTOL = 1e-12  # eigenvalues of a centred Gram below this fraction of the largest are zeros


def centred_gram(K: np.ndarray) -> np.ndarray:
    """``H K H`` with ``H = I − 11ᵀ/n``: the Gram of the samples minus their mean."""
    Kc = K - K.mean(axis=0, keepdims=True)
    Kc = Kc - Kc.mean(axis=1, keepdims=True)
    return 0.5 * (Kc + Kc.T)


@dataclass(frozen=True)
class PCABasis:
    """The PCA basis ``P = Xᵀ A`` of one set of samples, from their Gram ``K = X Xᵀ``.

    Attributes
    ----------
    A : ndarray (n, r)
        Coefficients, ``A = H V Λ^{-1/2}`` (``H`` dropped when not centred), ``PᵀP = I``.
    lam : ndarray (r,)
        Eigenvalues ``Λ`` of the (centred) Gram, descending.
    center : bool
        Whether the Gram was centred.
    complete : bool
        Whether every eigenpair above ``EIG_RTOL`` is kept (CORAL needs them all).

    A basis depends only on its samples, so one computed for the largest ``d`` serves
    every smaller one (the top eigenpairs are nested) and a device's basis can be computed
    once for all the splits that share its pool.
    """

    A: np.ndarray
    lam: np.ndarray
    center: bool
    complete: bool

    def top(self, d: int, n: int, what: str) -> np.ndarray:
        """``A`` of the top ``d`` axes, checked against ``n`` samples named ``what``."""
        if self.A.shape[0] != n:
            raise ValueError(
                f"the {what}' PCA basis has {self.A.shape[0]} rows but the pool has {n} "
                f"{what}; compute it with pca_basis from the pool's own Gram."
            )
        if d > self.A.shape[1]:
            raise ValueError(
                f"d={d} exceeds the {self.A.shape[1]} axes of the {what}' PCA basis; compute "
                "the basis with at least d axes (pca_basis(K, d)) or lower d."
            )
        return self.A[:, :d]


def pca_basis(
    K: np.ndarray,
    d: int | None = None,
    *,
    center: bool = True,
    what: str = "samples",
    up_to: bool = False,
) -> PCABasis:
    """The top-``d`` PCA basis of the samples of Gram ``K`` (module docstring).

    ``d is None`` keeps every eigenpair above ``EIG_RTOL`` of the largest; ``up_to=True``
    keeps those of the top ``d`` (fewer axes when the samples span fewer dimensions).

    Raises
    ------
    ValueError
        If ``d`` exceeds the rank of the (centred) samples, naming ``what`` they are.
    """
    n = K.shape[0]
    Kc = centred_gram(K) if center else 0.5 * (K + K.T)
    max_rank = n - 1 if center else n
    if d is not None and not 1 <= d <= max_rank:
        raise ValueError(
            f"d={d} needs 1 <= d <= {max_rank} ({n} {what}{', centred' if center else ''}); "
            "lower d or add unlabelled samples to the pool."
        )
    lam, V = sla.eigh(Kc, subset_by_index=None if d is None else [n - d, n - 1])
    top = max(float(lam[-1]), 0.0) if lam.size else 0.0
    keep = lam > EIG_RTOL * top
    if d is not None and not np.all(keep) and not up_to:
        raise ValueError(
            f"d={d} exceeds the rank of the {what} ({int(keep.sum())} non-zero eigenvalues "
            f"of {'the centred' if center else 'their'} Gram); lower d."
        )
    lam, V = lam[keep][::-1], V[:, keep][:, ::-1]
    if center:
        V = V - V.mean(axis=0, keepdims=True)  # H V: exact orthogonality to the mean
    return PCABasis(V / np.sqrt(lam), lam, center, d is None)


def basis_coefficients(given, K, d, center, what) -> np.ndarray:
    """The top-``d`` coefficients of ``given``, or of a basis computed from ``K``."""
    if given is None:
        return pca_basis(K, d, center=center, what=what).A
    if given.center != center:
        raise ValueError(
            f"the {what}' PCA basis was computed with center={given.center}, the prior asks "
            f"for center={center}; compute it with the same centring."
        )
    return given.top(d, K.shape[0], what)


def complete_basis(given, K, what) -> tuple[np.ndarray, np.ndarray]:
    """``(A, Λ)`` of the complete centred basis ``given``, or of one computed from ``K``."""
    if given is None:
        given = pca_basis(K, what=what)
    elif not (given.complete and given.center):
        raise ValueError(
            f"CORAL needs the complete centred PCA basis of the {what} (pca_basis(K)); "
            "the one given was truncated or uncentred."
        )
    return given.top(given.A.shape[1], K.shape[0], what), given.lam
