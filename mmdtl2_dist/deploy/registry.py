"""Register a fitted adapter in the MLflow model registry, with its provenance.

Each registration:

1. opens a run ``register <name>`` (tag ``mmdtl2_role = register``) in the study's
   experiment, with the parameters that were fitted;
2. logs the adapter as a pyfunc model in it (:func:`mmdtl2_dist.deploy.pyfunc.log_adapter`)
   and, on request, the explicit transform ``W`` as the run artifact ``W/W.npy``;
3. registers the model under ``name`` (a new version each time: 1, 2, ...), writes what it
   was trained on into the version's tags and description, and points ``alias`` at it.

Registering again creates the next version and moves the alias; earlier versions, their
tags and other aliases are left as they are. Stages are deprecated in MLflow 3: only
aliases are used (``models:/NAME@ALIAS``).

Loading a model (:func:`load_registered_model`, for ``mmdtl2 predict`` and ``mmdtl2
serve``) looks before it touches a store: MLflow opens a SQLite store by creating it, so a
``models:/`` URI looked up in a store that does not exist (MLflow's default is
``mlflow.db`` in the current folder) would leave an empty database behind and then report
only that the model is unknown.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROLE_REGISTER = "register"
MAX_TAG = 5000


@contextmanager
def use_tracking_uri(uri: str | None):
    """Use ``uri`` for tracking and registry inside the block, then restore the old URIs.

    A library call must not change the process-wide URIs for good.
    """
    import mlflow

    if not uri:
        yield
        return
    # set_*_uri export MLFLOW_TRACKING_URI / MLFLOW_REGISTRY_URI, so these variables hold
    # the URIs in force (None: MLflow's default); both are set back, the variables too.
    env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
        mlflow.set_registry_uri(env["MLFLOW_REGISTRY_URI"])
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def tracking_uri_and_origin(tracking_uri: str | None) -> tuple[str, str]:
    """The tracking URI in force and where it comes from (for messages); no side effects."""
    if tracking_uri:
        return tracking_uri, "--tracking-uri"
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"], "MLFLOW_TRACKING_URI"
    import mlflow

    default = "MLflow's default: neither --tracking-uri nor MLFLOW_TRACKING_URI is set"
    return mlflow.get_tracking_uri(), default


def local_store_path(uri: str) -> Path | None:
    """The database file or folder a local store URI names, else None (a server, memory)."""
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///") :].split("?")[0]
        return Path(path) if path and path != ":memory:" else None
    if uri.startswith("file:"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(uri).path))
    if ":" not in uri and uri != "databricks":  # a plain path: MLflow's file store
        return Path(uri)
    return None


def model_store_uri(model_uri: str, tracking_uri: str | None = None) -> str:
    """The store URI to look ``model_uri`` up in, after checking that the store exists.

    A ``models:/`` or ``runs:/`` URI needs a tracking/registry store: a local one that does
    not exist is reported (with where its URI came from and how to set it), not created.
    """
    uri, origin = tracking_uri_and_origin(tracking_uri)
    if model_uri.startswith(("models:/", "runs:/")):
        path = local_store_path(uri)
        if path is not None and not path.exists():
            raise FileNotFoundError(
                f"no MLflow store at {uri} ({origin}), so {model_uri!r} cannot be looked up; "
                "nothing was created. Name the store that holds the model: --tracking-uri "
                "sqlite:///STUDY/mlflow.db (the study folder `mmdtl2 register` used) or "
                "export MLFLOW_TRACKING_URI=..., or pass the model's folder as --model."
            )
    return uri


@contextmanager
def mlflow_errors_explained(uri: str, action: str, needs: str, otherwise: str | None = None):
    """An MLflow error inside the block becomes a ValueError saying what to fix.

    A refusal by the server (HTTP 401 or 403: authentication on, see docs/deploy.md) says
    which credentials are needed; any other error is re-raised as it is, or explained with
    ``otherwise`` when given.
    """
    import mlflow

    try:
        yield
    except mlflow.exceptions.MlflowException as exc:
        denied = exc.get_http_status_code() in (401, 403)
        if not denied and otherwise is None:
            raise
        fix = otherwise
        if denied:
            fix = (
                f"The server wants the credentials of a user with {needs}: export "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD."
            )
        raise ValueError(f"cannot {action} at {uri}: {exc.message}. {fix}") from exc


def model_lookup(model_uri: str, uri: str):
    """MLflow errors inside the block explained for a model read from ``uri``."""
    return mlflow_errors_explained(
        uri,
        f"load model {model_uri!r}",
        "read access to the model",
        otherwise="Check the name and alias, or pass --tracking-uri.",
    )


def load_registered_model(model_uri: str, tracking_uri: str | None = None):
    """``mlflow.pyfunc.load_model(model_uri)`` from a store that exists (see above)."""
    import mlflow

    uri = model_store_uri(model_uri, tracking_uri)
    with model_lookup(model_uri, uri), use_tracking_uri(uri), keeping_sys_path():
        return mlflow.pyfunc.load_model(model_uri)


@contextmanager
def keeping_sys_path():
    """Put ``sys.path`` back after loading a model.

    MLflow prepends a model's ``code/`` folder to ``sys.path`` for good. Ours holds the
    few ``mmdtl2_dist`` modules that scoring needs, under the package's own name, so it
    would shadow the installed package for every later import in this process and in the
    worker processes it spawns (which copy ``sys.path``). The model's modules are
    imported by the time the load returns, so the folder is not needed afterwards.
    """
    saved = list(sys.path)
    try:
        yield
    finally:
        sys.path[:] = saved


def download_registered_model(model_uri: str, tracking_uri: str | None, dst: str) -> str:
    """The model's folder, downloaded into ``dst`` without running its code."""
    import mlflow

    uri = model_store_uri(model_uri, tracking_uri)
    with model_lookup(model_uri, uri), use_tracking_uri(uri):
        return mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=dst)


