"""Choose a study's configuration and fit the adapter to deploy on all its labelled data.

A study evaluates configurations on random splits; the adapter that goes to the device-B
workstation is fitted once more, with the chosen configuration, on **every** labelled
sample of the pair's source device (source space) and target device (target space), with
the study's per-device preprocessing (statistics over all samples of each device, as in
the study; see :mod:`mmdtl2_dist.core.preprocessing`).

The configuration is, by default, the recommended one: MMDTL2 with ``select="auto"``
(:mod:`mmdtl2_dist.core.auto`; the rule chooses the prior on the pair's own labelled
samples, with every target sample of the device, labelled or not, in the prior's pool,
and self-trains on the unlabelled ones);
or the study's best trial by a named metric (its MLflow child runs, found by the study's
spec fingerprint); or explicit parameters. Only
methods whose fitted state is an :class:`~mmdtl2_dist.core.adapter.AdapterState` can be
deployed: ``mmdtl2`` and ``mmdt`` (MMDTL2 with ``c_f = 1``, ``c_d = 0``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DEPLOYABLE = ("mmdtl2", "mmdt")


@dataclass(frozen=True)
class StudyHandle:
    """A finished (or partial) study: its spec, feature store and MLflow experiment."""

    spec: object  # mmdtl2_dist.study.spec.StudySpec
    store: Path
    tracking_uri: str
    experiment: str

    @property
    def folder(self) -> Path:
        return self.spec.output


@dataclass
class ChosenConfig:
    """The configuration to deploy and what the study measured for it.

    Attributes
    ----------
    method : str
        ``mmdtl2`` or ``mmdt``.
    params : dict
        Parameters as the spec writes them (``"auto"`` for a data-driven gamma).
    select : dict or str
        Cross-validation grid, or ``"auto"`` (the frozen rule); chosen again, on all
        labelled target samples, at fit time.
    selected_by : str
        ``"best trial by <metric>"`` or ``"explicit parameters"``.
    label, trial_key, run_id : str or None
        The trial the configuration was taken from (best-trial mode), else None.
    metric, metric_value : str, float or None
        The ranking metric and the chosen trial's value of it.
    study_accuracy : dict
        ``{n_per_class: {"accuracy": ..., "accuracy_std": ..., "<metric>": ...}}`` of
        every finished trial of this configuration (empty if the study never ran it).
    data_fingerprint : str or None
        The feature-store fingerprint the study's trials were run on.
    """

    method: str
    params: dict
    select: dict | str
    selected_by: str
    label: str | None = None
    trial_key: str | None = None
    run_id: str | None = None
    metric: str | None = None
    metric_value: float | None = None
    n_per_class: int | None = None
    study_accuracy: dict = field(default_factory=dict)
    data_fingerprint: str | None = None


def open_study(folder: str | Path, tracking_uri: str | None = None) -> StudyHandle:
    """Open a study folder written by ``mmdtl2 study run``.

    The tracking URI is ``tracking_uri``, else the study's own
    (:func:`~mmdtl2_dist.study.runner.tracker_config`), as ``study run`` chose it.
    """
    from mmdtl2_dist.study.runner import load_state_spec, prepare_data, tracker_config

    spec = load_state_spec(folder)
    cfg = tracker_config(spec, tracking_uri)
    store, _ = prepare_data(spec)
    return StudyHandle(spec, Path(store), cfg["tracking_uri"], cfg["experiment"])


def study_pairs(handle: StudyHandle) -> list[tuple[str, str]]:
    """The study's (source, target) device pairs, checked against its store."""
    from mmdtl2_dist.store.feature_store import FeatureStore
    from mmdtl2_dist.study.preparation import resolve_pairs

    return resolve_pairs(handle.spec, FeatureStore.open(handle.store))


def choose_pair(handle: StudyHandle, pair: str | None) -> tuple[str, str]:
    """The (source, target) devices: ``pair`` (``"SRC->TGT"``) or the study's only pair."""
    pairs = study_pairs(handle)
    names = [f"{s}->{t}" for s, t in pairs]
    if pair is None:
        if len(pairs) != 1:
            raise ValueError(
                f"the study has {len(pairs)} device pairs; choose one with --pair (one of {names})."
            )
        return pairs[0]
    pair = "->".join(part.strip() for part in pair.split("->"))  # 'a -> b' is 'a->b'
    if pair not in names:
        raise ValueError(
            f"pair {pair!r} is not in the study; its pairs are {names}.{_redirect_hint(pair)}"
        )
    return pairs[names.index(pair)]


