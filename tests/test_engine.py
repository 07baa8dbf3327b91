"""Gram engine: plan (pure), equality with numpy on a real local Ray, failures, kernels."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slow_tiles import slow_gram_tiles

from mmdtl2_dist.commands import gram as gram_cmd
from mmdtl2_dist.core.kernels import KernelSpec, kernel_from_gram
from mmdtl2_dist.core.preprocessing import fit_preprocessing
from mmdtl2_dist.engine import GramStore, compute_gram, feature_blocks, gram_tile_plan
from mmdtl2_dist.engine.plan import (
    GPU_TILE_ROWS,
    choose_tile_rows,
    max_tile_rows,
    row_segments,
    task_memory_bytes,
)
from mmdtl2_dist.store import CorruptChunkError, FeatureStore, StoreWriter

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- plan (no Ray) -----
@settings(deadline=None, max_examples=50)
@given(n=st.integers(1, 200), t=st.integers(3, 120))
def test_tiles_cover_the_upper_triangle_once(n, t):
    cover = np.zeros((n, n), int)
    for tile in gram_tile_plan(n, t):
        assert tile.i <= tile.j and tile.a1 - tile.a0 <= t
        cover[tile.a0 : tile.a1, tile.b0 : tile.b1] += 1
    assert (cover[np.triu_indices(n)] == 1).all()
    assert (cover[np.tril_indices(n, -1)] <= 1).all()  # lower part only inside diagonal tiles


def test_row_segments_and_feature_blocks():
    assert row_segments([0, 5, 12], 3, 9) == [(0, 3, 5), (1, 0, 4)]
    assert row_segments([0, 5, 12], 5, 12) == [(1, 0, 7)]
    blocks = feature_blocks(64_896, 4056, 2048, 1024)
    assert blocks[0] == (0, 8112) and blocks[-1][1] == 64_896
    assert all((c0 % 4056 == 0) for c0, _ in blocks)  # aligned to the store's chunks
    assert task_memory_bytes(2048, blocks[0][1]) <= 1024 * 2**20
    # a tight budget narrows the blocks, then refuses with the fix
    assert feature_blocks(64_896, 4056, 2048, 500) == [
        (c, min(c + 4056, 64_896)) for c in range(0, 64_896, 4056)
    ]
    with pytest.raises(ValueError, match=r"use tile_rows <= \d+"):
        feature_blocks(64_896, 4056, 8192, 256)
    fit = max_tile_rows(4056, 256)
    assert task_memory_bytes(fit, 4056) <= 256 * 2**20 < task_memory_bytes(fit + 8, 4056)
    # Tiles as large as memory allows, at most all rows: each row is read once per tile of
    # its row, so 2,000 rows are one tile (read once), whose features are split among the
    # workers (choose_parts) instead of cutting it into 3 tiles that read every row twice.
    assert choose_tile_rows(2000, 256, 4056) == 2000
    assert choose_tile_rows(20_000, 256, 4056) == 2048
    assert choose_tile_rows(30, 30, 12) == 30
    # A GPU tile keeps its accumulator on the device: larger tiles fit the same host
    # budget (the page-locked blocks and the finished tile), up to GPU_TILE_ROWS.
    on_gpu = choose_tile_rows(20_000, 256, 4056, 1024, 4, gpu=True)
    assert on_gpu % 256 == 0 and 4 * 2048 > on_gpu > 2 * 2048
    gpu_blocks = feature_blocks(64_896, 4056, on_gpu, 1024, 4, gpu=True)
    assert task_memory_bytes(on_gpu, gpu_blocks[0][1], 4, gpu=True) <= 1024 * 2**20
    # two even tiles (an edge tile's chunk is stored whole), not 16,384 + 3,616 rows
    assert (
        GPU_TILE_ROWS == 16_384 and choose_tile_rows(20_000, 256, 4056, 8192, 4, gpu=True) == 10_240
    )
    assert choose_tile_rows(4_000, 256, 4056, 1024) == 2048  # CPU tiles: 2,048 + 1,952 rows
    # With preprocessing a GPU tile's blocks are also held outside the page-locked buffers
    prep = choose_tile_rows(20_000, 256, 4056, 1024, 4, gpu=True, prep=True)
    assert prep < on_gpu
    assert task_memory_bytes(prep, 4056, 4, gpu=True, prep=True) <= 1024 * 2**20


# ------------------------------------------------------------------- helpers ---------
def _store(path, sizes: dict, L: int, chunk_rows: int, seed=0, dtype=np.float32, space="s"):
    """A store with one array per device in ``space``; returns {device: X}."""
    rng = np.random.default_rng(seed)
    data = {}
    with StoreWriter(path) as w:
        for d, n in sizes.items():
            X = (rng.standard_normal((n, L)) * rng.uniform(0.5, 3, L)).astype(dtype)
            X[rng.random((n, L)) < 0.3] = 0
            w.create_array(d, space, n, L, dtype=dtype, chunk_rows=chunk_rows).append(X)
            data[d] = X
    return data


def _numpy_gram(data: dict, method="none"):
    Z = np.concatenate(
        [fit_preprocessing(data[d], method).transform(data[d]) for d in sorted(data)]
    )
    return Z @ Z.T


def _close(G, ref):
    # Float64 sums of float32 products in another order: relative error ~ L * 1e-16.
    np.testing.assert_allclose(G, ref, rtol=1e-11, atol=1e-11 * np.abs(ref).max())


# ------------------------------------------------------- equality with numpy on Ray --
@pytest.mark.ray
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    L=st.integers(1, 70),
    chunk_rows=st.integers(1, 16),
    tile_rows=st.integers(1, 50),
    seed=st.integers(0, 10**6),
)
def test_engine_gram_equals_numpy(ray_local, sizes, L, chunk_rows, tile_rows, seed):
    with tempfile.TemporaryDirectory() as tmp:
        data = _store(
            Path(tmp, "st"), {f"d{k}": n for k, n in enumerate(sizes)}, L, chunk_rows, seed
        )
        gs = compute_gram(Path(tmp, "st"), "s", Path(tmp, "g"), tile_rows=tile_rows, progress=False)
        ref = _numpy_gram(data)
        G = gs.to_numpy()
        _close(G, ref)
        assert np.array_equal(G, G.T)
        np.testing.assert_array_equal(gs.sq_norms(), np.diag(G))
        assert gs.last_run["computed"] == len(gram_tile_plan(sum(sizes), tile_rows))


@pytest.mark.ray
@pytest.mark.parametrize("method", ["none", "l2", "zscore", "l2_zscore"])
def test_preprocessed_gram_and_stored_statistics(ray_local, tmp_path, method):
    data = _store(
        tmp_path / "st", {"cam_b": 37, "cam_a": 50}, 90, chunk_rows=8, seed=5, dtype=np.float64
    )
    gs = compute_gram(
        tmp_path / "st",
        "s",
        tmp_path / "g",
        preprocessing=method,
        tile_rows=32,
        max_task_memory_mb=200,
        progress=False,
    )
    _close(gs.to_numpy(), _numpy_gram(data, method))
    for d in ("cam_a", "cam_b"):
        ref = fit_preprocessing(data[d], method)
        got = gs.stats(d)
        assert got.method == method
        if ref.mean is not None:
            np.testing.assert_allclose(got.mean, ref.mean, rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(got.scale, ref.scale, rtol=1e-12)
    # Gram row order: devices sorted, then rows
    assert list(gs.index["device"][:50]) == ["cam_a"] * 50
    assert np.array_equal(gs.index["row"][50:], np.arange(37))
    assert np.array_equal(gs.rows("cam_b", [0, 2]), [50, 52])


@pytest.mark.ray
def test_block_kernels_and_lower_triangle(ray_local, tmp_path):
    data = _store(tmp_path / "st", {"a": 45, "b": 30}, 33, chunk_rows=8, seed=2)
    gs = compute_gram(tmp_path / "st", "s", tmp_path / "g", tile_rows=16, progress=False)
    ref = _numpy_gram(data)
    ra, rb = np.array([70, 3, 3, 40, 16]), np.array([0, 74, 15, 33])  # mixed tiles, repeats
    _close(gs.block(ra, rb), ref[np.ix_(ra, rb)])
    _close(GramStore.open(tmp_path / "g", cache_mb=0).block(rb, ra), ref[np.ix_(rb, ra)])
    sq = np.diag(ref)
    for spec in (
        KernelSpec("linear"),
        KernelSpec("rbf", gamma=1e-2),
        KernelSpec("poly", gamma=1e-2, degree=3),
    ):
        want = kernel_from_gram(ref[np.ix_(ra, rb)], spec, sq[ra], sq[rb])
        np.testing.assert_allclose(gs.kernel(ra, rb, spec), want, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="unresolved"):
        gs.kernel(ra, rb, KernelSpec("rbf"))
    with pytest.raises(ValueError, match=r"Gram rows must lie in \[0, 75\)"):
        gs.block([75], [0])


@pytest.mark.ray
def test_deterministic_bits_whatever_the_workers(ray_local, tmp_path):
    _store(tmp_path / "st", {"a": 60, "b": 25}, 500, chunk_rows=16, seed=9)
    g1 = compute_gram(
        tmp_path / "st", "s", tmp_path / "g1", tile_rows=20, max_in_flight=1, progress=False
    )
    g2 = compute_gram(tmp_path / "st", "s", tmp_path / "g2", tile_rows=20, progress=False)
    assert np.array_equal(g1.to_numpy(), g2.to_numpy())
    h1 = {k: m["crc32c"] for k, m in g1.finished_tiles().items()}
    assert h1 == {k: m["crc32c"] for k, m in g2.finished_tiles().items()}
    assert len({m["pid"] for m in g2.finished_tiles().values()}) >= 1


@pytest.mark.ray
def test_in_process_gram_has_the_bits_of_ray(ray_local, tmp_path):
    """address=IN_PROCESS runs the same tasks without Ray: the same Gram, statistics and
    tile hashes as on Ray, bit for bit."""
    from mmdtl2_dist.engine import IN_PROCESS

    _store(tmp_path / "st", {"a": 60, "b": 25}, 300, chunk_rows=16, seed=4)
    kw = {"tile_rows": 20, "preprocessing": "l2_zscore", "progress": False}
    on_ray = compute_gram(tmp_path / "st", "s", tmp_path / "g1", **kw)
    here = compute_gram(tmp_path / "st", "s", tmp_path / "g2", address=IN_PROCESS, **kw)
    assert np.array_equal(on_ray.to_numpy(), here.to_numpy())
    assert np.array_equal(on_ray.sq_norms(np.arange(85)), here.sq_norms(np.arange(85)))
    for dev in ("a", "b"):
        a, b = on_ray.stats(dev), here.stats(dev)
        assert np.array_equal(a.mean, b.mean) and np.array_equal(a.scale, b.scale)
    assert {k: m["crc32c"] for k, m in on_ray.finished_tiles().items()} == {
        k: m["crc32c"] for k, m in here.finished_tiles().items()
    }
    assert {m["pid"] for m in here.finished_tiles().values()} == {os.getpid()}


def test_in_process_gram_needs_no_ray(tmp_path):
    """With Ray not importable at all, an in-process Gram is computed (and equals numpy)."""
    data = _store(tmp_path / "st", {"a": 30, "b": 12}, 40, chunk_rows=8, seed=2)
    np.save(tmp_path / "Z.npy", np.concatenate([data["a"], data["b"]]).astype(np.float64))
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["ray"] = None  # `import ray` raises ImportError
        import numpy as np
        from mmdtl2_dist.engine import IN_PROCESS, compute_gram
        g = compute_gram({str(tmp_path / "st")!r}, "s", {str(tmp_path / "g")!r},
                         address=IN_PROCESS, tile_rows=8, progress=False)
        Z = np.load({str(tmp_path / "Z.npy")!r})
        assert np.allclose(g.to_numpy(), Z @ Z.T, rtol=1e-12, atol=1e-9)
        assert not any(m == "ray" or m.startswith("ray.") for m in sys.modules
                       if sys.modules[m] is not None)
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]


@pytest.mark.ray
def test_killed_worker_does_not_change_the_result(ray_local, tmp_path):
    _store(tmp_path / "st", {"a": 40, "b": 24}, 300, chunk_rows=8, seed=4)
    clean = compute_gram(tmp_path / "st", "s", tmp_path / "clean", tile_rows=16, progress=False)
    probe = tmp_path / "probe"
    probe.mkdir()
    result = {}

    def run():
        try:
            result["gs"] = compute_gram(
                tmp_path / "st", "s", tmp_path / "g", tile_rows=16, progress=False
            )
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            result["error"] = exc

    th = threading.Thread(target=run)
    with slow_gram_tiles(probe, delay=1.5):  # each tile names its worker, then waits
        th.start()
        deadline = time.monotonic() + 120
        while not list(probe.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        victim = sorted(probe.iterdir())[0]
        tile_key, pid = victim.name.rsplit(".", 1)
        pid = int(pid)
        assert psutil.Process(pid).pid == pid  # a live Ray worker, busy with a Gram tile
        os.kill(pid, signal.SIGKILL)
        th.join(timeout=300)
    assert not th.is_alive() and "error" not in result, result.get("error")
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    retried = [p for p in probe.iterdir() if p.name.startswith(tile_key + ".")]
    assert len(retried) >= 2, "the killed tile was retried by another worker"
    assert np.array_equal(result["gs"].to_numpy(), clean.to_numpy())  # same bits


_DRIVER = textwrap.dedent(
    """
    import contextlib, json, sys
    sys.path[:0] = [{repo!r}, {tests!r}]
    from mmdtl2_dist.engine import compute_gram
    from slow_tiles import slow_gram_tiles
    delay = float(sys.argv[1])
    with slow_gram_tiles({probe!r}, delay) if delay else contextlib.nullcontext():
        gs = compute_gram({store!r}, "s", {out!r}, tile_rows=8, num_cpus=1, progress=False)
    print(json.dumps(gs.last_run))
    """
)


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL a driver started in a session of its own, with its raylet and workers."""
    children = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    for child in children:  # those that left the session
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    proc.communicate()


