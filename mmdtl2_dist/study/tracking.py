"""MLflow tracking of a study, from the driver only, idempotent across resumes.

Layout (one tracking store, by default ``sqlite:///<output>/mlflow.db``, artifacts under
``<output>/mlartifacts``):

- one **experiment** per study (``[tracking] experiment``, default ``mmdtl2-<name>``);
- one **parent run** (tag ``mmdtl2_role = parent``) holding the spec, the report
  (Markdown, CSV, PNG) and study-level timings;
- one **child run per trial** (tag ``mmdtl2_trial_key``, ``mlflow.parentRunId``) with the
  method parameters, the metrics (accuracy, per-class accuracy, per-pair accuracy, the
  objective per alternation, QP status counts and KKT residuals, timings; the alternation's
  figures are means over the units that ran one, counted by ``alternation_units``: a
  ``select="auto"`` split that picked the target SVM has none), tags (split
  seed, data fingerprint, code version) and the full per-split result as ``trial.json``.

Every write goes through :class:`StudyTracker` in the driver process: SQLite allows one
writer, and Ray Tune's ``MLflowLoggerCallback`` keeps its trial-to-run map in memory only,
so a resumed sweep would open duplicate runs. Here a trial's run is found by its
deterministic key: a FINISHED run is never logged again, an unfinished one (the driver
died while logging it) is deleted and logged afresh. Hence one run per trial, however
often the study is interrupted.
"""

from __future__ import annotations

import json
import math
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from mlflow.entities import Metric, Param, RunStatus
from mlflow.tracking import MlflowClient

import mmdtl2_dist
from mmdtl2_dist.study.pools import pool_text

ROLE_TAG = "mmdtl2_role"
KEY_TAG = "mmdtl2_trial_key"
STUDY_TAG = "mmdtl2_study"
FINGERPRINT_TAG = "mmdtl2_spec_fingerprint"
_SOLVED = ("solved", "optimal", "success", "ok")


def default_tracking_uri(output: Path) -> str:
    """``sqlite:///<output>/mlflow.db`` (MLflow 3.13+ refuses the ``./mlruns`` store)."""
    return f"sqlite:///{Path(output).resolve() / 'mlflow.db'}"