def _tag(v) -> str:
    s = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
    return s[:MAX_TAG]


def deployed_method_and_params(cfg, fitted) -> tuple[str, dict]:
    """The core method and the full parameters of the model that was fitted.

    The configuration's own unless ``select="auto"`` chose: then its pick, e.g. the target
    SVM (``c_t = 1``, the configuration's solver settings) or MMDTL2 with the rule's prior,
    weight and ``c_f`` and the ``c_d`` it fitted with (scaled with a large source; 0 for
    the shared-PCA prior without the pull) over the configuration's other parameters.
    """
    if not fitted.auto:
        return cfg.method, fitted.full_params
    from mmdtl2_dist.core.auto import picked_params

    params = picked_params(fitted.auto["pick"], fitted.full_params)
    if fitted.auto["method"] == "mmdtl2":
        params["c_d"] = fitted.auto["c_d"]
    return fitted.auto["method"], params


def version_tags(handle, cfg, fitted) -> dict[str, str]:
    """What a model version records about its training (all strings)."""
    from mmdtl2_dist.store.feature_store import FeatureStore, extraction_tags
    from mmdtl2_dist.study.tracking import code_version

    spec = handle.spec
    method, params = deployed_method_and_params(cfg, fitted)
    tags = {
        **extraction_tags(FeatureStore.open(handle.store).provenance),
        "study": spec.name,
        "study_folder": str(handle.folder),
        "spec_fingerprint": spec.fingerprint(),
        "data_fingerprint": fitted.store_fingerprint,
        "pair": f"{fitted.source}->{fitted.target}",
        "source_device": fitted.source,
        "target_device": fitted.target,
        "source_space": spec.source_space,
        "target_space": spec.target_space,
        "preprocessing": spec.preprocessing,
        "method": method,
        "params": params,
        "selected_by": cfg.selected_by,
        "n_train_source": str(fitted.n_source),
        "n_train_target": str(fitted.n_target),
        "n_features": str(fitted.estimator.adapter_.n_features),
        "classes": fitted.class_names,
        "study_accuracy": {str(k): v for k, v in cfg.study_accuracy.items()},
        "code_version": code_version(),
    }
    if cfg.select:
        tags["select_grid"] = cfg.select
        tags["selected_params"] = fitted.selected_params
    if fitted.n_unlabelled_target:
        tags["n_unlabelled_target"] = str(fitted.n_unlabelled_target)
    if fitted.auto:
        tags["auto_rule"] = fitted.auto["rule"]
        tags["auto_choice"] = {
            k: fitted.auto[k] for k in ("pick", "label", "params", "pca_dim", "c_d")
        }
        tags["auto_pool_size"] = str(fitted.auto["pool_size"])
        tags["auto_pseudo_labelled"] = str(fitted.auto["pseudo_labelled"])
        if fitted.auto["neighbours"]:
            tags["auto_neighbours"] = str(fitted.auto["neighbours"])
        if fitted.auto["source_alone_right"] is not None:
            tags["auto_source_alone_right"] = str(fitted.auto["source_alone_right"])
    for key in ("label", "trial_key", "run_id", "metric", "n_per_class"):
        v = getattr(cfg, key)
        if v is not None:
            tags[{"run_id": "trial_run_id", "label": "study_label"}.get(key, key)] = str(v)
    if cfg.metric_value is not None:
        tags["metric_value"] = repr(cfg.metric_value)
    return {k: _tag(v) for k, v in tags.items()}


