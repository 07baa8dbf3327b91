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

Before step 2 (and before any executor starts), the spec is checked against the
store's metadata (:func:`check_data`): names of devices and spaces, class sets, and
splits that can hold the requested labelled samples and a test set; ``mmdtl2 study
validate`` runs the same check.

``resume_study`` runs the trials that have no result file yet: a trial is done when
``<output>/results/<key>.json`` exists, so nothing of an executor's own state (Ray Tune
would unpickle its experiment state) is ever read back, and a study begun on one
executor can be resumed on the other. Result files and MLflow runs are keyed by the
trial key, so nothing is lost or duplicated. SIGINT or SIGTERM stops a study cleanly
(:class:`StudyInterrupted`): finished trials are kept and ``resume`` goes on from there.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mmdtl2_dist.progress import say
from mmdtl2_dist.store.outputs import OutputKind, claim_output
from mmdtl2_dist.study.data import (
    build_office_caltech_store,
    make_synthetic,
    pair_name,
    read_split_file,
    write_hoffman_split_file,
)
from mmdtl2_dist.study.executors import (
    STOP,
    Executor,
    TrialSink,
    default_executor,
    make_executor,
)
from mmdtl2_dist.study.plan import (
    PLAN_FILE,
    PairPlan,
    StudyPlan,
    load_plan,
    plan_error,
    save_plan,
)
from mmdtl2_dist.study.report import write_report
from mmdtl2_dist.study.spec import StudySpec, load_spec, parse_spec
from mmdtl2_dist.study.splits import (
    Split,
    check_disjoint,
    draw_splits,
    fixed_splits,
    labelled_subset,
)

STATE_FILE = "study.json"
STUDY_OUTPUT = OutputKind(
    "study folder", is_dir=True, recognise=lambda path: (path / STATE_FILE).is_file()
)


# -- data -------------------------------------------------------------------------------


def prepare_data(spec: StudySpec, data_dir: Path | None = None) -> tuple[Path, Path | None]:
    """The feature store and split file of a study (building bundled/synthetic data).

    Bundled and synthetic data are built in ``data_dir`` (default ``<output>/data``); a
    given store is used where it is, and nothing is written.
    """
    data_dir = spec.output / "data" if data_dir is None else data_dir
    split_file = spec.split_file
    if spec.builtin == "office_caltech10":
        data_dir.mkdir(parents=True, exist_ok=True)
        store = build_office_caltech_store(data_dir / "office_caltech10.zarr")
        if spec.protocol == "fixed" and split_file is None:
            split_file = write_hoffman_split_file(data_dir / "hoffman_splits.json")
    elif spec.synthetic is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        store = make_synthetic(data_dir / "synthetic.zarr", spec.synthetic)
    else:
        store = spec.store
    return store, split_file


def resolve_pairs(spec: StudySpec, fs) -> list[tuple[str, str]]:
    """The device pairs of the study, checked against the store."""
    for space in {spec.source_space, spec.target_space}:
        if space not in fs.spaces:
            raise ValueError(
                f"the feature store has no space {space!r}; it has {fs.spaces}. "
                "Fix source_space/target_space in [data]."
            )
    src_devs, tgt_devs = fs.devices_in(spec.source_space), fs.devices_in(spec.target_space)
    if spec.pairs == "all":
        pairs = [(s, t) for s in src_devs for t in tgt_devs if s != t]
        if not pairs:
            raise ValueError('pairs = "all" found no two devices; list pairs explicitly.')
        return pairs
    for s, t in spec.pairs:
        if s not in src_devs:
            raise ValueError(
                f"device {s!r} has no features in {spec.source_space!r}; devices "
                f"there: {src_devs}. Fix [data] pairs."
            )
        if t not in tgt_devs:
            raise ValueError(
                f"device {t!r} has no features in {spec.target_space!r}; devices "
                f"there: {tgt_devs}. Fix [data] pairs."
            )
    return list(spec.pairs)


