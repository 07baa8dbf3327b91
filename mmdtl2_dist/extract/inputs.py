"""The images of an extraction job: a folder layout or a manifest, as one table.

Two ways to name the images (:func:`read_images`):

- a folder ``ROOT/<device>/<class>/<image>`` (``.png``, ``.jpg``, ``.jpeg``, ``.bmp``,
  ``.tif``, ``.tiff``, any case): the class folders' names are the class names, numbered
  in sorted order over all devices (so a class has the same label on every device);
  images directly in ``ROOT/<device>/`` are unlabelled. The sample id is the path
  relative to ``ROOT``; there are no groups.
- a manifest ``.csv`` or ``.parquet`` with one row per image and the columns ``path``
  (relative to the manifest's folder, or absolute), ``device``, and optionally ``label``
  (an integer, or a class name; empty: unlabelled), ``class_name``, ``group`` (patient,
  video: a video's frames share its group, so that group splits keep a video on one
  side) and ``sample_id`` (default: the path as written).

The table (:class:`ImageTable`) keeps the images of each device in their order (sorted
paths for a folder, the manifest's order otherwise); its rows are the rows of the
feature store. Nothing here reads an image.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
MANIFEST_SUFFIXES = (".csv", ".parquet")
COLUMNS = ("path", "device", "label", "class_name", "group", "sample_id")


@dataclass(frozen=True)
class ImageTable:
    """Images to extract, one row each, grouped by device in sorted device order.

    Columns: ``path`` (absolute), ``device``, ``label`` (-1: unlabelled), ``class_name``,
    ``group``, ``sample_id``.
    """

    frame: pd.DataFrame
    source: str

    @property
    def devices(self) -> list[str]:
        return sorted(self.frame["device"].unique().tolist())

    def rows_of(self, device: str) -> np.ndarray:
        """Row numbers (into :attr:`frame`) of ``device``'s images, in order."""
        return np.flatnonzero(self.frame["device"].to_numpy() == device)

    def digest(self) -> str:
        """Hash of the table and of each file's size and modification time.

        A resumed job must see the same images: a file replaced since the interrupted
        run changes its size or time and so the digest.
        """
        h = hashlib.sha256()
        h.update(self.frame[list(COLUMNS)].to_csv(index=False).encode())
        for p in self.frame["path"]:
            try:
                st = os.stat(p)
                h.update(f"{st.st_size}:{st.st_mtime_ns}\n".encode())
            except OSError:
                h.update(b"missing\n")
        return h.hexdigest()


def read_images(source: str | os.PathLike) -> ImageTable:
    """The images named by a folder layout or a manifest (see the module docstring).

    Raises
    ------
    FileNotFoundError
        If ``source`` does not exist.
    ValueError
        If it names no image, or the manifest lacks a column or holds a bad label.
    """
    path = Path(source).expanduser().absolute()
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist; give a folder DEVICE/CLASS/IMAGE or a manifest "
            "(.csv or .parquet with the columns path, device[, label, group, sample_id])."
        )
    if path.is_dir():
        frame = _folder_frame(path)
    elif path.suffix.lower() in MANIFEST_SUFFIXES:
        frame = _manifest_frame(path)
    else:
        raise ValueError(
            f"{path} is neither a folder nor a manifest; give a folder DEVICE/CLASS/IMAGE or "
            "a .csv / .parquet manifest."
        )
    order = np.argsort(frame["device"].to_numpy(), kind="stable")
    frame = frame.iloc[order].reset_index(drop=True)
    return ImageTable(frame[list(COLUMNS)], str(path))


def _is_image(p: Path) -> bool:
    return p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".")


def _folder_frame(root: Path) -> pd.DataFrame:
    rows = []
    for device in sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")):
        for item in sorted(device.iterdir()):
            if item.is_dir() and not item.name.startswith("."):
                rows += [
                    (p, device.name, item.name) for p in sorted(item.iterdir()) if _is_image(p)
                ]
            elif _is_image(item):
                rows.append((item, device.name, ""))
    if not rows:
        raise ValueError(
            f"{root} holds no images (expected {root}/DEVICE/CLASS/IMAGE or "
            f"{root}/DEVICE/IMAGE for unlabelled ones, with suffixes {', '.join(IMAGE_SUFFIXES)})."
        )
    classes = sorted({c for _, _, c in rows if c})
    number = {c: k for k, c in enumerate(classes)}
    return pd.DataFrame(
        {
            "path": [str(p) for p, _, _ in rows],
            "device": [d for _, d, _ in rows],
            "label": [number[c] if c else -1 for _, _, c in rows],
            "class_name": [c for _, _, c in rows],
            "group": "",
            "sample_id": [str(p.relative_to(root)) for p, _, _ in rows],
        }
    )


def _manifest_frame(path: Path) -> pd.DataFrame:
    if path.suffix.lower() == ".csv":
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    else:
        table = pd.read_parquet(path)
    missing = [c for c in ("path", "device") if c not in table.columns]
    if missing:
        raise ValueError(
            f"{path}: the manifest lacks the column(s) {missing}; it needs path and device "
            f"(and may have label, class_name, group, sample_id); it has {list(table.columns)}."
        )
    if table.empty:
        raise ValueError(f"{path}: the manifest lists no images.")
    written = table["path"].astype(str)
    paths = [str(p if Path(p).is_absolute() else (path.parent / p)) for p in written]
    label, class_name = _labels(path, table)
    return pd.DataFrame(
        {
            "path": paths,
            "device": table["device"].astype(str).to_numpy(),
            "label": label,
            "class_name": class_name,
            "group": _text_column(table, "group"),
            "sample_id": (
                _text_column(table, "sample_id") if "sample_id" in table else written.to_numpy()
            ),
        }
    )


def _text_column(table: pd.DataFrame, name: str) -> np.ndarray:
    if name not in table:
        return np.full(len(table), "", dtype=object)
    return table[name].fillna("").astype(str).to_numpy(dtype=object)


def _labels(path: Path, table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Integer labels (-1: unlabelled) and class names from ``label`` / ``class_name``.

    Labels that are all integers are kept; otherwise they are class names, numbered in
    sorted order. A given ``class_name`` column names the classes of integer labels.
    """
    n = len(table)
    names = _text_column(table, "class_name")
    if "label" not in table:
        return np.full(n, -1, np.int64), names
    text = table["label"].fillna("").astype(str).str.strip().to_numpy(dtype=object)
    given = text != ""
    try:
        label = np.array([int(float(t)) if t else -1 for t in text], dtype=np.int64)
        exact = all(float(t) == int(float(t)) for t in text[given])
    except ValueError:
        exact = False
    if exact:
        if (label[given] < 0).any():
            bad = np.flatnonzero(given & (label < 0))[:5].tolist()
            raise ValueError(
                f"{path}: negative labels in rows {bad} (0-based); leave the label empty for "
                "an unlabelled image."
            )
        return label, names
    classes = sorted(set(text[given].tolist()))
    number = {c: k for k, c in enumerate(classes)}
    label = np.array([number[t] if t else -1 for t in text], dtype=np.int64)
    return label, np.where(given, text, "")
