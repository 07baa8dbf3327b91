"""What a trial does: slice cached Gram blocks for every (pair, split) and fit a method.

A **trial** is one method configuration at one number ``n`` of labelled target samples
per class, evaluated over *every* device pair and split of the study (a "unit" is one
pair and one split). Making a trial this coarse keeps Ray Tune's per-trial cost (seconds
on 2 CPUs: actor start, result processing, experiment checkpoints) small next to the
solver time; the units run one after the other inside the trial, or, with
``[execution] split_tasks = k``, shared between the trial and ``k`` Ray tasks inside the
trial's placement group (when a few trials dominate the study, as in the Office study
whose single sample count gives one trial per method, or on clusters with more CPUs than
trials).

Data reach the trial **by path**: the plan (splits and row maps, written once by the
driver to ``<output>/plan.json`` and ``plan.npz``, read as data: see
:mod:`mmdtl2_dist.study.plan`) and the Gram stores are opened from shared storage, so
the same code runs on a laptop and on a cluster whose nodes mount the study folder. Each
worker process keeps the Gram rows of the study's devices in memory between trials (Tune
reuses its actors), so a Gram is read once per worker, not once per trial.
"""

from __future__ import annotations

import json
import time
from functools import lru_cache
from pathlib import Path

import numpy as np

from mmdtl2_dist.core.methods import NEEDS_TEST_GRAM, GramProblem
from mmdtl2_dist.study.baselines import skada_predict
from mmdtl2_dist.study.plan import PairPlan, StudyPlan
from mmdtl2_dist.study.plan import load_plan as read_plan
from mmdtl2_dist.study.pools import unlabelled_pool
from mmdtl2_dist.study.spec import EXTRA_METHODS
from mmdtl2_dist.study.splits import Split, labelled_subset

INFO_KEYS = (
    "objective",
    "n_iter",
    "qp_status",
    "qp_kkt_residual",
    "time_wstep_s",
    "time_svm_s",
    "time_total_s",
    "converged",
)


def load_plan(path: str) -> StudyPlan:
    """Read and check a plan (see :mod:`mmdtl2_dist.study.plan`), cached per process.

    Cached by the content of ``plan.json`` (which holds the digest of its arrays): a plan
    drawn again under the same path is read again, by this driver too.
    """
    return _read_plan_once(str(path), Path(path).read_bytes())


@lru_cache(maxsize=4)
def _read_plan_once(path: str, content: bytes) -> StudyPlan:
    return read_plan(path)