def version_description(handle, cfg, fitted) -> str:
    """A few sentences for the model version's description."""
    spec = handle.spec
    method, params = deployed_method_and_params(cfg, fitted)
    p = json.dumps(params, sort_keys=True, default=str)
    s = (
        f"Adapter {fitted.source} ({spec.source_space}) -> {fitted.target} "
        f"({spec.target_space}), {len(fitted.class_names)} classes, "
        f"{fitted.estimator.adapter_.n_features} target features, preprocessing "
        f"{spec.preprocessing}. Fitted on all {fitted.n_source} source and {fitted.n_target} "
        f"target labelled samples of study {spec.name!r} (store fingerprint "
        f"{fitted.store_fingerprint}). Method {method}, parameters {p}"
    )
    if fitted.n_unlabelled_target:
        s += f", with {fitted.n_unlabelled_target} unlabelled target samples"
    if fitted.auto:
        a = fitted.auto
        s += (
            f", chosen by the rule {a['rule']}: {a['pick']} ({a['label']}, "
            f"{json.dumps(a['params'], default=str)}) from a pool of {a['pool_size']} samples, "
        )
        if a["source_alone_right"]:
            s += "without folds (the source SVM alone was right on every labelled target), "
        s += (
            f"{a['pseudo_labelled']} unlabelled target samples self-trained into the fit with "
            "the labels the rule's fold fits gave them"
            if a["pseudo_labelled"]
            else "without self-training"
        )
        if a["neighbours"]:
            s += (
                f"; its scores are smoothed over the {a['neighbours'][0]} nearest of the "
                "unlabelled target samples it keeps (a hard shift)"
            )
    elif fitted.selected_params:
        s += f", chosen by cross-validation: {json.dumps(fitted.selected_params, default=str)}"
    s += f". Configuration: {cfg.selected_by}"
    if cfg.metric_value is not None:
        s += (
            f" ({cfg.label!r}, n = {cfg.n_per_class} labelled target samples per class: "
            f"{cfg.metric} = {cfg.metric_value:.4f})"
        )
    if cfg.study_accuracy:
        acc = ", ".join(
            f"n={n}: {100 * r['accuracy']:.2f} %"
            for n, r in cfg.study_accuracy.items()
            if "accuracy" in r
        )
        s += (
            f". Study accuracy of this configuration (the study's mean over all its pairs "
            f"and splits): {acc}"
        )
    else:
        s += ". The study did not evaluate this configuration"
    return s + "."


