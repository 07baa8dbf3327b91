"""The plan of a study (pairs, splits, row maps), stored as data: JSON plus a pickle-free npz.

The driver writes the plan once to ``<output>/plan.json`` and ``<output>/plan.npz``; every
trial, on every node, reads it back from there. A study folder lives on shared storage,
so its files are read as data only: nothing in it is unpickled.

- ``plan.json``: ``format`` (``"mmdtl2-study-plan"``), ``version``, the spec and data
  fingerprints, the seed, ``arrays_sha256`` (the digest of ``plan.npz``) and one entry
  per pair: names, devices, spaces, store and Gram paths, ``shared``, the indices of
  its splits and ``target_group_names`` (the target device's groups, for named pools).
- ``plan.npz``: int64 vectors named ``pair<i>.<field>`` (``source_rows``,
  ``target_rows``, ``target_rows_in_source`` when the pair shares a space, ``y_source``,
  ``y_target`` (-1: unlabelled), ``target_group`` (each target sample's index into
  ``target_group_names``)) and ``pair<i>.split<j>.<field>`` (``source_train``,
  ``target_pool``, ``target_test``, ``target_order``, ``target_unlabelled``), read with
  ``allow_pickle=False``. A plan without the group arrays or ``target_unlabelled`` reads
  as a plan of a store whose samples are all labelled and whose groups are unknown.

:func:`load_plan` checks every type, shape and index range, and that no unlabelled
sample is a training or test sample (an unlabelled one has no class to keep or score),
and raises :class:`PlanError` naming the file and what is wrong. The plan is a
deterministic function of the spec (its seed) and the data, so the fix is always the
same: delete both files and let the next ``mmdtl2 study resume`` draw it again.
"""

from __future__ import annotations

import hashlib
import io
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mmdtl2_dist.store.atomic import atomic_file, write_json_atomic
from mmdtl2_dist.study.splits import Split

PLAN_FORMAT = "mmdtl2-study-plan"
PLAN_VERSION = 1
PLAN_FILE = "plan.json"
#: The study folder's state file (spec, Gram provenance, last run's timing).
STATE_FILE = "study.json"

_PAIR_STRINGS = (
    "name",
    "source",
    "target",
    "source_gram",
    "target_gram",
    "store",
    "source_space",
    "target_space",
)
_PAIR_ARRAYS = ("source_rows", "target_rows", "target_rows_in_source", "y_source", "y_target")
_SPLIT_ARRAYS = (
    "source_train",
    "target_pool",
    "target_test",
    "target_order",
    "target_unlabelled",
)


@dataclass(frozen=True)
class PairPlan:
    """Everything a trial needs about one (source, target) device pair.

    ``*_rows`` map device positions (0..n_device-1) to Gram rows; ``y_*`` are labels
    (-1: unlabelled); ``target_groups`` the target samples' groups (``None`` when a plan
    does not record them).
    """

    name: str
    source: str
    target: str
    source_gram: str
    target_gram: str
    shared: bool
    source_rows: np.ndarray
    target_rows: np.ndarray
    target_rows_in_source: np.ndarray | None
    y_source: np.ndarray
    y_target: np.ndarray
    splits: list[Split]
    store: str
    source_space: str
    target_space: str
    target_groups: np.ndarray | None = None


@dataclass(frozen=True)
class StudyPlan:
    """The plan of a study: pairs and splits, written once and read by every trial."""

    spec_fingerprint: str
    data_fingerprint: str
    seed: int
    pairs: list[PairPlan]


class PlanError(ValueError):
    """A plan file is missing, malformed or of another format; the message says the fix."""


def arrays_path(path: str | Path) -> Path:
    """The ``.npz`` that holds the arrays of the plan ``path``."""
    return Path(path).with_suffix(".npz")


