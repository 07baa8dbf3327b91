"""The block products of a Gram tile, in numpy (CPU) or torch (GPU, or torch's CPU device).

A tile accumulates ``G += A Bᵀ`` over the feature blocks of its rows, in a fixed order,
into a float64 accumulator. Two precisions:

``"float64"`` (exact, the default)
    Each block is converted to float64 (:data:`CAST_SPAN` features at a time, each span
    multiplied while it is in cache) and multiplied in float64 straight into the
    accumulator: BLAS ``dgemm`` with ``beta = 1`` (no temporary, no separate add pass),
    or ``dsyrk`` for a diagonal tile, which computes the upper triangle only (half the
    flops); the triangle is mirrored once, when the tile is done.
``"mixed"``
    Each block stays in float32 (the width features are stored in) and is multiplied in
    float32 (``sgemm``, or ``ssyrk`` for a diagonal tile) over sub-blocks of at most
    :data:`MIXED_SPAN` features, which is at least the engine's default feature block
    (:data:`~mmdtl2_dist.engine.plan.TARGET_COL_SPAN`): one float32 product per feature
    block (unless a store's column chunks are wider), added to the float64 accumulator.
    Every rounding in float32 happens inside one sub-block, so the error of an entry is
    bounded by the sub-block width, not by the feature dimension ``L``:

    * worst case, whatever the summation order the BLAS picks inside a sub-block,
      ``|Ĝ_ij - G_ij| <= γ_k (|X| |Y|ᵀ)_ij`` with ``γ_k = k u / (1 - k u)``,
      ``k = min(MIXED_SPAN, L) + 1`` roundings per term and ``u = 2⁻²⁴`` (float32 unit
      roundoff), plus float64 terms of order ``L 2⁻⁵³`` — see :func:`mixed_error_bound`;
    * for nonnegative features (CNN activations after ReLU), ``|X||Y|ᵀ = G``, so this
      is a bound on the relative error of every entry. Rounding errors of opposite
      signs cancel in practice (Higham & Mary, *A new approach to probabilistic
      rounding error analysis*, SIAM J. Sci. Comput. 2019: ``λ √k u`` with high
      probability): the measured worst entry on nonnegative conv3-like features of
      64,896 dimensions is 1.3e-7 relative (300 samples, blocks of 8,112 features), inside
      the 1e-6 target (``tests/test_gram_precision.py``, BENCHMARKS.md).

The torch products (:class:`~mmdtl2_dist.engine.torch_products.TorchProduct`) run the
same arithmetic on a torch device; torch is imported only for them (:func:`import_torch`).
"""

from __future__ import annotations

import threading

import numpy as np
from scipy.linalg import blas

from mmdtl2_dist.engine.timing import PhaseTimer

PRECISIONS = ("float64", "mixed")
#: Most features per float32 product in mixed precision (the error bound grows with it):
#: at least the feature block of a task (:data:`~mmdtl2_dist.engine.plan.TARGET_COL_SPAN`),
#: so a block is one product and one add pass into the float64 accumulator.
MIXED_SPAN = 8192
#: Features per float64 conversion and product in the exact mode, for blocks stored as
#: float32: each span is converted just before BLAS reads it (2,048 rows x 1,024
#: features of float64: 16 MB, in the shared cache), instead of a whole block going
#: through main memory twice more.
CAST_SPAN = 1024
#: Unit roundoff of float32 and float64.
U32, U64 = 2.0**-24, 2.0**-53

#: The numpy products' scratch buffers (blocks read, float64 spans, the float32 product),
#: per thread, kept for its next tiles: a fresh array of tens of MB is faulted in page by
#: page and zeroed by the kernel (BENCHMARKS.md, "Scratch buffers kept between a worker's
#: tiles"). A thread computes one tile at a time (a Ray worker runs one task at a time,
#: the in-process runner one after the other). The accumulator is the tile itself, which
#: the task returns, and stays each tile's own.
_LOCAL = threading.local()

TORCH_MISSING = (
    "Gram tiles on a torch device ({device}) need PyTorch, which is not installed here; "
    "install it with pip install '.[images]' (or pip install torch), or leave out "
    "--gpus/--device to compute the Gram with numpy on the CPU."
)


def thread_scratch() -> dict[str, np.ndarray]:
    """The numpy products' scratch buffers of the calling thread (:data:`_LOCAL`)."""
    if not hasattr(_LOCAL, "bufs"):
        _LOCAL.bufs = {}
    return _LOCAL.bufs