def compute_grams(
    spec: StudySpec, store: Path, *, address: str | None, progress: bool | None
) -> dict[str, str]:
    """The Gram of each feature space of the study: reused if present, else computed."""
    from mmdtl2_dist.engine import compute_gram

    out = {}
    for space in dict.fromkeys([spec.source_space, spec.target_space]):
        t0 = time.perf_counter()
        g = compute_gram(
            store,
            space,
            gram_dir=spec.gram_dir,
            preprocessing=spec.preprocessing,
            precision=spec.gram_precision,
            address=address,
            progress=progress,
        )
        how = "reused" if g.reused else f"computed ({g.last_run['computed']} tiles)"
        say(
            progress,
            f"study: Gram of {space!r} ({g.n} samples) {how} in "
            f"{time.perf_counter() - t0:.1f} s: {g.path}",
        )
        out[space] = str(g.path)
    return out


def gram_provenance(grams: dict[str, str]) -> dict[str, dict]:
    """Key, folder and store fingerprint of each Gram of a study (state and MLflow)."""
    from mmdtl2_dist.engine import GramStore

    out = {}
    for space, path in grams.items():
        g = GramStore.open(path)
        out[space] = {"key": g.key, "path": path, "store_fingerprint": g.job["store_fingerprint"]}
    return out


@dataclass(frozen=True)
class PairSplits:
    """The splits of one device pair, drawn from the store's metadata alone."""

    source: str
    target: str
    y_source: np.ndarray
    y_target: np.ndarray
    splits: list[Split]


def _check_classes(name: str, devices: tuple[str, str], ys: np.ndarray, yt: np.ndarray) -> None:
    """Every sample labelled, and the same classes on both devices of a pair."""
    for dev, y in zip(devices, (ys, yt), strict=True):
        if (y < 0).any():
            raise ValueError(
                f"device {dev!r} has unlabelled samples (label -1); a study "
                "needs labels for every sample of its devices."
            )
    s, t = devices
    lacks = [
        f"classes {sorted(set(a.tolist()) - set(b.tolist()))} of {da!r} have no {db!r} sample"
        for da, a, db, b in ((t, yt, s, ys), (s, ys, t, yt))
        if set(a.tolist()) - set(b.tolist())
    ]
    if lacks:
        raise ValueError(
            f"{name}: both devices must have the same classes, but " + "; ".join(lacks) + ". "
            "Give both devices the same class labels at ingest, or leave the pair out of "
            "[data] pairs."
        )


def _groups(spec: StudySpec, pair: tuple[str, str], ms, mt) -> tuple:
    """Group identifiers of both devices for protocol ``group`` (else ``None``s)."""
    if spec.protocol != "group":
        return None, None
    groups = ms["group"].to_numpy(str), mt["group"].to_numpy(str)
    for dev, g in zip(pair, groups, strict=True):
        if (g == "").any():
            raise ValueError(
                f"protocol 'group' needs the group column of device "
                f"{dev!r}, which is empty; fill it at ingest or use "
                "protocol 'half'."
            )
    return groups


def _draw_pair(
    spec: StudySpec, split_file: Path | None, pair: tuple[str, str], ys, yt, groups
) -> list[Split]:
    """The splits of one pair (drawn, or read from the split file), unchecked."""
    if spec.protocol == "fixed":
        name = pair_name(*pair)
        entries = read_split_file(split_file, name)
        if len(entries) < spec.n_splits:
            raise ValueError(
                f"{name}: the split file has {len(entries)} splits but "
                f"n_splits = {spec.n_splits}; lower n_splits."
            )
        return fixed_splits(
            entries[: spec.n_splits], seed=spec.seed, pair=pair, n_source=ys.size, n_target=yt.size
        )
    return draw_splits(
        ys,
        yt,
        n_splits=spec.n_splits,
        seed=spec.seed,
        pair=pair,
        protocol=spec.protocol,
        train_fraction=spec.train_fraction,
        groups_source=groups[0],
        groups_target=groups[1],
        source_per_class=spec.source_per_class,
    )


def _check_splits(spec: StudySpec, name: str, splits: list[Split], yt, groups_t) -> None:
    """Disjoint splits with training samples, a test set and enough labelled samples."""
    for sp in splits:
        check_disjoint(sp, groups_t)
        if sp.source_train.size == 0:
            raise ValueError(
                f"{name}: split {sp.index} has no source training sample; raise "
                "train_fraction or fix the split file."
            )
        if sp.target_test.size == 0:
            raise ValueError(
                f"{name}: split {sp.index} has no target test sample (each target class "
                "has too few samples or groups to leave one for testing); lower "
                "train_fraction, add target samples, or fix the split file."
            )
        try:
            labelled_subset(sp, yt, max(spec.samples_per_class))
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from exc


