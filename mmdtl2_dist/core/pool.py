r"""The pool of samples a transductive prior learns from, and the one form every prior takes.

A prior enters MMDTL2's alternation only through the prior-mapped targets
``u_m = W0 x̂_m`` of the labelled target samples and ``u(x) = W0 x`` of the samples to
score, and only through their inner products with the source samples and with each other
(:mod:`mmdtl2_dist.core.mmdtl2`, "Everything on Gram matrices"). Those four Gram blocks are
what ``prior="matrix"`` of :func:`mmdtl2_dist.core.methods.fit_predict` takes
(``Ksu``, ``Kuu``, ``Ksuq``, ``Kuuq`` of :class:`~mmdtl2_dist.core.methods.GramProblem`),
so every prior of :mod:`mmdtl2_dist.core.priors` runs through the existing alternation
unchanged, with its mixing weight ``prior_weight`` ``μ`` (``u = μ W0 x``).

The pool and the one form every prior takes
-------------------------------------------
The statistics come from a **pool** of samples of both devices in one feature space of
dimension ``L``: ``Ys`` (``ns`` source samples, rows) and ``Yt`` (``nt`` target samples:
the labelled ones, the unlabelled ones and, transductively, the samples to be scored), in
``Y = [Ys; Yt]`` (``p = ns + nt`` rows). Its linear Gram ``Kyy = Y Yᵀ`` has the blocks
``Kss``, ``Kst``, ``Ktt`` (:class:`SamplePool`). No label is used. Every prior is

.. math::

    W_0 = a I + Y^\top L\, T\, Y, \qquad
    u(x) = a x + Y^\top L\, c(x), \quad c(x) = T\, k_Y(x), \quad k_Y(x) = Y x,

with a scalar ``a``, ``L`` (p, r) and ``T`` (r, p) (:class:`PoolMap`): the map of a target
sample needs only its Gram column ``k_Y(x)`` against the pool (for a pool member, a column
of ``Kyy``; for a new sample, a column the Gram engine computes). With ``KyL = Kyy L`` and
``G = Lᵀ Kyy L`` the blocks are, for a source sample ``x_i`` and target samples ``x_j``,
``x_j'`` (pool rows ``i``, ``j``, ``j'``),

.. math::

    x_i^\top u_j = a K_{ij} + (K L)_{i\cdot} c_j, \qquad
    u_j^\top u_{j'} = a^2 K_{jj'} + a (KL)_{j\cdot} c_{j'} + a\, c_j^\top (KL)_{j'\cdot}^\top
        + c_j^\top G\, c_{j'},

all ``O(p² r)`` after the Gram; nothing of size ``L`` is formed.

The maps themselves (subspace alignment, shared PCA, CORAL, optimal transport) are in
:mod:`mmdtl2_dist.core.priors`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from mmdtl2_dist.core.methods import GramProblem


@dataclass(frozen=True)
class PriorBlocks:
    """Gram blocks of the prior-mapped targets ``u = W0 x`` (``prior="matrix"``).

    ``Ksu`` (N, M) source × mapped labelled targets, ``Kuu`` (M, M), ``Ksuq`` (N, Q)
    source × mapped test samples, ``Kuuq`` (M, Q): the fields of
    :class:`~mmdtl2_dist.core.methods.GramProblem` of the same names.
    """

    Ksu: np.ndarray
    Kuu: np.ndarray
    Ksuq: np.ndarray
    Kuuq: np.ndarray

    def as_dict(self) -> dict:
        return {"Ksu": self.Ksu, "Kuu": self.Kuu, "Ksuq": self.Ksuq, "Kuuq": self.Kuuq}


@dataclass(frozen=True)
class SamplePool:
    """Linear Grams of every sample a prior learns from, both devices in one feature space.

    Attributes
    ----------
    Kss : ndarray (ns, ns)
        Source pool × source pool (labelled source samples and any unlabelled ones).
    Ktt : ndarray (nt, nt)
        Target pool × target pool (labelled, unlabelled and the samples to score).
    Kst : ndarray (ns, nt)
        Source pool × target pool.
    source_train, target_train, target_test : ndarray of int
        Rows of the source pool that train the classifier (N), rows of the target pool
        that are labelled (M) and rows to score (Q). The test rows may be unlabelled pool
        samples (the transductive protocol); no label of the pool is ever read.
    """

    Kss: np.ndarray
    Ktt: np.ndarray
    Kst: np.ndarray
    source_train: np.ndarray
    target_train: np.ndarray
    target_test: np.ndarray

    @cached_property
    def Kyy(self) -> np.ndarray:
        """The whole pool's Gram ``[[Kss, Kst], [Kstᵀ, Ktt]]`` (p, p), formed once."""
        return np.block([[self.Kss, self.Kst], [self.Kst.T, self.Ktt]])

    def validate(self) -> None:
        """Check shapes, finiteness and index ranges; raise ValueError naming the fix."""
        if self.Kst is None:
            raise ValueError(
                "transductive priors need source and target in one feature space (the cross "
                "Gram Kst); for different feature spaces use prior='zero' or a map W0."
            )
        ns, nt = self.Kss.shape[0], self.Ktt.shape[0]
        for name, shape in {"Kss": (ns, ns), "Ktt": (nt, nt), "Kst": (ns, nt)}.items():
            arr = getattr(self, name)
            if arr.shape != shape:
                raise ValueError(f"SamplePool.{name} has shape {arr.shape}, expected {shape}.")
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"SamplePool.{name} contains NaN or Inf; recompute the Gram.")
        for name, n in (("source_train", ns), ("target_train", nt), ("target_test", nt)):
            ix = np.asarray(getattr(self, name))
            if ix.ndim != 1 or ix.dtype.kind not in "iu" or np.any((ix < 0) | (ix >= n)):
                raise ValueError(
                    f"SamplePool.{name} must be a 1-d array of row indices in 0..{n - 1}."
                )

    def with_rows(self, **rows) -> SamplePool:
        """The same pool with other ``source_train``/``target_train``/``target_test`` rows.

        Shares the whole pool's Gram :attr:`Kyy` once formed (``p × p``: formed once per
        pool, not once per view of it).
        """
        view = replace(self, **rows)
        if "Kyy" in self.__dict__:
            view.__dict__["Kyy"] = self.__dict__["Kyy"]
        return view

    def problem(
        self, ys, yt, prior: PriorBlocks | None = None, *, test_gram: bool = True
    ) -> GramProblem:
        """The :class:`GramProblem` of the split, with the prior's blocks if given.

        ``test_gram=False`` leaves out the test × test block ``Kqq`` (only ``mmdt_hoffman``
        reads it; ``Q × Q`` for ``Q`` scored rows).
        """
        s, lab, q = self.source_train, self.target_train, self.target_test
        return GramProblem(
            ys=np.asarray(ys),
            yt=np.asarray(yt),
            Kss=self.Kss[np.ix_(s, s)],
            Ktt=self.Ktt[np.ix_(lab, lab)],
            Ktq=self.Ktt[np.ix_(lab, q)],
            sq_q=np.diag(self.Ktt)[q].copy(),
            Kst=self.Kst[np.ix_(s, lab)],
            Ksq=self.Kst[np.ix_(s, q)],
            Kqq=self.Ktt[np.ix_(q, q)] if test_gram else None,
            **({} if prior is None else prior.as_dict()),
        )