def _redirect_hint(pair: str) -> str:
    """A hint when the shell took ``>`` of an unquoted ``--pair SRC->TGT`` as a redirection."""
    if not pair.endswith("-"):
        return ""
    return (
        f" The shell read the '>' of an unquoted --pair {pair}>TARGET as a redirection (and"
        " may have created an empty file named after the target device in this folder):"
        f" quote the pair, --pair '{pair}>TARGET'."
    )


def pair_metric(source: str, target: str) -> str:
    """The MLflow metric of a trial's mean accuracy on one pair."""
    from mmdtl2_dist.study.tracking import metric_key

    return f"accuracy_pair/{metric_key(f'{source}->{target}')}"


def _trial_runs(handle: StudyHandle) -> list:
    from mlflow.tracking import MlflowClient

    from mmdtl2_dist.study.tracking import FINGERPRINT_TAG, ROLE_TAG

    client = MlflowClient(tracking_uri=handle.tracking_uri)
    exp = client.get_experiment_by_name(handle.experiment)
    if exp is None:
        raise ValueError(
            f"no MLflow experiment {handle.experiment!r} at {handle.tracking_uri}; run the "
            "study first, or, if `study run` was given --tracking-uri, pass the same one "
            "(MLFLOW_TRACKING_URI is not read for a study)."
        )
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=(
            f"tags.{ROLE_TAG} = 'trial' and tags.{FINGERPRINT_TAG} = "
            f"'{handle.spec.fingerprint()}' and attributes.status = 'FINISHED'"
        ),
        max_results=50_000,
    )
    from mmdtl2_dist.store.feature_store import FeatureStore

    fp = FeatureStore.open(handle.store).fingerprint  # not the runs of a replaced store
    return [r for r in runs if r.data.tags.get("data_fingerprint", fp) == fp]


def _trials_by_key(handle: StudyHandle) -> dict:
    return {t.key: t for t in handle.spec.trials()}


def _accuracy_table(runs: list, keys: set[str], metric: str | None) -> dict:
    from mmdtl2_dist.study.tracking import KEY_TAG

    table = {}
    for r in runs:
        if r.data.tags.get(KEY_TAG) in keys:
            m = r.data.metrics
            row = {k: m[k] for k in ("accuracy", "accuracy_std") if k in m}
            if metric and metric in m:
                row[metric] = m[metric]
            table[int(r.data.params.get("n_per_class", -1))] = row
    return dict(sorted(table.items()))


def best_trial(
    handle: StudyHandle, metric: str, *, label: str | None = None, pair_metric_name=None
) -> ChosenConfig:
    """The deployable trial with the highest ``metric`` (ties: fewer labelled samples).

    Parameters
    ----------
    metric : str
        An MLflow metric of the trial runs, e.g. ``accuracy`` or
        ``accuracy_pair/amazon_to_webcam``.
    label : str, optional
        Restrict to one method column of the study (its label, grid point included).
    """
    from mmdtl2_dist.study.tracking import KEY_TAG

    if metric.endswith("_std"):
        raise ValueError(
            f"--metric {metric} is a standard deviation over splits, not a score to maximise; "
            "choose accuracy or an accuracy_pair/<pair> metric."
        )
    trials = _trials_by_key(handle)
    runs = _trial_runs(handle)
    cands = []
    for r in runs:
        t = trials.get(r.data.tags.get(KEY_TAG))
        if t is None or t.config.method not in DEPLOYABLE:
            continue
        if label is not None and label not in (t.config.label, t.config.base_label):
            continue
        if metric in r.data.metrics:
            cands.append((r, t))
    if not cands:
        labels = sorted({t.config.label for t in trials.values() if t.config.method in DEPLOYABLE})
        have = sorted(
            {k for r in runs for k in r.data.metrics
             if k.startswith("accuracy") and not k.endswith("_std")}
        )  # fmt: skip
        raise ValueError(
            f"no finished {'/'.join(DEPLOYABLE)} trial of study {handle.spec.name!r} has metric "
            f"{metric!r}"
            + (f" and label {label!r}" if label else "")
            + f". Deployable labels: {labels}; accuracy metrics: {have}. "
            "Run (or resume) the study, or fix --metric/--label."
        )
    run, trial = max(cands, key=lambda rt: (rt[0].data.metrics[metric], -rt[1].n_per_class))
    same = {t.key for t in trials.values() if t.config.label == trial.config.label}
    return ChosenConfig(
        method=trial.config.method,
        params=dict(trial.config.params),
        select=_select_copy(trial.config.select),
        selected_by=f"best trial by {metric}",
        label=trial.config.label,
        trial_key=trial.key,
        run_id=run.info.run_id,
        metric=metric,
        metric_value=float(run.data.metrics[metric]),
        n_per_class=trial.n_per_class,
        study_accuracy=_accuracy_table(runs, same, pair_metric_name),
        data_fingerprint=run.data.tags.get("data_fingerprint"),
    )


