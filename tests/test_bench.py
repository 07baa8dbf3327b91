"""The computation-time benchmarks of benchmarks/bench_scale.py (``make bench``), tiny sizes.

They live in the checkout, not in the package: these tests import the script from
``benchmarks/`` and run its studies on the ``tiny`` preset (seconds).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_scale.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_tiny_writes_json_and_plot(bench, tmp_path, capsys):
    out = tmp_path / "results"
    argv = ["--preset", "tiny", "--out", str(out), "--workdir", str(tmp_path)]
    assert bench.main([*argv, "--in-process"]) == 0
    res = {}
    for study in ("figure8", "wstep", "svm", "e2e"):
        res.update(json.loads((out / f"scale_{study}_tiny.json").read_text()))
    assert (out / "scale_figure8_tiny.png").stat().st_size > 0
    assert {"figure8", "wstep", "svm", "e2e", "machine"} <= set(res)
    assert all(r["status"] == "ok" for r in res["figure8"]), res["figure8"]
    for r in res["figure8"]:
        assert r["time_s"] > 0 and r["peak_rss_mb"] > 0
    # The dual and the primal solve the same problem: same predictions quality here.
    dual = {r["L"]: r for r in res["figure8"] if r["method"] == "dual"}
    primal = {r["L"]: r for r in res["figure8"] if r["method"] == "primal"}
    assert all(abs(dual[L]["test_accuracy"] - primal[L]["test_accuracy"]) < 0.05 for L in dual)
    for rec in res["wstep"]:
        for solver in rec["solvers"].values():
            assert solver["kkt_scaled"] <= 1e-8
    stream = [r for r in res["e2e"] if r.get("path") == "stream"]
    assert stream and all(r["status"] == "ok" and r["test_accuracy"] > 0.5 for r in stream)
    assert "| L |" in capsys.readouterr().out


def test_isolated_runs_are_child_processes_of_the_script(tmp_path):
    """As ``make bench`` runs it: the script, each task in a fresh interpreter."""
    argv = [sys.executable, str(SCRIPT), "--preset", "tiny", "--only", "wstep"]
    done = subprocess.run(
        [*argv, "--out", str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (rec,) = json.loads((tmp_path / "scale_wstep_tiny.json").read_text())["wstep"]
    assert rec["status"] == "ok" and rec["peak_rss_mb"] > 0, rec
    assert {"dcd", "osqp"} <= set(rec["solvers"])


def test_features_come_from_the_product_generator(bench):
    from mmdtl2_dist.store.synthetic import SyntheticSpec, synthetic_features

    Xs, ys, Xt, yt, Xq, yq = bench.scale_data(12, 10, 6, 3, seed=5, Q=9)
    spec = SyntheticSpec(n_source=10, n_target=15, n_classes=3, dim=12, seed=5)
    X, y = synthetic_features(spec, 1, dtype=np.float64)
    assert np.array_equal(Xs, synthetic_features(spec, 0, dtype=np.float64)[0])
    assert sorted(yt.tolist()) == [0, 0, 1, 1, 2, 2] and len(yq) == 9
    assert np.array_equal(np.sort(np.r_[yt, yq]), np.sort(y))
    rows = {tuple(r) for r in X}
    assert all(tuple(r) in rows for r in np.vstack([Xt, Xq]))


def test_out_of_memory_runs_are_reported_not_started(bench, monkeypatch):
    monkeypatch.setattr(bench, "_ISOLATE", False)  # the one cheap run in this process

    preset = {"dims": (20_000,), "per_class": (2,), "N": 10, "K": 2, "primal_max_dim": 10**6}
    # A dual run at L = 20,000 is cheap; primal and explicit W are refused by estimate.
    recs = bench.figure8(preset, mem_limit_gb=1.0, log=lambda *a: None)
    by = {r["method"]: r for r in recs}
    assert by["dual"]["status"] == "ok"
    assert by["primal"]["status"].startswith("out of memory (estimate")
    assert by["mmdt_explicit"]["status"].startswith("out of memory (estimate")
    assert bench.primal_memory_estimate(20_000, 4, 2) > 2**30
    assert "out of memory" in bench.figure8_table(recs)


def test_the_package_holds_no_benchmark_or_test_fixture():
    """Benchmarks, the loopback cluster and fault injection live in the checkout only."""
    import mmdtl2_dist
    from mmdtl2_dist.cli import build_parser
    from mmdtl2_dist.engine import compute_gram, tasks

    modules = {p.stem for p in Path(mmdtl2_dist.__file__).parent.rglob("*.py")}
    assert not {"bench", "loopback"} & modules
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert "bench" not in commands
    assert not [p for p in inspect.signature(compute_gram).parameters if p.startswith("_")]
    # ``part``: the feature part of a split tile (the job's plan), not a test hook.
    assert list(inspect.signature(tasks.gram_tile_task).parameters) == [
        "job",
        "tile",
        "stats",
        "norms",
        "part",
    ]


SCRIPTS = [p for p in sorted((ROOT / "benchmarks").glob("*.py")) if "__main__" in p.read_text()]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_script_starts(script):
    """Each script of benchmarks/ imports what it uses from the product and parses its
    arguments (``--help``): a function moved or renamed in the package breaks it here,
    not months later in the hands of whoever reruns a figure.
    """
    out = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
        cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage" in out.stdout.lower()


def test_extract_benchmark_refuses_gpus_where_torch_sees_none():
    """``bench_extract.py --gpus`` is for a machine with a GPU; elsewhere it says so before
    building any image set, instead of failing after minutes of CPU runs."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_extract.py"), "--gpus", "1"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode != 0
    assert "torch sees no CUDA device" in out.stderr and "leave --gpus out" in out.stderr
    assert "plain loop" not in out.stdout


def test_extract_benchmark_plain_loop_starts_its_clock_after_the_model_ran_once(
    monkeypatch, tmp_path
):
    """The plain loop runs its model once before its clock starts, as the extractor's
    probe does before its shards: a device's one-time start (on a GPU: its context, cuDNN,
    the kernels' loading) is timed in neither rate, or their ratio would flatter extract."""
    pytest.importorskip("torch")
    import time
    from types import SimpleNamespace

    import torchvision.models.feature_extraction as fx

    from mmdtl2_dist.extract.inputs import read_images
    from mmdtl2_dist.extract.model import ModelSpec, Preprocessing
    from mmdtl2_dist.extract.synthetic import ImageSetSpec, make_image_set

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        "bench_extract", ROOT / "benchmarks" / "bench_extract.py"
    )
    bench_extract = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_extract)
    events, cut_model = [], fx.create_feature_extractor

    def recorded_cut(*args, **kwargs):
        cut = cut_model(*args, **kwargs)
        cut.register_forward_pre_hook(lambda module, inputs: events.append("model"))
        return cut

    def clock():
        events.append("clock")
        return time.perf_counter()

    monkeypatch.setattr(fx, "create_feature_extractor", recorded_cut)
    monkeypatch.setattr(bench_extract, "time", SimpleNamespace(perf_counter=clock))
    images = make_image_set(tmp_path / "images", ImageSetSpec(2, 2, 2, size=32))
    paths = read_images(images).frame["path"].tolist()[:4]
    rate = bench_extract.plain_loop(
        paths, ModelSpec.parse("alexnet:conv3"), Preprocessing(64, 64), batch=2
    )
    assert rate > 0
    assert events == ["model", "clock", "model", "model", "clock"]
