"""The Office-Caltech10 reference protocol, on the bundled data, for every method.

Hoffman et al.'s protocol (ICLR 2013; the MMDT paper's benchmark): 12 domain shifts,
20 fixed splits each (20 source samples per class from amazon, 8 otherwise; 3 labelled
target samples per class; the rest of the target domain is the test set), SURF 800-d
features L2-normalised then z-scored per domain over all its images (Gong et al.'s and
Hoffman's preprocessing).

The protocol is a study (:func:`office_spec`): the spec of ``studies/office_caltech10.toml``
with the columns of :data:`COLUMNS` (the prior columns of
``studies/office_caltech10_prior.toml`` instead of the skada baselines), run by the study
runner on the local executor (worker processes, no Ray; the Gram computed in-process).
``mmdtl2 office`` prints the study report's table; its shift, split and column filters
are the spec's ``pairs``, ``n_splits`` and ``methods``.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

from mmdtl2_dist.core.selection import PRIOR_WEIGHTS
from mmdtl2_dist.datasets.office_caltech import N_TRIALS, SHIFTS, SPACE

#: Labelled target samples per class in Hoffman et al.'s split files.
TARGET_PER_CLASS = 3

#: The columns of the table, as ``[[methods]]`` entries of a study spec. Parameters not
#: given are the core's defaults. The CV-selected column chooses the prior's mixing
#: weight per split by cross-validation on the labelled target samples alone; the auto
#: column is the recommended configuration (``select = "auto"``, the frozen rule of
#: :mod:`mmdtl2_dist.core.auto`), its prior learnt from the source samples and every
#: target sample's features (the transductive protocol of the published methods).
COLUMNS: tuple[dict, ...] = (
    {"label": "source SVM", "method": "source_svm"},
    {"label": "target SVM", "method": "target_svm"},
    {"label": "MMDT (paper)", "method": "mmdt"},
    {"label": "MMDT (Hoffman code)", "method": "mmdt_hoffman"},
    {"label": "MMDTL2 linear", "method": "mmdtl2", "params": {"kernel": "linear"}},
    {"label": "MMDTL2 RBF", "method": "mmdtl2", "params": {"kernel": "rbf"}},
    {"label": "MMDTL2 poly", "method": "mmdtl2", "params": {"kernel": "poly"}},
    {"label": "MMDTL2 identity prior", "method": "mmdtl2", "params": {"prior": "identity"}},
    {
        "label": "MMDTL2 CV-selected",
        "method": "mmdtl2",
        "params": {"prior": "identity", "c_f": 1.0},
        "select": {"prior_weight": list(PRIOR_WEIGHTS)},
    },
    {"label": "MMDTL2 auto", "method": "mmdtl2", "select": "auto", "unlabelled": "all"},
)


def columns_named(labels: Sequence[str] | None) -> list[dict]:
    """The columns with these labels, in the given order (all of them for ``None``)."""
    if not labels:
        return list(COLUMNS)
    known = {c["label"]: c for c in COLUMNS}
    bad = [lab for lab in labels if lab not in known]
    if bad:
        raise ValueError(f"unknown column(s) {bad}; choose from {list(known)}.")
    return [known[lab] for lab in labels]


def office_spec(
    columns: Sequence[dict] = COLUMNS,
    shifts: Sequence[tuple[str, str]] = SHIFTS,
    n_splits: int = N_TRIALS,
    *,
    output: str | Path,
):
    """The study of the protocol: these columns, shifts and the first ``n_splits`` splits."""
    from mmdtl2_dist.study.spec import parse_spec

    if not 1 <= n_splits <= N_TRIALS:
        raise ValueError(
            f"the number of splits (--trials) must be between 1 and {N_TRIALS}, got {n_splits}."
        )
    raw = {
        "study": {
            "name": "office",
            "seed": 0,
            "description": "Office-Caltech10 SURF, Hoffman's fixed splits (mmdtl2 office)",
        },
        "data": {
            "builtin": "office_caltech10",
            "space": SPACE,
            "pairs": [list(s) for s in shifts],
            "preprocessing": "l2_zscore",
        },
        "splits": {
            "protocol": "fixed",
            "n_splits": n_splits,
            "samples_per_class": [TARGET_PER_CLASS],
        },
        "methods": [json.loads(json.dumps(c)) for c in columns],
    }
    return parse_spec(raw, None, output=output)


def run_office(
    spec, *, workers: int | None = None, track: bool = False, progress: bool | None = None
):
    """Run the protocol's study on the local executor; return the study's report dict."""
    from mmdtl2_dist.study.runner import run_study

    return run_study(spec, executor="local", num_cpus=workers, track=track, progress=progress)


def office_results(spec) -> dict:
    """The per-split results of a finished office study, as ``mmdtl2 office --out`` writes them.

    ``acc`` maps ``"source-target|label"`` to the accuracy of every split, in split order;
    ``chosen`` maps the CV-selected columns' keys to each split's configuration
    (``{split: params}``); ``mean_fit_time_s`` is the mean fit time of each column.
    """
    from mmdtl2_dist.study.runner import load_payloads

    payloads, missing = load_payloads(spec)
    if missing:
        raise ValueError(f"{spec.output} has {len(missing)} unfinished trials.")
    acc, chosen, fit = {}, {}, {}
    for p in payloads:
        fit[p["label"]] = sum(u["fit_s"] for u in p["units"]) / len(p["units"])
        for u in p["units"]:
            key = f"{u['pair'].replace('->', '-')}|{p['label']}"
            acc.setdefault(key, []).append(u["accuracy"])
            if p.get("select"):
                chosen.setdefault(key, {})[str(u["split"])] = {**p["params"], **u["chosen"]}
    return {
        "columns": [m.label for m in spec.methods],
        "acc": acc,
        "chosen": chosen,
        "mean_fit_time_s": fit,
    }


def study_folder(out: Path | None):
    """Where the office study runs, as a context giving its path.

    ``<out>/study`` when ``out`` is given (kept: ``mmdtl2 study resume`` and ``report``
    work on it), else a temporary folder, removed with the context.
    """
    if out is not None:
        return contextlib.nullcontext(str(Path(out) / "study"))
    return tempfile.TemporaryDirectory(prefix="mmdtl2-office-")
