"""Hyperparameter selection without peeking: cross-validation on the labelled targets.

The paper tuned nothing by validation and names it future work; test labels must never
choose a parameter. :func:`select_by_cv` scores every configuration of a grid by
cross-validation **on the labelled target training samples only** (the source samples
stay in every fold's training set, the test samples are never seen):

- with ``n`` labelled target samples per class, fold ``j`` holds out the ``j``-th sample
  of every class (leave-one-out per class, ``n`` folds; at most ``max_folds``);
- each configuration's score is the mean held-out accuracy over the folds; ties go to the
  configuration listed first (so list the defaults first);
- with a single labelled sample in some class, no fold can hold it out and keep the class
  in training: the first configuration is returned, and the table says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from mmdtl2_dist.core.methods import GramProblem, fit_predict


def cv_folds(yt: np.ndarray, max_folds: int = 10) -> list[np.ndarray]:
    """Held-out index sets: fold ``j`` holds out the ``j``-th sample of every class."""
    yt = np.asarray(yt)
    per_class = [np.flatnonzero(yt == c) for c in np.unique(yt)]
    n = min(len(ix) for ix in per_class) if per_class else 0
    if n < 2:
        return []
    return [np.array([ix[j] for ix in per_class]) for j in range(min(n, max_folds))]


def sub_problem(prob: GramProblem, train: np.ndarray, held: np.ndarray) -> GramProblem:
    """The problem whose labelled targets are ``train`` and whose test set is ``held``."""
    Ktt = prob.Ktt
    return GramProblem(
        ys=prob.ys,
        yt=prob.yt[train],
        Kss=prob.Kss,
        Ktt=Ktt[np.ix_(train, train)],
        Ktq=Ktt[np.ix_(train, held)],
        sq_q=np.diag(Ktt)[held],
        Kst=None if prob.Kst is None else prob.Kst[:, train],
        Ksq=None if prob.Kst is None else prob.Kst[:, held],
        Kqq=None if prob.Kqq is None else Ktt[np.ix_(held, held)],
    )


def select_by_cv(
    method: str,
    grid: Sequence[Mapping],
    problem: GramProblem,
    *,
    max_folds: int = 10,
) -> tuple[dict, list[dict]]:
    """Choose the configuration of ``grid`` with the best cross-validated accuracy.

    Parameters
    ----------
    method : str
        A method of :data:`mmdtl2_dist.core.methods.METHODS`.
    grid : sequence of dict
        Candidate parameter sets (each passed to :func:`fit_predict`).
    problem : GramProblem
        The split; only its source and labelled target training blocks are used.
    max_folds : int
        Cap on the number of folds.

    Returns
    -------
    best : dict
        The chosen parameters.
    table : list of dict
        One row per configuration: ``params``, ``cv_accuracy`` (or None), ``n_folds``.
    """
    grid = [dict(g) for g in grid]
    if not grid:
        raise ValueError("the selection grid is empty; give at least one configuration.")
    folds = cv_folds(problem.yt, max_folds)
    if not folds:
        table = [{"params": g, "cv_accuracy": None, "n_folds": 0} for g in grid]
        table[0]["note"] = "fewer than 2 labelled target samples in some class: no CV possible"
        return grid[0], table
    all_idx = np.arange(len(problem.yt))
    subs = []
    for held in folds:
        train = np.setdiff1d(all_idx, held)
        subs.append((sub_problem(problem, train, held), problem.yt[held]))
    table = []
    for g in grid:
        accs = [float(np.mean(fit_predict(method, g, sp).y_pred == yh)) for sp, yh in subs]
        table.append({"params": g, "cv_accuracy": float(np.mean(accs)), "n_folds": len(folds)})
    best = max(range(len(grid)), key=lambda i: (table[i]["cv_accuracy"], -i))
    return grid[best], table