def pair_splits(spec: StudySpec, fs, split_file: Path | None) -> list[PairSplits]:
    """Draw (or read) and check the splits of every pair, from the store's metadata only.

    No feature is read and no Ray is needed, so this runs before any compute (``study
    validate``, and the start of ``study run``) and fails in seconds on a spec that
    the data cannot serve.

    Raises
    ------
    ValueError
        Naming the pair, split and class, and the fix: an unknown space or device, an
        unlabelled sample, a class on one device only, too few splits in the split file,
        an empty group column, a split with no source training or no target test sample,
        a class with fewer target training samples than the largest
        ``samples_per_class``.
    """
    meta = fs.metadata
    out = []
    for s, t in resolve_pairs(spec, fs):
        ms = meta[(meta.device == s) & (meta.space == spec.source_space)].sort_values("row")
        mt = meta[(meta.device == t) & (meta.space == spec.target_space)].sort_values("row")
        ys, yt = ms["label"].to_numpy(np.int64), mt["label"].to_numpy(np.int64)
        name = pair_name(s, t)
        _check_classes(name, (s, t), ys, yt)
        groups = _groups(spec, (s, t), ms, mt)
        splits = _draw_pair(spec, split_file, (s, t), ys, yt, groups)
        _check_splits(spec, name, splits, yt, groups[1])
        out.append(PairSplits(s, t, ys, yt, splits))
    return out


def check_data(spec: StudySpec, store: Path, split_file: Path | None) -> list[PairSplits]:
    """Check the spec against the store's metadata (see :func:`pair_splits`)."""
    from mmdtl2_dist.store.feature_store import FeatureStore

    return pair_splits(spec, FeatureStore.open(store), split_file)


def validate_data(spec: StudySpec) -> str:
    """What ``study validate`` checks of the data: one line, or a ``ValueError``.

    A given store is checked where it is. The bundled data set is built in a temporary
    folder (a second or two) and checked there. Synthetic data are generated by ``study
    run`` itself, which checks them before Ray starts; an already generated store is
    checked.
    """
    import tempfile

    if spec.synthetic is not None and not (spec.output / "data" / "synthetic.zarr").exists():
        return "data: synthetic, generated and checked by `mmdtl2 study run` before Ray starts"
    with tempfile.TemporaryDirectory(prefix="mmdtl2-validate-") as tmp:
        store, split_file = prepare_data(spec, Path(tmp) if spec.builtin else None)
        pairs = check_data(spec, store, split_file)
    return (
        f"data: {len(pairs)} device pair(s) x {spec.n_splits} splits checked against the "
        f"store; each split holds {max(spec.samples_per_class)} labelled target samples "
        "per class and a test set"
    )


def build_plan(
    spec: StudySpec, store: Path, split_file: Path | None, grams: dict[str, str]
) -> StudyPlan:
    """Draw (or read) the splits of every pair and map device rows to Gram rows."""
    from mmdtl2_dist.engine import GramStore
    from mmdtl2_dist.store.feature_store import FeatureStore

    fs = FeatureStore.open(store)
    gs_src, gs_tgt = (
        GramStore.open(grams[spec.source_space]),
        GramStore.open(grams[spec.target_space]),
    )
    shared = spec.shared_space
    pairs = [
        PairPlan(
            name=pair_name(p.source, p.target),
            source=p.source,
            target=p.target,
            source_gram=grams[spec.source_space],
            target_gram=grams[spec.target_space],
            shared=shared,
            source_rows=gs_src.rows(p.source),
            target_rows=gs_tgt.rows(p.target),
            target_rows_in_source=gs_src.rows(p.target) if shared else None,
            y_source=p.y_source,
            y_target=p.y_target,
            splits=p.splits,
            store=str(store),
            source_space=spec.source_space,
            target_space=spec.target_space,
        )
        for p in pair_splits(spec, fs, split_file)
    ]
    return StudyPlan(spec.fingerprint(), fs.fingerprint, spec.seed, pairs)


