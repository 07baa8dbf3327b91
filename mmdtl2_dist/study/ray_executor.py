"""The Ray Tune executor: each trial a Ray Tune trial, on a local Ray or a cluster.

Each trial (:func:`~mmdtl2_dist.study.trial.tune_trainable`) reports once, at its end,
with its payload; :class:`StudyCallback` hands it to the sink in the driver. Every run
of a study that has trials to do runs the missing ones as a fresh experiment ``tune``,
``tune-1``, ... in the study folder. Nothing of Tune's own experiment state is read
back: ``Tuner.restore`` would unpickle it from the study folder (its ``tuner.pkl`` and
the trials' state), and it would bring nothing more, since a trial keeps no checkpoint
and an unfinished trial starts over either way. ``[execution]`` of the spec sets the
CPUs of a trial, the Ray tasks that share its units (``split_tasks``) and how many
trials run at once.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ray.tune import Callback
from ray.tune.stopper import Stopper

from mmdtl2_dist.study.executors import STOP, trials_failed
from mmdtl2_dist.study.spec import StudySpec, TrialSpec

TUNE_DIR = "tune"


class RayTuneExecutor:
    """Trials as Ray Tune trials; the Grams as Ray tasks of the engine."""

    name = "ray"

    def __init__(self, *, address: str | None, num_cpus: int | None):
        self.address, self.num_cpus = address, num_cpus
        # The engine uses the Ray session that start() connected to.
        self.gram_address = address
        self.ray, self.owned = None, False

    def start(self) -> None:
        """Connect to Ray exactly as the Gram engine does (one place for the init options)."""
        from mmdtl2_dist.engine import ensure_ray

        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        self.ray, self.owned = ensure_ray(self.address, self.num_cpus)

    def cpus(self) -> float:
        return float(self.ray.cluster_resources().get("CPU", 1.0))

    def close(self) -> None:
        if self.owned:
            self.ray.shutdown()
            self.owned = False

    def run(self, spec: StudySpec, plan_path: str, todo: list[TrialSpec], sink) -> None:
        from ray import tune

        tuner = tune.Tuner(
            _trainable(spec),
            param_space={
                "plan_path": plan_path,
                "split_tasks": spec.split_tasks,
                "trial": tune.grid_search([t.to_dict() for t in todo]),
            },
            tune_config=tune.TuneConfig(
                reuse_actors=True,
                trial_dirname_creator=trial_dirname,
                max_concurrent_trials=spec.max_concurrent_trials or None,
            ),
            run_config=tune.RunConfig(
                name=_tune_name(spec.output),
                storage_path=str(spec.output),
                verbose=0,
                callbacks=[StudyCallback(sink)],
                stop=_StopOnSignal(),
            ),
        )
        _fit(tuner, sink, spec.output)


def _trainable(spec: StudySpec):
    from ray import tune

    from mmdtl2_dist.study.trial import tune_trainable

    bundles = [{"CPU": spec.cpus_per_trial}] + [{"CPU": 1.0}] * spec.split_tasks
    return tune.with_resources(tune_trainable, tune.PlacementGroupFactory(bundles))


class _QuietAfterStop(logging.Filter):
    """Drop Tune's "Failed to fetch metrics" list once a signal stopped the trials.

    The trials it names are those stopped before their first result, run again on resume.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return STOP["signum"] is None or not record.getMessage().startswith("Failed to fetch")


def _fit(tuner, sink, out: Path) -> None:
    STOP["in_trials"] = True
    quiet = _QuietAfterStop()
    analysis = logging.getLogger("ray.tune.analysis.experiment_analysis")
    analysis.addFilter(quiet)
    try:
        grid = tuner.fit()
    finally:
        STOP["in_trials"] = False
        analysis.removeFilter(quiet)
    for r in grid:  # results the callback missed (e.g. the driver died right after)
        if r.metrics and "payload" in r.metrics:
            sink(json.loads(r.metrics["payload"]))
    if STOP["signum"] is not None:
        raise KeyboardInterrupt  # trials stopped by a signal; see study.interrupt.stop_on_signals
    errors = [str(e) for e in grid.errors]
    if errors:
        raise trials_failed(errors, out)


def _tune_name(out: Path) -> str:
    """A new experiment name in ``out``: ``tune``, else ``tune-1``, ``tune-2``, ..."""
    name, k = TUNE_DIR, 0
    while (out / name).exists():
        k += 1
        name = f"{TUNE_DIR}-{k}"
    return name


class _StopOnSignal(Stopper):
    """Ends the Tune experiment once SIGINT or SIGTERM has come (see ``executors.STOP``)."""

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        return STOP["signum"] is not None


def trial_dirname(trial) -> str:
    """Short Tune trial folder names (the default spells out the whole config)."""
    return f"trial_{trial.trial_id}"


class StudyCallback(Callback):
    """Hands each trial's progress and final result to the sink, in the driver."""

    def __init__(self, sink):
        self.sink = sink

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if "payload" in result:
            self.sink(json.loads(result["payload"]))
        elif "trial_progress" in result:
            self.sink.running(trial.config["trial"]["key"], result["trial_progress"])
