"""Prepare a study's data: the store, the device pairs, the Grams, the splits and the plan.

The driver-side steps before any trial runs (:mod:`mmdtl2_dist.study.runner`, steps 1-3):
:func:`prepare_data` (the given store, or the bundled / synthetic one built in
``<output>/data``), :func:`check_data` (the spec against the store's metadata: devices,
spaces, class sets, splits that can hold the requested labelled samples and a test set;
``mmdtl2 study validate`` runs the same check), :func:`compute_grams` and
:func:`build_plan` (the splits and the Gram rows of every pair, saved as the plan).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mmdtl2_dist.progress import say
from mmdtl2_dist.store.outputs import make_output_folder
from mmdtl2_dist.study.data import (
    build_office_caltech_store,
    make_synthetic,
    pair_name,
    read_split_file,
    write_hoffman_split_file,
)
from mmdtl2_dist.study.plan import (
    PairPlan,
    StudyPlan,
    load_plan,
    plan_error,
    save_plan,
)
from mmdtl2_dist.study.pools import check_pool_groups
from mmdtl2_dist.study.spec import StudySpec
from mmdtl2_dist.study.splits import (
    Split,
    check_disjoint,
    draw_splits,
    fixed_splits,
    labelled_subset,
    on_device,
)


def _data_folder(data_dir: Path, output: Path) -> None:
    """Create the folder of a study's built data, unless it exists.

    A study that is only read (``register``, ``validate``) needs no write permission.
    """
    if not data_dir.is_dir():
        make_output_folder(data_dir, output)


def prepare_data(spec: StudySpec, data_dir: Path | None = None) -> tuple[Path, Path | None]:
    """The feature store and split file of a study (building bundled/synthetic data).

    Bundled and synthetic data are built in ``data_dir`` (default ``<output>/data``); a
    given store is used where it is, and nothing is written.
    """
    data_dir = spec.output / "data" if data_dir is None else data_dir
    split_file = spec.split_file
    if spec.builtin == "office_caltech10":
        _data_folder(data_dir, spec.output)
        store = build_office_caltech_store(data_dir / "office_caltech10.zarr")
        if spec.protocol == "fixed" and split_file is None:
            split_file = write_hoffman_split_file(data_dir / "hoffman_splits.json")
    elif spec.synthetic is not None:
        _data_folder(data_dir, spec.output)
        store = make_synthetic(data_dir / "synthetic.zarr", spec.synthetic)
    else:
        store = spec.store
    return store, split_file


def resolve_pairs(spec: StudySpec, fs) -> list[tuple[str, str]]:
    """The device pairs of the study, checked against the store."""
    for space in {spec.source_space, spec.target_space}:
        if space not in fs.spaces:
            raise ValueError(
                f"the feature store has no space {space!r}; it has {fs.spaces}. "
                "Fix source_space/target_space in [data]."
            )
    src_devs, tgt_devs = fs.devices_in(spec.source_space), fs.devices_in(spec.target_space)
    if spec.pairs == "all":
        pairs = [(s, t) for s in src_devs for t in tgt_devs if s != t]
        if not pairs:
            raise ValueError('pairs = "all" found no two devices; list pairs explicitly.')
        return pairs
    for s, t in spec.pairs:
        if s not in src_devs:
            raise ValueError(
                f"device {s!r} has no features in {spec.source_space!r}; devices "
                f"there: {src_devs}. Fix [data] pairs."
            )
        if t not in tgt_devs:
            raise ValueError(
                f"device {t!r} has no features in {spec.target_space!r}; devices "
                f"there: {tgt_devs}. Fix [data] pairs."
            )
    return list(spec.pairs)


def compute_grams(
    spec: StudySpec, store: Path, *, address: str | None, progress: bool | None
) -> dict[str, str]:
    """The Gram of each feature space of the study: reused if present, else computed."""
    from mmdtl2_dist.engine import compute_gram

    out = {}
    for space in dict.fromkeys([spec.source_space, spec.target_space]):
        t0 = time.perf_counter()
        g = compute_gram(
            store,
            space,
            gram_dir=spec.gram_dir,
            preprocessing=spec.preprocessing,
            precision=spec.gram_precision,
            address=address,
            progress=progress,
        )
        how = "reused" if g.reused else f"computed ({g.last_run['computed']} tiles)"
        say(
            progress,
            f"study: Gram of {space!r} ({g.n} samples) {how} in "
            f"{time.perf_counter() - t0:.1f} s: {g.path}",
        )
        out[space] = str(g.path)
    return out


def gram_provenance(grams: dict[str, str]) -> dict[str, dict]:
    """Key, folder and store fingerprint of each Gram of a study (state and MLflow)."""
    from mmdtl2_dist.engine import GramStore

    out = {}
    for space, path in grams.items():
        g = GramStore.open(path)
        out[space] = {"key": g.key, "path": path, "store_fingerprint": g.job["store_fingerprint"]}
    return out


@dataclass(frozen=True)
class PairSplits:
    """The splits of one device pair, drawn from the store's metadata alone.

    ``y_*`` are every sample's labels (-1: unlabelled), ``target_groups`` the target
    samples' groups (named pools), ``n_unlabelled_source`` the source samples left out of
    training for want of a label.
    """

    source: str
    target: str
    y_source: np.ndarray
    y_target: np.ndarray
    splits: list[Split]
    target_groups: np.ndarray
    n_unlabelled_source: int = 0


def _check_labelled(name: str, devices: tuple[str, str], ys: np.ndarray, yt: np.ndarray) -> None:
    """Each device of a pair has labelled samples to train (and the target to test) on."""
    for side, dev, y in zip(("source", "target"), devices, (ys, yt), strict=True):
        if not (y >= 0).any():
            raise ValueError(
                f"{name}: {side} device {dev!r} has no labelled sample ({y.size} samples, all "
                "labelled -1); a study trains and tests on labelled samples. Label some of "
                "them (the label column of the extract manifest) or leave the pair out of "
                "[data] pairs."
            )


def _check_classes(name: str, devices: tuple[str, str], ys: np.ndarray, yt: np.ndarray) -> None:
    """The same classes among the labelled samples of both devices of a pair."""
    s, t = devices
    lacks = [
        f"classes {sorted(set(a.tolist()) - set(b.tolist()))} of {da!r} have no {db!r} sample"
        for da, a, db, b in ((t, yt, s, ys), (s, ys, t, yt))
        if set(a.tolist()) - set(b.tolist())
    ]
    if lacks:
        raise ValueError(
            f"{name}: both devices must have the same classes, but " + "; ".join(lacks) + ". "
            "Give both devices the same class labels at ingest, or leave the pair out of "
            "[data] pairs."
        )


def _check_class_counts(spec: StudySpec, name: str, device: str, yt: np.ndarray) -> None:
    """Each target class has the labelled samples the study asks: ``n`` to train, 1 to test.

    Split files choose their test samples themselves, so protocol ``"fixed"`` asks ``n``.
    """
    n = max(spec.samples_per_class)
    need = n if spec.protocol == "fixed" else n + 1
    labels, counts = np.unique(yt, return_counts=True)
    short = [
        f"class {k} has {c}"
        for k, c in zip(labels.tolist(), counts.tolist(), strict=True)
        if c < need
    ]
    if short:
        asks = f"{n} labelled per class" + ("" if need == n else " plus 1 to test")
        raise ValueError(
            f"{name}: target device {device!r} has too few labelled samples: "
            f"{', '.join(short)}; the study asks {asks} ({need}). Label more samples of "
            f"those classes on {device!r} or lower samples_per_class."
        )


def _groups(spec: StudySpec, pair: tuple[str, str], ms, mt) -> tuple:
    """Group identifiers of both devices for protocol ``group`` (else ``None``s)."""
    if spec.protocol != "group":
        return None, None
    groups = ms["group"].to_numpy(str), mt["group"].to_numpy(str)
    for dev, g in zip(pair, groups, strict=True):
        if (g == "").any():
            raise ValueError(
                f"protocol 'group' needs the group column of device "
                f"{dev!r}, which is empty; fill it at ingest or use "
                "protocol 'half'."
            )
    return groups


def _draw_pair(
    spec: StudySpec, split_file: Path | None, pair: tuple[str, str], ys, yt, groups
) -> list[Split]:
    """The splits of one pair (drawn, or read from the split file), unchecked."""
    if spec.protocol == "fixed":
        name = pair_name(*pair)
        entries = read_split_file(split_file, name)
        if len(entries) < spec.n_splits:
            raise ValueError(
                f"{name}: the split file has {len(entries)} splits but "
                f"n_splits = {spec.n_splits}; lower n_splits."
            )
        return fixed_splits(
            entries[: spec.n_splits], seed=spec.seed, pair=pair, n_source=ys.size, n_target=yt.size
        )
    return draw_splits(
        ys,
        yt,
        n_splits=spec.n_splits,
        seed=spec.seed,
        pair=pair,
        protocol=spec.protocol,
        train_fraction=spec.train_fraction,
        groups_source=groups[0],
        groups_target=groups[1],
        source_per_class=spec.source_per_class,
    )


def _check_splits(spec: StudySpec, name: str, splits: list[Split], yt, groups_t) -> None:
    """Disjoint splits with training samples, a test set and enough labelled samples."""
    for sp in splits:
        check_disjoint(sp, groups_t)
        if sp.source_train.size == 0:
            raise ValueError(
                f"{name}: split {sp.index} has no source training sample; raise "
                "train_fraction or fix the split file."
            )
        if sp.target_test.size == 0:
            raise ValueError(
                f"{name}: split {sp.index} has no target test sample (each target class "
                "has too few samples or groups to leave one for testing); lower "
                "train_fraction, add target samples, or fix the split file."
            )
        try:
            labelled_subset(sp, yt, max(spec.samples_per_class))
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from exc


def pair_splits(spec: StudySpec, fs, split_file: Path | None) -> list[PairSplits]:
    """Draw (or read) and check the splits of every pair, from the store's metadata only.

    No feature is read and no Ray is needed, so this runs before any compute (``study
    validate``, and the start of ``study run``) and fails in seconds on a spec that
    the data cannot serve.

    Raises
    ------
    ValueError
        Naming the pair, split and class, and the fix: an unknown space or device, a
        device without labelled samples, a class on one device only, a target class with
        fewer labelled samples than the largest ``samples_per_class`` plus one to test,
        too few splits in the split file, an empty group column, a split with no source
        training or no target test sample, a class with fewer target training samples
        than the largest ``samples_per_class``, a named unlabelled pool whose groups the
        target devices lack.

    Samples labelled -1 are unlabelled: the splits are drawn over the labelled samples
    (:func:`~mmdtl2_dist.study.splits.on_device`), the unlabelled target samples join
    the pools of :mod:`mmdtl2_dist.study.pools`, the unlabelled source samples are left
    out (:func:`unlabelled_notes`).
    """
    meta = fs.metadata
    out = []
    for s, t in resolve_pairs(spec, fs):
        ms = meta[(meta.device == s) & (meta.space == spec.source_space)].sort_values("row")
        mt = meta[(meta.device == t) & (meta.space == spec.target_space)].sort_values("row")
        out.append(_one_pair_splits(spec, split_file, (s, t), ms, mt))
    check_pool_groups(spec, {p.target: p.target_groups for p in out})
    return out


def _one_pair_splits(spec: StudySpec, split_file: Path | None, pair, ms, mt) -> PairSplits:
    """The checked splits of one pair, drawn over its labelled samples (:func:`on_device`)."""
    ys, yt = ms["label"].to_numpy(np.int64), mt["label"].to_numpy(np.int64)
    name = pair_name(*pair)
    _check_labelled(name, pair, ys, yt)
    ls, lt = np.flatnonzero(ys >= 0), np.flatnonzero(yt >= 0)
    _check_classes(name, pair, ys[ls], yt[lt])
    _check_class_counts(spec, name, pair[1], yt[lt])
    groups = _groups(spec, pair, ms, mt)
    drawn_groups = (None, None) if groups[0] is None else (groups[0][ls], groups[1][lt])
    drawn = _draw_pair(spec, split_file, pair, ys[ls], yt[lt], drawn_groups)
    _check_splits(spec, name, drawn, yt[lt], drawn_groups[1])
    splits = [
        on_device(sp, ls, lt, _training_side_unlabelled(sp, yt, lt, groups[1])) for sp in drawn
    ]
    target_groups = mt["group"].to_numpy(str)
    return PairSplits(*pair, ys, yt, splits, target_groups, int((ys < 0).sum()))


def _training_side_unlabelled(split: Split, yt: np.ndarray, lt: np.ndarray, groups) -> np.ndarray:
    """The unlabelled target samples on the training side of a split drawn over ``lt``.

    All of them, except under protocol ``"group"`` those of a test group.
    """
    unlabelled = np.flatnonzero(yt < 0)
    if groups is None:
        return unlabelled
    test_groups = groups[lt[split.target_test]]
    return unlabelled[~np.isin(groups[unlabelled], test_groups)]


def unlabelled_notes(pairs: list[PairSplits]) -> list[str]:
    """One line per source device whose unlabelled samples a study leaves out of training."""
    left_out = {p.source: p.n_unlabelled_source for p in pairs if p.n_unlabelled_source}
    return [
        f"study: {n} unlabelled samples (label -1) of source device {dev!r} are left out "
        "(a source sample trains only with its label)"
        for dev, n in left_out.items()
    ]


def check_data(spec: StudySpec, store: Path, split_file: Path | None) -> list[PairSplits]:
    """Check the spec against the store's metadata (see :func:`pair_splits`)."""
    from mmdtl2_dist.store.feature_store import FeatureStore

    return pair_splits(spec, FeatureStore.open(store), split_file)


