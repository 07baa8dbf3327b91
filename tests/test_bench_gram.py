"""benchmarks/bench_gram.py at tiny sizes: its JSON, timing table, cost model and load flag."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_gram.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gram", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.ray
def test_throughput_reports_timing_prediction_and_load(tmp_path):
    argv = ["throughput", "--n", "120", "--dim", "600", "--repeat", "1"]
    argv += ["--workdir", str(tmp_path / "w"), "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads((tmp_path / "gram_throughput.json").read_text())
    labels = ["float64, 1 worker", "float64, 2 workers", "mixed, 1 worker", "mixed, 2 workers"]
    assert list(res["engine"]) == labels
    assert res["numpy_threads"] == 2 and res["calibration"]["loaded_workers"] == 2
    cal = res["calibration"]
    assert cal["loaded_flops_per_s_float64"] > 0 and cal["loaded_flops_per_s_mixed"] > 0
    for label in labels:
        run = res["engine"][label]
        assert run["timing"]["phases"]["product"] > 0
        assert res["cost_model"]["runs"][label]["seconds"] > 0
    assert res["engine"]["float64, 2 workers"]["max_rel_err"] < 1e-12
    assert res["engine"]["mixed, 2 workers"]["max_rel_err"] < 1e-6
    assert set(res["ratios"]) == {"float64", "mixed"}
    assert res["load"]["samples"] >= 1 and "noisy" in res["load"]
    before, after = res["load"]["numpy_seconds_before_after"]
    assert res["numpy_f64_seconds"] == min(before[1], after[1])
    assert "numpy's times moved by" in done.stdout
    assert res["calibration"]["flops_per_s_float64"] > 0
    assert "where the time goes, float64, 2 workers" in done.stdout
    assert "predicted" in done.stdout


@pytest.mark.ray
def test_big_reports_memory_time_and_prediction_per_precision(tmp_path):
    argv = ["big", "--n", "200", "--dim", "600", "--precision", "float64,mixed"]
    argv += ["--workdir", str(tmp_path / "w"), "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads((tmp_path / "gram_big.json").read_text())
    assert set(res["runs"]) == {"float64", "mixed"}
    for precision, run in res["runs"].items():
        assert run["gram_peak_rss_gb"] > 0 and run["predicted_seconds"] > 0
        assert run["spot_check_max_rel_err"] < (1e-12 if precision == "float64" else 1e-6)
        last = run["last_run"]  # one timing record per task: tiles, or parts and combines
        assert last["timing"]["tiles"] == last["computed"] + last["parts_computed"]


def test_a_run_whose_numpy_times_moved_is_flagged_noisy(bench):
    """Numpy's own product timed before and after the engine's runs: a machine whose
    speed changed (a virtual machine's neighbours, a clock) is caught, unlike by the load."""
    quiet = bench.speed_drift((1.00, 2.00), (1.05, 1.95))
    assert quiet["speed_drift"] == pytest.approx(0.05) and not quiet["speed_noisy"]
    moved = bench.speed_drift((1.00, 2.00), (1.26, 2.09))
    assert moved["speed_drift"] == pytest.approx(0.26) and moved["speed_noisy"]
    quiet_load = {"noisy": False, "foreign_cores_mean": 0.05}
    assert bench.with_speed_drift(quiet_load, (1.00, 2.00), (1.26, 2.09))["noisy"]
    assert not bench.with_speed_drift(quiet_load, (1.00, 2.00), (1.05, 1.95))["noisy"]


def test_load_monitor_flags_a_competing_process(bench, tmp_path):
    """A CPU-bound process outside the benchmark's own process tree makes the run noisy."""
    flag = tmp_path / "burning"
    burn = (
        "import os, sys, time\n"
        "if os.fork():\n    os._exit(0)\n"  # the burner leaves this tree (reparented)
        f"open({str(flag)!r}, 'w').close()\n"
        "t = time.time()\n"
        "while time.time() - t < 4:\n    pass\n"
    )
    subprocess.run([sys.executable, "-c", burn], check=True)
    while not flag.exists():
        time.sleep(0.05)
    with bench.LoadMonitor(interval=0.5) as load:
        time.sleep(2.5)
    summary = load.summary()
    assert summary["foreign_cores_mean"] >= 0.5 and summary["noisy"]
    assert summary["load_avg_1min"]["max"] is not None
