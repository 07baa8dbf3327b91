"""Office-Caltech10 SURF features and Hoffman et al.'s 20 fixed splits (bundled).

The data are Gong et al.'s 800-bin SURF bag-of-words histograms of the four
Office-Caltech10 domains and the split files of Hoffman et al.'s MMDT code; see
``office_caltech10_surf/SOURCE.md`` for provenance, licence notes and the checks made.

Reference protocol (Hoffman et al., ICLR 2013): for each of the 12 shifts and each of
20 trials, the source training set has 20 images per class (8 when the source is webcam
or dslr), the target training set 3 per class, and the target test set is the rest of
the target domain.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np
import scipy.io as sio

DOMAINS = ("amazon", "webcam", "dslr", "caltech")
CLASS_NAMES = (
    "back_pack",
    "bike",
    "calculator",
    "headphones",
    "keyboard",
    "laptop_computer",
    "monitor",
    "mouse",
    "mug",
    "projector",
)
SHIFTS = tuple((s, t) for s in DOMAINS for t in DOMAINS if s != t)
_FILES = {
    "amazon": "amazon_SURF_L10",
    "webcam": "webcam_SURF_L10",
    "dslr": "dslr_SURF_L10",
    "caltech": "Caltech10_SURF_L10",
}
#: Hoffman et al.'s split files: 20 random trials per shift.
N_TRIALS = 20
#: The feature space of the bundled SURF features in a study spec.
SPACE = "surf800"


def _check_domain(name: str) -> None:
    if name not in DOMAINS:
        raise ValueError(f"unknown Office-Caltech10 domain {name!r}; choose one of {DOMAINS}.")


def _path(name: str):
    return resources.files("mmdtl2_dist.datasets").joinpath("office_caltech10_surf", name)


@dataclass(frozen=True)
class Domain:
    """One domain: features, labels (1..10) and image names, rows in file order."""

    name: str
    X: np.ndarray
    y: np.ndarray
    image_names: tuple[str, ...]


@lru_cache(maxsize=8)
def load_domain(name: str) -> Domain:
    """Load the SURF features of one domain as float64 (the files store uint8 counts).

    Parameters
    ----------
    name : {"amazon", "webcam", "dslr", "caltech"}
        Domain name.
    """
    _check_domain(name)
    with _path(_FILES[name] + ".mat").open("rb") as fh:
        d = sio.loadmat(fh)
    with _path(_FILES[name] + "_imgs.mat").open("rb") as fh:
        names = sio.loadmat(fh)["imgNames"]
    X = d["fts"].astype(np.float64)
    y = d["labels"].reshape(-1).astype(np.int64)
    image_names = tuple(str(n[0][0]) if n[0].size else "" for n in names)
    if X.shape[0] != y.shape[0] or X.shape[0] != len(image_names):
        raise ValueError(f"bundled data for {name!r} are inconsistent; reinstall mmdtl2-dist.")
    X.setflags(write=False)
    y.setflags(write=False)
    return Domain(name, X, y, image_names)


@dataclass(frozen=True)
class Split:
    """One trial of a shift: 0-based row indices into the source and target domains."""

    trial: int
    source_train: np.ndarray
    target_train: np.ndarray
    target_test: np.ndarray


@lru_cache(maxsize=16)
def load_hoffman_splits(source: str, target: str) -> tuple[Split, ...]:
    """Hoffman et al.'s 20 fixed splits of one shift, as 0-based indices.

    Parameters
    ----------
    source, target : str
        Domain names (different).
    """
    _check_domain(source)
    _check_domain(target)
    if source == target:
        raise ValueError("source and target must be different domains.")
    fname = f"SameCategory_{source}-{target}_20RandomTrials_10Categories.mat"
    with _path("splits/" + fname).open("rb") as fh:
        d = sio.loadmat(fh)
    train, test = d["train"][0, 0], d["test"][0, 0]

    def idx(arr) -> np.ndarray:
        out = np.asarray(arr, dtype=np.int64).reshape(-1) - 1  # MATLAB indices are 1-based
        out.setflags(write=False)
        return out

    return tuple(
        Split(
            trial=i,
            source_train=idx(train["source"][0, i]),
            target_train=idx(train["target"][0, i]),
            target_test=idx(test["target"][0, i]),
        )
        for i in range(train["source"].shape[1])
    )