def save_plan(plan: StudyPlan, path: str | Path) -> None:
    """Write a plan as ``path`` (JSON) and ``arrays_path(path)`` (npz, no pickle).

    The arrays are written first and the JSON, which holds their digest, last: a plan
    whose JSON exists is complete.
    """
    path = Path(path)
    arrays, pairs = {}, []
    for i, p in enumerate(plan.pairs):
        for f in _PAIR_ARRAYS:
            if getattr(p, f) is not None:
                arrays[f"pair{i}.{f}"] = np.asarray(getattr(p, f), dtype=np.int64)
        for j, s in enumerate(p.splits):
            for f in _SPLIT_ARRAYS:
                arrays[f"pair{i}.split{j}.{f}"] = np.asarray(getattr(s, f), dtype=np.int64)
        entry = {f: getattr(p, f) for f in _PAIR_STRINGS}
        if p.target_groups is not None:
            names, codes = np.unique(np.asarray(p.target_groups, dtype=str), return_inverse=True)
            arrays[f"pair{i}.target_group"] = codes.astype(np.int64)
            entry["target_group_names"] = names.tolist()
        entry["shared"] = bool(p.shared)
        entry["splits"] = [int(s.index) for s in p.splits]
        pairs.append(entry)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    blob = buf.getvalue()
    with atomic_file(arrays_path(path)) as f:
        f.write(blob)
    doc = {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "spec_fingerprint": plan.spec_fingerprint,
        "data_fingerprint": plan.data_fingerprint,
        "seed": int(plan.seed),
        "arrays_sha256": hashlib.sha256(blob).hexdigest(),
        "pairs": pairs,
    }
    write_json_atomic(path, doc, indent=1)


def plan_error(path: Path, what: str) -> PlanError:
    """The error for an unusable plan ``path``: what is wrong, and how to draw it again."""
    return PlanError(
        f"study plan {path} is unusable: {what}. The plan is drawn from the spec and the "
        f"data alone; delete {path.name} and {arrays_path(path).name} and run "
        f"`mmdtl2 study resume {shlex.quote(str(path.parent))}` to draw it again."
    )


def _typed(path: Path, doc: dict, key: str, kind: type, where: str = ""):
    v = doc.get(key)
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise plan_error(path, f"{where}{key!r} must be a {kind.__name__}, got {v!r}")
    return v