def _select_copy(select) -> dict | str:
    """A selection as a configuration keeps it: ``"auto"``, or a copy of the grid."""
    return select if isinstance(select, str) else dict(select or {})


def _full_params(method: str, params: dict) -> dict:
    from mmdtl2_dist.core.methods import default_params
    from mmdtl2_dist.core.params import check_names
    from mmdtl2_dist.study.spec import core_params

    check_names(method, params)
    return {**default_params(method), **core_params(params)}


def explicit_config(
    handle: StudyHandle,
    method: str,
    params: dict,
    select: dict | str | None = None,
    pair_metric_name: str | None = None,
    selected_by: str = "explicit parameters",
) -> ChosenConfig:
    """A configuration given by the user (``select``: a grid, or ``"auto"``).

    The study's results for it are attached if the study ran the same method with the
    same (default-completed) parameters and selection.
    """
    from mmdtl2_dist.study.spec import check_param

    if method not in DEPLOYABLE:
        raise ValueError(f"method {method!r} cannot be deployed; choose one of {DEPLOYABLE}.")
    _check_selection(method, params, select)
    grid = select if isinstance(select, dict) else {}
    for k, v in {**params, **{k: v[0] for k, v in grid.items() if v}}.items():
        check_param("--param", method, k, v)
    full = _full_params(method, params)
    trials = _trials_by_key(handle)
    same = {
        t.key
        for t in trials.values()
        if t.config.method == method
        and _full_params(method, t.config.params) == full
        and (t.config.select or {}) == (select or {})
    }
    runs = _trial_runs(handle) if same else []
    fps = {r.data.tags.get("data_fingerprint") for r in runs}
    return ChosenConfig(
        method=method,
        params=dict(params),
        select=_select_copy(select),
        selected_by=selected_by,
        study_accuracy=_accuracy_table(runs, same, pair_metric_name),
        data_fingerprint=next(iter(fps)) if len(fps) == 1 else None,
    )


def _check_selection(method: str, params: dict, select) -> None:
    """``select="auto"`` is MMDTL2's rule, which sets its prior, weight and ``c_f``."""
    from mmdtl2_dist.core.auto import check_auto_request

    if select == "auto":
        check_auto_request(method, params, "--select auto", "the --param options")


def recommended_config(handle: StudyHandle, pair_metric_name: str | None = None) -> ChosenConfig:
    """The recommended configuration, the default of ``mmdtl2 register``.

    MMDTL2 with ``select="auto"``, with the study's accuracy for it if the study ran it.
    """
    from mmdtl2_dist.core.auto import AUTO_RULE

    return explicit_config(
        handle, "mmdtl2", {}, "auto", pair_metric_name,
        selected_by=f"recommended configuration (select='auto', rule {AUTO_RULE})",
    )  # fmt: skip


@dataclass
class FittedAdapter:
    """The estimator fitted for deployment and what it was trained on."""

    estimator: object  # mmdtl2_dist.estimators.MMDTL2
    source: str
    target: str
    class_names: list[str]
    n_source: int
    n_target: int
    store_fingerprint: str
    full_params: dict
    selected_params: dict
    example: np.ndarray
    n_unlabelled_target: int = 0
    auto: dict | None = None  # select="auto": the rule, its pick and pool size


def _device_data(fs, device: str, space: str, unlabelled: bool = False):
    """Features, labels and metadata of one device's labelled samples, and the rest.

    With ``unlabelled`` the samples labelled -1 come back apart (features only);
    without it they are refused.
    """
    meta = fs.metadata
    m = meta[(meta.device == device) & (meta.space == space)].sort_values("row")
    y = m["label"].to_numpy(np.int64)
    X = fs.read(device, space).astype(np.float64, copy=False)
    if (y < 0).any() and not unlabelled:
        raise ValueError(
            f"device {device!r} has {int((y < 0).sum())} unlabelled samples (label -1); the "
            "source device's samples must all be labelled (unlabelled samples are used on "
            "the target device only)."
        )
    keep = y >= 0
    return X[keep], y[keep], m[keep], X[~keep]


