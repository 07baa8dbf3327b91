"""One Gram per store content, space and preprocessing, computed once and reused.

Real Zarr stores, a real local Ray, real driver processes holding and waiting for the
Gram's lock (and one killed with SIGKILL while holding it), and real studies.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_engine import kill_session
from test_study import make_store

from mmdtl2_dist.commands import gram as gram_cmd
from mmdtl2_dist.engine import GramStore, compute_gram, gram_location, gram_tile_plan
from mmdtl2_dist.store import FeatureStore, StoreWriter
from mmdtl2_dist.study.spec import SpecError, load_spec

REPO = Path(__file__).resolve().parents[1]


def _store(path, seed=0, sizes=(30, 18), L=12):
    """A two-device store in space ``s``; returns the stacked features (Gram row order)."""
    rng = np.random.default_rng(seed)
    Xs = []
    with StoreWriter(path, overwrite=True) as w:
        for d, n in zip(("a", "b"), sizes, strict=True):
            X = rng.standard_normal((n, L))
            w.create_array(d, "s", n, L, dtype=np.float64, chunk_rows=8).append(X)
            Xs.append(X)
    return np.concatenate(Xs)


def _markers(gs: GramStore) -> dict:
    return {k: (m["attempt"], m["pid"]) for k, m in gs.finished_tiles().items()}


# -- the key and the location ------------------------------------------------------------


@pytest.mark.ray
def test_gram_folder_is_keyed_by_store_content_space_and_preprocessing(ray_local, tmp_path):
    st = tmp_path / "st.zarr"
    X = _store(st)
    fp = FeatureStore.open(st).fingerprint
    gs = compute_gram(st, "s", tile_rows=8, progress=False)
    assert gs.path == tmp_path / "st.zarr.grams" / f"s__none__{fp[:16]}"
    assert gs.key == gs.path.name and not gs.reused
    n_tiles = len(gram_tile_plan(48, 8))
    assert gs.last_run["computed"] == n_tiles
    np.testing.assert_allclose(gs.to_numpy(), X @ X.T, rtol=1e-12)

    # The same store content, space and preprocessing: reused whatever the tile size.
    again = compute_gram(st, "s", tile_rows=16, progress=False)
    assert again.path == gs.path and again.reused and again.tile_rows == 8
    assert again.last_run["computed"] == 0
    assert again.last_run["skipped"] == again.last_run["verified"] == n_tiles
    assert _markers(again) == _markers(gs)
    # Other preprocessing: another Gram beside it.
    l2 = compute_gram(st, "s", preprocessing="l2", progress=False)
    assert l2.path == gs.path.with_name(f"s__l2__{fp[:16]}") and not l2.reused

    # The store rewritten with other features: another fingerprint, never the old Gram.
    job_before = (gs.path / "job.json").read_text()
    X2 = _store(st, seed=1)
    fp2 = FeatureStore.open(st).fingerprint
    assert fp2 != fp
    new = compute_gram(st, "s", progress=False)
    assert new.path == gs.path.with_name(f"s__none__{fp2[:16]}") and not new.reused
    np.testing.assert_allclose(new.to_numpy(), X2 @ X2.T, rtol=1e-12)
    assert (gs.path / "job.json").read_text() == job_before  # the old Gram is left alone


def test_unusable_gram_folder_and_conflicting_arguments_are_named(tmp_path):
    st = tmp_path / "st.zarr"
    _store(st)
    (tmp_path / "afile").write_text("x")
    unusable = r"cannot create the Gram folder .*afile/grams.*--gram-dir"
    with pytest.raises(ValueError, match=unusable):
        compute_gram(st, "s", gram_dir=tmp_path / "afile" / "grams", progress=False)
    with pytest.raises(ValueError, match="out_path .* or gram_dir, not both"):
        compute_gram(st, "s", tmp_path / "g", gram_dir=tmp_path / "d", progress=False)
    parser = argparse.ArgumentParser()
    gram_cmd.register(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["gram", str(st), "--out", "x", "--gram-dir", "y"])
    assert not (tmp_path / "st.zarr.grams").exists()  # nothing written


# -- two processes, one Gram -------------------------------------------------------------

_DRIVER = textwrap.dedent(
    """
    import contextlib, json, sys
    sys.path[:0] = [{repo!r}, {tests!r}]
    from mmdtl2_dist.engine import compute_gram
    from slow_tiles import slow_gram_tiles
    delay = float(sys.argv[1])
    with slow_gram_tiles({probe!r}, delay) if delay else contextlib.nullcontext():
        gs = compute_gram({store!r}, "s", tile_rows=8, num_cpus=1, progress=True)
    print(json.dumps({{"reused": gs.reused, **gs.last_run}}))
    """
)


def _driver(tmp_path, delay: float, **kw) -> subprocess.Popen:
    script = tmp_path / "driver.py"
    if not script.exists():
        script.write_text(
            _DRIVER.format(
                repo=str(REPO),
                tests=str(REPO / "tests"),
                store=str(tmp_path / "st.zarr"),
                probe=str(tmp_path / "probe"),
            )
        )
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.Popen(
        [sys.executable, str(script), str(delay)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _wait_for(cond, proc, timeout=180):
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow  # two drivers, each with a Ray of its own: 30-70 s on 2 busy cores
@pytest.mark.ray
def test_second_process_waits_for_the_lock_then_reuses(tmp_path):
    X = _store(tmp_path / "st.zarr")
    (tmp_path / "probe").mkdir()
    out = gram_location(FeatureStore.open(tmp_path / "st.zarr"), "s", "none")
    first = _driver(tmp_path, 0.8)
    _wait_for(lambda: any((tmp_path / "probe").iterdir()), first)  # computing, lock held
    second = _driver(tmp_path, 0.0)
    _wait_for(lambda: second.stderr.readline().startswith("gram: another process"), second)
    assert first.poll() is None  # the second is waiting while the first computes
    r1, r2 = (json.loads(p.communicate(timeout=300)[0].splitlines()[-1]) for p in (first, second))
    assert first.returncode == second.returncode == 0
    assert r1["reused"] is False and r1["computed"] == 21
    assert r2["reused"] is True and r2["computed"] == 0
    # Each tile ran once, in the first process's workers only.
    assert len(list((tmp_path / "probe").iterdir())) == 21
    np.testing.assert_allclose(GramStore.open(out).to_numpy(), X @ X.T, rtol=1e-12)


@pytest.mark.slow
@pytest.mark.ray
def test_lock_of_a_killed_process_is_released_and_its_gram_resumed(tmp_path):
    X = _store(tmp_path / "st.zarr")
    (tmp_path / "probe").mkdir()
    out = gram_location(FeatureStore.open(tmp_path / "st.zarr"), "s", "none")
    first = _driver(tmp_path, 1.0, start_new_session=True)
    _wait_for(lambda: len(list((out / "tiles").glob("*.json"))) >= 3, first)
    second = _driver(tmp_path, 0.0)
    _wait_for(lambda: second.stderr.readline().startswith("gram: another process"), second)
    kill_session(first)
    done = json.loads(second.communicate(timeout=300)[0].splitlines()[-1])
    assert second.returncode == 0
    assert done["reused"] is False and done["skipped"] >= 3
    assert done["computed"] + done["skipped"] == 21
    np.testing.assert_allclose(GramStore.open(out).to_numpy(), X @ X.T, rtol=1e-12)


@pytest.mark.ray
def test_moved_store_and_grams_keep_their_gram(ray_local, tmp_path):
    """Nothing in a Gram is found by the store's absolute path: a partial Gram moved with
    its store resumes from the new place, and a moved complete one is reused."""
    X = _store(tmp_path / "st.zarr")
    (tmp_path / "probe").mkdir()
    partial = gram_location(FeatureStore.open(tmp_path / "st.zarr"), "s", "none")
    driver = _driver(tmp_path, 0.4, start_new_session=True)
    _wait_for(lambda: len(list((partial / "tiles").glob("*.json"))) >= 3, driver)
    kill_session(driver)  # the driver, its Ray and its workers: nothing writes any more
    done = set(GramStore.open(partial).finished_tiles())
    assert 3 <= len(done) < 21

    there = tmp_path / "there"
    there.mkdir()
    shutil.move(tmp_path / "st.zarr", there / "st.zarr")
    shutil.move(partial.parent, there / "st.zarr.grams")
    with pytest.raises(ValueError, match=r"other parameters.*tile_rows"):  # its tiles only
        compute_gram(there / "st.zarr", "s", tile_rows=16, progress=False)
    gs = compute_gram(there / "st.zarr", "s", progress=False)  # resumed, with its own tiles
    assert gs.path == there / "st.zarr.grams" / partial.name and gs.tile_rows == 8
    assert not gs.reused and gs.last_run["skipped"] == len(done)
    assert gs.last_run["computed"] + gs.last_run["skipped"] == 21
    np.testing.assert_allclose(gs.to_numpy(), X @ X.T, rtol=1e-12)
    stored = json.loads((gs.path / "job.json").read_text())
    assert stored["store"] == str(tmp_path / "st.zarr")  # where it began: not checked
    markers = _markers(gs)

    # The Grams moved on their own: found through gram_dir, reused as they are.
    shutil.move(there / "st.zarr.grams", tmp_path / "grams")
    again = compute_gram(there / "st.zarr", "s", gram_dir=tmp_path / "grams", progress=False)
    assert again.reused and again.path == tmp_path / "grams" / partial.name
    assert _markers(again) == markers


# -- `mmdtl2 gram`, then studies -----------------------------------------------------------

SPEC = """
[study]
name = "reuse"
seed = 3
[data]
store = "st.zarr"
space = "f"
pairs = [["cam_a", "cam_b"]]
preprocessing = "l2_zscore"
{extra}
[splits]
protocol = "half"
n_splits = 2
samples_per_class = [2]
[[methods]]
label = "targetSVM"
method = "target_svm"
[[methods]]
label = "MMDTL2"
method = "mmdtl2"
params = {{ qp_solver = "osqp", qp_tol = 1e-6 }}
"""


def _spec(tmp_path, name, extra=""):
    p = tmp_path / f"{name}.toml"
    p.write_text(SPEC.format(extra=extra))
    return load_spec(p, output=tmp_path / name)


def test_spec_gram_dir_is_read_from_the_spec_folder(tmp_path):
    make_store(tmp_path / "st.zarr")
    assert _spec(tmp_path, "a").gram_dir is None
    assert _spec(tmp_path, "b", 'gram_dir = "g"').gram_dir == tmp_path / "g"
    (tmp_path / "f").write_text("x")
    with pytest.raises(SpecError, match=r"gram_dir .*f' is a file, not a folder"):
        _spec(tmp_path, "c", 'gram_dir = "f"')


@pytest.mark.slow  # two short studies and a Gram, about 1 min on 2 busy cores
@pytest.mark.ray
@pytest.mark.mlflow
def test_studies_reuse_the_gram_of_mmdtl2_gram_and_of_each_other(
    tmp_path, ray_local, capfd, mlflow_sqlite
):
    from mlflow.tracking import MlflowClient

    from mmdtl2_dist.study.runner import run_study

    make_store(tmp_path / "st.zarr")
    parser = argparse.ArgumentParser()
    gram_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["gram", str(tmp_path / "st.zarr")])
    assert args.func(args) == 0
    shown = capfd.readouterr().out
    cached = gram_location(FeatureStore.open(tmp_path / "st.zarr"), "f", "l2_zscore")
    assert f"key {cached.name}: a study on this store" in shown
    computed = _markers(GramStore.open(cached))

    uri = mlflow_sqlite["tracking_uri"]
    run_study(_spec(tmp_path, "after_gram"), tracking_uri=uri, progress=True)
    err = capfd.readouterr().err
    assert "study: Gram of 'f' (105 samples) reused in" in err and str(cached) in err
    assert _markers(GramStore.open(cached)) == computed  # not one tile recomputed
    state = json.loads((tmp_path / "after_gram" / "study.json").read_text())
    assert state["grams"]["f"]["key"] == cached.name
    assert state["grams"]["f"]["path"] == str(cached)
    client = MlflowClient(uri)
    parent = client.search_runs(
        [client.get_experiment_by_name("mmdtl2-reuse").experiment_id],
        "tags.mmdtl2_role = 'parent'",
    )[0]
    assert parent.data.params["gram.f"] == cached.name
    assert parent.data.tags["gram_path.f"] == str(cached)

    # Two studies with a Gram folder of their own: the first computes, the second reuses.
    own = 'gram_dir = "own_grams"'
    run_study(
        _spec(tmp_path, "own1", own), tracking_uri=f"sqlite:///{tmp_path / '1.db'}", progress=True
    )
    err = capfd.readouterr().err
    assert "study: Gram of 'f' (105 samples) computed (" in err
    assert str(tmp_path / "own_grams" / cached.name) in err
    run_study(
        _spec(tmp_path, "own2", own), tracking_uri=f"sqlite:///{tmp_path / '2.db'}", progress=True
    )
    assert "study: Gram of 'f' (105 samples) reused in" in capfd.readouterr().err

    # The same results whichever Gram each study used.
    tables = [
        pd.read_csv(tmp_path / name / "report" / "table.csv").sort_values(["label"])
        for name in ("after_gram", "own1", "own2")
    ]
    for t in tables[1:]:
        pd.testing.assert_frame_equal(t.reset_index(drop=True), tables[0].reset_index(drop=True))