def validate_data(spec: StudySpec) -> str:
    """What ``study validate`` checks of the data: one line, or a ``ValueError``.

    A given store is checked where it is. The bundled data set is built in a temporary
    folder (a second or two) and checked there. Synthetic data are generated by ``study
    run`` itself, which checks them before Ray starts; an already generated store is
    checked.
    """
    import tempfile

    if spec.synthetic is not None and not (spec.output / "data" / "synthetic.zarr").exists():
        return "data: synthetic, generated and checked by `mmdtl2 study run` before Ray starts"
    with tempfile.TemporaryDirectory(prefix="mmdtl2-validate-") as tmp:
        store, split_file = prepare_data(spec, Path(tmp) if spec.builtin else None)
        pairs = check_data(spec, store, split_file)
    line = (
        f"data: {len(pairs)} device pair(s) x {spec.n_splits} splits checked against the "
        f"store; each split holds {max(spec.samples_per_class)} labelled target samples "
        "per class and a test set"
    )
    return "\n".join([line, *unlabelled_notes(pairs)])


def build_plan(
    spec: StudySpec, store: Path, split_file: Path | None, grams: dict[str, str]
) -> StudyPlan:
    """Draw (or read) the splits of every pair and map device rows to Gram rows."""
    from mmdtl2_dist.engine import GramStore
    from mmdtl2_dist.store.feature_store import FeatureStore

    fs = FeatureStore.open(store)
    gs_src, gs_tgt = (
        GramStore.open(grams[spec.source_space]),
        GramStore.open(grams[spec.target_space]),
    )
    shared = spec.shared_space
    pairs = [
        PairPlan(
            name=pair_name(p.source, p.target),
            source=p.source,
            target=p.target,
            source_gram=grams[spec.source_space],
            target_gram=grams[spec.target_space],
            shared=shared,
            source_rows=gs_src.rows(p.source),
            target_rows=gs_tgt.rows(p.target),
            target_rows_in_source=gs_src.rows(p.target) if shared else None,
            y_source=p.y_source,
            y_target=p.y_target,
            splits=p.splits,
            target_groups=p.target_groups,
            store=str(store),
            source_space=spec.source_space,
            target_space=spec.target_space,
        )
        for p in pair_splits(spec, fs, split_file)
    ]
    return StudyPlan(spec.fingerprint(), fs.fingerprint, spec.seed, pairs)


def study_plan(
    spec: StudySpec, store: Path, split_file: Path | None, grams: dict[str, str], path: Path
) -> StudyPlan:
    """The study's plan: drawn and written once, later read back and checked against this run.

    A plan read back must name this spec, this store (its content fingerprint) and this
    study's Gram stores; trials read exactly what it names.
    """
    from mmdtl2_dist.store.feature_store import FeatureStore

    if not path.exists():
        plan = build_plan(spec, store, split_file, grams)
        save_plan(plan, path)
        return plan
    plan = load_plan(path)
    named = {g for p in plan.pairs for g in (p.source_gram, p.target_gram)}
    if plan.spec_fingerprint != spec.fingerprint():
        raise plan_error(path, "it was drawn for another spec")
    if plan.data_fingerprint != FeatureStore.open(store).fingerprint:
        raise plan_error(
            path,
            f"it was drawn from other data than the store {store} (drawn again, it sets the "
            "old data's trial results aside in results/other_data and runs those trials again)",
        )
    if any(p.store != str(store) for p in plan.pairs) or not named <= set(grams.values()):
        raise plan_error(path, "it names a store or Gram stores other than this study's")
    return plan