def _study_plan(
    spec: StudySpec, store: Path, split_file: Path | None, grams: dict[str, str], path: Path
) -> StudyPlan:
    """The study's plan: drawn and written once, later read back and checked against this run.

    A plan read back must name this spec, this store (its content fingerprint) and this
    study's Gram stores; trials read exactly what it names.
    """
    from mmdtl2_dist.store.feature_store import FeatureStore

    if not path.exists():
        plan = build_plan(spec, store, split_file, grams)
        save_plan(plan, path)
        return plan
    plan = load_plan(path)
    named = {g for p in plan.pairs for g in (p.source_gram, p.target_gram)}
    if plan.spec_fingerprint != spec.fingerprint():
        raise plan_error(path, "it was drawn for another spec")
    if plan.data_fingerprint != FeatureStore.open(store).fingerprint:
        raise plan_error(path, f"it was drawn from other data than the store {store}")
    if any(p.store != str(store) for p in plan.pairs) or not named <= set(grams.values()):
        raise plan_error(path, "it names a store or Gram stores other than this study's")
    return plan


# -- signals ----------------------------------------------------------------------------


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_TUNE_SIGINT_ENV = "TUNE_DISABLE_SIGINT_HANDLER"


class StudyInterrupted(KeyboardInterrupt):
    """A study stopped by SIGINT or SIGTERM; its finished trials are kept for a resume.

    ``exit_code`` is the shell's ``128 + signal number``: 130 for SIGINT (Ctrl-C), 143 for
    SIGTERM.
    """

    def __init__(self, signum: int, spec: StudySpec):
        trials = spec.trials()
        self.signum = int(signum)
        self.output = spec.output
        self.total = len(trials)
        self.done = self.total - len(_missing(spec, trials))
        super().__init__(
            f"stopped by {signal.Signals(self.signum).name} with {self.done} of "
            f"{self.total} trials done (kept in {self.output / 'results'})"
        )

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def resumable(self) -> bool:
        """Whether ``study resume`` can continue it (the stop came after the data check)."""
        return (self.output / STATE_FILE).exists()


def _reclaim_signals() -> None:
    """Put the study's signal handlers back after an executor started.

    Ray's core worker installs its own SIGTERM handler in the driver, which logs and
    aborts, so a SIGTERM would leave neither a resume hint nor an exit status of 143.
    """
    if STOP["handler"] is not None:
        for s in _STOP_SIGNALS:
            signal.signal(s, STOP["handler"])


@contextmanager
def _stop_on_signals(spec: StudySpec):
    """While a study runs, SIGINT and SIGTERM stop it cleanly and raise StudyInterrupted.

    The first signal is recorded (``executors.STOP``). While an executor runs trials, it
    then stops at its next step (Tune ends the experiment; the local executor stops its
    workers), so the driver is never stopped halfway through writing a result file or an
    MLflow run (running trials are dropped and run again on resume); anywhere else it
    raises ``KeyboardInterrupt`` at once (the Gram resumes from its finished tiles). A
    second signal always raises at once. Tune's own SIGINT handler, which stops quietly
    and returns as if the run had finished, is turned off so that one handler sees every
    signal. Outside the main thread no handler can be installed and signals keep their
    default effect.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    STOP.update(signum=None, in_trials=False)

    def on_signal(signum, frame):
        first = STOP["signum"] is None
        if first:
            STOP["signum"] = signum
        if not (first and STOP["in_trials"]):
            raise KeyboardInterrupt

    STOP["handler"] = on_signal
    saved = {s: signal.signal(s, on_signal) for s in _STOP_SIGNALS}
    env = os.environ.get(_TUNE_SIGINT_ENV)
    os.environ[_TUNE_SIGINT_ENV] = "1"
    try:
        yield
    except KeyboardInterrupt:
        raise StudyInterrupted(STOP["signum"] or signal.SIGINT, spec) from None
    finally:
        STOP["handler"] = None
        for s, handler in saved.items():
            signal.signal(s, handler)
        if env is None:
            os.environ.pop(_TUNE_SIGINT_ENV, None)
        else:
            os.environ[_TUNE_SIGINT_ENV] = env


# -- entry points -----------------------------------------------------------------------


def tracker_config(
    spec: StudySpec, uri: str | None, class_names: dict[str, str] | None = None
) -> dict:
    """Arguments of the study's :class:`StudyTracker` (plain values)."""
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
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, default=str))
    tmp.replace(path)