@pytest.mark.ray
def test_stopped_driver_resumes_without_recomputing(ray_local, tmp_path):
    data = _store(tmp_path / "st", {"a": 30, "b": 18}, 64, chunk_rows=8, seed=1)
    out, probe = tmp_path / "g", tmp_path / "probe"
    probe.mkdir()
    script = tmp_path / "driver.py"
    script.write_text(
        _DRIVER.format(
            repo=str(REPO),
            tests=str(REPO / "tests"),
            store=str(tmp_path / "st"),
            out=str(out),
            probe=str(probe),
        )
    )
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(
        [sys.executable, str(script), "0.4"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    n_tiles = len(gram_tile_plan(48, 8))  # 21
    deadline = time.monotonic() + 180
    tiles = out / "tiles"
    while time.monotonic() < deadline and proc.poll() is None:
        if tiles.exists() and len(list(tiles.glob("*.json"))) >= 4:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    kill_session(proc)
    before = {p.stem: json.loads(p.read_text()) for p in tiles.glob("*.json")}
    assert 4 <= len(before) < n_tiles
    with pytest.raises(ValueError, match="incomplete"):
        GramStore.open(out).block([0], [0])

    done = subprocess.run(
        [sys.executable, str(script), "0"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last["skipped"] >= len(before) and last["computed"] + last["skipped"] == n_tiles
    after = GramStore.open(out)
    markers = after.finished_tiles()
    for key, marker in before.items():  # finished tiles were not recomputed
        assert markers[key]["attempt"] == marker["attempt"]
    _close(after.to_numpy(), _numpy_gram(data))


# SIGINT's handler restored first, as a terminal starts a command: a suite launched in the
# background ignores SIGINT, and an ignored signal stays ignored across exec.
_CLI_DRIVER = textwrap.dedent(
    """
    import signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path[:0] = [{repo!r}, {tests!r}]
    from mmdtl2_dist.cli import main
    from slow_tiles import slow_gram_tiles
    with slow_gram_tiles({probe!r}, 60):
        sys.exit(main(["gram", {store!r}, "--out", {out!r}, "--tile-rows", "8",
                       "--num-cpus", "1", "--quiet"]))
    """
)


@pytest.mark.ray
def test_ctrl_c_of_mmdtl2_gram_says_what_is_kept_and_exits_130(tmp_path):
    """A real SIGINT of a running ``mmdtl2 gram``: one line saying that the finished tiles
    are kept and the same command resumes, no traceback, the shell's status 130."""
    _store(tmp_path / "st", {"a": 24}, 16, chunk_rows=8)
    probe = tmp_path / "probe"
    probe.mkdir()
    script = tmp_path / "driver.py"
    script.write_text(
        _CLI_DRIVER.format(
            repo=str(REPO), tests=str(REPO / "tests"), store=str(tmp_path / "st"),
            out=str(tmp_path / "g"), probe=str(probe),
        )
    )  # fmt: skip
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None and not any(probe.iterdir()):
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)  # a tile is running: the driver waits on Ray
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            kill_session(proc)
    assert proc.returncode == 130, err[-3000:]
    assert "mmdtl2 gram: interrupted; its finished tiles are kept" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]


@pytest.mark.ray
def test_corrupt_feature_chunk_is_reported(ray_local, tmp_path):
    _store(tmp_path / "st", {"a": 32}, 20, chunk_rows=8)
    chunk = tmp_path / "st" / "features" / "a" / "s" / "c" / "2" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[20] ^= 0x01
    chunk.write_bytes(bytes(raw))
    with pytest.raises(CorruptChunkError, match=r"chunk\(s\) \(2, 0\)"):
        compute_gram(tmp_path / "st", "s", tmp_path / "g", tile_rows=8, progress=False)
    assert not GramStore.open(tmp_path / "g").complete


@pytest.mark.ray
def test_resume_checks_parameters_and_finished_jobs_return_at_once(ray_local, tmp_path):
    _store(tmp_path / "st", {"a": 20}, 10, chunk_rows=8)
    gs = compute_gram(tmp_path / "st", "s", tmp_path / "g", tile_rows=8, progress=False)
    markers = gs.finished_tiles()
    again = compute_gram(tmp_path / "st", "s", tmp_path / "g", progress=False)
    assert again.finished_tiles() == markers
    with pytest.raises(ValueError, match="other parameters.*preprocessing"):
        compute_gram(tmp_path / "st", "s", tmp_path / "g", preprocessing="l2", progress=False)
    # A complete Gram is used as it is, whatever tile size is asked for.
    other = compute_gram(tmp_path / "st", "s", tmp_path / "g", tile_rows=4, progress=False)
    assert other.reused and other.tile_rows == 8 and other.finished_tiles() == markers
    with pytest.raises(ValueError, match="unknown space"):
        compute_gram(tmp_path / "st", "nope", tmp_path / "h", progress=False)
    with pytest.raises(ValueError, match="preprocessing must be one of"):
        compute_gram(tmp_path / "st", "s", tmp_path / "h", preprocessing="pca", progress=False)


@pytest.mark.ray
def test_cli_gram_with_progress(ray_local, tmp_path, capsys):
    data = _store(tmp_path / "st", {"a": 20, "b": 12}, 15, chunk_rows=8)
    parser = argparse.ArgumentParser()
    gram_cmd.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "gram",
            str(tmp_path / "st"),
            "--out",
            str(tmp_path / "g"),
            "--tile-rows",
            "8",
            "--preprocessing",
            "l2",
            "--progress",  # stderr is not a terminal here
        ]
    )
    assert args.func(args) == 0
    out = capsys.readouterr()
    assert "10/10 tiles" in out.err and "computed 10 tiles" in out.out
    _close(GramStore.open(tmp_path / "g").to_numpy(), _numpy_gram(data, "l2"))
    assert FeatureStore.open(tmp_path / "st").spaces == ["s"]