def release_scratch() -> None:
    """Free the calling thread's scratch buffers: the job whose tiles ran here is done."""
    _LOCAL.bufs = {}


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(
            f"precision must be one of {PRECISIONS}, got {precision!r}: 'float64' is the "
            "exact Gram, 'mixed' multiplies in float32 and accumulates in float64."
        )
    return precision


def mixed_error_bound(n_features: int, span: int = MIXED_SPAN) -> float:
    """Worst-case bound on ``|Ĝ - G| / (|X||Y|ᵀ)`` entrywise, for mixed precision.

    ``γ_k`` for the ``k = span + 1`` float32 roundings a term meets inside its sub-block
    (the product, then at most ``span`` additions), plus ``γ_m`` in float64 for the
    conversion and the ``m = ceil(L / span) + 1`` additions across sub-blocks.
    """
    k = min(span, n_features) + 1
    m = -(-n_features // span) + 1
    return k * U32 / (1 - k * U32) + m * U64 / (1 - m * U64)


NO_GPU = (
    "Gram tiles on {device} need a CUDA GPU, and torch finds none on {host} "
    "(torch.cuda.is_available() is False: no GPU, no driver, or a CPU-only torch); run "
    "on a machine with a GPU, or use --device cpu, or leave out --gpus/--device."
)


def import_torch(device: str):
    """Import torch for tiles on ``device``, or say how to install it."""
    try:
        import torch
    except ImportError:
        raise ImportError(TORCH_MISSING.format(device=device)) from None
    return torch


def check_device(device: str):
    """Import torch and check that ``device`` is a torch device this machine has.

    Returns the torch module. Raises ImportError (torch missing), ValueError (not a
    device name) or RuntimeError (a CUDA device without a usable GPU), each saying what
    to do.
    """
    torch = import_torch(device)
    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError) as exc:
        raise ValueError(
            f"device {device!r} is not a torch device ({exc}); use 'cuda', 'cuda:N' or 'cpu'."
        ) from None
    if kind == "cuda" and not torch.cuda.is_available():
        import socket

        raise RuntimeError(NO_GPU.format(device=device, host=socket.gethostname()))
    return torch


class NumpyProduct:
    """The float64 accumulator of one tile and its block products, in numpy and BLAS.

    The accumulator holds ``Gᵀ`` in Fortran order, which is ``G`` in C order: BLAS
    updates it in place (``Gᵀ += B Aᵀ``) and the tile comes out C-ordered without a
    copy. A C-ordered block ``A`` goes to BLAS as ``Aᵀ``, a Fortran-ordered view of the
    same memory, so nothing is copied (scipy copies only arrays in the other order).
    """

    device = "numpy"
    #: Blocks are read by the task's own thread: the other cores run other tiles.
    read_pool = None

    def __init__(self, shape: tuple[int, int], precision: str, timer: PhaseTimer):
        self._acc = np.zeros(shape[::-1], order="F")
        self.mixed = precision == "mixed"
        self.dtype = np.float32 if self.mixed else np.float64
        self.timer = timer
        self.symmetric = False
        self._buf: np.ndarray | None = None
        self._bufs = thread_scratch()

    @property
    def G(self) -> np.ndarray:
        """The tile accumulated so far (a C-ordered view of the accumulator)."""
        return self._acc.T

    def block_buffer(self, slot: str, shape: tuple[int, int], dtype) -> np.ndarray:
        """A C-ordered array to read a block of ``slot`` into, reused block after block."""
        return reused_buffer(self._bufs, f"read-{slot}", shape, dtype)

    def cast(self, x: np.ndarray, slot: str = "a") -> np.ndarray:
        """``x`` as :meth:`add` takes it: as it is.

        Float32 blocks of the exact mode are converted to float64 inside :meth:`add`,
        :data:`CAST_SPAN` features at a time, into a small buffer that stays in cache
        until BLAS reads it: a whole block converted at once goes through main memory
        twice more, which cost about a tenth of the product's time.
        """
        return x

    def add(self, A: np.ndarray, B: np.ndarray | None = None) -> None:
        """``G += A Bᵀ`` (``B`` None: ``A Aᵀ``, one triangle only, half the flops)."""
        self.symmetric = B is None
        A = np.ascontiguousarray(A)
        B = A if B is None else np.ascontiguousarray(B)
        if self.mixed:
            self._add_mixed(A, B)
        elif A.dtype == np.float64 and B.dtype == np.float64:
            with self.timer.phase("product"):
                self._acc = _blas_update(self._acc, B, None if self.symmetric else A, 1.0)
        else:
            self._add_converted(A, B)

    def _add_converted(self, A: np.ndarray, B: np.ndarray) -> None:
        """The exact product of blocks stored narrower than float64, span by span."""
        for k0 in range(0, A.shape[1], CAST_SPAN):
            k1 = min(k0 + CAST_SPAN, A.shape[1])
            with self.timer.phase("cast"):
                b = self._converted(B, k0, k1, "b")
                a = None if self.symmetric else self._converted(A, k0, k1, "a")
            with self.timer.phase("product"):
                self._acc = _blas_update(self._acc, b, a, 1.0)

    def _converted(self, X: np.ndarray, k0: int, k1: int, slot: str) -> np.ndarray:
        out = reused_buffer(self._bufs, f"cast-{slot}", (X.shape[0], k1 - k0), np.float64)
        np.copyto(out, X[:, k0:k1])
        return out

    def _add_mixed(self, A: np.ndarray, B: np.ndarray) -> None:
        with self.timer.phase("product"):
            A, B = A.astype(np.float32, copy=False), B.astype(np.float32, copy=False)
            if self._buf is None:  # zeros: a symmetric product leaves one triangle alone
                n, m = self._acc.shape
                self._buf = reused_buffer(self._bufs, "mixed", (m, n), np.float32).T
                self._buf.fill(0.0)
            for k0 in range(0, A.shape[1], MIXED_SPAN):
                a = None if self.symmetric else A[:, k0 : k0 + MIXED_SPAN]
                self._buf = _blas_update(self._buf, B[:, k0 : k0 + MIXED_SPAN], a, 0.0)
                self._acc += self._buf

    def result(self) -> np.ndarray:
        """The tile, C-ordered; a symmetric tile's computed triangle mirrored."""
        if self.symmetric:
            mirror_upper(self._acc)
        return self.G

    def all_finite(self) -> bool:
        """Whether every entry of the tile is finite (after :meth:`result`)."""
        return bool(np.isfinite(self._acc).all())