def load_state_spec(output: str | Path) -> StudySpec:
    """The spec of an existing study folder (for resume and report)."""
    out = Path(output).expanduser().resolve()
    path = out / STATE_FILE
    if not path.exists():
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
    with _stop_on_signals(spec):
        return _run_study(
            spec,
            runner,
            tracking_uri=tracking_uri,
            track=track,
            progress=progress,
            max_trials=max_trials,
        )


def _checked_data(spec: StudySpec) -> tuple[Path, Path | None]:
    """Claim the study folder and check the spec against its data (seconds, no compute)."""
    out = spec.output
    state_path = out / STATE_FILE
    claim_output(out, STUDY_OUTPUT, overwrite=None)  # continue our own study, touch nothing else
    if state_path.exists():
        old = json.loads(state_path.read_text())
        if old.get("spec_fingerprint") != spec.fingerprint():
            raise ValueError(
                f"{out} holds another study (its spec changed); choose another "
                "--output or delete the folder."
            )
    store, split_file = prepare_data(spec)
    check_data(spec, store, split_file)  # before the executor and the Gram (hours)
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
    store, split_file = _checked_data(spec)
    stages = {"executor": executor.name, "data_check_s": time.perf_counter() - t_start}
    spec.output.mkdir(parents=True, exist_ok=True)
    _write_state(spec, {})
    executor.start()
    _reclaim_signals()
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
    plan = _study_plan(spec, store, split_file, grams, plan_path)
    trials = spec.trials()
    n_units = sum(len(p.splits) for p in plan.pairs)
    tracker, sink = _tracking(spec, plan, provenance, tracking_uri, track, progress)
    say(
        progress,
        f"study {spec.name!r}: {len(trials)} trials x {n_units} fits ({len(plan.pairs)} "
        f"pairs) on the {executor.name} executor; output {spec.output}",
    )
    t1, stages["trials_t0"] = time.perf_counter(), time.time()
    _run_trials(spec, executor, plan_path, trials, sink, max_trials=max_trials, progress=progress)
    stages["trials_wall_s"] = time.perf_counter() - t1
    stages["trials_t1"], stages["cpus"] = time.time(), executor.cpus()
    t2 = time.perf_counter()
    rep = report_study(spec, tracker=tracker, progress=progress, timing=stages, log=track)
    stages["report_s"] = time.perf_counter() - t2
    return rep


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


def _missing(spec: StudySpec, trials: list) -> list:
    results = spec.output / "results"
    return [t for t in trials if not (results / f"{t.key}.json").exists()]


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
    missing = _missing(spec, trials)
    # Longest first (a rough per-method cost rank), so that on few CPUs a slow trial does
    # not start last and run alone; the report keeps the spec's column order.
    todo = sorted(missing, key=lambda t: _COST_RANK.get(t.config.method, 9))
    if max_trials is not None:
        todo = todo[:max_trials]
    if not todo:
        return
    if len(missing) < len(trials):
        say(progress, f"study: {len(trials) - len(missing)} trials already done, kept")
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
        raise ValueError(f"no finished trials in {spec.output}; run `mmdtl2 study run` first.")
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


