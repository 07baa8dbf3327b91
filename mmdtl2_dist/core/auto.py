"""``select="auto"``: the selection rule frozen on development data, on Gram matrices.

The rule (BENCHMARKS.md, "Selection rule, frozen 2026-11-26 on dev data"; its version
string :data:`AUTO_RULE` is recorded with every result it produces) picks among six
candidates on two axes, how much to trust the source and how hard to pull the labelled
targets towards their class's source samples:

- **D** (the default up to :data:`MANY_LABELS` labels a class): MMDTL2 with the
  shared-PCA prior ``W0 = P Pᵀ`` over the pool, ``d = min(4C, p − 1)`` (lowered to the
  rank of the centred pool if the features span fewer dimensions), prior weight 0.5;
- **O** (only the target; the default when every class has more labels): the linear
  target SVM with ``c_t = 1``, the baseline that adaptation must beat, whatever the
  caller's ``c_t`` and kernel; the source is ignored. With 20 and 40 labelled targets per
  class every MMDTL2 candidate fell below it on dev (BENCHMARKS.md, "The target SVM as the
  rule's alternative (O)" and "... as the default with many labels"). It is a candidate
  only when the labelled targets cover every class of the source: it cannot predict a
  class it has no labelled sample of;
- **S** (trust the source): MMDTL2 with the identity prior ``W0 = I`` at weight 1;
- **D0** (D without the L2 pull): D with ``c_d = 0`` whatever the caller's ``c_d``. The
  pull ties each labelled target to its class's source mean; with many labelled targets
  and a large source it costs MMDTL2 up to 22 points on the pixel dev data, and on
  near-ceiling deep features it helps (BENCHMARKS.md, "The L2 pull's weight ``c_d`` with
  more labels"), so the folds choose. A candidate with at most
  :data:`NO_PULL_MOST_CLASSES` classes, the most it was designed and confirmed with, and
  at most :data:`NO_PULL_MOST_VARIABLES` labelled W-step variables (classes × labelled
  targets), the largest such fit timed (:func:`no_pull_is_a_candidate`): without the
  pull the W-step's block of free dual variables grows with both (a 65-class fit at 10
  labels a class was stopped at 9.8 GB after 25 minutes). Not fitted either when the
  caller's ``c_d`` is 0: it would be D;
- **F** (the default at one labelled target in some class): MMDTL2 with the shared-PCA
  prior, ``d = min(2C, p − 1)``, weight 1;
- **N** (nearly the source SVM, F's alternative and the pick where the source alone is
  right, below): MMDTL2 with the identity prior at weight 1 and ``c_f = 100``, which
  holds ``W`` near ``I``;

the MMDTL2 candidates with ``c_f = 1`` and the caller's other MMDTL2 parameters (the
core's defaults unless given), the L2 pull's ``c_d`` (except D0's) held to its design
strength with a large source (:func:`rule_pull`: times ``min(1, 20 / n̄)``, ``n̄`` the
labelled source samples a class on average). ``C`` is the number of classes (of the
labelled source and target samples) and ``p`` the pool size.

**The pool** (:class:`~mmdtl2_dist.core.pool.SamplePool`) is what the shared-PCA prior
learns from, without labels: the labelled source samples and every target sample the
caller provides (labelled, unlabelled and, only when the caller puts them there, the
samples to be scored: the transductive protocol of the published methods).

**The rule.** ``n`` is the smallest number of labelled target samples in a class. If
``n < 2`` no per-class fold can be formed: **leave-classes-out folds**
(:func:`~mmdtl2_dist.core.auto_folds.class_group_folds`: the labelled classes that the
source has, sorted, in ``g = min(3, their number)`` groups, fold ``j`` holding out the
labelled targets of group ``j``, so that each held-out target is of a class its fold fit
has no label of: what the source must carry when labels are that few), F guarded by N
with the guard below, no self-training; ``2g + 1`` fits (7 with three classes or more).
On dev this took N on most COIL20 splits, where F lost 4-5 points to the source SVM, and
on about a sixth of the Office-Caltech10 splits with every source image (where F lost up
to 7 points and the guarded rule still loses up to 4), and kept F on the digits, where F
gained. With fewer than two such classes, F alone, one fit.
Otherwise ``min(n, 3)`` per-class folds in canonical order
(:func:`~mmdtl2_dist.core.selection.cv_folds`, fold ``j`` holds out the ``j``-th sample of
every class by :func:`~mmdtl2_dist.core.selection.canonical_order`); D, O, S and D0
are fitted on every fold and each held-out sample gets its multiclass hinge loss ``h``.
The default ``d`` is D with alternatives (O, S, D0), or O with alternatives (D, S, D0) when ``n``
exceeds :data:`MANY_LABELS`; without O or D0 when they are no candidates
(:func:`default_and_alternatives`). For each alternative ``a``:
``g_a`` = mean over held-out samples of ``h_d − h_a``, ``se_a`` = their standard
deviation (``ddof=1``) / √(number held out). If some ``g_a > se_a``, the alternative with
the larger ``g_a`` (the first listed on a tie); otherwise the default. Both comparisons
are in exact arithmetic (:func:`~mmdtl2_dist.core.auto_folds.exceeds`): when a single
held-out sample's loss differs, ``g_a = se_a`` exactly, which is not a gain, and rounding
must not make it one (near the ceiling, most held-out losses are 0 for every candidate,
and this case is common).

**The source first.** Where D is the default with at most :data:`MANY_LABELS` labelled
targets in the smallest class (:func:`source_is_tested`), the source SVM is first fitted
on the labelled source alone and scores the labelled targets
(:func:`~mmdtl2_dist.core.auto_folds.source_alone_right`). If it is right on every one,
the pick is :data:`~mmdtl2_dist.core.auto_candidates.SOURCE_RIGHT_PICK`, N (``W`` held
near ``I``: nearly the source SVM on source and labelled targets), fitted once on the
labelled targets, without folds, self-training or smoothing: 2 fits. On the
near-identical devices of the dev data (Office webcam ↔ dslr, deep features) the folds
could not tell trusting the source from adapting (held-out hinge losses mostly below 0.1
for both), which cost up to a point on the test; on SURF and the pixel shifts the test
never held.

**Self-training from the fold fits.** The **unlabelled targets** are the pool's target
rows the prior may learn from that are not labelled. Each fold fit of the CV also scores
them (in the same fit as its held-out samples); the pick's raw multiclass decision scores
are averaged over its folds (one objective for every fold, so a score is a functional
margin in the same units). Per class, ``k`` unlabelled targets, those
predicted as that class with the largest margin of the top score over the second
(:func:`~mmdtl2_dist.core.self_training.confident_pseudo_labels`), join the labelled
targets with that label, and the pick is fitted once on them. ``k`` is the class's
labelled count, twice that on a **hard shift** (:func:`pseudo_labels_per_labelled`): the
pick's mean held-out hinge loss is at least :data:`HARD_HINGE` (the fold fits leave the
held-out targets inside the margin or misclassified) and no class has more than
:data:`DOUBLE_UP_TO` labelled targets. Without per-class folds (one label in some
class), without unlabelled targets, or when some class has more than :data:`MANY_LABELS`
labelled targets (many labels: the pseudo-labels' errors cost more than they add) the
final fit uses the labelled targets alone.

**Self-training validated on the folds.** Before the final fit self-trains, each of the
pick's fold fits is self-trained the same way (its own confident pseudo-labels, as many
per labelled target of the fold) and fitted again, and scores its held-out targets
(:func:`~mmdtl2_dist.core.self_training.self_trained_fold_hinge`). Self-training is
dropped when it raised the held-out hinge loss by more than :data:`SELF_TRAINING_Z`
standard errors (the guard's test, with self-training as the default, ties kept). On
raw-pixel dev data (MNIST → USPS, 3 labels a class) the MMDTL2 picks lost 7.0 points to
self-training although 90 % of their pseudo-labels were right; the folds see it. Fits:
at most ``1 + 4·min(n, 3) + min(n, 3) + 1`` = 17, the first the source test.

**Neighbour smoothing on a hard shift.** When the pick's mean held-out hinge loss is at
least :data:`HARD_HINGE` (on either kind of folds), no class has more than
:data:`MANY_LABELS` labelled targets (the range it was confirmed on) and there are
unlabelled targets, the final fit's scores of a target sample are averaged, at weight
0.5, with those of its 5 nearest unlabelled targets (:mod:`mmdtl2_dist.core.neighbours`;
applied on Grams by :mod:`mmdtl2_dist.core.auto_fit`, on features by the adapter). No
fit is added. Near the ceiling (deep features) smoothing lost where the target domain is
small, so it is kept to shifts the fold fits find hard (SURF, pixels), where it gained.

Each step was designed on dev data and confirmed on new split sets; BENCHMARKS.md gives
each design, confirmation and earlier version, from "Selection rule, frozen 2026-11-26 on
dev data" to "The source first where it needs no correction (SF-N)".

The rule is frozen: its candidates, dimensions, weights, folds and guard are constants
here and in :mod:`mmdtl2_dist.core.auto_folds` (its folds and guard), not parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from mmdtl2_dist.core.auto_candidates import (
    ALTERNATIVES,
    CANDIDATES,
    DEFAULT,
    MANY_LABELS_ALTERNATIVES,
    MANY_LABELS_DEFAULT,
    ONE_LABEL_ALTERNATIVES,
    ONE_LABEL_DEFAULT,
    SOURCE_RIGHT_PICK,
    TARGET_SVM_KEYS,
)
from mmdtl2_dist.core.auto_folds import (
    exceeds,
    fold_fits,
    guarded_pick,
    paired_gain,
    rule_folds,
    source_alone_right,
)
from mmdtl2_dist.core.methods import GramProblem
from mmdtl2_dist.core.neighbours import NEIGHBOUR_WEIGHT, NEIGHBOURS
from mmdtl2_dist.core.params import DEFAULTS
from mmdtl2_dist.core.pool import PoolMap, SamplePool, pool_problem
from mmdtl2_dist.core.priors import learnt_pca_map
from mmdtl2_dist.core.self_training import (
    final_scored_rows,
    self_trained_fold_hinge,
    self_training_pool,
    unlabelled_rows,
)

AUTO_RULE = "auto-2026-11-29-sfn"
HARD_HINGE = 0.25  # the pick's mean held-out hinge loss from which a shift is hard
DOUBLE_UP_TO = 3  # labelled targets per class up to which a hard shift doubles ``k``
# Labelled targets per class above which labels are "many": the target SVM is the default
# when every class has more, and no class with more self-trains.
MANY_LABELS = 10
# Self-training is kept unless, in the folds, it raised the pick's held-out hinge loss by
# more than this many standard errors.
SELF_TRAINING_Z = 1.0
# Labelled source samples per class up to which the L2 pull keeps the caller's ``c_d``; with
# more, ``c_d`` is scaled down so that the pull on a labelled target stays what it is here.
PULL_SOURCES_PER_CLASS = 20
# D without the pull (D0) is a candidate up to this many classes (the most it was designed
# and confirmed with, COIL20) and this many W-step variables of the labelled targets,
# classes x labelled targets (COIL20 at 20 labels a class, its largest fit timed: 18.6 s).
NO_PULL_MOST_CLASSES = 20
NO_PULL_MOST_VARIABLES = 8000
# What the rule chooses for its MMDTL2 candidates; the caller sets the rest (the target
# SVM, candidate O, keeps its own c_t and linear kernel: :func:`rule_params`).
RULE_KEYS = ("prior", "prior_weight", "c_f")


@dataclass
class AutoChoice:
    """What :func:`select_auto` chose, and why.

    ``pick`` names a :data:`~mmdtl2_dist.core.auto_candidates.CANDIDATES` entry,
    ``params`` the full parameters of its core method (:attr:`method`); ``pca_dim`` and
    ``prior_map`` (the shared-PCA map over the pool,
    :class:`~mmdtl2_dist.core.pool.PoolMap`) are set for a shared-PCA pick.
    ``table``: one row per fitted candidate (mean held-out hinge loss, gain over the
    default, its standard error). ``problem``: the final fit's :class:`GramProblem`, with
    the pick's prior blocks, the labelled targets followed by the ``pseudo_rows`` (target
    pool rows, labels ``pseudo_labels``), scoring the pool's ``target_test`` rows, then the
    ``neighbours`` rows not among them. ``n_unlabelled``: the unlabelled target rows the
    rule could learn from; ``neighbours``: those rows on a hard shift (the final scores are
    smoothed over them), else none. ``pseudo_per_labelled``: pseudo-labels taken per
    labelled target (:func:`pseudo_labels_per_labelled`; 0 also when the check dropped
    them). ``self_training_check``: the check's ``(gain, se)`` of the self-trained fold
    fits' held-out hinge loss (``None`` when not asked). ``fold_kind``: ``"per_class"``,
    ``"class_groups"`` (leave-classes-out) or ``None`` (no folds). ``c_d``: the pick's L2
    pull weight (0 for D0, else the MMDTL2 candidates' :func:`rule_pull` weight, also for
    the target SVM). ``source_right``: whether the source SVM alone was right on every
    labelled target (``None``: not tested, :func:`source_is_tested`).
    """

    pick: str
    params: dict
    pca_dim: int | None
    prior_map: PoolMap | None
    table: list[dict]
    n_folds: int
    n_per_class: int
    pool_size: int
    problem: GramProblem = field(repr=False)
    pseudo_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, int), repr=False)
    pseudo_labels: np.ndarray = field(default_factory=lambda: np.zeros(0, int), repr=False)
    n_unlabelled: int = 0
    pseudo_per_labelled: int = 0
    self_training_check: tuple[float, float] | None = None
    fold_kind: str | None = None
    c_d: float = DEFAULTS["mmdtl2"]["c_d"]
    rule: str = AUTO_RULE
    neighbours: np.ndarray = field(default_factory=lambda: np.zeros(0, int), repr=False)
    source_right: bool | None = None

    @property
    def n_fits(self) -> int:
        """Fits: the source test, candidates × folds, the self-training check, the final."""
        checked = self.n_folds if self.self_training_check is not None else 0
        tested = self.source_right is not None
        return tested + len(self.table) * self.n_folds + checked + 1

    @property
    def method(self) -> str:
        """The core method the pick is fitted with (``"mmdtl2"`` or ``"target_svm"``)."""
        return CANDIDATES[self.pick].method

    def record(self) -> dict:
        """The JSON-able provenance of the choice (rule version, pick, pool size, table)."""
        return {
            "rule": self.rule,
            "pick": self.pick,
            "label": CANDIDATES[self.pick].label,
            "method": self.method,
            "params": dict(CANDIDATES[self.pick].params),
            "c_d": self.c_d,
            "pca_dim": self.pca_dim,
            "n_folds": self.n_folds,
            "folds": self.fold_kind,
            "n_per_class": self.n_per_class,
            "pool_size": self.pool_size,
            "unlabelled": self.n_unlabelled,
            "pseudo_labelled": len(self.pseudo_rows),
            "pseudo_per_labelled": self.pseudo_per_labelled,
            "self_training_check": self.self_training_check,
            "neighbours": [NEIGHBOURS, NEIGHBOUR_WEIGHT] if len(self.neighbours) else None,
            "source_alone_right": self.source_right,
            "table": self.table,
        }


def check_auto_request(
    method: str,
    params: Mapping | None,
    asked: str = "select='auto'",
    remove_from: str = "the parameters, or fit a fixed configuration without select='auto'",
) -> None:
    """Refuse ``select="auto"`` for another method than MMDTL2, or with the rule's own keys.

    The rule sets :data:`RULE_KEYS` itself. ``asked`` and ``remove_from`` word the error
    as the caller's user wrote the request (the API, a study spec, the CLI).
    """
    if method != "mmdtl2":
        raise ValueError(f"{asked} is a rule for method 'mmdtl2', not {method!r}.")
    fixed = sorted(set(params or {}) & set(RULE_KEYS))
    if fixed:
        raise ValueError(
            f"{asked} chooses {list(RULE_KEYS)} itself; remove {fixed} from {remove_from}."
        )


def rule_params(cand: str, params: Mapping | None) -> dict:
    """The parameters candidate ``cand`` is fitted with.

    An MMDTL2 candidate: the caller's MMDTL2 ``params`` with its prior, weight and
    ``c_f``. The target SVM (O): its ``c_t = 1`` (the target SVM the rule is measured
    against) and the caller's solver settings
    (:data:`~mmdtl2_dist.core.auto_candidates.TARGET_SVM_KEYS`).
    """
    check_auto_request("mmdtl2", params)
    return picked_params(cand, params)


def picked_params(cand: str, params: Mapping | None) -> dict:
    """:func:`rule_params` over any parameters: the candidate's replace the caller's."""
    c = CANDIDATES[cand]
    if c.method == "target_svm":
        return {**{k: v for k, v in (params or {}).items() if k in TARGET_SVM_KEYS}, **c.params}
    return {**(params or {}), **c.params}


def rule_pull(params: Mapping | None, ys: np.ndarray) -> dict:
    """The caller's ``params`` with the L2 pull's ``c_d`` held to its design strength.

    The pull ``½ Σ s_nm ‖W x̂_m − x_n‖²``, ``s_nm = c_d [y_n = y_m]``, weighs a labelled
    target of class ``k`` by ``N_k c_d`` towards its class's source mean (``N_k`` its
    labelled source samples): it grows with the source. Where the source has on average
    more than :data:`PULL_SOURCES_PER_CLASS` samples a class, ``c_d`` is multiplied by
    that number over the average, so that the pull per labelled target is the one the
    rule was designed with (at most 20 source samples a class). The result always holds
    ``c_d`` (the core's default unless the caller gave one).
    """
    params = dict(params or {})
    per_class = len(ys) / max(len(np.unique(ys)), 1)
    c_d = float(params.get("c_d", DEFAULTS["mmdtl2"]["c_d"]))
    params["c_d"] = c_d * min(1.0, PULL_SOURCES_PER_CLASS / per_class) if per_class else c_d
    return params


def pca_dim(cand: str, n_classes: int, pool_size: int) -> int | None:
    """``d = min(k C, p − 1)`` of a shared-PCA candidate (None for the others)."""
    k = CANDIDATES[cand].pca_per_class
    return None if k is None else min(k * n_classes, pool_size - 1)


def pseudo_labels_per_labelled(most_per_class: int, pick_hinge: float) -> int:
    """Self-training's pseudo-labels per labelled target (module docstring).

    0 when the largest class has more than :data:`MANY_LABELS` labelled targets (on dev
    their errors then cost more than they add), 2 on a hard shift (``pick_hinge``, the
    pick's mean held-out hinge loss, at least :data:`HARD_HINGE`) with at most
    :data:`DOUBLE_UP_TO` labels in every class, else 1.
    """
    if most_per_class > MANY_LABELS:
        return 0
    return 2 if most_per_class <= DOUBLE_UP_TO and pick_hinge >= HARD_HINGE else 1


def no_pull_is_a_candidate(n_classes: int, n_labelled: int, c_d: float) -> bool:
    """Whether D without the pull (D0) is fitted.

    Only with a pull to drop (``c_d > 0``, else D0 is D), at most
    :data:`NO_PULL_MOST_CLASSES` classes and :data:`NO_PULL_MOST_VARIABLES` W-step
    variables of the ``n_labelled`` labelled targets.
    """
    return (
        c_d > 0
        and n_classes <= NO_PULL_MOST_CLASSES
        and n_classes * n_labelled <= NO_PULL_MOST_VARIABLES
    )


def default_and_alternatives(
    fewest_per_class: int, target_covers: bool = True, *, no_pull: bool
) -> tuple[str, tuple[str, ...]]:
    """The guard's default and alternatives.

    F guarded by N at one labelled target in some class; D guarded by (O, S, D0); O
    guarded by (D, S, D0) when every class has more than :data:`MANY_LABELS`. Without
    ``target_covers`` (some source class has no labelled target) the target SVM is no
    candidate; without ``no_pull`` (:func:`no_pull_is_a_candidate`) D0 is none.
    """
    if fewest_per_class < 2:
        return ONE_LABEL_DEFAULT, ONE_LABEL_ALTERNATIVES
    default, alternatives = DEFAULT, ALTERNATIVES
    if target_covers and fewest_per_class > MANY_LABELS:
        default, alternatives = MANY_LABELS_DEFAULT, MANY_LABELS_ALTERNATIVES
    drop = set() if no_pull else {"D0"}
    if not target_covers:
        drop |= {c for c in alternatives if CANDIDATES[c].method != "mmdtl2"}
    return default, tuple(a for a in alternatives if a not in drop)


def source_is_tested(default: str, fewest_per_class: int) -> bool:
    """Whether the source is tested: D is the default, the smallest class ≤ MANY_LABELS."""
    return default == DEFAULT and fewest_per_class <= MANY_LABELS


def choice_table(names, dims, hinge, gains) -> list[dict]:
    """One row per fitted candidate: its mean held-out hinge loss and gain over the default."""
    return [
        {
            "candidate": c,
            "label": CANDIDATES[c].label,
            "pca_dim": dims[c],
            "cv_hinge": float(hinge[c].mean()) if c in hinge else None,
            "gain_over_default": gains.get(c, (None, None))[0],
            "se": gains.get(c, (None, None))[1],
            "n_held_out": int(hinge[c].size) if c in hinge else 0,
        }
        for c in names
    ]


def select_auto(
    pool: SamplePool, ys, yt, params: Mapping | None = None, *, learn: np.ndarray | None = None
) -> AutoChoice:
    """The frozen rule (module docstring) on one split: the chosen configuration.

    ``pool`` holds the Grams of every sample the prior may learn from and the rows of the
    labelled source (``source_train``), labelled target (``target_train``) and scored
    (``target_test``, may be empty) samples; ``ys``, ``yt`` their labels; ``params``
    other MMDTL2 parameters (not the rule's :data:`RULE_KEYS`). ``learn``: a mask of the
    pool's rows (source rows first, as ``pool.Kyy``) that the prior learns from, by
    default all; rows outside it are only scored (e.g. test samples under an inductive
    protocol).
    """
    pool.validate()
    ys, yt = np.asarray(ys), np.asarray(yt)
    if yt.size == 0:
        raise ValueError(
            "select='auto' needs labelled target samples; got none (use SourceSVM without them)."
        )
    n_classes = len(np.unique(np.r_[ys, yt]))
    learn = np.ones(pool.Kyy.shape[0], bool) if learn is None else np.asarray(learn, bool)
    if learn.shape != (pool.Kyy.shape[0],):
        raise ValueError(
            f"learn must be a boolean mask of the pool's {pool.Kyy.shape[0]} rows, got shape "
            f"{learn.shape}."
        )
    p = int(learn.sum())
    params = rule_pull(params, ys)
    counts = np.unique(yt, return_counts=True)[1]
    n_min = int(counts.min())
    no_pull = no_pull_is_a_candidate(n_classes, len(yt), params["c_d"])
    default, alternatives = default_and_alternatives(
        n_min, bool(np.isin(ys, yt).all()), no_pull=no_pull
    )
    right = source_alone_right(pool, ys, yt) if source_is_tested(default, n_min) else None
    if right:
        default, alternatives = SOURCE_RIGHT_PICK, ()
    folds, per_class = ([], False) if right else rule_folds(pool, ys, yt)  # none: no choice
    names = [default, *alternatives] if folds else [default]
    unl = unlabelled_rows(pool, learn)
    unl_pool = pool.with_rows(target_test=unl if per_class else unl[:0])
    maps, dims, hinge, scores, per_fold, problems = {}, {}, {}, {}, {}, {}
    for c in names:  # candidates of one dimension share the map and the folds' blocks
        d = pca_dim(c, n_classes, p)
        if d not in problems:
            m, both = learnt_pca_map(pool, d, learn), (pool, unl_pool) if folds else ()
            problems[d] = (m, *(pool_problem(q, ys, yt, m, test_gram=False) for q in both))
        maps[c], *blocks = problems[d]
        dims[c] = None if maps[c] is None else maps[c].L.shape[1]
        if folds:
            hinge[c], scores[c], classes, per_fold[c] = fold_fits(
                CANDIDATES[c].method, rule_params(c, params), *blocks, folds
            )
    pick, gains = guarded_pick(hinge, default, alternatives) if folds else (default, {})
    fit_pool, fit_yt, pseudo, labels, times = pool, yt, np.zeros(0, int), yt[:0], 0
    if scores.get(pick) is not None:
        times = pseudo_labels_per_labelled(int(counts.max()), float(hinge[pick].mean()))
    st_check = None
    if times:
        st_hinge = self_trained_fold_hinge(
            CANDIDATES[pick].method, rule_params(pick, params), pool, ys, yt, maps[pick], unl,
            folds, per_fold[pick], classes, times,
        )  # fmt: skip
        st_check = paired_gain(hinge[pick], st_hinge)
        times = 0 if exceeds(-st_check[0], SELF_TRAINING_Z * st_check[1]) else times
    if times:
        fit_pool, fit_yt, pseudo, labels = self_training_pool(
            pool, yt, unl, scores[pick], classes, times
        )
    hard = bool(folds) and float(hinge[pick].mean()) >= HARD_HINGE
    near = unl if hard and counts.max() <= MANY_LABELS else unl[:0]
    return AutoChoice(
        pick, rule_params(pick, params), dims[pick], maps[pick],
        choice_table(names, dims, hinge, gains), len(folds), n_min, p,
        pool_problem(fit_pool.with_rows(target_test=final_scored_rows(pool, near)), ys, fit_yt,
                     maps[pick]),
        pseudo, labels, len(unl), times,
        st_check, ("per_class" if per_class else "class_groups") if folds else None,
        CANDIDATES[pick].params.get("c_d", params["c_d"]), AUTO_RULE, near, right,
    )  # fmt: skip