def _blas_update(C: np.ndarray, X: np.ndarray, Y: np.ndarray | None, beta: float) -> np.ndarray:
    """``C = X Yᵀ + beta C`` in place by BLAS (``Y`` None: ``syrk``, upper triangle of ``X Xᵀ``).

    ``C`` is Fortran-ordered and ``X``, ``Y`` (C-ordered) are passed as their
    transposes: BLAS reads and writes the arrays' own memory, and returns ``C`` itself.
    """
    single = C.dtype == np.float32
    if Y is None:
        syrk = blas.ssyrk if single else blas.dsyrk
        return syrk(1.0, X.T, beta=beta, c=C, trans=1, overwrite_c=True)
    gemm = blas.sgemm if single else blas.dgemm
    return gemm(1.0, X.T, Y.T, beta=beta, c=C, trans_a=1, overwrite_c=True)


def mirror_upper(G: np.ndarray, block: int = 256) -> None:
    """Copy the upper triangle of the square ``G`` onto its lower one, in place.

    Block by block (a block and its transpose stay in cache): a few ms for 2,000 rows,
    several times faster than fancy indexing of the whole triangle.
    """
    n = G.shape[0]
    for i in range(0, n, block):
        G[i : i + block, :i] = G[:i, i : i + block].T
        diag = G[i : i + block, i : i + block]
        rows, cols = np.tril_indices(diag.shape[0], -1)
        diag[rows, cols] = diag[cols, rows]


def reused_buffer(bufs: dict, key: str, shape: tuple[int, int], dtype, allocate=None) -> np.ndarray:
    """A C-ordered ``shape`` view of the bytes ``bufs[key]``, grown when too small, else reused.

    A fresh array of tens of MB per block is mapped and faulted in page by page (and
    zeroed by the kernel): more costly than reading the block into it.
    ``allocate(nbytes)`` makes the byte array (default ``np.empty``; GPU tiles allocate
    page-locked memory).
    """
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    buf = bufs.get(key)
    if buf is None or buf.size < nbytes:
        buf = bufs[key] = (allocate or _host_bytes)(nbytes)
    return buf[:nbytes].view(dtype).reshape(shape)


def _host_bytes(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, dtype=np.uint8)


def tile_product(shape, precision: str, timer: PhaseTimer, device: str | None):
    """The product of a tile: numpy on the CPU (``device`` None), else torch on it."""
    if device is None:
        return NumpyProduct(shape, precision, timer)
    from mmdtl2_dist.engine.torch_products import TorchProduct

    return TorchProduct(shape, precision, timer, device)
