"""The unlabelled target pool of a method: the target samples it may use without labels.

A spec names the pool (``[splits] unlabelled``, or a method's own ``unlabelled``) in one of
two forms:

- a mode: ``"non-test"`` (default; every target sample of the device outside the test
  set: the split's labelled training part and the device's unlabelled samples),
  ``"all"`` (also the test samples' features, never their labels: the transductive
  protocol) or ``"none"`` (the labelled target samples only);
- a named pool, ``{ groups = ["session_7", "session_8"], mode = "non-test" }``: the
  samples of that mode whose ``group`` (the store's group column: a video, a session, a
  site) is one of the named groups, together with the unit's labelled samples. ``mode``
  is ``"non-test"`` (default) or ``"all"``; a labelled test sample of a named group is
  in the pool only with ``"all"``.

Unlabelled samples are the store's samples labelled ``-1``. They are never labelled
training or test samples (:mod:`mmdtl2_dist.study.splits` draws over the labelled ones);
a split's :attr:`~mmdtl2_dist.study.splits.Split.target_unlabelled` lists the ones its
``"non-test"`` pool holds: every unlabelled sample of the device, except, under protocol
``"group"``, those of a test group (a frame of a test video is on the test side, with or
without a label). ``"all"`` holds every unlabelled sample.

A pool is canonical after :func:`canonical_pool`: a mode string, or
``{"groups": sorted names, "mode": mode}``; its JSON is a trial's parameter and part of
its key.
"""

from __future__ import annotations

import json
from difflib import get_close_matches

import numpy as np

#: The pool modes (the string form of ``unlabelled``).
POOL_MODES = ("non-test", "all", "none")
#: The modes a named pool takes (``"none"`` holds no unlabelled sample to name).
NAMED_POOL_MODES = ("non-test", "all")
DEFAULT_POOL = "non-test"


def canonical_pool(pool) -> str | dict:
    """A schema-checked ``unlabelled`` value as a mode or ``{"groups", "mode"}``."""
    if isinstance(pool, str):
        return pool
    return {"groups": sorted(pool["groups"]), "mode": pool.get("mode", DEFAULT_POOL)}


def pool_mode(pool) -> str:
    """The mode of a canonical pool."""
    return pool if isinstance(pool, str) else pool["mode"]


def pool_groups(pool) -> list[str] | None:
    """The group names of a named pool (``None`` for a mode)."""
    return None if isinstance(pool, str) else list(pool["groups"])


def pool_text(pool) -> str:
    """A pool as one line (a run's parameter): the mode, or its JSON."""
    return pool if isinstance(pool, str) else json.dumps(pool, sort_keys=True)


def unlabelled_pool(pair, split, labelled: np.ndarray, pool=DEFAULT_POOL) -> np.ndarray:
    """Target positions (device-local) that a method may use without their labels.

    ``pair`` is the unit's :class:`~mmdtl2_dist.study.plan.PairPlan` (its labels mark
    the unlabelled samples, -1; its ``target_groups`` name the groups), ``split`` the
    split, ``labelled`` the unit's labelled target samples, ``pool`` a canonical pool
    (see the module docstring).
    """
    mode = pool_mode(pool)
    if mode not in POOL_MODES:
        raise ValueError(f"unlabelled must be 'non-test', 'all' or 'none', got {mode!r}.")
    if mode == "none":
        return np.sort(labelled)
    if mode == "all":
        unl = np.flatnonzero(np.asarray(pair.y_target) < 0)
        seen = np.union1d(np.union1d(split.target_pool, split.target_test), unl)
    else:
        seen = np.union1d(split.target_pool, split.target_unlabelled)
    groups = pool_groups(pool)
    if groups is None:
        return seen
    if pair.target_groups is None:
        raise ValueError(
            f"pair {pair.name}: the study plan records no target groups, which the named "
            "pool needs; delete plan.json and plan.npz from the study folder and resume."
        )
    named = seen[np.isin(np.asarray(pair.target_groups)[seen], groups)]
    return np.union1d(named, labelled)


def named_pools(spec) -> dict[str, list[str]]:
    """The group names of each method configuration whose pool names groups, by label."""
    out = {}
    for t in spec.trials():
        groups = pool_groups(t.unlabelled)
        if groups is not None:
            out[t.config.label] = groups
    return out


def check_pool_groups(spec, target_groups: dict[str, np.ndarray]) -> None:
    """Every named group is a group of a target device, and each target device has one.

    ``target_groups``: each target device of the study and its samples' groups.

    Raises
    ------
    ValueError
        Naming the method, the unknown groups (or the device with none of the named
        groups), some groups the devices do have, and the fix.
    """
    have = {dev: set(np.asarray(g, dtype=str).tolist()) - {""} for dev, g in target_groups.items()}
    known = set().union(*have.values()) if have else set()
    for label, groups in named_pools(spec).items():
        unknown = sorted(set(groups) - known)
        if unknown:
            near = sorted({m for u in unknown for m in get_close_matches(u, known, n=3)})
            raise ValueError(
                f"method {label!r}: unlabelled names groups {unknown} that no target device "
                f"of the study has (target devices {sorted(have)}, {len(known)} groups; "
                f"closest names: {near or sorted(known)[:8]}). Name groups of the store's "
                "group column in unlabelled = { groups = [...] }."
            )
        for dev, names in have.items():
            if not set(groups) & names:
                raise ValueError(
                    f"method {label!r}: none of the unlabelled groups {groups} is a group of "
                    f"target device {dev!r}; name at least one of its groups "
                    f"(e.g. {sorted(names)[:8]}), or leave its pairs out of [data] pairs."
                )
