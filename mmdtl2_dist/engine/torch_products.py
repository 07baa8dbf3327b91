"""The block products of a Gram tile on a torch device: a GPU, or torch's CPU device.

:class:`TorchProduct` runs the arithmetic of :class:`~mmdtl2_dist.engine.products.NumpyProduct`
with torch: exact (float32 blocks converted to float64 on the device, float64 products)
or mixed (float32 products over :func:`mixed_span` features, each added to the float64
accumulator), inside the same error bound.

On a GPU the host never waits for the device until the tile is done:

* a feature block is read into page-locked host memory (two buffers per operand, used
  in turn, so the next block is read while the last one is copied), copied on a stream
  of its own into a device buffer paired with it, and multiplied on the compute stream
  once the copy is there; meanwhile the task reads the next block. Reading, the copy
  and the product of consecutive blocks overlap, and the tile runs at the pace of the
  slowest of the three (on a data-centre GPU: reading and writing, see BENCHMARKS.md);
* the task's reads use several threads (:func:`read_pool`), as one core reads the store
  far slower than a GPU multiplies;
* ``product`` and ``transfer`` are the device's own times, from CUDA events.

A diagonal tile computes the upper triangle only, in square sub-blocks of
:func:`triangle_blocks` (torch has no ``syrk``): about 56 % of the full product's flops
for 8 sub-blocks a side, against 50 % for ``syrk`` and 100 % for one product. The upper
triangle is then mirrored, so the tile is exactly symmetric as on the CPU.

On torch's CPU device (``device="cpu"``) the same code runs step after step: it is how
the GPU path is tested on machines without one.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from mmdtl2_dist.engine.products import MIXED_SPAN, check_device, reused_buffer
from mmdtl2_dist.engine.timing import PhaseTimer

#: Sub-blocks a side of a diagonal tile's triangle (fewer when they would be small).
TRIANGLE_SPLIT = 8
#: Fewest rows of a triangle sub-block: smaller products leave a GPU idle.
MIN_TRIANGLE_ROWS = 1024
#: Most threads a GPU tile reads its blocks with.
MAX_READ_THREADS = 8
#: Features per float32 product of a mixed tile on a GPU. Over a whole block of 8,112
#: features cuBLAS's float32 products left the worst entry of a 20,000-row Gram 1.03e-6
#: off float64 on an H200 (OpenBLAS's: 1.3e-7); the error of a float32 product grows with
#: the features it sums. With spans of 2,048 the worst entry was 2.6-2.7e-7 on an H200,
#: and the products' device time stayed 0.6-0.7 s of a 4-6 s Gram (BENCHMARKS.md).
GPU_MIXED_SPAN = 2048

_PINNED: dict[str, np.ndarray] = {}  # page-locked byte arrays (numpy views of torch's)
_POOL: list[ThreadPoolExecutor] = []


def mixed_span(device: str) -> int:
    """Features per float32 product of a mixed tile on ``device``.

    :data:`GPU_MIXED_SPAN` on a GPU, the CPU tiles'
    :data:`~mmdtl2_dist.engine.products.MIXED_SPAN` elsewhere.
    """
    return GPU_MIXED_SPAN if str(device).startswith("cuda") else MIXED_SPAN


def triangle_blocks(n: int) -> list[tuple[int, int]]:
    """Row ranges of the sub-blocks of an ``n``-row diagonal tile (``TRIANGLE_SPLIT`` at most)."""
    parts = max(1, min(TRIANGLE_SPLIT, n // MIN_TRIANGLE_ROWS))
    step = math.ceil(n / parts)
    return [(s, min(s + step, n)) for s in range(0, n, step)]


def read_pool() -> ThreadPoolExecutor:
    """The threads a GPU tile reads with: this process's cores, at most ``MAX_READ_THREADS``.

    One pool per worker process, kept for its later tiles. Ray counts a GPU tile as one
    CPU; its reads use more while the GPU computes, when the task's own core would idle.
    """
    if not _POOL:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        _POOL.append(ThreadPoolExecutor(max(1, min(MAX_READ_THREADS, cores)), "gram-read"))
    return _POOL[0]


class TorchProduct:
    """The float64 accumulator of one tile on a torch device, and its block products."""

    def __init__(
        self, shape, precision: str, timer: PhaseTimer, device: str, span: int | None = None
    ):
        with timer.phase("setup"):  # the first tile of a worker imports torch, opens the device
            self.torch = check_device(device)
            self.device = str(device)
            self.cuda = self.device.startswith("cuda")
            if self.cuda:  # a failed tile before this one may have left copies in flight
                self.torch.cuda.synchronize(self.device)
            self.G = self.torch.zeros(shape, dtype=self.torch.float64, device=device)
        self.mixed = precision == "mixed"
        self.span = mixed_span(self.device) if span is None else int(span)
        if self.span < 1:
            raise ValueError(f"span must be at least 1 feature, got {span}.")
        self.timer = timer
        self.symmetric = False
        self.read_pool = read_pool() if self.cuda else None
        self._bufs: dict[str, np.ndarray] = {}
        self._events: dict[str, list] = {"product": [], "transfer": []}
        self._copied: dict[str, object] = {}  # pinned buffer -> event of its last copy
        self._turn: dict[str, int] = {}
        self._copy_stream = self.torch.cuda.Stream(device=device) if self.cuda else None
        self._device_bufs: dict[str, object] = {}
        self._used: dict[str, object] = {}  # device buffer -> event after its last products
        self._in_use: list[str] = []
        self._host: np.ndarray | None = None  # the tile's copy on the host (result())

    def block_buffer(self, slot: str, shape: tuple[int, int], dtype) -> np.ndarray:
        """A C-ordered array to read a block of ``slot`` into.

        On a GPU: one of the slot's two page-locked buffers, in turn, once the device
        has finished copying what it last held. Elsewhere one buffer, reused.
        """
        if not self.cuda:
            return reused_buffer(self._bufs, f"read-{slot}", shape, dtype)
        turn = self._turn[slot] = 1 - self._turn.get(slot, 1)
        key = f"read-{slot}-{turn}"
        copied = self._copied.pop(key, None)
        if copied is not None:
            copied.synchronize()
        return _pinned(self.torch, key, shape, dtype)

    def cast(self, x: np.ndarray, slot: str = "a") -> np.ndarray:
        """``x`` as it goes to the device: float32 stays float32 (half the bytes to copy).

        Exact mode converts it to float64 on the device.
        """
        return x.astype(np.float32, copy=False) if self.mixed or x.dtype != np.float64 else x

    def add(self, A: np.ndarray, B: np.ndarray | None = None) -> None:
        """``G += A Bᵀ`` on the device (``B`` None: ``A Aᵀ``, the upper triangle only)."""
        self.symmetric = B is None
        dtype = self.torch.float32 if self.mixed else self.torch.float64
        a = self._to_device(A)
        b = a if B is None else self._to_device(B)
        with self._device_time("product"):
            a = a.to(dtype)
            b = a if B is None else b.to(dtype)
            if B is not None:
                self._add_products(self.G, a, b)
            else:
                rows = triangle_blocks(a.shape[0])
                for k, (i0, i1) in enumerate(rows):
                    for j0, j1 in rows[k:]:
                        self._add_products(self.G[i0:i1, j0:j1], a[i0:i1], a[j0:j1])
        if self.cuda and self._in_use:  # the next copies into these buffers wait for this
            used = self.torch.cuda.Event()
            used.record(self.torch.cuda.current_stream(self.device))
            self._used.update(dict.fromkeys(self._in_use, used))
            self._in_use.clear()

    def _add_products(self, G, a, b) -> None:
        if not self.mixed:
            G.addmm_(a, b.T)
            return
        for k0 in range(0, a.shape[1], self.span):
            G += a[:, k0 : k0 + self.span] @ b[:, k0 : k0 + self.span].T

    def _to_device(self, x: np.ndarray):
        """``x`` on the device.

        On a GPU a block in one of the page-locked buffers is copied on the copy stream,
        without waiting, into the device buffer paired with it (allocated once per tile,
        on the compute stream, so the GPU memory a tile holds stays what it needs); the
        compute stream waits for the copy, and the copy for the last products that read
        that device buffer (for a fresh buffer, for everything queued before it). Other
        arrays (preprocessed blocks) are copied in turn.
        """
        x = np.ascontiguousarray(x)
        key = _pinned_key(x) if self.cuda else None
        if key is None:
            with self.timer.phase("transfer"):
                return self.torch.from_numpy(x).to(self.device)
        target = self._device_buffer(key, x)
        if key in self._used:
            self._copy_stream.wait_event(self._used[key])
        self._in_use.append(key)
        with self._device_time("transfer", self._copy_stream):
            with self.torch.cuda.stream(self._copy_stream):
                target.copy_(self.torch.from_numpy(x), non_blocking=True)
        done = self.torch.cuda.Event()
        done.record(self._copy_stream)
        self.torch.cuda.current_stream(self.device).wait_event(done)
        self._copied[key] = done
        return target

    def _device_buffer(self, key: str, x: np.ndarray):
        """The device buffer paired with page-locked buffer ``key``, viewed as ``x``."""
        size = x.nbytes
        buf = self._device_bufs.get(key)
        if buf is None or buf.numel() < size:
            buf = self.torch.empty(size, dtype=self.torch.uint8, device=self.device)
            self._device_bufs[key] = buf
            # Fresh memory may be what products queued on the compute stream still read
            # (the caching allocator hands back a stream's freed memory at once): the
            # first copy into it waits for the compute stream.
            self._copy_stream.wait_stream(self.torch.cuda.current_stream(self.device))
        dtype = self.torch.from_numpy(x[:0]).dtype
        return buf[:size].view(dtype).view(x.shape)

    def _device_time(self, phase: str, stream=None):
        """Host time on the CPU device; on a GPU, CUDA events read when the tile is done.

        The events go on ``stream`` (default: the tile's compute stream).
        """
        if not self.cuda:
            return self.timer.phase(phase)
        stream = stream or self.torch.cuda.current_stream(self.device)
        return _EventPair(self.torch, self._events[phase], stream)

    def result(self) -> np.ndarray:
        """The tile in float64 on the host (waits for the device's last product).

        On a GPU it is copied into this process's page-locked result buffer (ten times
        the rate of a copy to fresh memory): valid until the worker's next tile.
        """
        if self.symmetric:
            with self._device_time("product"):
                mirror_upper_blocks(self.torch, self.G, triangle_blocks(self.G.shape[0]))
        if self.cuda:  # the products' time is the events'; the copy back is timed alone
            self.torch.cuda.current_stream(self.device).synchronize()
        with self.timer.phase("transfer"):
            if self.cuda:
                G = _pinned(self.torch, "result", tuple(self.G.shape), np.float64)
                self.torch.from_numpy(G).copy_(self.G)
            else:
                G = self.G.numpy()
        self._host = G
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
            for phase, pairs in self._events.items():
                ms = sum(start.elapsed_time(end) for start, end in pairs)
                self.timer.seconds[phase] += ms / 1000.0
        return G

    def all_finite(self) -> bool:
        """Whether every entry of the tile is finite (after :meth:`result`).

        Checked on the device, where the tile still is, by its smallest and largest
        entries (``torch.aminmax`` propagates NaN; an infinity is one of them): a
        reduction that copies nothing, instead of a pass over the host's copy (0.1-0.2 s
        for a 10,240-row tile). ``torch.isfinite`` would build a float64 copy and three
        masks of the tile's size. Where the device has no memory even for the
        reduction's output, the host's copy is checked.
        """
        if self._host is None:
            raise RuntimeError("all_finite() checks a finished tile: call result() first.")
        try:
            low, high = self.torch.aminmax(self.G)
            return bool(self.torch.isfinite(low) and self.torch.isfinite(high))
        except self.torch.OutOfMemoryError:
            return bool(np.isfinite(self._host).all())


class _EventPair:
    """Records a start and an end CUDA event on ``stream`` around a block."""

    def __init__(self, torch, pairs: list, stream):
        self.torch, self.pairs, self.stream = torch, pairs, stream

    def __enter__(self):
        self.start = self.torch.cuda.Event(enable_timing=True)
        self.start.record(self.stream)
        return self

    def __exit__(self, *exc):
        end = self.torch.cuda.Event(enable_timing=True)
        end.record(self.stream)
        self.pairs.append((self.start, end))
        return False


def mirror_upper_blocks(torch, G, rows: list[tuple[int, int]]) -> None:
    """Copy the upper triangle of the square ``G`` onto its lower one, block by block.

    ``rows`` are the sub-blocks :meth:`TorchProduct.add` computed: the blocks below the
    diagonal become the transposes of those above it, and each diagonal block its own
    upper triangle mirrored, so ``G`` is exactly symmetric.
    """
    for k, (i0, i1) in enumerate(rows):
        D = G[i0:i1, i0:i1]
        D.copy_(torch.triu(D) + torch.triu(D, 1).T)
        for j0, j1 in rows[k + 1 :]:
            G[j0:j1, i0:i1].copy_(G[i0:i1, j0:j1].T)


def _pinned(torch, key: str, shape: tuple[int, int], dtype) -> np.ndarray:
    """A C-ordered ``shape`` view of this process's page-locked buffer ``key``, grown as needed.

    Kept for the worker's later tiles: page-locking is slow (about as slow as reading
    the memory it locks), and a GPU worker's tiles have the same size.
    """

    def page_locked(nbytes: int) -> np.ndarray:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()

    return reused_buffer(_PINNED, key, shape, dtype, page_locked)


def _pinned_key(x: np.ndarray) -> str | None:
    """The page-locked buffer ``x`` lies at the start of, if any (its copy can be async)."""
    start = x.__array_interface__["data"][0]
    for key, buf in _PINNED.items():
        if buf.__array_interface__["data"][0] == start:
            return key
    return None