class _DenseGram:
    """Rows of a Gram store held in memory, addressed by global Gram row."""

    def __init__(self, path: str, rows: np.ndarray):
        from mmdtl2_dist.engine import GramStore

        g = GramStore.open(path)
        self.rows = np.asarray(rows, dtype=np.int64)
        self.G = g.block(self.rows, self.rows)
        self.sq = g.sq_norms(self.rows)

    def pos(self, gram_rows: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.rows, gram_rows)

    def block(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.G[np.ix_(self.pos(a), self.pos(b))]


_GRAMS: dict = {}


def dense_gram(path: str, rows: np.ndarray) -> _DenseGram:
    """The Gram rows ``rows`` of store ``path``, cached in this process."""
    key = (path, hash(np.asarray(rows).tobytes()))
    if key not in _GRAMS:
        if len(_GRAMS) >= 4:
            _GRAMS.pop(next(iter(_GRAMS)))
        _GRAMS[key] = _DenseGram(path, rows)
    return _GRAMS[key]


def _needed_rows(plan: StudyPlan, path: str) -> np.ndarray:
    rows = []
    for p in plan.pairs:
        if p.source_gram == path:
            rows.append(p.source_rows)
            if p.target_rows_in_source is not None:
                rows.append(p.target_rows_in_source)
        if p.target_gram == path:
            rows.append(p.target_rows)
    return np.unique(np.concatenate(rows))


def unit_problem(
    plan: StudyPlan,
    pair: PairPlan,
    split: Split,
    n: int,
    need_qq: bool = False,
    unlabelled: str | dict = "non-test",
) -> tuple[GramProblem, np.ndarray, dict]:
    """Slice the Gram blocks of one unit: its problem, its test labels and the rows used.

    ``Kst``/``Ksq`` are None unless both devices share a space, ``Kqq`` (test × test) is
    sliced only when ``need_qq`` (``mmdt_hoffman``'s transductive PCA). The rows serve
    the feature methods, and ``rows["pool"]`` is the unlabelled target pool
    ``unlabelled`` (a canonical pool, :func:`~mmdtl2_dist.study.pools.unlabelled_pool`).
    """
    t_local = labelled_subset(split, pair.y_target, n) if n > 0 else np.zeros(0, np.int64)
    s_local, q_local = split.source_train, split.target_test
    gs = dense_gram(pair.source_gram, _needed_rows(plan, pair.source_gram))
    gt = dense_gram(pair.target_gram, _needed_rows(plan, pair.target_gram))
    s, t, q = pair.source_rows[s_local], pair.target_rows[t_local], pair.target_rows[q_local]
    Kst = Ksq = None
    if pair.shared:
        Kst, Ksq = gs.block(s, t), gs.block(s, q)
    prob = GramProblem(
        ys=pair.y_source[s_local],
        yt=pair.y_target[t_local],
        Kss=gs.block(s, s),
        Ktt=gt.block(t, t),
        Ktq=gt.block(t, q),
        sq_q=gt.sq[gt.pos(q)],
        Kst=Kst,
        Ksq=Ksq,
        Kqq=gt.block(q, q) if need_qq else None,
    )
    return (
        prob,
        pair.y_target[q_local],
        {
            "source": s_local,
            "target": t_local,
            "test": q_local,
            "pool": unlabelled_pool(pair, split, t_local, unlabelled),
        },
    )


def _plain(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def evaluate_unit(plan: StudyPlan, pair: PairPlan, split: Split, trial: dict) -> dict:
    """Fit and score one method configuration on one (pair, split).

    Core methods go through :func:`mmdtl2_dist.core.methods.fit_predict`; with a
    ``select`` grid, :func:`mmdtl2_dist.core.selection.select_by_cv` first chooses the
    selected parameters by cross-validation on the labelled target samples of the unit
    (the test samples are never seen), and the unit records what it chose.

    Returns
    -------
    dict
        ``pair``, ``split``, ``accuracy``, ``per_class`` (recall per test class),
        ``n_test``, ``fit_s`` (the method, CV included), ``cv_s`` (CV alone),
        ``slice_s``, ``info`` (the method's diagnostics), ``chosen`` (parameters picked
        by cross-validation, if any) and ``cv_accuracy`` (their CV score, or None); for
        methods that use unlabelled samples (``select = "auto"``, the skada baselines)
        ``target_pool_size`` (the unit's target pool, labelled samples included), and for
        ``select = "auto"`` ``auto`` and ``pool_size`` (the prior's pool: the source
        training samples and the target pool).
    """
    from mmdtl2_dist.study.spec import core_params

    method = trial["method"]
    t0 = time.perf_counter()
    prob, yq, rows = unit_problem(
        plan, pair, split, trial["n_per_class"], method in NEEDS_TEST_GRAM,
        trial.get("unlabelled", "non-test"),
    )  # fmt: skip
    t1 = time.perf_counter()
    params, select = core_params(dict(trial["params"])), trial.get("select") or {}
    chosen, cv_acc, cv_s, auto = {}, None, 0.0, None
    uses_pool = method in EXTRA_METHODS or select == "auto"
    if method in EXTRA_METHODS:
        y_pred, info = _skada_unit(pair, rows, prob, method, params)
    elif select == "auto":
        y_pred, info, auto = _auto_unit(plan, pair, rows, prob, params)
        chosen = {"auto": f"{auto['pick']}: {auto['label']}", "rule": auto["rule"]}
        cv_s = info["select_s"]
    else:
        from mmdtl2_dist.core.evaluate import evaluate

        select = {k: [core_params({k: v})[k] for v in vals] for k, vals in select.items()}
        ev = evaluate(method, params, prob, select)
        chosen = {k: _plain(trial_value(v, k)) for k, v in ev.chosen.items()}
        cv_acc, cv_s = ev.cv_accuracy, ev.cv_s
        y_pred, info = ev.result.y_pred, ev.result.info
    fit_s = time.perf_counter() - t1
    y_pred = np.asarray(y_pred)
    per_class = {str(int(k)): float(np.mean(y_pred[yq == k] == k)) for k in np.unique(yq)}
    return {
        "pair": pair.name,
        "split": split.index,
        "accuracy": float(np.mean(y_pred == yq)),
        "per_class": per_class,
        "n_test": int(yq.size),
        "n_labelled": int(prob.yt.size),
        "fit_s": fit_s,
        "cv_s": cv_s,
        "slice_s": t1 - t0,
        "info": {k: _plain(info[k]) for k in INFO_KEYS if k in info},
        "chosen": chosen,
        "cv_accuracy": cv_acc,
        **({"target_pool_size": int(rows["pool"].size)} if uses_pool else {}),
        **({} if auto is None else {"auto": auto, "pool_size": auto["pool_size"]}),
    }


def _auto_unit(plan: StudyPlan, pair: PairPlan, rows: dict, prob: GramProblem, params: dict):
    """``select = "auto"`` on one unit (:func:`mmdtl2_dist.core.auto_fit.fit_predict_auto`).

    The prior's pool is the unit's source training samples and ``rows["pool"]`` (the
    unlabelled target pool of the study's protocol) with the labelled ones; the test
    samples are rows of the target Gram block too, so that they can be scored, but the
    prior learns from them only when the protocol puts them in the pool (``"all"``).
    """
    from mmdtl2_dist.core.auto_fit import fit_predict_auto
    from mmdtl2_dist.core.pool import SamplePool

    if not pair.shared:
        raise ValueError(
            f'select = "auto" needs source and target in one feature space; pair {pair.name} '
            "maps one space to another. Use a fixed MMDTL2 configuration for it."
        )
    s_local, t_local, q_local = rows["source"], rows["target"], rows["test"]
    U = np.union1d(np.union1d(rows["pool"], t_local), q_local)
    gs = dense_gram(pair.source_gram, _needed_rows(plan, pair.source_gram))
    gt = dense_gram(pair.target_gram, _needed_rows(plan, pair.target_gram))
    s, u = pair.source_rows[s_local], pair.target_rows[U]
    pool = SamplePool(
        prob.Kss, gt.block(u, u), gs.block(s, u), np.arange(len(s)),
        np.searchsorted(U, t_local), np.searchsorted(U, q_local),
    )  # fmt: skip
    learn = np.r_[np.ones(len(s), bool), np.isin(U, np.union1d(rows["pool"], t_local))]
    res, choice = fit_predict_auto(pool, prob.ys, prob.yt, params, learn=learn)
    record = {k: v for k, v in choice.record().items() if k != "table"}
    return res.y_pred, res.info, _plain(record)


def trial_value(v, name: str):
    """A core parameter value as a spec writes it (``None`` -> ``"auto"``/``"none"``)."""
    from mmdtl2_dist.study.spec import NONE_WORDS

    return NONE_WORDS.get(name, v) if v is None else v


@lru_cache(maxsize=8)
def _features(store: str, device: str, space: str, gram: str) -> np.ndarray:
    from mmdtl2_dist.engine import GramStore
    from mmdtl2_dist.store.feature_store import FeatureStore

    X = FeatureStore.open(store).read(device, space).astype(np.float64)
    return GramStore.open(gram).stats(device).transform(X)


def _skada_unit(pair: PairPlan, rows: dict, prob: GramProblem, method: str, params: dict):
    Xs_all = _features(pair.store, pair.source, pair.source_space, pair.source_gram)
    Xt_all = _features(pair.store, pair.target, pair.target_space, pair.target_gram)
    s, t, q, pool = rows["source"], rows["target"], rows["test"], rows["pool"]
    masked = np.full(pool.size, -1, dtype=np.int64)
    labelled = np.isin(pool, t)
    masked[labelled] = pair.y_target[pool[labelled]]
    return skada_predict(method, params, Xs_all[s], prob.ys, Xt_all[pool], masked, Xt_all[q])


def run_units(
    plan_path: str, trial: dict, units: list[tuple[int, int]], on_unit=None
) -> list[dict]:
    """Evaluate the given (pair index, split index) units of a trial, in order.

    ``on_unit(done, total)`` is called after each unit (progress reporting).
    """
    plan = load_plan(plan_path)
    out = []
    for pi, si in units:
        pair = plan.pairs[pi]
        out.append(evaluate_unit(plan, pair, pair.splits[si], trial))
        if on_unit is not None:
            on_unit(len(out), len(units))
    return out


def all_units(plan: StudyPlan) -> list[tuple[int, int]]:
    return [(pi, si) for pi, p in enumerate(plan.pairs) for si in range(len(p.splits))]


def evaluate_trial(plan_path: str, trial: dict, split_tasks: int = 0, on_unit=None) -> dict:
    """Evaluate a trial over every unit; return its payload (what is reported and logged).

    Parameters
    ----------
    plan_path : str
        The study plan.
    trial : dict
        :meth:`TrialSpec.to_dict`.
    split_tasks : int
        0: every unit in this process. k > 0: the units are dealt round-robin into
        ``k + 1`` shares; ``k`` Ray tasks of one CPU each (in the trial's placement group)
        take one share each while this process works through the last one, so a single
        trial keeps ``k + 1`` CPUs busy.
    on_unit : callable, optional
        ``on_unit(done, total)`` after each unit this process evaluates (its own share:
        the shares are dealt round-robin, so its fraction done stands for the trial's).

    Returns
    -------
    dict
        See :func:`trial_payload`.
    """
    t_start = time.time()
    t0 = time.perf_counter()
    plan = load_plan(plan_path)
    units = all_units(plan)
    if split_tasks > 0:
        import ray

        remote = ray.remote(num_cpus=1, max_retries=2)(run_units)
        shares = [units[i :: split_tasks + 1] for i in range(split_tasks + 1)]
        refs = [remote.remote(plan_path, trial, c) for c in shares[:-1] if c]
        results = run_units(plan_path, trial, shares[-1], on_unit)
        results += [r for part in ray.get(refs) for r in part]
    else:
        results = run_units(plan_path, trial, units, on_unit)
    timing = {
        "wall_s": time.perf_counter() - t0,
        "t_start": t_start,
        "t_end": time.time(),
        "cpus": 1 + split_tasks,
    }
    return trial_payload(plan, trial, results, timing)


def trial_payload(plan: StudyPlan, trial: dict, results: list[dict], timing: dict) -> dict:
    """A trial's payload from its units' results, in whatever order they were computed.

    The units are put in the plan's order (pair, then split) first, so the payload, and
    the mean over its units, has the same bits whichever executor computed them and
    however it shared them out.

    Returns
    -------
    dict
        The trial (:meth:`TrialSpec.to_dict`), ``units`` (per-unit results), ``accuracy``
        and ``accuracy_std`` over units, and ``timing``: ``wall_s`` (the trial, start to
        end), ``t_start``/``t_end`` (epoch seconds, for the study's slot accounting) and
        ``cpus`` (processes that worked on it); the sums ``solver_s`` (the units'
        method fits, CV included) and ``slice_s`` (Gram loading and slicing); and the
        ``data_fingerprint`` of the store its plan was drawn from.
    """
    units = [(p.name, s.index) for p in plan.pairs for s in p.splits]
    order = {u: k for k, u in enumerate(units)}
    results = sorted(results, key=lambda r: order[(r["pair"], r["split"])])
    acc = np.array([r["accuracy"] for r in results])
    return {
        **trial,
        "units": results,
        "accuracy": float(acc.mean()),
        "accuracy_std": float(acc.std(ddof=1)) if acc.size > 1 else 0.0,
        "wall_s": timing["wall_s"],
        "solver_s": float(sum(r["fit_s"] for r in results)),
        "slice_s": float(sum(r["slice_s"] for r in results)),
        "t_start": timing["t_start"],
        "t_end": timing["t_end"],
        "cpus": timing["cpus"],
        "data_fingerprint": plan.data_fingerprint,
    }


#: Least seconds between a trial's progress reports (each one waits for the driver).
PROGRESS_REPORT_S = 10.0


def tune_trainable(config: dict) -> None:
    """The Ray Tune function trainable: evaluate the trial, report its result.

    While it runs, the trial also reports ``trial_progress`` (the fraction of its units
    done), for the driver's progress line: after its first unit (an early rate for the
    ETA), then at most every :data:`PROGRESS_REPORT_S` seconds.
    """
    from ray import tune

    last = [time.monotonic()]

    def report_progress(done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and (done == 1 or now - last[0] >= PROGRESS_REPORT_S):
            last[0] = now
            tune.report({"trial_progress": done / total})

    payload = evaluate_trial(
        config["plan_path"], config["trial"], int(config.get("split_tasks", 0)), report_progress
    )
    tune.report(
        {
            "accuracy": payload["accuracy"],
            "accuracy_std": payload["accuracy_std"],
            "solver_s": payload["solver_s"],
            "trial_wall_s": payload["wall_s"],
            "payload": json.dumps(payload, default=_plain),
        }
    )
