"""The Office-Caltech10 reference protocol, on the bundled data, for every method.

Hoffman et al.'s protocol (ICLR 2013; the MMDT paper's benchmark): 12 domain shifts,
20 fixed splits each (20 source samples per class from amazon, 8 otherwise; 3 labelled
target samples per class; the rest of the target domain is the test set), SURF 800-d
features L2-normalised then z-scored per domain over all its images (Gong et al.'s and
Hoffman's preprocessing). Reported as a study reports it: mean accuracy ± standard
deviation over the 20 splits, with Welch t-test marks (:func:`format_table`).

Every split only needs Gram blocks, so each domain's Gram is computed once here (the
features are small) and every (shift, split, method) slices it, as the study runner does
on Ray for large data. Splits run in parallel worker processes, each with one BLAS thread
(small matrices are much faster single-threaded on a shared machine).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

import numpy as np

from mmdtl2_dist.core.methods import GramProblem, fit_predict
from mmdtl2_dist.core.preprocessing import fit_preprocessing
from mmdtl2_dist.core.selection import NAMED_GRIDS
from mmdtl2_dist.datasets.office_caltech import SHIFTS, load_domain, load_hoffman_splits
from mmdtl2_dist.progress import Progress

#: Labelled target samples per class in Hoffman et al.'s split files.
TARGET_PER_CLASS = 3


@dataclass(frozen=True)
class MethodSpec:
    """A table column: a label, a core method and its parameters."""

    label: str
    method: str
    params: dict


# The columns of the table. A "select" entry names a grid of
# mmdtl2_dist.core.selection.NAMED_GRIDS, chosen per split by cross-validation on the
# labelled target samples (issue 8); "cv_*" entries go to select_by_cv without the
# prefix (e.g. cv_folds="loo"); the rest are fixed.
DEFAULT_COLUMNS: tuple[MethodSpec, ...] = (
    MethodSpec("source SVM", "source_svm", {}),
    MethodSpec("target SVM", "target_svm", {}),
    MethodSpec("MMDT (paper)", "mmdt", {}),
    MethodSpec("MMDT (Hoffman code)", "mmdt_hoffman", {}),
    MethodSpec("MMDTL2 linear", "mmdtl2", {"kernel": "linear"}),
    MethodSpec("MMDTL2 RBF", "mmdtl2", {"kernel": "rbf"}),
    MethodSpec("MMDTL2 poly", "mmdtl2", {"kernel": "poly"}),
    MethodSpec("MMDTL2 identity prior", "mmdtl2", {"prior": "identity"}),
    MethodSpec("MMDTL2 CV-selected", "mmdtl2", {"select": "prior_weight", "c_f": 1.0}),
)

_CACHE: dict = {}


def _domain_gram(name: str, preprocessing: str):
    key = (name, preprocessing)
    if key not in _CACHE:
        dom = load_domain(name)
        X = fit_preprocessing(dom.X, preprocessing).transform(dom.X)
        _CACHE[key] = (X, dom.y)
    return _CACHE[key]


def split_problem(source: str, target: str, trial: int, preprocessing: str = "l2_zscore"):
    """The :class:`GramProblem` of one split, and the test labels."""
    Xs_all, ys_all = _domain_gram(source, preprocessing)
    Xt_all, yt_all = _domain_gram(target, preprocessing)
    sp = load_hoffman_splits(source, target)[trial]
    prob = GramProblem.from_features(
        Xs_all[sp.source_train],
        ys_all[sp.source_train],
        Xt_all[sp.target_train],
        yt_all[sp.target_train],
        Xt_all[sp.target_test],
    )
    return prob, yt_all[sp.target_test]


def _run_split(source, target, trial, columns, preprocessing):
    from threadpoolctl import threadpool_limits

    from mmdtl2_dist.core.selection import select_by_cv

    with threadpool_limits(1):
        prob, yq = split_problem(source, target, trial, preprocessing)
        out = []
        for col in columns:
            t0 = time.perf_counter()
            params = dict(col.params)
            chosen = None
            if "select" in params:
                grid = NAMED_GRIDS[params.pop("select")]
                cv = {k[3:]: params.pop(k) for k in list(params) if k.startswith("cv_")}
                chosen, _ = select_by_cv(col.method, [{**params, **g} for g in grid], prob, **cv)
                params = chosen
            res = fit_predict(col.method, params, prob)
            acc = float(np.mean(res.y_pred == yq))
            out.append((col.label, acc, time.perf_counter() - t0, chosen))
        return source, target, trial, out


def run_protocol(
    columns: Sequence[MethodSpec] = DEFAULT_COLUMNS,
    shifts: Sequence[tuple[str, str]] = SHIFTS,
    trials: Sequence[int] = range(20),
    *,
    preprocessing: str = "l2_zscore",
    workers: int | None = None,
    progress: bool | None = None,
) -> dict:
    """Run the protocol; returns ``{"acc": {(shift, label): [acc per trial]}, ...}``.

    ``progress``: lines on stderr (:mod:`mmdtl2_dist.progress`; ``None``: when stderr is
    a terminal).
    """
    workers = workers or min(2, os.cpu_count() or 1)
    acc: dict = {}
    fit_time: dict = {}
    chosen: dict = {}
    jobs = [(s, t, k) for (s, t) in shifts for k in trials]
    t0 = time.perf_counter()
    bar = Progress("office", len(jobs), unit="splits", enabled=progress)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futs = [pool.submit(_run_split, s, t, k, tuple(columns), preprocessing) for s, t, k in jobs]
        for fut in as_completed(futs):
            s, t, k, out = fut.result()
            for label, a, dt, ch in out:
                acc.setdefault(((s, t), label), {})[k] = a
                fit_time.setdefault(label, []).append(dt)
                if ch is not None:
                    chosen.setdefault(((s, t), label), {})[k] = ch
            bar.advance()
    acc = {key: [v[k] for k in sorted(v)] for key, v in acc.items()}
    return {
        "acc": acc,
        "fit_time": fit_time,
        "chosen": chosen,
        "columns": [c.label for c in columns],
        "methods": {c.label: c.method for c in columns},
        "shifts": list(shifts),
        "wall_s": time.perf_counter() - t0,
    }


def format_table(result: dict) -> str:
    """The study report's per-pair table of the result, with its caption.

    One row per shift (``amazon->webcam``, as a study names its pairs) and an ``all
    pairs`` row (per split, the mean over the shifts); cells are mean ± standard
    deviation over the splits with the one-tailed Welch t-test marks against the source
    and target SVM columns (:mod:`mmdtl2_dist.study.report`).
    """
    from mmdtl2_dist.study.data import pair_name
    from mmdtl2_dist.study.report import (
        caption,
        markdown_table,
        pair_tables,
        references,
        results_frame,
    )

    labels, methods = result["columns"], result["methods"]
    trials = [
        {
            "key": f"{s}-{t}|{label}",
            "label": label,
            "base_label": label,
            "method": methods[label],
            "n_per_class": TARGET_PER_CLASS,
            "units": [
                {"pair": pair_name(s, t), "split": k, "accuracy": a}
                for k, a in enumerate(result["acc"][((s, t), label)])
            ],
        }
        for s, t in result["shifts"]
        for label in labels
    ]
    df = results_frame(trials)
    rs, rt = references(labels, methods)
    table = markdown_table(pair_tables(df, labels, rs, rt), "pair", labels)
    return f"{caption(df['split'].nunique(), rs, rt)}\n\n{table}"
