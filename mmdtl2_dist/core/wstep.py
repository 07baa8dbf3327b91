"""The W-step of MMDTL2 on Gram matrices: its dual QP (paper Corollary 1), solved.

The notation is that of :mod:`mmdtl2_dist.core.mmdtl2`, whose alternation calls
:func:`solve_wstep`. The dual has one variable per class and labelled target sample, so
its Hessian has ``(K M)²`` float64 entries. Up to :data:`MATRIX_FREE_ABOVE_BYTES` it is
built once, Jacobi-scaled, in one compiled pass
(:func:`~mmdtl2_dist.core.kron.kron_hessian`); above, coordinate descent uses it without
building it (:class:`~mmdtl2_dist.core.kron.ScaledKron`: memory linear in ``K M`` but
for the polish's block of free variables, a sweep ``O(K M (K + M))`` operations). The
route depends on the problem's size alone, never on the machine's free memory, so a fit
runs the same algorithm everywhere. OSQP needs the array: a W-step it could not hold is
refused with its size (:func:`check_wstep_fits`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mmdtl2_dist.core import memory
from mmdtl2_dist.core.kron import ScaledKron
from mmdtl2_dist.core.qp import QPResult, jacobi_scale, solve_prescaled_box_qp

if TYPE_CHECKING:
    from mmdtl2_dist.core.mmdtl2 import MMDTL2Params, TransferOperators


@dataclass
class WStepResult:
    """Dual solution of one W-step.

    ``a`` (K·M,), ``Gamma`` (N+M, M), ``Omega`` (N+M, M), and the products ``Kz Γ`` and
    ``Kz Ω`` that the rest of the alternation needs.
    """

    a: np.ndarray
    Gamma: np.ndarray
    Omega: np.ndarray
    qp: QPResult
    KzGamma: np.ndarray | None = None
    KzOmega: np.ndarray | None = None


def wstep_dual(
    Kz: np.ndarray,
    beta: np.ndarray,
    b: np.ndarray,
    Yt: np.ndarray,
    R_c: np.ndarray,
    G: np.ndarray,
    N: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The W-step dual QP (paper Corollary 1, with the prior offset): ``(ΘᵀΘ, f)``.

    The QP is ``min ½ aᵀHa − fᵀa``, ``0 ≤ a ≤ c_t`` (the negated dual), where

    - ``H = Y ((ΘᵀΘ) ⊗ G) Y`` with ``ΘᵀΘ = βᵀ Kz β`` (:func:`wstep_hessian`; it has
      ``(KM)²`` entries, so it is scaled, and built or not, where it is solved),
    - ``f = 1 − Y b̃ − Y vec(Θᵀ R G)``, ``ΘᵀR = βᵀ Kz R_c``,
      ``b̃_km = b_k + θ_kᵀ u_m = b_k + (βᵀ Kz E_u)_km``,
    - ``Y = diag(vec(Yt))``, ``a`` class-major: ``a[k*M + m] = a_km``.

    Parameters
    ----------
    Kz : ndarray (N+M, N+M)
        Gram of ``Z = [Xs, U]``.
    beta : ndarray (N+M, K)
        Hyperplanes as coefficients on ``Z``.
    b : ndarray (K,)
        Biases.
    Yt : ndarray (K, M)
        One-vs-rest labels of the target samples.
    R_c : ndarray (N+M, M)
        ``[S; −S_M]``.
    G : ndarray (M, M)
        From :func:`transfer_operators`.
    N : int
        Number of source samples.
    """
    KzB = Kz @ beta  # (N+M, K)
    TT = beta.T @ KzB  # ΘᵀΘ
    ThR = KzB.T @ R_c  # ΘᵀR (K, M)
    b_tilde = b[:, None] + KzB[N:, :].T  # (K, M)
    y = Yt.ravel()
    f = 1.0 - y * b_tilde.ravel() - y * (ThR @ G).ravel()
    return TT, f


#: W-step Hessians up to this size are built without asking the system for its memory.
SMALL_WSTEP_BYTES = 1 << 28
#: W-step Hessians (``8 (K M)²`` bytes) above this size are never built for coordinate
#: descent: 256 MB, ``K M`` above 5,792 (20 classes and 9 targets a class, self-trained),
#: so coordinate descent never needs to ask for memory.
MATRIX_FREE_ABOVE_BYTES = SMALL_WSTEP_BYTES


