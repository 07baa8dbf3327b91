"""Smoke test of ``mmdtl2 bench`` (the tiny preset: every study, seconds)."""

from __future__ import annotations

import json

from mmdtl2_dist.bench import figure8_table, primal_memory_estimate
from mmdtl2_dist.cli import main


def test_bench_tiny_writes_json_and_plot(tmp_path, capsys):
    out = tmp_path / "results"
    argv = ["bench", "--preset", "tiny", "--out", str(out), "--workdir", str(tmp_path)]
    rc = main([*argv, "--in-process"])
    assert rc == 0
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


def test_out_of_memory_runs_are_reported_not_started(monkeypatch):
    import mmdtl2_dist.bench as bench
    from mmdtl2_dist.bench import figure8

    monkeypatch.setattr(bench, "_ISOLATE", False)  # the one cheap run in this process

    preset = {"dims": (20_000,), "per_class": (2,), "N": 10, "K": 2, "primal_max_dim": 10**6}
    # A dual run at L = 20,000 is cheap; primal and explicit W are refused by estimate.
    recs = figure8(preset, mem_limit_gb=1.0, log=lambda *a: None)
    by = {r["method"]: r for r in recs}
    assert by["dual"]["status"] == "ok"
    assert by["primal"]["status"].startswith("out of memory (estimate")
    assert by["mmdt_explicit"]["status"].startswith("out of memory (estimate")
    assert primal_memory_estimate(20_000, 4, 2) > 2**30
    assert "out of memory" in figure8_table(recs)