@pytest.mark.ray
def test_rerun_names_and_recomputes_damaged_output(ray_local, tmp_path, capsys):
    """A re-run verifies the finished Gram and recomputes exactly what was damaged."""
    data = _store(tmp_path / "st", {"a": 20, "b": 12}, 15, chunk_rows=8)
    parser = argparse.ArgumentParser()
    gram_cmd.register(parser.add_subparsers())
    out = tmp_path / "g"
    argv = ["gram", str(tmp_path / "st"), "--out", str(out), "--tile-rows", "8"]
    args = parser.parse_args([*argv, "--preprocessing", "l2"])
    assert args.func(args) == 0
    clean = GramStore.open(out)
    G, sq, before = clean.to_numpy(), clean.sq_norms(), clean.finished_tiles()
    capsys.readouterr()

    flipped = out / "gram" / "c" / "0" / "1"
    raw = bytearray(flipped.read_bytes())
    raw[40] ^= 0x10
    flipped.write_bytes(bytes(raw))
    (out / "gram" / "c" / "2" / "3").unlink()
    norms = out / "row_norms" / "c" / "0"
    norms.write_bytes(norms.read_bytes()[:-3] + b"xyz")
    assert args.func(args) == 0
    printed, err = capsys.readouterr()
    assert f"{out} has damaged parts, recomputed in this run" in err
    assert f"tile 0_1 (chunk file {flipped}) cannot be decoded" in err
    assert f"tile 2_3 (chunk file {out / 'gram' / 'c' / '2' / '3'}) is missing" in err
    assert "row_norms cannot be read" in err
    assert "computed 2 tiles, skipped 8" in printed and "3 damaged part(s) recomputed" in printed
    again = GramStore.open(out)
    assert len(again.last_run["repaired"]) == 3
    assert np.array_equal(again.to_numpy(), G) and np.array_equal(again.sq_norms(), sq)
    after = again.finished_tiles()
    assert {k for k in before if after[k]["attempt"] != before[k]["attempt"]} == {"0_1", "2_3"}

    # Values replaced by valid chunks of other values: caught by the recorded hash.
    other = _store(tmp_path / "st2", {"a": 20, "b": 12}, 15, chunk_rows=8, seed=5)
    assert other
    compute_gram(tmp_path / "st2", "s", tmp_path / "g2", tile_rows=8, progress=False)
    (out / "gram" / "c" / "1" / "1").write_bytes((tmp_path / "g2/gram/c/1/1").read_bytes())
    assert args.func(args) == 0
    printed, err = capsys.readouterr()
    assert "tile 1_1" in err and "holds other values than its task wrote" in err
    assert np.array_equal(GramStore.open(out).to_numpy(), G)
    assert args.func(args) == 0  # intact: verified, nothing recomputed
    printed, err = capsys.readouterr()
    assert "damaged" not in err and "computed 0 tiles, skipped 10" in printed
    _close(G, _numpy_gram(data, "l2"))

    job = json.loads((out / "job.json").read_text())
    (out / "job.json").write_text(json.dumps({**job, "devices": ["a", "../../x"]}))
    with pytest.raises(ValueError, match=r"job.json is damaged or crafted: device name '\.\./"):
        GramStore.open(out)


