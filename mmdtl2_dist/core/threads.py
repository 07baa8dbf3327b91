"""One BLAS/OpenMP thread inside the library's compute entry points.

A fit is a long sequence of small dense operations: eigen-decompositions of the ``M x M``
target kernel, Cholesky factors of QP active sets of a few hundred variables, Grams of a
few hundred samples, coordinate-descent sweeps. A multi-threaded BLAS adds a
synchronisation to each of them and, on a machine whose cores are busy, its spinning
threads compete with the work. ``benchmarks/bench_threads.py`` measures it on a shared
2-core machine (load average 11-28 throughout, from other jobs): the README's first
estimator fit (230 Office-Caltech10 samples) took 7-21 s with one thread and more than
300 s with the default two. The largest products the library forms in memory were no
case for more threads there either: the kernel between 30 training targets and a batch of
4,000 samples to score (L = 4,096) took 1.7-2.4 times as long with two threads, the Gram
of 2,000 such samples 1.5 times as long, or 10 % less with CPU burners on both cores. On an
idle many-core machine such products could gain up to the core count, but the product
parallelises across processes instead (Ray workers, the Office-Caltech10 runner's worker
processes), one per core, where it scales without oversubscription.

So every entry point (estimator ``fit``/``predict``/``transform``, the Gram-form
:func:`~mmdtl2_dist.core.methods.fit_predict`,
:func:`~mmdtl2_dist.core.selection.select_by_cv`,
:func:`~mmdtl2_dist.core.mmdtl2.fit_mmdtl2_gram` and the deployed adapter's scoring) is
decorated with :func:`one_thread`: while it runs, the BLAS and OpenMP pools are limited to
one thread (``threadpoolctl``), and the previous limits come back when it returns. Nested
entry points (an estimator's ``fit`` calling the core) share the outermost limit. The limit
only ever lowers a setting: a user's ``OMP_NUM_THREADS=1`` or ``threadpool_limits(...)``
around the call stays in force.

Threads: the BLAS thread count is one setting for the whole process (an OpenBLAS built on
pthreads, as in numpy's and scipy's wheels, has one pool), so the limit is held by a
process-wide count of the entry points running in any Python thread: the first one sets
it, the last one to return restores it. ``threadpoolctl`` lets one Python thread at a time
change an OpenBLAS pool (the others' requests are ignored); the limit releases that control
right after each change, so the next change can come from any thread, and a user's
``threadpool_limits`` held in another thread keeps control and wins. While a fit runs,
code in other threads of the process sees one BLAS thread as well. Without
``threadpoolctl`` (a deployed model's numpy-only environment) nothing is limited.
"""

from __future__ import annotations

import functools
import sys
import threading
from contextlib import contextmanager

_lock = threading.Lock()
_running = 0  # entry points running in this process, in any Python thread
_limiter = None  # threadpoolctl's limiter while _running > 0
_controller = None
_modules_seen = -1


def _thread_controller():
    """A cached ``ThreadpoolController`` (None without threadpoolctl); call under ``_lock``.

    Building one inspects every loaded shared library (milliseconds, more than scoring a
    small batch). A controller only knows the libraries loaded when it was built, and new
    BLAS/OpenMP libraries arrive with imports, so it is rebuilt when ``sys.modules`` grew.
    """
    global _controller, _modules_seen
    if _controller is None or len(sys.modules) != _modules_seen:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # numpy-only deployment: leave the pools as they are
            return None
        _controller, _modules_seen = ThreadpoolController(), len(sys.modules)
    return _controller


def _release_control() -> None:
    """Give up this thread's control of OpenBLAS's pool, if it took it (threadpoolctl ≥ 3.6)."""
    import threadpoolctl

    openblas = getattr(threadpoolctl, "OpenBLASController", None)
    clear = getattr(openblas, "clear_controlling_thread", None)
    if clear is not None:
        clear()


@contextmanager
def _limited():
    """One BLAS/OpenMP thread while any entry point of the process runs."""
    global _running, _limiter
    with _lock:
        if _running == 0:
            controller = _thread_controller()
            if controller is not None:
                _limiter = controller.limit(limits=1)
                _release_control()
        _running += 1
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            if _running == 0 and _limiter is not None:
                _limiter.restore_original_limits()
                _release_control()
                _limiter = None


def one_thread(func):
    """Decorate a compute entry point: it runs with one BLAS/OpenMP thread.

    The undecorated function is ``func.__wrapped__``.
    """

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with _limited():
            return func(*args, **kwargs)

    return wrapper
