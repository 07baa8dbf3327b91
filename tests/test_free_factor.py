"""The polish's factor carried through fixed variables (core/free_factor.py).

References: the block itself (``Rᵀ R`` against the sub-block of ``H``), ``numpy.linalg.solve``
for the Newton step, and the polish that refactorises every block (the updates off).
Tolerances: the reconstructed blocks and the solves are backward stable, so their errors
are a few units of rounding times the block's norm (1e-12 relative on these
well-conditioned blocks of norm ~1), and so are two polishes that solve the same Newton
systems by the two routes.
"""

import numpy as np
import pytest
from scipy.linalg import lapack

from mmdtl2_dist.core import dcd, free_factor
from mmdtl2_dist.core.free_factor import RegularFactor, drop_columns
from mmdtl2_dist.core.kron import ScaledKron


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


def _blocked_polish_problem(seed, unbuilt, out=0.03):
    """A box QP whose Newton polish from an interior point is blocked again and again:
    the unconstrained optimum lies inside the box but for 3 % of the variables, which
    the loop fixes a few at a time. The unbuilt W-step Hessian, or the same built."""
    rng = np.random.default_rng(seed)
    K, M = 6, 40
    A = rng.standard_normal((K, K + 2))
    B = rng.standard_normal((M, M + 5))
    A, B = A @ A.T, B @ B.T / M + 0.1 * np.eye(M)
    s = rng.choice([-1.0, 1.0], K * M) / np.sqrt(np.kron(np.diag(A), np.diag(B)))
    H = ScaledKron(A, B, s)
    inside = rng.uniform(0.0, 1.0, K * M)
    f = H.dense() @ np.where(rng.random(K * M) < out, 1.3, inside)
    return (H if unbuilt else H.dense()), f, inside, np.zeros(K * M), np.ones(K * M)


@pytest.mark.parametrize("unbuilt", [True, False], ids=["unbuilt", "built"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_polish_with_kept_factors_lands_where_the_refactorising_polish_does(
    seed, unbuilt, monkeypatch
):
    """One polish from the same point with every free block's factor kept and updated
    (threshold 0) and with every block refactorised: the same point to 1e-12 (both solve
    the same Newton systems; a wrong update, permutation or block moves it far more),
    after updates in a row."""
    H, f, x0, lb, ub = _blocked_polish_problem(seed, unbuilt)
    updates, real = [], free_factor.RegularFactor.without
    monkeypatch.setattr(
        free_factor.RegularFactor, "without",
        lambda self, fixed: (r := real(self, fixed), updates.append(r is not None))[0],
    )  # fmt: skip
    ends = []
    for keep_at in (0, 10**9):
        monkeypatch.setattr(dcd, "KEEP_FACTOR_AT", keep_at)
        updates.clear()
        ends.append((dcd._polish(H, f, x0, lb, ub)[0], sum(updates)))
    (x_kept, n_updates), (x_fresh, n_none) = ends
    assert n_updates >= 2 and n_none == 0  # the second drops from an updated factor
    np.testing.assert_allclose(x_kept, x_fresh, rtol=0, atol=1e-12)
    assert np.all((x_fresh >= lb) & (x_fresh <= ub)) and np.any(x_fresh == ub)


def test_a_factor_with_nothing_fixed_is_itself():
    """A mask fixing nothing keeps the factor (no column to drop)."""
    H, _ = _block(20, 4)
    f = _factor(H, "F")
    assert f.without(np.zeros(20, bool)) is f
    assert np.array_equal(drop_columns(f.R, np.zeros(0, np.int64)), f.R)