@dataclass(frozen=True)
class PoolMap:
    """A prior ``W0 = a I + Yᵀ L T Y`` over the pool ``Y = [Ys; Yt]``.

    Attributes
    ----------
    a : float
        Weight of the identity part.
    L : ndarray (p, r)
        Pool coefficients of the ``r`` vectors the map's output is built from.
    T : ndarray (r, p)
        Coordinates ``c(x) = T (Y x)`` of a target sample from its Gram column.
    """

    a: float
    L: np.ndarray
    T: np.ndarray

    def blocks(self, pool: SamplePool) -> PriorBlocks:
        """The four prior blocks of the split's source and target rows (module docstring)."""
        Kyy = pool.Kyy
        ns, s = pool.Kss.shape[0], pool.source_train
        lab, q = ns + pool.target_train, ns + pool.target_test
        KyL = Kyy @ self.L
        G = self.L.T @ KyL  # (r, r)
        C_l, C_q = self.T @ Kyy[:, lab], self.T @ Kyy[:, q]
        Ksu = self.a * Kyy[np.ix_(s, lab)] + KyL[s] @ C_l
        Ksuq = self.a * Kyy[np.ix_(s, q)] + KyL[s] @ C_q
        Kuu = self._mapped_gram(Kyy, KyL, G, lab, lab, C_l, C_l)
        Kuuq = self._mapped_gram(Kyy, KyL, G, lab, q, C_l, C_q)
        return PriorBlocks(Ksu, 0.5 * (Kuu + Kuu.T), Ksuq, Kuuq)

    def _mapped_gram(self, Kyy, KyL, G, rows, cols, C_r, C_c) -> np.ndarray:
        """``u_jᵀ u_j'`` for pool rows ``rows`` × ``cols`` with coordinates ``C_r``, ``C_c``."""
        a = self.a
        out = C_r.T @ G @ C_c
        if a != 0.0:
            out += a * a * Kyy[np.ix_(rows, cols)] + a * (KyL[rows] @ C_c + C_r.T @ KyL[cols].T)
        return out


def pool_problem(
    pool: SamplePool, ys, yt, pmap: PoolMap | None, *, test_gram: bool = True
) -> GramProblem:
    """The split's problem on ``pool``'s rows, with the blocks of the prior map ``pmap``."""
    blocks = None if pmap is None else pmap.blocks(pool)
    return pool.problem(ys, yt, blocks, test_gram=test_gram)
