"""Running a Gram job's tasks: a bounded number in flight, results in submission order."""

from __future__ import annotations


def run_tasks(ray, submits: list, on_done, max_in_flight: int | None = None) -> list:
    """Run tasks, at most ``max_in_flight`` at once; results in submission order.

    ``submits`` are zero-argument callables that submit one task and return its ref. A
    task's own error is re-raised (not Ray's wrapper) after the others are cancelled.
    """
    limit = len(submits) if max_in_flight is None else max(1, int(max_in_flight))
    results: list = [None] * len(submits)
    queue = list(enumerate(submits))
    pending: dict = {}
    try:
        while queue or pending:
            while queue and len(pending) < limit:
                k, submit = queue.pop(0)
                pending[submit()] = k
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=2.0)
            for ref in ready:
                k = pending.pop(ref)
                results[k] = ray.get(ref)
                on_done(results[k])
            if not ready:
                on_done(None)
    except ray.exceptions.RayTaskError as exc:
        for ref in pending:
            ray.cancel(ref)
        cause = getattr(exc, "cause", None)
        if isinstance(cause, Exception):
            raise cause from None
        raise
    return results