def register_adapter(
    handle,
    cfg,
    fitted,
    *,
    name: str,
    alias: str | None = "champion",
    export_w: bool = False,
    await_s: int = 300,
    extractor=None,
):
    """Log, register and alias a fitted adapter (see the module docstring).

    ``extractor`` (:func:`~mmdtl2_dist.deploy.training.study_extractor`) makes the model
    take images: it runs the extractor before the adapter (tag ``input = images``). The
    version's tags name the extractor and weights of a store from ``mmdtl2 extract``
    (with or without ``extractor``).

    Returns
    -------
    mlflow.entities.model_registry.ModelVersion
        The new version (with its tags and description).
    """
    from mlflow.tracking import MlflowClient

    if not name or any(c in name for c in "/@:"):
        raise ValueError(f"model name must be non-empty without '/', '@' or ':', got {name!r}.")
    if alias is not None and (not alias or not alias.replace("_", "").replace("-", "").isalnum()):
        raise ValueError(f"alias must be letters, digits, '_' or '-', got {alias!r}.")
    if alias is not None and alias.lower() == "latest":
        raise ValueError("'latest' is reserved by MLflow; choose another alias, e.g. champion.")
    client = MlflowClient(tracking_uri=handle.tracking_uri, registry_uri=handle.tracking_uri)
    exp = client.get_experiment_by_name(handle.experiment)
    exp_id = exp.experiment_id if exp is not None else _create_experiment(client, handle)
    tags = version_tags(handle, cfg, fitted)
    if extractor is not None:
        tags["input"] = "images"
    W = fitted.estimator.transform_matrix() if export_w else None  # fails before logging
    with use_tracking_uri(handle.tracking_uri):
        return _log_and_register(
            handle, cfg, fitted, client, exp_id, tags, W, name, alias, await_s, extractor
        )


def _create_experiment(client, handle) -> str:
    """The study's experiment in its store, with the study's artifact folder.

    Without an artifact location MLflow would put the model's files in ``./mlruns`` of
    whatever folder ``register`` runs in.
    """
    from mmdtl2_dist.study.runner import tracker_config

    art = tracker_config(handle.spec, handle.tracking_uri)["artifact_location"]
    return client.create_experiment(handle.experiment, artifact_location=art)


def _log_and_register(
    handle, cfg, fitted, client, exp_id, tags, W, name, alias, await_s, extractor=None
):
    import mlflow

    from mmdtl2_dist.deploy.pyfunc import log_adapter
    from mmdtl2_dist.study.tracking import ROLE_TAG, STUDY_TAG

    with mlflow.start_run(
        experiment_id=exp_id,
        run_name=f"register {name}",
        tags={ROLE_TAG: ROLE_REGISTER, STUDY_TAG: handle.spec.name, "registered_model": name},
    ) as run:
        params = deployed_method_and_params(cfg, fitted)[1]
        mlflow.log_params({k: str(v)[:6000] for k, v in params.items()})
        mlflow.set_tags({k: v for k, v in tags.items() if k not in ("params",)})
        info = log_adapter(
            fitted.estimator.adapter_,
            class_names=fitted.class_names,
            input_example=None if extractor is not None else fitted.example,
            extractor=extractor,
            model_config={
                "source_device": fitted.source,
                "target_device": fitted.target,
                "study": handle.spec.name,
            },
        )
        if W is not None:
            log_matrix(W, run.info.run_id, client)
    mv = mlflow.register_model(info.model_uri, name, await_registration_for=await_s, tags=tags)
    client.update_model_version(
        name, mv.version, description=version_description(handle, cfg, fitted)
    )
    if alias is not None:
        client.set_registered_model_alias(name, alias, mv.version)
    return client.get_model_version(name, mv.version)


def log_matrix(W: np.ndarray, run_id: str, client) -> None:
    """Log the explicit ``W`` (Ls, Lt + 1) as the run artifact ``W/W.npy``.

    ``W`` comes from :meth:`MMDTL2.transform_matrix`, which refuses non-linear kernels and
    matrices over its size limit.
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "W.npy"
        np.save(path, W, allow_pickle=False)
        client.log_artifact(run_id, str(path), artifact_path="W")
