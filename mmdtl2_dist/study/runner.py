"""Run, resume and report a study (the driver side).

``run_study``:

1. prepares the data (the given store, or builds the bundled / synthetic one in
   ``<output>/data``), validates the spec against it;
2. finds each feature space's Gram in the store's Gram folder (``[data] gram_dir``,
   default ``<store>.grams`` beside the store; :mod:`mmdtl2_dist.engine.location`), keyed
   by the store's content, the space and the preprocessing: a Gram that ``mmdtl2 gram``
   or another study computed is reused, else the engine computes it there **once**;
3. draws the splits and writes the plan (``<output>/plan.json`` + ``plan.npz``, data
   only: :mod:`mmdtl2_dist.study.plan`) — trials only read it;
4. hands every trial (method configuration x samples per class) that has no result yet
   to an executor (:mod:`mmdtl2_dist.study.executors`: worker processes of this machine,
   or Ray Tune on a local Ray or a cluster); each finished trial is written to
   ``<output>/results/<key>.json`` and logged to MLflow from the driver;
5. writes the report (``<output>/report``) and logs it to the parent MLflow run.

Steps 1-3 are :mod:`mmdtl2_dist.study.preparation`. Before step 2 (and before any
executor starts), the spec is checked against the store's metadata
(:func:`~mmdtl2_dist.study.preparation.check_data`); ``mmdtl2 study validate`` runs the
same check.

``resume_study`` runs the trials that have no result file yet: a trial is done when
``<output>/results/<key>.json`` exists, so nothing of an executor's own state (Ray Tune
would unpickle its experiment state) is ever read back, and a study begun on one
executor can be resumed on the other. Result files and MLflow runs are keyed by the
trial key, so nothing is lost or duplicated. SIGINT or SIGTERM stops a study cleanly
(:mod:`mmdtl2_dist.study.interrupt`): finished trials are kept and ``resume`` goes on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from mmdtl2_dist.progress import say
from mmdtl2_dist.store.atomic import remove_temporaries, write_json_atomic
from mmdtl2_dist.store.outputs import make_output_folder
from mmdtl2_dist.study.executors import (
    Executor,
    TrialSink,
    default_executor,
    make_executor,
    missing_trials,
    set_aside_other_data,
)
from mmdtl2_dist.study.folder import refuse_if_running, study_folder_lock
from mmdtl2_dist.study.interrupt import reclaim_signals, stop_on_signals
from mmdtl2_dist.study.plan import (
    PLAN_FILE,
    STATE_FILE,
    StudyPlan,
)
from mmdtl2_dist.study.preparation import (
    check_data,
    compute_grams,
    gram_provenance,
    prepare_data,
    study_plan,
    unlabelled_notes,
)
from mmdtl2_dist.study.report import write_report
from mmdtl2_dist.study.spec import StudySpec, load_spec, parse_spec
from mmdtl2_dist.study.timing import study_timing, timing_line


def tracker_config(
    spec: StudySpec, uri: str | None, class_names: dict[str, str] | None = None
) -> dict:
    """Arguments of the study's :class:`StudyTracker` (plain values).

    The tracking URI is ``uri`` (``--tracking-uri``), else the spec's ``[tracking] uri``,
    else ``sqlite:///<output>/mlflow.db`` (worked out from the folder where it is now).
    The environment's ``MLFLOW_TRACKING_URI`` is not read: a study is run, resumed,
    reported and registered from one store without it.
    """
    from mmdtl2_dist.study.tracking import default_tracking_uri

    uri = uri or spec.tracking_uri or default_tracking_uri(spec.output)
    art = None
    if uri.startswith("sqlite:") or uri.startswith("file:"):
        art = (spec.output / "mlartifacts").resolve().as_uri()
    return {
        "tracking_uri": uri,
        "experiment": spec.experiment or f"mmdtl2-{spec.name}",
        "study_name": spec.name,
        "spec_fingerprint": spec.fingerprint(),
        "artifact_location": art,
        "class_names": class_names,
    }


def _tracker(spec: StudySpec, uri: str | None):
    from mmdtl2_dist.study.tracking import StudyTracker

    return StudyTracker(**tracker_config(spec, uri))


def _write_state(spec: StudySpec, extra: dict) -> None:
    path = spec.output / STATE_FILE
    state = json.loads(path.read_text()) if path.exists() else {}
    state.update(
        {
            "spec_path": str(spec.path) if spec.path else None,
            "raw": spec.raw,
            "spec_fingerprint": spec.fingerprint(),
            "output": str(spec.output),
            **extra,
        }
    )
    write_json_atomic(path, state, indent=1, default=str)


def load_state_spec(output: str | Path) -> StudySpec:
    """The spec of an existing study folder (for resume and report)."""
    out = Path(output).expanduser().resolve()
    path = out / STATE_FILE
    if not path.exists():
        refuse_if_running(out)  # a first run has the folder, and no state file yet
        raise FileNotFoundError(
            f"{out} is not a study folder (no {STATE_FILE}); pass the "
            "folder that `mmdtl2 study run` wrote (its --output)."
        )
    state = json.loads(path.read_text())
    sp = Path(state["spec_path"]) if state.get("spec_path") else None
    return parse_spec(state["raw"], sp, output=out)


def run_study(
    spec: StudySpec | str | Path,
    *,
    resume: bool = False,
    executor: str | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
    tracking_uri: str | None = None,
    track: bool = True,
    progress: bool | None = None,
    max_trials: int | None = None,
) -> dict:
    """Run (or resume) a study end to end; return the report dict.

    ``spec.output`` must be missing, an empty directory or this study's folder; a folder
    holding anything else is refused before anything is written there.

    Parameters
    ----------
    spec : StudySpec or path
        The study.
    resume : bool
        Continue the study in ``spec.output`` (after an interruption); a run does the
        same, since both run only the trials that have no result yet.
    executor : {"local", "ray"}, optional
        Where the trials run (:mod:`mmdtl2_dist.study.executors`); default ``ray`` when
        ``address`` is given, else ``local``. Both give the same results, bit for bit,
        and either can resume a study the other began.
    address : str, optional
        Ray cluster address (``ray`` executor); default a local Ray (or the running
        session).
    num_cpus : int, optional
        CPUs of a new local Ray, or worker processes of the local executor (default:
        all CPUs).
    tracking_uri : str, optional
        MLflow tracking URI (default ``sqlite:///<output>/mlflow.db``).
    track : bool
        Log the study to MLflow; result files and the report are written either way.
    progress : bool or None
        Progress lines on stderr (:mod:`mmdtl2_dist.progress`); ``None``: when stderr is a
        terminal.
    max_trials : int, optional
        Stop after this many new trials (for tests and benchmarks of interruption).

    Raises
    ------
    ValueError
        The spec does not fit its data (:func:`check_data`), before any executor starts;
        an unknown executor, or ``address`` with the local one.
    StudyInterrupted
        SIGINT or SIGTERM stopped the study; no report is written, finished trials are
        kept for ``study resume``.
    """
    if not isinstance(spec, StudySpec):
        spec = load_spec(spec)
    runner = make_executor(
        executor or default_executor(address), address=address, num_cpus=num_cpus
    )
    with stop_on_signals(spec), study_folder_lock(spec):
        return _run_study(
            spec,
            runner,
            tracking_uri=tracking_uri,
            track=track,
            progress=progress,
            max_trials=max_trials,
        )


def _checked_data(spec: StudySpec, progress: bool | None) -> tuple[Path, Path | None]:
    """Check the study folder's state and the spec against its data (seconds, no compute)."""
    out = spec.output
    state_path = out / STATE_FILE
    if state_path.exists():
        old = json.loads(state_path.read_text())
        if old.get("spec_fingerprint") != spec.fingerprint():
            raise ValueError(
                f"{out} holds another study (its spec changed); choose another "
                "--output or delete the folder."
            )
    store, split_file = prepare_data(spec)
    pairs = check_data(spec, store, split_file)  # before the executor and the Gram (hours)
    for note in unlabelled_notes(pairs):
        say(progress, note)
    return store, split_file


def _run_study(
    spec: StudySpec,
    executor: Executor,
    *,
    tracking_uri: str | None,
    track: bool,
    progress: bool | None,
    max_trials: int | None,
) -> dict:
    t_start = time.perf_counter()
    store, split_file = _checked_data(spec, progress)
    stages = {"executor": executor.name, "data_check_s": time.perf_counter() - t_start}
    make_output_folder(spec.output, spec.output)
    for folder in (spec.output, spec.output / "results", spec.output / "data"):
        remove_temporaries(folder)  # writes a killed run stopped before their rename
    _write_state(spec, {})
    executor.start()
    reclaim_signals()
    stages["executor_start_s"] = time.perf_counter() - t_start - stages["data_check_s"]
    try:
        rep = _run_started(
            spec,
            executor,
            store,
            split_file,
            stages,
            tracking_uri=tracking_uri,
            track=track,
            progress=progress,
            max_trials=max_trials,
        )
    finally:
        executor.close()
    stages["study_wall_s"] = rep["timing"]["study_wall_s"] = time.perf_counter() - t_start
    _write_state(spec, {"last_run": stages})
    say(progress, "study: " + timing_line(rep["timing"], stages))
    return rep


def _run_started(
    spec: StudySpec,
    executor: Executor,
    store: Path,
    split_file: Path | None,
    stages: dict,
    *,
    tracking_uri: str | None,
    track: bool,
    progress: bool | None,
    max_trials: int | None,
) -> dict:
    """The study once its executor has started: Grams, plan, trials, report."""
    t0 = time.perf_counter()
    grams = compute_grams(spec, store, address=executor.gram_address, progress=progress)
    stages["data_and_gram_s"] = time.perf_counter() - t0 + stages.pop("data_check_s")
    provenance = gram_provenance(grams)
    _write_state(spec, {"grams": provenance})
    plan_path = spec.output / PLAN_FILE
    drawn = not plan_path.exists()
    plan = study_plan(spec, store, split_file, grams, plan_path)
    moved = set_aside_other_data(spec.output, plan.data_fingerprint, unknown_too=drawn)
    if moved:
        say(
            progress,
            f"study: {moved} trial results from other data than {store} moved to "
            f"{spec.output / 'results' / 'other_data'}; those trials run again",
        )
    trials = spec.trials()
    n_units = sum(len(p.splits) for p in plan.pairs)
    tracker, sink = _tracking(spec, plan, provenance, tracking_uri, track, progress)
    say(
        progress,
        f"study {spec.name!r}: {len(trials)} trials x {n_units} fits ({len(plan.pairs)} "
        f"pairs) on the {executor.name} executor; output {spec.output}",
    )
    t1, stages["trials_t0"] = time.perf_counter(), time.time()
    try:
        _run_trials(
            spec, executor, plan_path, trials, sink, max_trials=max_trials, progress=progress
        )
        stages["trials_wall_s"] = time.perf_counter() - t1
        stages["trials_t1"], stages["cpus"] = time.time(), executor.cpus()
        t2 = time.perf_counter()
        rep = report_study(spec, tracker=tracker, progress=progress, timing=stages, log=track)
    except BaseException as exc:
        _end_parent_run(tracker, exc)
        raise
    if rep.get("missing") and tracker is not None:  # stopped early (max_trials)
        tracker.set_parent_status("KILLED")
    stages["report_s"] = time.perf_counter() - t2
    return rep


def _end_parent_run(tracker, exc: BaseException) -> None:
    """Mark the study's MLflow run stopped (KILLED) or failed, not left RUNNING."""
    if tracker is None:
        return
    stopped = isinstance(exc, KeyboardInterrupt)  # StudyInterrupted (a signal) is one too
    try:
        tracker.set_parent_status("KILLED" if stopped else "FAILED")
    except Exception:  # noqa: BLE001 - the store may be what failed; the study's error matters
        pass


def _tracking(
    spec: StudySpec,
    plan: StudyPlan,
    provenance: dict,
    uri: str | None,
    track: bool,
    progress: bool | None,
) -> tuple:
    """The study's MLflow tracker (``None`` when not tracking) and its trial sink."""
    total, units = len(spec.trials()), sum(len(p.splits) for p in plan.pairs)
    if not track:
        return None, TrialSink(str(spec.output), {}, {}, total, progress, units)
    from mmdtl2_dist.store.feature_store import FeatureStore, extraction_tags
    from mmdtl2_dist.study.tracking import class_names

    fs = FeatureStore.open(plan.pairs[0].store)
    names = class_names(fs.metadata)
    tcfg = tracker_config(spec, uri, names)
    tracker = _tracker(spec, uri)
    tracker.supersede_other_data(plan.data_fingerprint)
    tags = {
        "split_seed": str(spec.seed),
        "data_fingerprint": plan.data_fingerprint,
        "code_version": _code_version(),
        "study": spec.name,
        **extraction_tags(fs.provenance),
    }
    tracker.log_parent(
        params={**_flat_params(spec), **{f"gram.{s}": g["key"] for s, g in provenance.items()}},
        tags={**tags, **{f"gram_path.{s}": g["path"] for s, g in provenance.items()}},
        files=[spec.path] if spec.path else [],
    )
    tracker.set_parent_status("RUNNING")  # a resume of a stopped study: running again
    return tracker, TrialSink(str(spec.output), tcfg, tags, total, progress, units)


_COST_RANK = {
    "coral_svm": 0,
    "mmdt_hoffman": 1,
    "mmdtl2": 2,
    "mmdt": 3,
    "sa_svm": 4,
    "kmm_svm": 5,
    "source_svm": 6,
    "target_svm": 7,
}


def _run_trials(
    spec: StudySpec,
    executor: Executor,
    plan_path: Path,
    trials: list,
    sink: TrialSink,
    *,
    max_trials: int | None,
    progress: bool | None,
) -> None:
    """Run the trials that have no result file yet on the executor.

    A trial is done when ``<output>/results/<key>.json`` exists, so a run, a resume
    and a run on another executor all pick up where the last one stopped.
    """
    missing = missing_trials(spec.output, trials)
    # Longest first (a rough per-method cost rank), so that on few CPUs a slow trial does
    # not start last and run alone; the report keeps the spec's column order.
    todo = sorted(missing, key=lambda t: _COST_RANK.get(t.config.method, 9))
    if max_trials is not None:
        todo = todo[:max_trials]
    if len(missing) < len(trials):
        say(
            progress,
            f"study: {len(trials) - len(missing)} of {len(trials)} trials already done, kept",
        )
    if todo:
        executor.run(spec, str(plan_path), todo, sink)


def _code_version() -> str:
    from mmdtl2_dist.study.tracking import code_version

    return code_version()


def _flat_params(spec: StudySpec) -> dict:
    out = {}

    def walk(prefix, v):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}" if prefix else k, x)
        elif prefix != "methods":
            out[prefix] = json.dumps(v) if isinstance(v, list) else v

    walk("", {k: v for k, v in spec.raw.items() if k != "methods"})
    out["methods"] = json.dumps([m.label for m in spec.methods])
    return out