def code_version() -> str:
    """Package version, plus the git commit when running from a checkout."""
    version = mmdtl2_dist.__version__
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(mmdtl2_dist.__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        return f"{version}+g{sha}" if sha else version
    except (OSError, subprocess.SubprocessError):
        return version


def metric_key(s: str) -> str:
    """``s`` as an MLflow metric name: ``->`` becomes ``_to_``, other symbols ``_``."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in s.replace("->", "_to_"))


def class_names(metadata) -> dict[str, str]:
    """``{str(label): class name}`` of the labelled rows of a feature store's metadata.

    Per-class metrics are named after the class (``accuracy_class/back_pack``); a label
    without a name keeps its number.
    """
    rows = metadata[metadata["label"] >= 0]
    return {
        str(int(label)): str(name)
        for label, name in zip(rows["label"], rows["class_name"], strict=True)
        if str(name)
    }


def class_metric_keys(labels, names: dict[str, str] | None) -> dict[str, str]:
    """Metric key of each label's accuracy: the class name, sanitised for MLflow.

    MLflow allows alphanumerics, ``_ - . /`` and spaces in metric names; other
    characters become ``_``. Two classes whose names sanitise alike get their label
    appended, so that no metric is overwritten.
    """
    names = names or {}
    keys = {str(k): metric_key(names.get(str(k), str(k))) for k in labels}
    counts = Counter(keys.values())
    return {
        k: f"accuracy_class/{v}" if counts[v] == 1 else f"accuracy_class/{v}_{k}"
        for k, v in keys.items()
    }


def _finite(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def trial_metrics(
    payload: dict, class_names: dict[str, str] | None = None
) -> list[tuple[str, float, int]]:
    """Metrics of one trial as ``(key, value, step)`` triples (see the module docstring).

    ``class_names`` (:func:`class_names`) names the per-class metrics.
    """
    units = payload["units"]
    acc = np.array([u["accuracy"] for u in units], dtype=float)
    out = [
        ("accuracy", float(acc.mean()), 0),
        ("accuracy_std", float(acc.std(ddof=1)) if acc.size > 1 else 0.0, 0),
        ("n_units", float(acc.size), 0),
    ]
    for pair in dict.fromkeys(u["pair"] for u in units):
        a = [u["accuracy"] for u in units if u["pair"] == pair]
        out.append((f"accuracy_pair/{metric_key(pair)}", float(np.mean(a)), 0))
    classes = sorted({k for u in units for k in u.get("per_class", {})}, key=str)
    keys = class_metric_keys(classes, class_names)
    for k in classes:
        v = [u["per_class"][k] for u in units if k in u.get("per_class", {})]
        out.append((keys[str(k)], float(np.mean(v)), 0))
    objectives = [u.get("info", {}).get("objective") for u in units]
    objectives = [o for o in objectives if isinstance(o, list) and o]
    out.append(("alternation_units", float(len(objectives)), 0))
    if objectives:
        depth = max(len(o) for o in objectives)
        for i in range(depth):
            vals = [o[i] for o in objectives if len(o) > i and _finite(o[i])]
            if vals:
                out.append(("objective_mean", float(np.mean(vals)), i))
        for i, v in enumerate(objectives[0]):
            if _finite(v):
                out.append(("objective_first_split", float(v), i))
    infos = [u.get("info", {}) for u in units]
    res = [r for i in infos for r in np.ravel(i.get("qp_kkt_residual", [])) if _finite(r)]
    if res:
        out += [
            ("qp_kkt_residual_max", float(np.max(res)), 0),
            ("qp_kkt_residual_mean", float(np.mean(res)), 0),
        ]
    statuses = [str(s) for i in infos for s in np.ravel(i.get("qp_status", []))]
    if statuses:
        bad = sum(not any(w in s.lower() for w in _SOLVED) for s in statuses)
        out += [("qp_solves", float(len(statuses)), 0), ("qp_not_solved", float(bad), 0)]
    for name in ("n_iter", "time_wstep_s", "time_svm_s", "time_total_s"):
        vals = [i[name] for i in infos if _finite(i.get(name))]
        if vals:
            out.append(
                (
                    f"{name}_sum" if name.startswith("time") else f"{name}_mean",
                    float(np.sum(vals) if name.startswith("time") else np.mean(vals)),
                    0,
                )
            )
    for name in ("wall_s", "solver_s", "slice_s"):
        if _finite(payload.get(name)):
            out.append((f"trial_{name}", float(payload[name]), 0))
    return out


class StudyTracker:
    """Driver-side MLflow logging of one study (see the module docstring).

    Parameters
    ----------
    tracking_uri : str
        Any MLflow tracking URI.
    experiment : str
        Experiment name.
    artifact_location : str, optional
        Artifact root for a new experiment (``file://...``); ignored when it exists.
    study_name, spec_fingerprint : str
        Tags of the parent run.
    class_names : dict, optional
        ``{str(label): class name}`` for the per-class metric names (:func:`class_names`).
    """

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        *,
        study_name: str,
        spec_fingerprint: str,
        artifact_location: str | None = None,
        class_names: dict[str, str] | None = None,
    ):
        self.uri = tracking_uri
        self.class_names = dict(class_names or {})
        self.client = MlflowClient(tracking_uri=tracking_uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            self.experiment_id = self.client.create_experiment(
                experiment, artifact_location=artifact_location, tags={STUDY_TAG: study_name}
            )
        else:
            if exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            self.experiment_id = exp.experiment_id
        self.experiment = experiment
        self.study_name = study_name
        self.spec_fingerprint = spec_fingerprint
        self.parent_id = self._parent()

    def _search(self, filter_string: str) -> list:
        return self.client.search_runs(
            [self.experiment_id], filter_string=filter_string, max_results=5000
        )

    def _parent(self) -> str:
        runs = self._search(
            f"tags.{ROLE_TAG} = 'parent' and tags.{FINGERPRINT_TAG} = '{self.spec_fingerprint}'"
        )
        if runs:
            return runs[0].info.run_id
        run = self.client.create_run(
            self.experiment_id,
            run_name=self.study_name,
            tags={
                ROLE_TAG: "parent",
                STUDY_TAG: self.study_name,
                FINGERPRINT_TAG: self.spec_fingerprint,
                "code_version": code_version(),
            },
        )
        return run.info.run_id

    def trial_runs(self) -> dict[str, list]:
        """Active child runs by trial key."""
        out: dict[str, list] = {}
        for r in self._search(
            f"tags.{ROLE_TAG} = 'trial' and tags.{FINGERPRINT_TAG} = '{self.spec_fingerprint}'"
        ):
            out.setdefault(r.data.tags.get(KEY_TAG), []).append(r)
        return out

    def supersede_other_data(self, data_fingerprint: str) -> int:
        """Retag the study's trial runs logged from other data ``superseded``; how many.

        A store re-ingested with other content under the same path: its old runs keep
        their metrics, and no search for the study's trials (resume, report, register)
        finds them again. Runs without a data fingerprint are left as they are.
        """
        stale = [
            r
            for runs in self.trial_runs().values()
            for r in runs
            if r.data.tags.get("data_fingerprint", data_fingerprint) != data_fingerprint
        ]
        for r in stale:
            self.client.set_tag(r.info.run_id, ROLE_TAG, "superseded")
        return len(stale)

    def log_trial(self, payload: dict, tags: dict[str, str]) -> str:
        """Log one trial as a child run, unless a FINISHED run already holds it.

        Returns
        -------
        str
            The run id (existing or new).
        """
        key = payload["key"]
        existing = self.trial_runs().get(key, [])
        done = [r for r in existing if r.info.status == "FINISHED"]
        if done:
            return done[0].info.run_id
        for r in existing:  # a half-logged run of an interrupted driver
            self.client.delete_run(r.info.run_id)
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"{payload['label']} n={payload['n_per_class']}",
            tags={
                ROLE_TAG: "trial",
                KEY_TAG: key,
                STUDY_TAG: self.study_name,
                FINGERPRINT_TAG: self.spec_fingerprint,
                "mlflow.parentRunId": self.parent_id,
                **tags,
            },
        )
        rid = run.info.run_id
        params = {
            "method": payload["method"],
            "label": payload["label"],
            "n_per_class": payload["n_per_class"],
            **payload.get("params", {}),
        }
        if payload.get("select"):
            params["select_grid"] = json.dumps(payload["select"], sort_keys=True)
        if "unlabelled" in payload:
            params["unlabelled"] = pool_text(payload["unlabelled"])
        ts = 0
        metrics = [
            Metric(k, v, ts, step) for k, v, step in trial_metrics(payload, self.class_names)
        ]
        self.client.log_batch(rid, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
        for i in range(0, len(metrics), 900):
            self.client.log_batch(rid, metrics=metrics[i : i + 900])
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "trial.json"
            p.write_text(json.dumps(payload, default=_json_default))
            self.client.log_artifact(rid, str(p))
        self.client.set_terminated(rid, RunStatus.to_string(RunStatus.FINISHED))
        return rid

    def log_parent(
        self,
        *,
        params: dict | None = None,
        metrics: dict | None = None,
        files: list[Path] = (),
        tags: dict | None = None,
        finished: bool = False,
    ) -> None:
        """Log the spec, the report files and study-level numbers to the parent run."""
        rid = self.parent_id
        if params:
            have = self.client.get_run(rid).data.params
            new = [Param(k, str(v)[:6000]) for k, v in params.items() if k not in have]
            if new:
                self.client.log_batch(rid, params=new)
        if metrics:
            self.client.log_batch(
                rid, metrics=[Metric(k, float(v), 0, 0) for k, v in metrics.items() if _finite(v)]
            )
        for k, v in (tags or {}).items():
            self.client.set_tag(rid, k, str(v))
        for f in files:
            self.client.log_artifact(
                rid, str(f), artifact_path="report" if Path(f).suffix != ".toml" else None
            )
        if finished:
            self.client.set_terminated(rid, RunStatus.to_string(RunStatus.FINISHED))

    def set_parent_status(self, status: str) -> None:
        """Set the parent run's status.

        ``RUNNING`` while a run or resume logs trials, ``KILLED`` once it is stopped,
        ``FAILED`` on an error; :meth:`log_parent` marks it ``FINISHED`` at the end.
        """
        if status == "RUNNING":
            self.client.update_run(self.parent_id, status=status)
        else:
            self.client.set_terminated(self.parent_id, status)


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)