def _read_json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise plan_error(path, "the file does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise plan_error(path, f"not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
        raise plan_error(path, f"not a {PLAN_FORMAT!r} file")
    if doc.get("version") != PLAN_VERSION:
        version = doc.get("version")
        raise plan_error(path, f"format version {version!r}, this code reads {PLAN_VERSION}")
    return doc


def _read_arrays(path: Path, digest: str) -> dict[str, np.ndarray]:
    npz = arrays_path(path)
    try:
        blob = npz.read_bytes()
    except OSError as exc:
        raise plan_error(path, f"its arrays cannot be read ({exc})") from None
    if hashlib.sha256(blob).hexdigest() != digest:
        raise plan_error(path, f"{npz.name} does not match the digest in {path.name}")
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as exc:  # noqa: BLE001 -- any decoding failure is a malformed file
        raise plan_error(path, f"{npz.name} is not a pickle-free npz of arrays ({exc})") from None


def _vector(
    path: Path, arrays: dict, key: str, bound: int | None = None, low: int = 0
) -> np.ndarray:
    a = arrays.get(key)
    if a is None:
        raise plan_error(path, f"array {key!r} is missing")
    if a.ndim != 1 or a.dtype.kind not in "iu":
        got = f"{a.dtype} {a.shape}"
        raise plan_error(path, f"array {key!r} must be a 1-D integer vector, got {got}")
    a = a.astype(np.int64)
    if a.size and (a.min() < low or (bound is not None and a.max() >= bound)):
        limit = f"[{low}, {bound})" if bound is not None else f">= {low}"
        raise plan_error(path, f"array {key!r} holds values outside {limit}")
    return a


def _read_split(path: Path, arrays: dict, key: str, index: int, ys, yt) -> Split:
    n_s, n_t = ys.size, yt.size
    s = _vector(path, arrays, f"{key}.source_train", n_s)
    pool = _vector(path, arrays, f"{key}.target_pool", n_t)
    test = _vector(path, arrays, f"{key}.target_test", n_t)
    order = _vector(path, arrays, f"{key}.target_order", n_t)
    unl = np.zeros(0, dtype=np.int64)
    if f"{key}.target_unlabelled" in arrays:
        unl = _vector(path, arrays, f"{key}.target_unlabelled", n_t)
    if not np.array_equal(np.sort(order), np.sort(pool)):
        raise plan_error(path, f"{key}.target_order is not an order of {key}.target_pool")
    for name, idx, y in (
        ("source_train", s, ys),
        ("target_pool", pool, yt),
        ("target_test", test, yt),
    ):
        if (y[idx] < 0).any():
            raise plan_error(path, f"{key}.{name} holds unlabelled samples (label -1)")
    if (yt[unl] >= 0).any():
        raise plan_error(path, f"{key}.target_unlabelled holds labelled samples")
    return Split(index, s, pool, test, order, unl)


def _read_groups(path: Path, arrays: dict, key: str, entry: dict, n_t: int) -> np.ndarray | None:
    """The target samples' groups of a pair, or ``None`` if the plan does not record them."""
    if "target_group_names" not in entry:
        return None
    names = _typed(path, entry, "target_group_names", list, f"{key}: ")
    if not all(isinstance(n, str) for n in names):
        raise plan_error(path, f"{key}: 'target_group_names' must be a list of strings")
    codes = _vector(path, arrays, f"{key}.target_group", len(names))
    if codes.size != n_t:
        raise plan_error(path, f"{key}.target_group and target_rows differ in length")
    return np.asarray(names, dtype=str)[codes] if names else np.zeros(0, dtype=str)


def _read_pair(path: Path, arrays: dict, i: int, entry) -> PairPlan:
    where = f"pair {i}: "
    if not isinstance(entry, dict):
        raise plan_error(path, f"{where}must be an object")
    text = {f: _typed(path, entry, f, str, where) for f in _PAIR_STRINGS}
    shared = _typed(path, entry, "shared", bool, where)
    indices = _typed(path, entry, "splits", list, where)
    key = f"pair{i}"
    src_rows = _vector(path, arrays, f"{key}.source_rows")
    tgt_rows = _vector(path, arrays, f"{key}.target_rows")
    ys = _vector(path, arrays, f"{key}.y_source", low=-1)
    yt = _vector(path, arrays, f"{key}.y_target", low=-1)
    if ys.size != src_rows.size or yt.size != tgt_rows.size:
        raise plan_error(path, f"{where}labels and Gram rows differ in length")
    in_src = None
    if shared:
        in_src = _vector(path, arrays, f"{key}.target_rows_in_source")
        if in_src.size != tgt_rows.size:
            raise plan_error(path, f"{where}target_rows_in_source and target_rows differ in length")
    splits = []
    for j, index in enumerate(indices):
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise plan_error(path, f"{where}split index {index!r} is not an integer >= 0")
        splits.append(_read_split(path, arrays, f"{key}.split{j}", index, ys, yt))
    return PairPlan(
        shared=shared,
        source_rows=src_rows,
        target_rows=tgt_rows,
        target_rows_in_source=in_src,
        y_source=ys,
        y_target=yt,
        splits=splits,
        target_groups=_read_groups(path, arrays, key, entry, yt.size),
        **text,
    )


def load_plan(path: str | Path) -> StudyPlan:
    """Read and check a plan written by :func:`save_plan`.

    Raises
    ------
    PlanError
        If either file is missing or malformed (wrong format or version, a digest that
        does not match, a missing or non-integer array, an index out of range).
    """
    path = Path(path)
    doc = _read_json(path)
    arrays = _read_arrays(path, _typed(path, doc, "arrays_sha256", str))
    pairs = _typed(path, doc, "pairs", list)
    return StudyPlan(
        spec_fingerprint=_typed(path, doc, "spec_fingerprint", str),
        data_fingerprint=_typed(path, doc, "data_fingerprint", str),
        seed=_typed(path, doc, "seed", int),
        pairs=[_read_pair(path, arrays, i, e) for i, e in enumerate(pairs)],
    )
