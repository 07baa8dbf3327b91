"""Office-Caltech10 deep features (bundled): GoogLeNet-1024 and DeCAF6.

- ``googlenet1024``: 1024-d GoogLeNet (Szegedy et al., CVPR 2015) features of amazon,
  webcam and dslr (no caltech copy could be fetched);
- ``decaf6``: 4096-d DeCAF fc6 (Donahue et al., ICML 2014) features of webcam and dslr
  (the amazon and caltech files were too large for the snapshot they came from).

Rows are the images of one domain, labels 1..10 in the class order of the SURF files
(:data:`mmdtl2_dist.datasets.office_caltech.CLASS_NAMES`), with the same per-class counts.
The files carry no image names, so rows are not matched to the SURF files' rows. Provenance,
licence notes and the checks made are in each folder's ``SOURCE.md``
(``office_caltech10_googlenet1024/``, ``office_caltech10_decaf6/``).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import numpy as np
import scipy.io as sio

from mmdtl2_dist.datasets.office_caltech import Domain

#: Feature set -> (folder, {domain: file}, feature key, label key).
FEATURE_SETS = {
    "googlenet1024": (
        "office_caltech10_googlenet1024",
        {"amazon": "amazon.mat", "webcam": "webcam.mat", "dslr": "dslr.mat"},
        "fts",
        "labels",
    ),
    "decaf6": (
        "office_caltech10_decaf6",
        {"webcam": "Webcam_decaf.mat", "dslr": "dslr_decaf.mat"},
        "fea",
        "gnd",
    ),
}


def deep_domains(features: str) -> tuple[str, ...]:
    """The domains bundled for one feature set."""
    if features not in FEATURE_SETS:
        raise ValueError(
            f"unknown Office-Caltech10 feature set {features!r}; choose one of "
            f"{tuple(FEATURE_SETS)} (the SURF features are office_caltech.load_domain's)."
        )
    return tuple(FEATURE_SETS[features][1])


@lru_cache(maxsize=8)
def load_deep_domain(features: str, name: str) -> Domain:
    """Load one domain of a deep feature set as float64 (``image_names`` is empty).

    Parameters
    ----------
    features : {"googlenet1024", "decaf6"}
        Feature set.
    name : str
        Domain: one of :func:`deep_domains` of the set.
    """
    domains = deep_domains(features)
    if name not in domains:
        raise ValueError(f"the {features} features are bundled for {domains} only, not {name!r}.")
    folder, files, xkey, ykey = FEATURE_SETS[features]
    path = resources.files("mmdtl2_dist.datasets").joinpath(folder, files[name])
    with path.open("rb") as fh:
        d = sio.loadmat(fh)
    X = np.asarray(d[xkey], dtype=np.float64)
    y = np.asarray(d[ykey]).reshape(-1).astype(np.int64)
    if X.shape[0] != y.shape[0]:
        raise ValueError(
            f"bundled {features} data for {name!r} are inconsistent; reinstall mmdtl2-dist."
        )
    X.setflags(write=False)
    y.setflags(write=False)
    return Domain(name, X, y, ())