def wstep_hessian(
    TT: np.ndarray, G: np.ndarray, Yt: np.ndarray, d: np.ndarray | None = None,
    solver: str = "dcd",
) -> np.ndarray | ScaledKron:  # fmt: skip
    """``H = Y ((ΘᵀΘ) ⊗ G) Y`` of the W-step dual, scaled to ``D H D`` when ``d`` is given.

    Exactly symmetric; built unless coordinate descent (``solver="dcd"``) can use it
    unbuilt and it is larger than :data:`MATRIX_FREE_ABOVE_BYTES`; ``solver=None``:
    always built.
    """
    s = Yt.ravel().astype(np.float64)
    H = ScaledKron(TT, G, s if d is None else s * d)
    if solver == "dcd" and 8 * s.size**2 > MATRIX_FREE_ABOVE_BYTES:
        return H
    return H.dense()


#: Dense Hessians a QP solver holds at its peak: coordinate descent works on the one
#: built; OSQP copies it into a sparse matrix and its upper triangle (about 2.5 more).
SOLVER_COPIES = {"dcd": 1.0, "osqp": 3.5}


def check_wstep_fits(K: int, M: int, solver: str = "dcd") -> None:
    """Refuse a W-step whose Hessian (``(K M)²`` float64) would not fit in memory.

    The kernel would otherwise kill the process (or the study's worker) mid-fit.
    """
    need = int(8 * (K * M) ** 2 * SOLVER_COPIES.get(solver, 1.0))
    if need <= SMALL_WSTEP_BYTES or solver == "dcd":  # dcd builds it up to that size only
        return
    have = memory.available_bytes()
    if need > have:
        fix = (
            "fit with fewer labelled target samples per class (select='auto' self-trains "
            "with as many again, twice as many on a hard shift with at most 3 labels a "
            "class), or on a machine with more memory"
        )
        if solver != "dcd":
            fix = f"use qp_solver='dcd' (it never builds a Hessian above 256 MB), or {fix}"
        raise ValueError(
            f"the W-step QP of this fit has {K} classes x {M} labelled target samples = "
            f"{K * M:,} dual variables, and solving it ({solver}) needs {need / 1e9:.1f} GB, "
            f"more than the {have / 1e9:.1f} GB available. Instead, {fix}."
        )


def solve_wstep(
    Kz, beta, b, Yt, R_c, ops: TransferOperators, N, params: MMDTL2Params, a0=None, KzRc=None
):
    """Solve the W-step dual and return ``Γ`` and the transformed-target coefficients ``Ω``.

    ``KzRc = Kz R_c`` (constant over the alternation) may be passed to save an
    ``(N+M)² M`` product; ``Kz Γ`` and ``Kz Ω`` then come from ``Kz β`` at ``O((N+M) K M)``.
    The QP's Hessian (``(KM)²`` entries, ``diag H = diag(ΘᵀΘ) ⊗ diag(G)``) is
    Jacobi-scaled and built, or left unbuilt for coordinate descent when large
    (:func:`wstep_hessian`).
    """
    K, M = Yt.shape
    check_wstep_fits(K, M, params.qp_solver)
    TT, f = wstep_dual(Kz, beta, b, Yt, R_c, ops.G, N)
    if not (np.all(np.isfinite(TT)) and np.all(np.isfinite(ops.G)) and np.all(np.isfinite(f))):
        raise ValueError("the W-step QP has NaN or Inf coefficients; check the input features.")
    d = jacobi_scale(np.kron(np.diag(TT), np.diag(ops.G)))
    qp = solve_prescaled_box_qp(
        wstep_hessian(TT, ops.G, Yt, d, params.qp_solver), f, d, 0.0, params.c_t,
        solver=params.qp_solver, tol=params.qp_tol, x0=a0,
    )  # fmt: skip
    YA = Yt * qp.x.reshape(K, M)  # (Υ ⊙ Λ)ᵀ
    Gamma = R_c + beta @ YA
    E_u = np.zeros((N + M, M))
    E_u[N:, :] = np.eye(M)
    Omega = E_u + Gamma @ ops.G
    KzRc = Kz @ R_c if KzRc is None else KzRc
    KzGamma = KzRc + (Kz @ beta) @ YA
    KzOmega = Kz[:, N:] + KzGamma @ ops.G
    return WStepResult(qp.x, Gamma, Omega, qp, KzGamma, KzOmega)
