"""The engine's tasks run in this process, without Ray: ``compute_gram(address=IN_PROCESS)``.

The driver talks to Ray through six calls (``remote(fn).options(...)``, ``.remote(...)``,
``put``, ``wait``, ``get``, ``cancel``). :class:`InProcessTasks` answers the same calls
by running each task in this process when the driver waits for it, one at a time and
in submission order, so the driver has one code path and the Gram has the same bits as
on Ray (the tasks are the same functions, and every sum has a fixed order whatever runs
it). A task's exception reaches the driver as it was raised.

This is for data that one machine computes in seconds (the Office-Caltech10 Gram is
2,533 x 2,533 from 800 features): no Ray start, no worker processes, the BLAS threads of
this process. Large Grams belong on Ray, whose tasks run in parallel and survive a dead
worker.
"""

from __future__ import annotations

from collections.abc import Callable

from mmdtl2_dist.engine.products import release_scratch

#: The ``address`` of :func:`mmdtl2_dist.engine.compute_gram` that runs its tasks here.
IN_PROCESS = "in-process"


class _NeverRaised(Exception):
    """Stands for Ray's task-error wrapper: in-process tasks raise their own errors."""


class _Exceptions:
    RayTaskError = _NeverRaised


class _Ref:
    """A submitted task: runs once, when the driver first waits for it.

    An argument that is another task's ref is replaced by that task's result (run
    first if needed), as Ray hands a task the results of the tasks it depends on.
    """

    def __init__(self, fn: Callable, args: tuple):
        self.fn, self.args = fn, args
        self.done, self.value = False, None

    def run(self) -> None:
        if not self.done:
            args = [_result(a) if isinstance(a, _Ref) else a for a in self.args]
            self.value = self.fn(*args)
            self.done = True


def _result(ref: _Ref):
    ref.run()
    return ref.value


class _Remote:
    def __init__(self, fn: Callable):
        self.fn = fn

    def options(self, **_ray_options) -> _Remote:
        return self

    def remote(self, *args) -> _Ref:
        return _Ref(self.fn, args)


class InProcessTasks:
    """The part of Ray's API the Gram driver uses, answered in this process."""

    exceptions = _Exceptions

    def remote(self, fn: Callable) -> _Remote:
        return _Remote(fn)

    def put(self, value):
        return value

    def wait(self, refs: list[_Ref], num_returns: int = 1, timeout: float | None = None):
        """Run the first ``num_returns`` pending tasks; ``(ready, not ready)``."""
        ready = refs[:num_returns]
        for ref in ready:
            ref.run()
        return ready, refs[num_returns:]

    def get(self, ref: _Ref):
        ref.run()
        return ref.value

    def cancel(self, ref: _Ref) -> None:
        """Nothing to stop: a task runs only while the driver waits for it."""

    def shutdown(self) -> None:
        """Free the scratch buffers the tiles kept in this thread: the job is done."""
        release_scratch()
