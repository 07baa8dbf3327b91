"""The polish's factor carried through fixed variables (core/free_factor.py).

References: the block itself (``Rᵀ R`` against the sub-block of ``H``), ``numpy.linalg.solve``
for the Newton step, and the polish that refactorises every block (the updates off) for a
whole box QP. Tolerances: the reconstructed blocks and the solves are backward stable, so
their errors are a few units of rounding times the block's norm (1e-12 relative on these
well-conditioned blocks of norm ~1); two exact solves of one strictly convex QP agree to
the polish's accuracy (objective 1e-12 relative, minimiser 1e-8).
"""

import numpy as np
import pytest
from scipy.linalg import lapack

from mmdtl2_dist.core import dcd, free_factor
from mmdtl2_dist.core.dcd import dcd_box_qp
from mmdtl2_dist.core.free_factor import RegularFactor, drop_columns


def _block(n, seed):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, n + 5))
    return A @ A.T / n, rng


def _factor(H, order):
    R, piv, rank, _ = lapack.dpstrf(H, lower=0)
    assert rank == H.shape[0]
    return RegularFactor(np.asarray(R, order=order), piv - 1)


@pytest.mark.parametrize("drop", [[0], [39], [17], [3, 4], [0, 20, 39], [1, 2, 3, 30]])
def test_dropped_columns_leave_the_factor_of_the_smaller_block(drop):
    """``R'ᵀ R'`` is the block without the dropped pivots' rows and columns, ``R'`` upper
    triangular with a non-negative diagonal, whichever pivots are dropped, from a factor
    in either memory order (LAPACK's lower triangle holds the input's entries: unread)."""
    H, _ = _block(40, 1)
    R, piv, _, _ = lapack.dpstrf(H, lower=0)
    perm = piv - 1
    keep = np.setdiff1d(np.arange(40), drop)
    P = H[np.ix_(perm, perm)][np.ix_(keep, keep)]
    for R_in in (R, np.ascontiguousarray(R)):  # LAPACK's Fortran order, and C order
        S = drop_columns(R_in, np.array(drop))
        assert S.shape == (40 - len(drop),) * 2 and S.flags.c_contiguous
        assert np.all(np.tril(S, -1) == 0.0) and np.all(np.diag(S) >= 0)
        np.testing.assert_allclose(S.T @ S, P, atol=1e-12 * np.abs(H).max())


@pytest.mark.parametrize("order", ["F", "C"])
def test_a_kept_factor_solves_and_multiplies_as_its_block_after_variables_are_fixed(order):
    """From LAPACK's Fortran-ordered factor or a C-ordered one: the Newton step solves
    ``H_FF d = −g`` and ``factor @ v`` is ``H_FF v``, before and after two rounds of fixed
    variables; fixing too many at once asks for a new factorisation (None)."""
    H, rng = _block(600, 2)
    f = _factor(H, order)
    keep = np.arange(600)
    for fixed_at in ([5, 300], [0, 1, 2, 250, 590]):
        g, v = rng.standard_normal(keep.size), rng.standard_normal(keep.size)
        block = H[np.ix_(keep, keep)]
        np.testing.assert_allclose(f.step(g), -np.linalg.solve(block, g), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(f @ v, block @ v, atol=1e-12 * np.abs(block @ v).max())
        fixed = np.zeros(keep.size, bool)
        fixed[fixed_at] = True
        f, keep = f.without(fixed), keep[~fixed]
    g = rng.standard_normal(keep.size)
    np.testing.assert_allclose(f.step(g), -np.linalg.solve(H[np.ix_(keep, keep)], g), rtol=1e-9)
    many = np.zeros(keep.size, bool)
    many[: keep.size // 8] = True
    assert f.without(many) is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_polish_with_kept_factors_reaches_the_refactorising_polishs_optimum(seed, monkeypatch):
    """A box QP whose polish fixes many variables one at a time, solved with every free
    block kept and updated (threshold 0) and with every block refactorised (threshold
    above its size): the same objective and minimiser, both exact (KKT 1e-10)."""
    rng = np.random.default_rng(seed)
    n = 300
    A = rng.standard_normal((n, n))
    H = A @ A.T / n + 0.05 * np.eye(n)
    f = 2.0 * rng.standard_normal(n)
    lb, ub = np.zeros(n), np.full(n, 0.5)
    runs = []
    for keep_at in (0, n + 1):
        monkeypatch.setattr(dcd, "KEEP_FACTOR_AT", keep_at)
        kept = []
        real = free_factor.RegularFactor.without
        monkeypatch.setattr(
            free_factor.RegularFactor, "without",
            lambda self, fixed, real=real, kept=kept: (kept.append(1), real(self, fixed))[1],
        )  # fmt: skip
        r = dcd_box_qp(H, f, lb, ub, None, 1e-10, max_epochs=2)  # the polish does the work
        assert r.ok
        runs.append((r.x, len(kept)))
    (x_kept, n_updates), (x_fresh, n_none) = runs
    assert n_updates > 0 and n_none == 0
    obj = [0.5 * x @ H @ x - f @ x for x in (x_kept, x_fresh)]
    assert abs(obj[0] - obj[1]) <= 1e-12 * abs(obj[1])
    np.testing.assert_allclose(x_kept, x_fresh, atol=1e-8)