def cpu_accounting(
    intervals: list[tuple[float, float, int]], t0: float, t1: float, cpus: float
) -> dict[str, float]:
    """Split the CPU time of a trial phase into trials running and idle CPUs.

    Parameters
    ----------
    intervals : list of (start, end, cpus)
        Epoch seconds of each trial and the CPUs it holds.
    t0, t1 : float
        The trial phase (epoch seconds).
    cpus : float
        CPUs of the cluster.

    Returns
    -------
    dict
        ``capacity_cpu_s`` (``cpus * (t1 - t0)``) = ``in_trials_cpu_s`` (CPUs held by
        running trials) + ``scheduling_idle_cpu_s`` (idle while some trial had not
        started yet: the executor's start-up (Ray Tune and its actors, or worker
        processes), result handling and driver-side MLflow logging) +
        ``tail_idle_cpu_s`` (idle after the last trial started: too few trials left to
        fill the CPUs, i.e. load imbalance).
    """
    last_start = max((a for a, _, _ in intervals), default=t0)
    edges = sorted({t0, t1, *(min(max(x, t0), t1) for a, b, _ in intervals for x in (a, b))})
    held = sched = tail = 0.0
    for a, b in zip(edges[:-1], edges[1:], strict=False):
        mid = 0.5 * (a + b)
        busy = min(float(sum(c for s, e, c in intervals if s <= mid < e)), cpus)
        held += busy * (b - a)
        idle = (cpus - busy) * (b - a)
        if mid < last_start:
            sched += idle
        else:
            tail += idle
    return {
        "capacity_cpu_s": cpus * (t1 - t0),
        "in_trials_cpu_s": held,
        "scheduling_idle_cpu_s": sched,
        "tail_idle_cpu_s": tail,
    }


def study_timing(payloads: list[dict], timing: dict) -> dict:
    """Timings of a study: its stages, and where the CPU time of the trial phase went.

    ``solver_cpu_s`` is the sum of the method fits (what the study is for),
    ``gram_slicing_cpu_s`` the sum of loading and slicing cached Gram blocks, and
    ``trial_other_cpu_s`` the rest of the CPU time held by trials (per-trial set-up, and
    CPUs of a trial waiting for its slowest share). Everything else is framework or
    scheduling: see :func:`cpu_accounting`. ``solver_share`` is ``solver_cpu_s`` over
    ``capacity_cpu_s``.
    """
    out = {
        "trials": len(payloads),
        "fits": sum(len(p["units"]) for p in payloads),
        "solver_cpu_s": float(sum(p["solver_s"] for p in payloads)),
        "gram_slicing_cpu_s": float(sum(p.get("slice_s", p.get("load_s", 0.0)) for p in payloads)),
    }
    t0, t1, cpus = timing.get("trials_t0"), timing.get("trials_t1"), timing.get("cpus")
    if t0 and t1 and cpus:
        # Only trials of this run's trial phase (a resumed study also holds older ones).
        mine = [p for p in payloads if "t_start" in p and t0 - 1 <= p["t_start"] <= t1]
        acc = cpu_accounting(
            [(p["t_start"], p["t_end"], int(p.get("cpus", 1))) for p in mine], t0, t1, cpus
        )
        solver = float(sum(p["solver_s"] for p in mine))
        slicing = float(sum(p.get("slice_s", 0.0) for p in mine))
        acc["trials_this_run"] = len(mine)
        acc["solver_cpu_s_this_run"] = solver
        acc["gram_slicing_cpu_s_this_run"] = slicing
        acc["trial_other_cpu_s"] = max(acc["in_trials_cpu_s"] - solver - slicing, 0.0)
        acc["solver_share"] = solver / acc["capacity_cpu_s"] if acc["capacity_cpu_s"] else 0.0
        out.update(acc)
    return {**{k: v for k, v in timing.items() if k not in ("trials_t0", "trials_t1")}, **out}


def timing_line(t: dict, stages: dict) -> str:
    """One line of the study's timing for the progress output."""
    line = (
        f"{stages.get('study_wall_s', 0):.0f} s wall ({stages.get('executor', '?')} executor "
        f"start {stages.get('executor_start_s', 0):.0f} s, data + Gram "
        f"{stages.get('data_and_gram_s', 0):.0f} s, trials {stages.get('trials_wall_s', 0):.0f}"
        f" s, report {stages.get('report_s', 0):.0f} s)"
    )
    if "capacity_cpu_s" in t:
        line += (
            f"; trial phase {t['capacity_cpu_s']:.0f} CPU-s = fits {t['solver_cpu_s_this_run']:.0f}"
            f" + Gram slicing {t['gram_slicing_cpu_s_this_run']:.0f} + other in-trial "
            f"{t['trial_other_cpu_s']:.0f} + scheduling idle {t['scheduling_idle_cpu_s']:.0f}"
            f" + tail idle {t['tail_idle_cpu_s']:.0f}"
        )
    return line