def test_tiles_marked_with_a_blake2b_hash_are_checked_with_it(tmp_path, capsys):
    """A marker that holds a blake2b hash instead of a CRC32C is checked with it:
    a tile that matches it is kept, one that does not (or a marker with neither) is
    recomputed, and the rewritten markers record a CRC32C."""
    import hashlib

    from mmdtl2_dist.engine import IN_PROCESS

    data = _store(tmp_path / "st", {"a": 20, "b": 12}, 15, chunk_rows=8)
    out = tmp_path / "g"
    kw = {"tile_rows": 8, "address": IN_PROCESS, "progress": False}
    G = compute_gram(tmp_path / "st", "s", out, **kw).to_numpy()
    for key, (good, r0, c0) in {
        "0_1": (True, 0, 8),
        "1_1": (False, 8, 8),
        "0_0": (None, 0, 0),
    }.items():
        path = out / "tiles" / f"{key}.json"
        marker = json.loads(path.read_text())
        del marker["crc32c"]
        block = np.ascontiguousarray(G[r0 : r0 + 8, c0 : c0 + 8])
        if good is not None:
            digest = hashlib.blake2b(block.data, digest_size=16).hexdigest()
            marker["blake2b"] = digest if good else "0" * 32
        path.write_text(json.dumps(marker))
    gs = compute_gram(tmp_path / "st", "s", out, **kw)
    assert sorted(r.split()[1] for r in gs.last_run["repaired"]) == ["0_0", "1_1"]
    assert np.array_equal(gs.to_numpy(), G)
    assert "crc32c" in gs.finished_tiles()["1_1"] and "blake2b" in gs.finished_tiles()["0_1"]
    _close(G, _numpy_gram(data, "none"))