def resume_study(output: str | Path, **kwargs) -> dict:
    """Resume the study in folder ``output`` (see :func:`run_study`)."""
    return run_study(load_state_spec(output), resume=True, **kwargs)


def load_payloads(spec: StudySpec) -> tuple[list[dict], list[str]]:
    """Trial payloads present in ``<output>/results``, and keys of missing trials."""
    found, missing = [], []
    for t in spec.trials():
        p = spec.output / "results" / f"{t.key}.json"
        if p.exists():
            found.append(json.loads(p.read_text()))
        else:
            missing.append(t.key)
    return found, missing


def report_study(
    spec: StudySpec | str | Path,
    *,
    tracker=None,
    tracking_uri: str | None = None,
    progress: bool = True,
    timing: dict | None = None,
    log: bool = True,
) -> dict:
    """Write the report of a (finished or partial) study and log it to MLflow.

    Parameters
    ----------
    spec : StudySpec, or a study folder
        The study.
    tracker : StudyTracker, optional
        Reuse an open tracker.
    log : bool
        Log the report to the parent MLflow run.
    """
    if not isinstance(spec, StudySpec):
        spec = load_state_spec(spec)
    payloads, missing = load_payloads(spec)
    if not payloads:
        began = (spec.output / STATE_FILE).is_file()
        fix = f"continue it with `mmdtl2 study resume {spec.output}`" if began else (
            "run `mmdtl2 study run` first")  # fmt: skip
        raise ValueError(f"no finished trials in {spec.output}; {fix}.")
    if timing is None:
        st = spec.output / STATE_FILE
        timing = json.loads(st.read_text()).get("last_run", {}) if st.exists() else {}
    timing = study_timing(payloads, dict(timing))
    title = f"Study {spec.name}" + (
        f" (incomplete: {len(missing)} trials missing)" if missing else ""
    )
    order = [c.label for c in spec.configs()]
    rep = write_report(
        payloads,
        spec.output / "report",
        title=title,
        ref_source=spec.reference_source,
        ref_target=spec.reference_target,
        label_order=order,
        timing=timing,
    )
    if log:
        if tracker is None:
            tracker = _tracker(spec, tracking_uri)
        tracker.log_parent(
            metrics={k: v for k, v in timing.items() if isinstance(v, int | float)},
            files=rep["files"],
            finished=not missing,
        )
        rep["tracking_uri"] = tracker.uri
        rep["experiment"] = tracker.experiment
    rep["missing"] = missing
    rep["timing"] = timing
    return rep
