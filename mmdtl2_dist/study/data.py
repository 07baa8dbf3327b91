"""Data of a study: the feature store (given, bundled or synthetic) and fixed split files.

Split file format (``[splits] protocol = "fixed"``, ``file = "splits.json"``)::

    {"pairs": {"amazon->webcam": [
        {"source_train": [0, 5, ...], "target_train": [...], "target_test": [...]},
        ...]}}

Indices are 0-based positions within each device's *labelled* samples (the store's row
order, the samples labelled -1 skipped): the positions in a store of labelled samples
only, so a split file stays valid when unlabelled samples are added to the store.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mmdtl2_dist.datasets.office_caltech import SPACE
from mmdtl2_dist.store.atomic import write_json_atomic

OFFICE_SPACE = SPACE


def pair_name(source: str, target: str) -> str:
    return f"{source}->{target}"


def build_office_caltech_store(path: Path) -> Path:
    """Write the bundled Office-Caltech10 SURF features as a feature store.

    One device per domain (``amazon``, ``webcam``, ``dslr``, ``caltech``), one shared
    space ``surf800``; labels 1..10, class names, image names as sample ids (the group
    of an image is its own name: the data set has no video or patient structure).
    Nothing is written if a complete store already exists at ``path``.
    """
    from mmdtl2_dist.datasets.office_caltech import CLASS_NAMES, DOMAINS, load_domain
    from mmdtl2_dist.store.feature_store import StoreWriter

    if (path / "metadata.parquet").exists():
        return path
    with StoreWriter(path, overwrite=False) as w:
        for name in DOMAINS:
            d = load_domain(name)
            a = w.create_array(
                name,
                OFFICE_SPACE,
                d.X.shape[0],
                d.X.shape[1],
                dtype=np.float64,
                source=f"office_caltech10 {name}",
            )
            a.append(d.X)
            ids = [f"{name}/{i}:{n}" for i, n in enumerate(d.image_names)]
            a.set_metadata(
                label=d.y, class_name=[CLASS_NAMES[k - 1] for k in d.y], group=ids, sample_id=ids
            )
    return path


def write_hoffman_split_file(path: Path) -> Path:
    """Write Hoffman et al.'s 20 fixed splits of the 12 shifts as a split file."""
    from mmdtl2_dist.datasets.office_caltech import SHIFTS, load_hoffman_splits

    if path.exists():
        return path
    pairs = {}
    for s, t in SHIFTS:
        pairs[pair_name(s, t)] = [
            {
                "source_train": sp.source_train.tolist(),
                "target_train": sp.target_train.tolist(),
                "target_test": sp.target_test.tolist(),
            }
            for sp in load_hoffman_splits(s, t)
        ]
    write_json_atomic(path, {"source": "Hoffman et al. (MMDT), 20 random trials", "pairs": pairs})
    return path


def read_split_file(path: Path, pair: str) -> list[dict]:
    """The split entries of one pair from a split file (see the module docstring)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read split file {str(path)!r}: {exc}") from exc
    pairs = doc.get("pairs") if isinstance(doc, dict) else None
    if not isinstance(pairs, dict):
        raise ValueError(
            f'split file {str(path)!r} must hold {{"pairs": {{"src->tgt": [...]}}}}}}}}.'
        )
    if pair not in pairs:
        raise ValueError(
            f"split file {str(path)!r} has no splits for {pair}; it has {sorted(pairs)}."
        )
    return pairs[pair]


def make_synthetic(path: Path, options: dict) -> Path:
    """Generate the ``[data.synthetic]`` store with the engine's generator (once)."""
    from mmdtl2_dist.store.synthetic import SyntheticSpec, make_synthetic_store

    if (path / "metadata.parquet").exists():
        return path
    try:
        spec = SyntheticSpec(**options)
    except TypeError as exc:
        raise ValueError(
            f"study spec: [data.synthetic] {exc}; see "
            "mmdtl2_dist.store.synthetic.SyntheticSpec for the options."
        ) from exc
    make_synthetic_store(path, spec, progress=None)
    return path