def _estimator(cfg: ChosenConfig, full: dict, preprocessing: str):
    """The MMDTL2 estimator of a configuration (its grid expanded, or ``"auto"``)."""
    from mmdtl2_dist.core.params import mmdt_as_mmdtl2
    from mmdtl2_dist.estimators import MMDTL2
    from mmdtl2_dist.study.spec import core_params

    select = None
    if cfg.select == "auto":
        select = "auto"
    elif cfg.select:
        from mmdtl2_dist.core.evaluate import expand_grid

        select = [core_params(g) for g in expand_grid({}, cfg.select)]
    if cfg.method == "mmdt":  # MMDTL2 with MMDT's settings, so that it takes unlabelled rows
        full = mmdt_as_mmdtl2(full)
    est_params = {k: v for k, v in full.items() if k in MMDTL2().get_params()}
    return MMDTL2(**est_params, preprocessing=preprocessing, select=select)


def fit_adapter(handle: StudyHandle, pair: tuple[str, str], cfg: ChosenConfig) -> FittedAdapter:
    """Fit ``cfg`` on all samples of ``pair`` (see the module docstring).

    Target samples labelled -1 in the store are given to the estimator as unlabelled
    (its target statistics and, with ``select="auto"``, the prior's pool and the
    self-training step, which adds some of them with pseudo-labels to the final fit).
    """
    from mmdtl2_dist.store.feature_store import FeatureStore

    spec = handle.spec
    fs = FeatureStore.open(handle.store)
    if cfg.data_fingerprint and cfg.data_fingerprint != fs.fingerprint:
        warnings.warn(
            f"the feature store changed since the study ran (fingerprint {fs.fingerprint} "
            f"now, {cfg.data_fingerprint} then); the study's accuracy may not apply.",
            stacklevel=2,
        )
    source, target = pair
    Xs, ys, ms, _ = _device_data(fs, source, spec.source_space)
    Xt, yt, mt, Xu = _device_data(fs, target, spec.target_space, unlabelled=True)
    full = _full_params(cfg.method, cfg.params)
    est = _estimator(cfg, full, spec.preprocessing)
    est.fit_domains(Xs, ys, Xt, yt, Xt_unlabelled=Xu if len(Xu) else None)
    est.adapter_.feature_space = spec.target_space
    names = {}
    for m in (ms, mt):
        for lab, name in zip(m["label"], m["class_name"], strict=True):
            if isinstance(name, str) and name:
                names.setdefault(int(lab), name)
    class_names = [names.get(int(c), str(c)) for c in est.classes_]
    return FittedAdapter(
        estimator=est,
        source=source,
        target=target,
        class_names=class_names,
        n_source=len(ys),
        n_target=len(yt),
        store_fingerprint=fs.fingerprint,
        full_params=full,
        selected_params=dict(getattr(est, "selected_params_", {}) or {}) if cfg.select else {},
        example=Xt[:1].copy(),
        n_unlabelled_target=len(Xu),
        auto=est.auto_,
    )


def study_extractor(handle: StudyHandle, weights: str):
    """The extractor that made the study's target features, with the given weights.

    The store must have been written by ``mmdtl2 extract`` (its provenance names the
    model, layers and preprocessing), and ``weights`` must be the very weights it used
    (same SHA-256): an image-input adapter must compute the features its adapter was
    fitted on.

    Raises
    ------
    ValueError
        If the store has no extraction provenance, or the weights differ.
    """
    from mmdtl2_dist.extract.model import Extractor, ModelSpec, Preprocessing, require_torch
    from mmdtl2_dist.store.feature_store import FeatureStore

    require_torch()
    fs = FeatureStore.open(handle.store)
    prov = fs.provenance.get("extraction")
    if not prov:
        raise ValueError(
            f"the study's feature store {fs.path} was not written by `mmdtl2 extract`, so no "
            "extractor is known for its features; register without --with-extractor (the "
            "adapter takes features), or build the study on a store from `mmdtl2 extract`."
        )
    space = handle.spec.target_space
    layer = next((k for k, v in prov["layers"].items() if v["space"] == space), None)
    if layer is None:
        raise ValueError(f"the store's extraction made no space {space!r}: {prov['layers']}.")
    spec = ModelSpec(prov["model"], (layer,))
    ex = Extractor(spec, weights, Preprocessing.from_dict(prov["preprocessing"]))
    want = prov["weights"]
    if ex.identity.sha256 != want["sha256"]:
        raise ValueError(
            f"--with-extractor {weights}: these weights ({ex.identity.name}, SHA-256 "
            f"{ex.identity.sha256[:16]}...) are not those the study's features were extracted "
            f"with ({want['name']}, SHA-256 {want['sha256'][:16]}...); give those weights."
        )
    ex.identity = type(ex.identity)(want["name"], want["sha256"])
    return ex
