"""The bundled data sets: every file ships with the package, and the deep features load."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import numpy as np
import pytest

from mmdtl2_dist.datasets.office_caltech import load_domain
from mmdtl2_dist.datasets.office_caltech_deep import deep_domains, load_deep_domain

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ROOT / "mmdtl2_dist" / "datasets"


def test_every_bundled_data_file_is_package_data():
    """A file under datasets/ that no package-data pattern names is missing from a wheel."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = conf["tool"]["setuptools"]["package-data"]["mmdtl2_dist.datasets"]
    files = [
        p.relative_to(DATASETS).as_posix()
        for p in DATASETS.rglob("*")
        if p.is_file() and p.suffix in (".mat", ".md")
    ]
    assert any(f.startswith("office_caltech10_googlenet1024/") for f in files)
    assert any(f.startswith("office_caltech10_decaf6/") for f in files)
    missing = [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert not missing, f"not in package-data: {missing}"


@pytest.mark.parametrize(
    "features, dim", [("googlenet1024", 1024), ("decaf6", 4096)], ids=["googlenet", "decaf"]
)
def test_deep_features_have_the_surf_labels_and_their_provenance(features, dim):
    for name in deep_domains(features):
        dom = load_deep_domain(features, name)
        surf = load_domain(name)
        assert dom.X.shape == (surf.X.shape[0], dim) and dom.X.dtype == np.float64
        np.testing.assert_array_equal(dom.y, surf.y)  # same images per class, same order
        assert not dom.X.flags.writeable
    folder = {
        "googlenet1024": "office_caltech10_googlenet1024",
        "decaf6": "office_caltech10_decaf6",
    }
    assert "## Provenance" in (DATASETS / folder[features] / "SOURCE.md").read_text()


def test_unknown_feature_set_or_domain_names_the_choices():
    with pytest.raises(ValueError, match=r"unknown Office-Caltech10 feature set 'vgg'.*googlenet"):
        load_deep_domain("vgg", "amazon")
    with pytest.raises(ValueError, match=r"decaf6 features are bundled for \('webcam', 'dslr'\)"):
        load_deep_domain("decaf6", "amazon")
