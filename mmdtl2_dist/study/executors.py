"""Where a study's trials run: the executors, and what they hand their results to.

The runner (:mod:`mmdtl2_dist.study.runner`) prepares the data, the Grams and the plan,
then gives an executor the trials that have no result yet and a :class:`TrialSink`; the
executor evaluates every (trial, pair, split) unit with
:func:`~mmdtl2_dist.study.trial.run_units` and hands each finished trial's payload
(:func:`~mmdtl2_dist.study.trial.trial_payload`) to the sink, which writes
``<output>/results/<key>.json`` and the trial's MLflow run. Result files, MLflow runs,
resume, report and exit codes are therefore the same whichever executor ran the trials,
and so are the results, bit for bit: the units are the same code on the same plan and
Grams, one BLAS thread each, and a payload puts its units in the plan's order.

Two executors (``mmdtl2 study run --executor``):

- ``local`` (:class:`LocalExecutor`): the units in worker processes of this machine
  (``concurrent.futures``), no Ray at all; the Grams are computed in this process
  (:data:`~mmdtl2_dist.engine.IN_PROCESS`). Seconds to start; the default without
  ``--address``.
- ``ray`` (:class:`~mmdtl2_dist.study.ray_executor.RayTuneExecutor`): each trial a Ray
  Tune trial, on a local Ray or a cluster (``--address``); the Grams on Ray too.

To add an executor, write a class with the methods of :class:`Executor` and name it in
:data:`EXECUTORS`.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import shlex
import signal
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from mmdtl2_dist.store.atomic import write_json_atomic

if TYPE_CHECKING:  # the command line imports this module: no heavy imports at its top
    from mmdtl2_dist.study.spec import StudySpec, TrialSpec

#: ``module:class`` of each executor (imported when chosen: ``ray`` imports Ray).
EXECUTORS = {
    "local": "mmdtl2_dist.study.executors:LocalExecutor",
    "ray": "mmdtl2_dist.study.ray_executor:RayTuneExecutor",
}

#: The signal that stopped the running study (``None`` until one comes) and whether an
#: executor is running trials (then it stops at its next step; see
#: :func:`mmdtl2_dist.study.interrupt.stop_on_signals`). Module state: Tune's stopper
#: finds it by reference.
STOP: dict = {"signum": None, "in_trials": False, "handler": None}


class Executor(Protocol):
    """What the runner needs of an executor."""

    #: ``--executor`` name.
    name: str
    #: The ``address`` the Gram engine gets (:func:`mmdtl2_dist.engine.compute_gram`).
    gram_address: str | None

    def start(self) -> None:
        """Acquire what the trials run on (called once, after the data are checked)."""

    def cpus(self) -> float:
        """CPUs the trials run on (the capacity of the study's CPU accounting)."""

    def run(self, spec: StudySpec, plan_path: str, todo: list[TrialSpec], sink) -> None:
        """Evaluate ``todo`` and hand each finished trial's payload to ``sink``.

        Returns when every trial is done; raises ``KeyboardInterrupt`` once
        ``STOP["signum"]`` is set, and :func:`trials_failed` when trials failed.
        """

    def close(self) -> None:
        """Release what :meth:`start` acquired."""


def missing_trials(output, trials: list) -> list:
    """The trials of ``trials`` with no result file in the study folder ``output``."""
    results = Path(output) / "results"
    return [t for t in trials if not (results / f"{t.key}.json").exists()]


def set_aside_other_data(output, data_fingerprint: str, *, unknown_too: bool) -> int:
    """Move result files computed from other data than ``data_fingerprint`` aside.

    A store re-ingested with other content under the same path gets a new plan (the old
    one names the old store's fingerprint and is refused); the trials' result files of
    the old data would otherwise count as done and enter the report. They go to
    ``results/other_data/<their fingerprint>/``, nothing deleted, and their trials run
    again. A file without a fingerprint (written before payloads carried one) is set
    aside too, to ``other_data/unknown/``, when ``unknown_too``: the plan was just drawn,
    so nothing says which data it came from; under a plan read back and checked against
    the store it is this data's. Returns how many were moved.
    """
    results = Path(output) / "results"
    moved = 0
    for path in sorted(results.glob("*.json")) if results.is_dir() else ():
        try:
            payload = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # unreadable: the report names it
        theirs = payload.get("data_fingerprint") if isinstance(payload, dict) else None
        if theirs == data_fingerprint or (theirs is None and not unknown_too):
            continue
        name = str(theirs) if theirs is not None and str(theirs).isalnum() else "unknown"
        aside = results / "other_data" / name
        aside.mkdir(parents=True, exist_ok=True)
        os.replace(path, aside / path.name)
        moved += 1
    return moved


def make_executor(name: str, *, address: str | None, num_cpus: int | None) -> Executor:
    """The executor ``name`` (``local`` or ``ray``).

    Raises
    ------
    ValueError
        An unknown name, or ``--address`` with the local executor.
    """
    if name not in EXECUTORS:
        raise ValueError(f"unknown executor {name!r}; choose one of {sorted(EXECUTORS)}.")
    module, cls = EXECUTORS[name].split(":")
    return getattr(importlib.import_module(module), cls)(address=address, num_cpus=num_cpus)


def default_executor(address: str | None) -> str:
    """``ray`` when a Ray cluster address is given, else ``local``."""
    return "local" if address is None else "ray"


def trials_failed(errors: list[str], output: Path) -> RuntimeError:
    """The error of a run whose trials failed (the finished ones are kept)."""
    return RuntimeError(
        f"{len(errors)} trial(s) failed; the first error: {errors[0]}. Fix the cause and "
        f"run `mmdtl2 study resume {shlex.quote(str(output))}`."
    )


class TrialSink:
    """Receives trials in the driver: result file, MLflow run, progress line.

    Progress counts fits (trials x units): finished trials count whole, running ones by
    the fraction of their units done that the executor last reported (:meth:`running`).
    Built from plain values so that it can live inside a pickled Tune callback (Tune
    stores the run config, callbacks included). An empty ``tracker_cfg`` logs nothing to
    MLflow.
    """

    def __init__(
        self,
        output: str,
        tracker_cfg: dict,
        tags: dict,
        total: int,
        progress: bool | None,
        units: int = 1,
    ):
        self.output, self.tracker_cfg, self.tags = output, tracker_cfg, tags
        self.total, self.progress, self.units = total, progress, units
        self._tracker = None
        self._running: dict[str, float] = {}
        self._bar = self._new_bar()  # the clock starts with the trials

    def __getstate__(self):
        return {**self.__dict__, "_tracker": None, "_bar": None, "_running": {}}

    @property
    def tracker(self):
        from mmdtl2_dist.study.tracking import StudyTracker

        if self._tracker is None and self.tracker_cfg:
            self._tracker = StudyTracker(**self.tracker_cfg)
        return self._tracker

    def _finished(self) -> int:
        return len(list((Path(self.output) / "results").glob("*.json")))

    def _new_bar(self):
        from mmdtl2_dist.progress import Progress

        return Progress(
            "study",
            self.total * self.units,
            unit="fits",
            enabled=self.progress,
            done=self._finished() * self.units,
        )

    @property
    def bar(self):
        if self._bar is None:  # unpickled
            self._bar = self._new_bar()
        return self._bar

    def _fits_done(self) -> int:
        running = sum(self._running.values())
        return min(round((self._finished() + running) * self.units), self.total * self.units)

    def running(self, key: str, fraction: float) -> None:
        """A running trial has done this fraction of its units."""
        self._running[key] = float(fraction)
        self.bar.update(self._fits_done())

    def __call__(self, payload: dict) -> None:
        results = Path(self.output) / "results"
        results.mkdir(parents=True, exist_ok=True)
        path = results / f"{payload['key']}.json"
        fresh = not path.exists()
        if fresh:
            write_json_atomic(path, payload)
        self._running.pop(payload["key"], None)
        if self.tracker is not None:
            self.tracker.log_trial(payload, self.tags)
        if fresh:
            self.bar.update(
                self._fits_done(),
                f"[{self._finished()}/{self.total} trials] {payload['label']} "
                f"n={payload['n_per_class']}: accuracy {100 * payload['accuracy']:.2f} ± "
                f"{100 * payload['accuracy_std']:.2f} % (std over {len(payload['units'])} "
                f"fits), fits {payload['solver_s']:.1f} CPU-s in {payload['wall_s']:.1f} s",
                force=True,
            )


# -- the local executor -----------------------------------------------------------------


def _init_worker(driver: int) -> None:
    """Set up a local worker: one BLAS thread, as Ray gives a one-CPU trial.

    Ctrl-C is the driver's to handle: it stops the workers itself. A worker whose
    driver has died (SIGKILL, out of memory) exits within a second instead of waiting
    for work forever.
    """
    # threadpool_limits limits only the BLAS libraries loaded: numpy's, and scipy's own
    # (scipy's wheels bring a second OpenBLAS, which the pool's eigendecomposition uses)
    import numpy  # noqa: F401
    import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_limits

    from mmdtl2_dist.lifecycle import when_parent_is_gone

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threadpool_limits(1)
    when_parent_is_gone(driver, lambda: os._exit(1), "mmdtl2-worker-driver-watch")


def _unit_task(plan_path: str, trial: dict, unit: tuple[int, int]) -> tuple:
    """One unit in a worker: ``(pid, start, end, result)`` (epoch seconds)."""
    from mmdtl2_dist.study.trial import run_units

    t0 = time.time()
    result = run_units(plan_path, trial, [unit])[0]
    return os.getpid(), t0, time.time(), result


class _TrialParts:
    """The units of one trial as they come back from the workers."""

    def __init__(self, trial: dict, n_units: int):
        self.trial, self.n_units = trial, n_units
        self.results: list[dict] = []
        self.pids: set[int] = set()
        self.t_start, self.t_end = float("inf"), 0.0
        self.failed = False

    def add(self, pid: int, t0: float, t1: float, result: dict) -> bool:
        """Add a unit; whether the trial is complete."""
        self.results.append(result)
        self.pids.add(pid)
        self.t_start, self.t_end = min(self.t_start, t0), max(self.t_end, t1)
        return len(self.results) == self.n_units

    def timing(self) -> dict:
        return {
            "wall_s": self.t_end - self.t_start,
            "t_start": self.t_start,
            "t_end": self.t_end,
            "cpus": len(self.pids),
        }


class LocalExecutor:
    """Every unit of every trial as a task of a pool of worker processes on this machine.

    Units, not whole trials, are the tasks, so the workers stay busy until the last unit
    whatever the trials' sizes (``[execution]`` settings are the Ray executor's and are
    not used here). Trials are queued longest first, so they finish one after the other
    and each is written as soon as its last unit is in. Workers are started with
    ``spawn`` (the driver holds Zarr's and MLflow's threads, which a fork would copy in
    whatever state they are) and run with one BLAS thread.
    """

    name = "local"

    def __init__(self, *, address: str | None, num_cpus: int | None):
        if address is not None:
            raise ValueError(
                f"--address {address} names a Ray cluster, and the local executor runs "
                "without Ray; add --executor ray, or leave out --address."
            )
        if num_cpus is not None and num_cpus < 1:
            raise ValueError(f"--num-cpus must be at least 1, got {num_cpus}.")
        self.workers = num_cpus or os.cpu_count() or 1

    @property
    def gram_address(self) -> str:
        """The Grams are computed in this process, without Ray."""
        from mmdtl2_dist.engine import IN_PROCESS

        return IN_PROCESS

    def start(self) -> None:
        """Nothing to start before the trials (the pool starts with them)."""

    def cpus(self) -> float:
        return float(self.workers)

    def close(self) -> None:
        """The pool is closed by :meth:`run`."""

    def run(self, spec: StudySpec, plan_path: str, todo: list[TrialSpec], sink) -> None:
        from mmdtl2_dist.study.trial import all_units, load_plan

        plan = load_plan(plan_path)
        units = all_units(plan)
        parts = {t.key: _TrialParts(t.to_dict(), len(units)) for t in todo}
        known = set(multiprocessing.active_children())
        pool = ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(os.getpid(),),
        )
        futures = {
            pool.submit(_unit_task, plan_path, parts[t.key].trial, u): t.key
            for t in todo
            for u in units
        }
        STOP["in_trials"] = True
        try:
            errors = self._collect(plan, futures, parts, sink)
        except BaseException:
            _stop_pool(pool, known)
            raise
        finally:
            STOP["in_trials"] = False
        pool.shutdown()
        if errors:
            raise trials_failed(errors, spec.output)

    def _collect(self, plan, futures: dict, parts: dict, sink) -> list[str]:
        """Hand each trial to the sink once its last unit is in; the failed trials' errors."""
        from mmdtl2_dist.study.trial import trial_payload

        errors = []
        while futures:
            done, _ = wait(futures, timeout=0.5, return_when=FIRST_COMPLETED)
            if STOP["signum"] is not None:
                raise KeyboardInterrupt  # see study.interrupt.stop_on_signals
            for fut in done:
                part = parts[futures.pop(fut)]
                if part.failed or fut.cancelled():
                    continue
                exc = fut.exception()
                if exc is not None:
                    part.failed = True
                    errors.append(f"{part.trial['label']}: {type(exc).__name__}: {exc}")
                    _cancel_trial(futures, parts, part)
                elif part.add(*fut.result()):
                    sink(trial_payload(plan, part.trial, part.results, part.timing()))
                else:
                    sink.running(part.trial["key"], len(part.results) / part.n_units)
        return errors


def _cancel_trial(futures: dict, parts: dict, part: _TrialParts) -> None:
    """Cancel the queued units of a failed trial (its running ones finish, unused)."""
    for fut, key in futures.items():
        if parts[key] is part:
            fut.cancel()


def _stop_pool(pool: ProcessPoolExecutor, known: set) -> None:
    """Stop a pool at once: drop queued tasks, terminate the workers it started."""
    pool.shutdown(wait=False, cancel_futures=True)
    workers = [p for p in multiprocessing.active_children() if p not in known]
    for p in workers:
        p.terminate()
    for p in workers:
        p.join(timeout=10)