def _session_processes(pid: int) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """The Ray processes a command started, and its watchdog (its other child)."""
    kids = psutil.Process(pid).children(recursive=True)
    watchdog = [p for p in kids if any("ray_watchdog.py" in a for a in p.cmdline())]
    return [p for p in kids if p not in watchdog], watchdog


@pytest.mark.ray
def test_killed_gram_command_leaves_no_ray_process(ray_local, tmp_path):
    """SIGKILL of `mmdtl2 gram` while its local Ray computes: its Ray processes stop at once.

    `study run` starts its local Ray through the same function (`ensure_ray`). The
    Ray of this test session (``ray_local``) must survive: it is not the command's.
    """
    _store(tmp_path / "st", {"a": 400, "b": 200}, 64, chunk_rows=16)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "mmdtl2_dist.cli", "gram", str(tmp_path / "st")]
    cmd += ["--num-cpus", "1", "-q"]
    proc = subprocess.Popen(
        [*cmd, "--out", str(tmp_path / "g"), "--tile-rows", "8"],
        env=env,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    ours = ray_local._private.worker._global_node.all_processes["raylet"][0].process.pid
    ours = [psutil.Process(ours), *psutil.Process(ours).children(recursive=True)]
    ray_procs, watchdog = [], []
    try:
        deadline = time.monotonic() + 240
        tiles = tmp_path / "g" / "tiles"
        while time.monotonic() < deadline and proc.poll() is None:
            if tiles.exists() and len(list(tiles.glob("*.json"))) >= 3:
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        ray_procs, watchdog = _session_processes(proc.pid)
        titles = " ".join(" ".join(p.cmdline()) for p in ray_procs)
        assert "raylet" in titles and "ray::DashboardAgent" in titles
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        _, alive = psutil.wait_procs(ray_procs, timeout=15)
        assert not alive, [(p.pid, p.cmdline()) for p in alive]
        assert len(watchdog) == 1 and not psutil.wait_procs(watchdog, timeout=10)[1]
        err = proc.stderr.read().decode()
        assert f"mmdtl2: process {proc.pid}, which started the local Ray session" in err
        assert "has exited; stopped the" in err and "ray::DashboardAgent" in err
        assert all(p.is_running() for p in ours)  # another Ray is left alone

        # A command that ends normally: its watchdog leaves with it, silently.
        done = subprocess.run(
            [*cmd, "--out", str(tmp_path / "g2"), "--tile-rows", "200"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0 and "stopped the" not in done.stderr, done.stderr[-2000:]
    finally:
        for p in ray_procs + watchdog:  # only this test's session, by pid and start time
            try:
                p.kill()
            except psutil.Error:
                pass
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_local_ray_workers_run_at_the_commands_niceness(tmp_path):
    """A local Ray started by the product runs its workers at the command's priority,
    and its start prints no token-authentication notice.

    Ray's default worker niceness (15) makes them yield the cores to every other process
    of the machine; the command's own workers must not (a real local Ray in a real
    subprocess: this session's Ray is already running). Ray's notice on every local
    start advises disabling authentication; it is kept off the command's output.
    """
    code = (
        "import os\n"
        "from mmdtl2_dist.engine.ray_session import ensure_ray\n"
        "ray, owned = ensure_ray(None, 1)\n"
        "nice = ray.get(ray.remote(lambda: os.nice(0)).remote())\n"
        "print(os.nice(0), nice)\n"
        "ray.shutdown()\n"
    )
    unset = ("RAY_worker_niceness", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-2000:]
    driver, worker = map(int, out.stdout.split()[-2:])
    assert worker == driver
    assert "Token authentication" not in out.stderr + out.stdout


def test_only_rays_token_enabled_notice_is_dropped():
    """The filter drops Ray's "enabled" notice and lets the "disabled" warning through."""
    import logging

    from mmdtl2_dist.engine.ray_session import _TOKEN_LOGGER, _hide_token_notice

    _hide_token_notice()
    _hide_token_notice()  # once is enough: no second filter
    log = logging.getLogger(_TOKEN_LOGGER)
    assert len(log.filters) == 1
    make = lambda msg: log.makeRecord(_TOKEN_LOGGER, logging.WARNING, "f", 1, msg, (), None)  # noqa: E731
    assert not log.filters[0].filter(
        make("Token authentication is enabled for this Ray cluster. Set")
    )
    assert log.filters[0].filter(make("Token authentication is disabled for this Ray cluster."))
