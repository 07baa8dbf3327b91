"""Train/test splits of a study: drawn from a seed, or read from fixed split files.

Three protocols (``[splits] protocol`` of a study spec):

- ``"half"`` — the paper's protocol (Tamaki et al., Section 6): each domain is split at
  random into a training part (``train_fraction``, one half by default) and a test part,
  stratified by class. The source training part trains the source side; the target
  training part is the *pool* from which ``n`` labelled samples per class are kept; the
  target test part is a fixed test set for every ``n``.
- ``"group"`` — as ``"half"`` but whole groups (the ``group`` column of the feature store:
  frames of one video, images of one patient) go to one side, so nothing of a group
  straddles train and test. Groups are assigned per majority class to keep the split
  roughly stratified.
- ``"fixed"`` — split files (for example Hoffman et al.'s), given as index lists
  (positions among the device's labelled samples, :mod:`mmdtl2_dist.study.data`).

Indices are positions within one device's samples (0-based, in the store's row order).
Splits are drawn over the *labelled* samples of a device (label >= 0) and mapped to device
positions (:func:`on_device`): a store with extra unlabelled samples (label -1) gives the
same splits as the store without them. The unlabelled samples are never training or test
samples; :attr:`Split.target_unlabelled` lists those the split's non-test pool holds (see
:mod:`mmdtl2_dist.study.pools`).

The labelled target samples for ``n`` per class are the first ``n`` samples of each class
in a fixed random order of the pool (one order per split), so the labelled sets are
*nested*: the set for ``n = 5`` contains the set for ``n = 4``. Rows of a table then differ
only by the added samples, not by a new draw.

Every random draw uses ``numpy.random.default_rng`` seeded with ``(seed, split index,
stream)``, where ``stream`` is a stable CRC of the device pair and the side (source,
target); a split therefore reproduces from the seed alone, independently of the other
pairs, of the order of the spec and of the number of splits.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace

import numpy as np

PROTOCOLS = ("half", "group", "fixed")


@dataclass(frozen=True)
class Split:
    """One train/test split of a (source, target) device pair.

    Attributes
    ----------
    index : int
        Split number, 0-based.
    source_train : ndarray of int
        Source samples used for training.
    target_pool : ndarray of int
        Target training samples from which labelled samples are kept.
    target_test : ndarray of int
        Fixed target test set.
    target_order : ndarray of int
        ``target_pool`` in the random order used to keep ``n`` samples per class.
    target_unlabelled : ndarray of int
        Unlabelled target samples (label -1) on the training side of the split: never
        labelled, only in the pools of methods that use unlabelled samples.
    """

    index: int
    source_train: np.ndarray
    target_pool: np.ndarray
    target_test: np.ndarray
    target_order: np.ndarray
    target_unlabelled: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def _stream(*names: str) -> int:
    return zlib.crc32("\x1f".join(names).encode())


def _rng(seed: int, split: int, *names: str) -> np.random.Generator:
    return np.random.default_rng([int(seed), int(split), _stream(*names)])


def stratified_half(
    y: np.ndarray, rng: np.random.Generator, train_fraction: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """Split sample positions into train and test parts, stratified by class.

    Each class with ``n_k`` samples gives ``round(train_fraction * n_k)`` samples to the
    training part (at least one and at most ``n_k - 1`` when ``n_k >= 2``).

    Parameters
    ----------
    y : ndarray of shape (n,)
        Class labels.
    rng : numpy.random.Generator
        Random generator.
    train_fraction : float
        Fraction of each class in the training part.

    Returns
    -------
    train, test : ndarray of int
        Sorted positions.
    """
    y = np.asarray(y)
    train = []
    for k in np.unique(y):
        idx = np.flatnonzero(y == k)
        perm = rng.permutation(idx)
        n_train = int(round(train_fraction * idx.size))
        if idx.size >= 2:
            n_train = min(max(n_train, 1), idx.size - 1)
        train.append(perm[:n_train])
    train = np.sort(np.concatenate(train)) if train else np.zeros(0, dtype=np.int64)
    test = np.setdiff1d(np.arange(y.size), train)
    return train.astype(np.int64), test.astype(np.int64)


def group_half(
    y: np.ndarray, groups: np.ndarray, rng: np.random.Generator, train_fraction: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """Split whole groups into train and test parts, roughly stratified by class.

    Each group is filed under its most frequent class; within each class the groups are
    shuffled and moved to the training part while that keeps the class's training share
    closest to ``train_fraction``. A class with a single group goes to training.

    Parameters
    ----------
    y : ndarray of shape (n,)
        Class labels.
    groups : ndarray of shape (n,)
        Group identifiers (any hashable values; equal value = same group).
    rng : numpy.random.Generator
        Random generator.
    train_fraction : float
        Target fraction of each class in the training part.

    Returns
    -------
    train, test : ndarray of int
        Sorted positions; no group has samples on both sides.
    """
    y = np.asarray(y)
    groups = np.asarray(groups).astype(str)
    uniq, inverse = np.unique(groups, return_inverse=True)
    major = np.empty(uniq.size, dtype=y.dtype)
    sizes = np.bincount(inverse, minlength=uniq.size)
    for g in range(uniq.size):
        labels, counts = np.unique(y[inverse == g], return_counts=True)
        major[g] = labels[np.argmax(counts)]
    train_groups = []
    for k in np.unique(major):
        gk = rng.permutation(np.flatnonzero(major == k))
        goal = train_fraction * sizes[gk].sum()
        taken = 0
        for i, g in enumerate(gk):
            # The first group always trains; the last one always tests (when there are
            # several); in between, take a group while it brings the share closer.
            closer = abs(taken + sizes[g] - goal) < abs(taken - goal)
            if i > 0 and (i == gk.size - 1 or not closer):
                break
            train_groups.append(g)
            taken += sizes[g]
    is_train = np.isin(inverse, np.asarray(train_groups, dtype=np.int64))
    return np.flatnonzero(is_train).astype(np.int64), np.flatnonzero(~is_train).astype(np.int64)


def labelled_subset(split: Split, y_target: np.ndarray, n_per_class: int) -> np.ndarray:
    """The labelled target training samples for ``n_per_class`` samples per class.

    The first ``n_per_class`` samples of each class in ``split.target_order`` (so sets for
    growing ``n`` are nested). ``n_per_class = 0`` gives no target sample.

    Parameters
    ----------
    split : Split
        The split.
    y_target : ndarray
        Labels of all target samples (indexed by position).
    n_per_class : int
        Samples kept per class.

    Returns
    -------
    ndarray of int
        Positions of the kept samples, in ``target_order`` order.

    Raises
    ------
    ValueError
        If a class of the pool has fewer than ``n_per_class`` samples.
    """
    y_target = np.asarray(y_target)
    order = split.target_order
    labels = y_target[order]
    keep = np.zeros(order.size, dtype=bool)
    for k in np.unique(labels):
        where = np.flatnonzero(labels == k)
        if where.size < n_per_class:
            raise ValueError(
                f"split {split.index}: class {k.tolist()} has only "
                f"{where.size} target training "
                f"samples but {n_per_class} per class were requested; lower "
                "samples_per_class or raise train_fraction."
            )
        keep[where[:n_per_class]] = True
    return order[keep]


def draw_splits(
    y_source: np.ndarray,
    y_target: np.ndarray,
    *,
    n_splits: int,
    seed: int,
    pair: tuple[str, str],
    protocol: str = "half",
    train_fraction: float = 0.5,
    groups_source: np.ndarray | None = None,
    groups_target: np.ndarray | None = None,
    source_per_class: int | None = None,
) -> list[Split]:
    """Draw the random splits of one device pair.

    Parameters
    ----------
    y_source, y_target : ndarray
        Labels of all samples of the source and target devices.
    n_splits : int
        Number of splits.
    seed : int
        Study seed.
    pair : (str, str)
        Source and target device names (they seed independent streams).
    protocol : {"half", "group"}
        See the module docstring.
    train_fraction : float
        Share of each domain used for training.
    groups_source, groups_target : ndarray, optional
        Group identifiers, required by ``"group"``.
    source_per_class : int, optional
        Keep at most this many source training samples per class (first of a random
        order); all of the training part when ``None``.

    Returns
    -------
    list of Split
    """
    if protocol not in ("half", "group"):
        raise ValueError(f"draw_splits draws 'half' or 'group' splits, not {protocol!r}.")
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}.")
    if protocol == "group" and (groups_source is None or groups_target is None):
        raise ValueError(
            "protocol 'group' needs group identifiers for both devices; fill the 'group' "
            "column of the feature store or use protocol 'half'."
        )
    src, tgt = pair
    splits = []
    for i in range(n_splits):
        rs = _rng(seed, i, src, tgt, "source")
        rt = _rng(seed, i, src, tgt, "target")
        if protocol == "half":
            s_train, _ = stratified_half(y_source, rs, train_fraction)
            t_train, t_test = stratified_half(y_target, rt, train_fraction)
        else:
            s_train, _ = group_half(y_source, groups_source, rs, train_fraction)
            t_train, t_test = group_half(y_target, groups_target, rt, train_fraction)
        if source_per_class is not None:
            s_train = _first_per_class(rs.permutation(s_train), y_source, source_per_class)
        order = rt.permutation(t_train)
        splits.append(Split(i, s_train, t_train, t_test, order))
    return splits


def _first_per_class(order: np.ndarray, y: np.ndarray, n: int) -> np.ndarray:
    labels = np.asarray(y)[order]
    keep = np.zeros(order.size, dtype=bool)
    for k in np.unique(labels):
        keep[np.flatnonzero(labels == k)[:n]] = True
    return np.sort(order[keep])


def fixed_splits(
    entries: list[dict], *, seed: int, pair: tuple[str, str], n_source: int, n_target: int
) -> list[Split]:
    """Splits from fixed index lists (for example Hoffman et al.'s split files).

    Parameters
    ----------
    entries : list of dict
        One dict per split with ``source_train``, ``target_train`` and ``target_test``
        (0-based positions within each device).
    seed : int
        Seeds the order in which labelled target samples are kept.
    pair : (str, str)
        Source and target device names.
    n_source, n_target : int
        Number of labelled samples of each device (to check the indices).

    Returns
    -------
    list of Split
    """
    splits = []
    for i, e in enumerate(entries):
        missing = {"source_train", "target_train", "target_test"} - set(e)
        if missing:
            raise ValueError(f"split {i} of {pair[0]}->{pair[1]} lacks {sorted(missing)}.")
        s = np.asarray(e["source_train"], dtype=np.int64)
        t = np.asarray(e["target_train"], dtype=np.int64)
        q = np.asarray(e["target_test"], dtype=np.int64)
        for name, idx, n in (
            ("source_train", s, n_source),
            ("target_train", t, n_target),
            ("target_test", q, n_target),
        ):
            if idx.size and (idx.min() < 0 or idx.max() >= n):
                raise ValueError(
                    f"split {i} of {pair[0]}->{pair[1]}: {name} indices must be 0-based "
                    f"positions among the device's {n} labelled samples (below {n}), got "
                    f"range [{idx.min()}, {idx.max()}]."
                )
        if np.intersect1d(t, q).size:
            raise ValueError(
                f"split {i} of {pair[0]}->{pair[1]}: target_train and target_test share "
                "samples; fix the split file so that the test set is disjoint."
            )
        order = _rng(seed, i, pair[0], pair[1], "target").permutation(t)
        splits.append(Split(i, s, t, q, order))
    return splits


def on_device(
    split: Split, source: np.ndarray, target: np.ndarray, unlabelled: np.ndarray
) -> Split:
    """A split drawn over labelled samples, in device positions.

    ``source``/``target``: the device positions of the labelled samples the split was
    drawn over (sorted, so sorted index sets stay sorted); ``unlabelled``: the device
    positions of its :attr:`Split.target_unlabelled`.
    """
    return replace(
        split,
        source_train=source[split.source_train],
        target_pool=target[split.target_pool],
        target_test=target[split.target_test],
        target_order=target[split.target_order],
        target_unlabelled=np.asarray(unlabelled, dtype=np.int64),
    )


def check_disjoint(split: Split, groups_target: np.ndarray | None = None) -> None:
    """Raise if target training and test samples (or their groups) overlap."""
    if np.intersect1d(split.target_pool, split.target_test).size:
        raise ValueError(f"split {split.index}: target train and test samples overlap.")
    if groups_target is not None:
        g = np.asarray(groups_target).astype(str)
        common = np.intersect1d(g[split.target_pool], g[split.target_test])
        if common.size:
            raise ValueError(
                f"split {split.index}: groups {common[:5].tolist()} are on both sides."
            )
