"""The Gram engine's precision, devices, timing and cost model.

Mixed precision (float32 products summed in float64) against the exact Gram, the torch
tile path on torch's CPU device against the numpy path, the per-tile timing breakdown,
and the cost model. Most run in-process (no Ray, seconds); the ``ray`` ones run the same
tasks on a local Ray.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from mmdtl2_dist.engine import IN_PROCESS, GramStore, compute_gram, gram_tile_plan
from mmdtl2_dist.engine.cost import predict_gram_seconds, workers_for
from mmdtl2_dist.engine.in_process import InProcessTasks
from mmdtl2_dist.engine.plan import TARGET_COL_SPAN
from mmdtl2_dist.engine.products import MIXED_SPAN, NumpyProduct, mixed_error_bound
from mmdtl2_dist.engine.timing import PHASES, PhaseTimer, format_timing, summarize_timing
from mmdtl2_dist.store import CorruptChunkError, FeatureStore, SyntheticSpec, make_synthetic_store

#: Feature blocks of 7,080 (two store chunks of 3,540): three whole blocks and a partial one,
#: each one float32 product in mixed precision (MIXED_SPAN covers a block).
L_CNN = 24_776


@pytest.fixture(scope="module")
def cnn_store(tmp_path_factory):
    """Nonnegative, sparse conv-like features (ReLU activations), two devices."""
    path = tmp_path_factory.mktemp("cnn") / "cnn.zarr"
    spec = SyntheticSpec(n_source=150, n_target=90, dim=L_CNN, seed=3)
    make_synthetic_store(path, spec)
    fs = FeatureStore.open(path)
    X = np.concatenate([fs.read(d, "conv3") for d in fs.devices_in("conv3")]).astype(np.float64)
    assert (X >= 0).all() and (X == 0).mean() > 0.3
    return path, X @ X.T, np.abs(X) @ np.abs(X).T


def _gram(store, out, **kw):
    return compute_gram(store, "conv3", out, address=IN_PROCESS, progress=False, **kw)


# ---------------------------------------------------------------- mixed precision ----
def test_mixed_precision_error_is_bounded_on_cnn_features(cnn_store, tmp_path):
    store, ref, absref = cnn_store
    G = _gram(store, tmp_path / "mixed", precision="mixed", tile_rows=64).to_numpy()
    err = np.abs(G - ref)
    # The worst-case bound holds entry by entry (|X||X|ᵀ = G for nonnegative features).
    bound = mixed_error_bound(L_CNN)
    assert (err <= bound * absref).all()
    assert 4e-4 < bound < 5e-4  # k u with k = MIXED_SPAN + 1 roundings per term
    # Measured: rounding errors cancel, far inside the worst case and the 1e-6 target.
    assert err.max() / np.abs(ref).max() <= 1e-6
    assert (err / absref).max() <= 1e-6
    assert err.max() > 0  # it is float32 arithmetic: not the exact Gram


def test_block_products_update_the_accumulator_in_place():
    """Exact tiles: BLAS dgemm/dsyrk add into the tile's own accumulator (no temporary),
    equal to numpy's product; mixed tiles: one float32 product per feature block, the
    symmetric one (ssyrk) on a diagonal tile, mirrored once at the end."""
    assert MIXED_SPAN >= TARGET_COL_SPAN  # a feature block is one float32 product
    rng = np.random.default_rng(7)
    A = rng.standard_normal((70, 3000)).astype(np.float32)
    B = rng.standard_normal((50, 3000)).astype(np.float32)
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    for precision, rtol in (("float64", 1e-12), ("mixed", 1e-5)):
        for other, ref in ((None, A64 @ A64.T), (B, A64 @ B64.T)):
            prod = NumpyProduct((70, ref.shape[1]), precision, PhaseTimer())
            G = prod.G
            for c0 in range(0, 3000, 1000):
                b = None if other is None else prod.cast(other[:, c0 : c0 + 1000], "b")
                prod.add(prod.cast(A[:, c0 : c0 + 1000]), b)
                assert np.shares_memory(prod.G, G)  # updated where it is, never copied
            if other is None:  # the symmetric product computes one triangle only
                assert not np.triu(G, 1).any()
            out = prod.result()
            np.testing.assert_allclose(out, ref, rtol=rtol, atol=rtol * np.abs(ref).max())
            assert out.flags.c_contiguous and np.shares_memory(out, G)  # no copy at the end
            assert other is not None or np.array_equal(out, out.T)


def test_tiles_after_other_tiles_reuse_the_scratch_and_keep_their_bits():
    """A thread keeps the products' scratch buffers for its next tile (no fresh pages per
    task); what an earlier tile left in them never reaches a later one; another thread has
    its own, and the in-process runner frees them when its job is done."""
    from mmdtl2_dist.engine import products

    rng = np.random.default_rng(3)
    X = rng.standard_normal((90, 2500)).astype(np.float32)

    def tile(precision, rows, symmetric):
        prod = NumpyProduct((rows, rows), precision, PhaseTimer())
        for c0 in range(0, 2500, 1000):
            a = prod.block_buffer("a", (rows, min(1000, 2500 - c0)), np.float32)
            a[:] = X[:rows, c0 : c0 + 1000]
            b = None
            if not symmetric:
                b = prod.block_buffer("b", a.shape, np.float32)
                b[:] = X[-rows:, c0 : c0 + 1000]
            prod.add(a, b)
        return prod.result().copy(), a

    for precision in ("float64", "mixed"):
        for symmetric in (True, False):
            products.release_scratch()
            alone, _ = tile(precision, 40, symmetric)
            tile(precision, 90, not symmetric)[1].fill(np.nan)  # a larger tile, then NaN left
            after, buf = tile(precision, 40, symmetric)
            assert np.array_equal(after, alone), (precision, symmetric)
            assert np.shares_memory(buf, products.thread_scratch()["read-a"])
    with ThreadPoolExecutor(1) as pool:
        assert "read-a" not in pool.submit(products.thread_scratch).result()
    runner = InProcessTasks()
    runner.shutdown()
    assert products.thread_scratch() == {}


def test_mixed_gram_is_never_taken_for_the_exact_one(cnn_store, tmp_path):
    store, ref, _ = cnn_store
    grams = tmp_path / "grams"
    mixed = compute_gram(store, "conv3", gram_dir=grams, precision="mixed", address=IN_PROCESS)
    exact = compute_gram(store, "conv3", gram_dir=grams, address=IN_PROCESS)
    assert not exact.reused and exact.path != mixed.path
    assert (mixed.precision, exact.precision) == ("mixed", "float64")
    assert mixed.key.split("__")[1] == "none-mixed" and exact.key.split("__")[1] == "none"
    assert np.array_equal(exact.to_numpy(), _gram(store, tmp_path / "x").to_numpy())
    again = compute_gram(store, "conv3", gram_dir=grams, precision="mixed", address=IN_PROCESS)
    assert again.reused and again.path == mixed.path
    # The same exact folder is refused for the other precision, naming it.
    with pytest.raises(ValueError, match=r"precision.*'mixed', 'float64'"):
        compute_gram(store, "conv3", mixed.path, address=IN_PROCESS)
    with pytest.raises(ValueError, match="precision must be one of"):
        compute_gram(store, "conv3", tmp_path / "y", precision="float16")


def test_a_gram_stored_without_precision_is_the_exact_one(cnn_store, tmp_path):
    """Gram stores whose job.json has no ``precision`` are exact: reused, and resumed."""
    store, ref, _ = cnn_store
    out = tmp_path / "g"
    _gram(store, out, tile_rows=64)
    job = json.loads((out / "job.json").read_text())
    del job["precision"]
    (out / "job.json").write_text(json.dumps(job))
    assert GramStore.open(out).precision == "float64"
    assert _gram(store, out).reused
    (out / "tiles" / "0_1.json").unlink()  # an interrupted job of such a store
    (out / "job.json").write_text(json.dumps({**job, "complete": False}))
    resumed = _gram(store, out)
    assert resumed.last_run["computed"] == 1 and resumed.precision == "float64"
    np.testing.assert_allclose(resumed.to_numpy(), ref, rtol=1e-12)


@pytest.mark.parametrize("device", [None, "cpu"])
def test_every_tiles_marker_holds_the_crc32c_of_its_stored_values(cnn_store, tmp_path, device):
    """Inner tiles record the CRC32C their chunk write computed, edge tiles (240 rows in
    tiles of 64: the last row block is 48 rows, stored padded) a CRC32C of the tile: both
    must equal the CRC32C of the values read back, computed here on its own."""
    import google_crc32c

    if device is not None:
        pytest.importorskip("torch")
    store, _, _ = cnn_store
    gs = _gram(store, tmp_path / "g", tile_rows=64, device=device)
    G = gs.to_numpy()
    markers = [json.loads(m.read_text()) for m in (tmp_path / "g" / "tiles").glob("*.json")]
    edges = 0
    for m in markers:
        (a0, a1), (b0, b1) = m["rows_a"], m["rows_b"]
        values = np.ascontiguousarray(G[a0:a1, b0:b1])
        assert m["crc32c"] == google_crc32c.value(values.tobytes()), m["tile"]
        edges += min(a1 - a0, b1 - b0) < 64
    assert len(markers) == 10 and edges == 4


@pytest.mark.parametrize(
    ("compression", "device"), [("none", None), ("zstd", None), ("zstd", "cpu")]
)
def test_lost_feature_chunk_is_named_and_nothing_is_written(tmp_path, compression, device):
    """A lost feature chunk is named and no tile is written. The store's own layout is read
    straight from its files, which find the chunk missing; a compressed store is read by
    zarr, which reads it as NaN (the fill value), and the inputs are then checked on the
    finished tile (a NaN reaches its whole row), not per block: by numpy, or by torch on
    the tile's device (here torch's CPU device, the GPU tiles' code path)."""
    from mmdtl2_dist.store import StoreWriter

    if device is not None:
        pytest.importorskip("torch")

    store = tmp_path / "s.zarr"
    X = np.random.default_rng(1).random((40, 64)).astype(np.float32)
    with StoreWriter(store, compression=compression) as w:
        w.create_array("source", "conv3", 40, 64, chunk_rows=16).append(X)
    array = FeatureStore.open(store).array_path("source", "conv3")
    (Path(array) / "c" / "0" / "0").unlink()
    with pytest.raises(CorruptChunkError, match=r"chunk\(s\) \(0, 0\) are missing"):
        _gram(store, tmp_path / "g", device=device)
    assert not list((tmp_path / "g" / "tiles").iterdir())


# --------------------------------------------------------------- torch tiles (CPU) ---
def test_torch_tiles_equal_the_numpy_tiles(cnn_store, tmp_path):
    pytest.importorskip("torch")
    store, ref, absref = cnn_store
    exact = _gram(store, tmp_path / "n", tile_rows=64, preprocessing="l2_zscore").to_numpy()
    on_torch = _gram(store, tmp_path / "t", tile_rows=64, preprocessing="l2_zscore", device="cpu")
    np.testing.assert_allclose(on_torch.to_numpy(), exact, rtol=0, atol=1e-12 * np.abs(exact).max())
    assert on_torch.last_run["device"] == "cpu"
    assert {w["device"] for w in on_torch.last_run["timing"]["workers"].values()} == {"cpu"}
    mixed = _gram(store, tmp_path / "m", tile_rows=64, precision="mixed", device="cpu")
    assert (np.abs(mixed.to_numpy() - ref) <= mixed_error_bound(L_CNN) * absref).all()
    assert np.abs(mixed.to_numpy() - ref).max() / np.abs(ref).max() <= 1e-6


def test_a_torch_tiles_finiteness_check_finds_nan_and_both_infinities_on_device_or_host(
    monkeypatch,
):
    """The check runs on the tile's device by its extreme entries; where the device has no
    memory left for it, the host's copy decides. Each must find a NaN, +inf or -inf
    anywhere in the tile (on-diagonal and off) and pass a finite tile."""
    torch = pytest.importorskip("torch")
    from mmdtl2_dist.engine.torch_products import TorchProduct

    A = np.random.default_rng(5).random((30, 40))

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("no memory for the reduction")

    answers = {}
    for bad in (None, np.nan, np.inf, -np.inf):
        product = TorchProduct((30, 30), "float64", PhaseTimer(), "cpu")
        with pytest.raises(RuntimeError, match="call result"):
            product.all_finite()
        product.add(A)
        product.result()
        if bad is not None:
            product.G[3, 7] = bad  # the device's tile; on torch's CPU device the host copy too
        answers[bad, "device"] = product.all_finite()
        with monkeypatch.context() as m:
            m.setattr(torch, "aminmax", out_of_memory)
            answers[bad, "host"] = product.all_finite()
    expected = {(bad, where): bad is None for bad in (None, np.nan, np.inf, -np.inf)
                for where in ("device", "host")}  # fmt: skip
    assert answers == expected


@pytest.mark.parametrize("precision", ["float64", "mixed"])
def test_torch_diagonal_tiles_compute_the_triangle_and_mirror_it_exactly(precision):
    """A diagonal tile in sub-blocks (upper triangle only), against the float64 product.

    2,600 rows make two sub-blocks a side (three products, not four); the tile must equal
    ``X Xᵀ`` to float64 rounding (exact mode) or inside the mixed bound, and be exactly
    symmetric, as numpy's ``syrk`` tiles are. An off-diagonal tile is one product.
    """
    pytest.importorskip("torch")
    from mmdtl2_dist.engine.torch_products import TorchProduct, triangle_blocks

    assert triangle_blocks(2600) == [(0, 1300), (1300, 2600)]
    assert triangle_blocks(1000) == [(0, 1000)] and len(triangle_blocks(40_000)) == 8
    rng = np.random.default_rng(4)
    X = np.maximum(rng.standard_normal((2600, 300)), 0).astype(np.float32)
    Y = rng.random((700, 300)).astype(np.float32)
    X64, Y64 = X.astype(np.float64), Y.astype(np.float64)
    tol = 1e-13 if precision == "float64" else mixed_error_bound(300)
    product = TorchProduct((2600, 2600), precision, PhaseTimer(), "cpu")
    product.add(X[:, :200])
    product.add(X[:, 200:])
    G = product.result()
    assert np.array_equal(G, G.T)
    assert np.abs(G - X64 @ X64.T).max() <= tol * np.abs(X64 @ X64.T).max()
    product = TorchProduct((2600, 700), precision, PhaseTimer(), "cpu")
    product.add(X, Y)
    assert np.abs(product.result() - X64 @ Y64.T).max() <= tol * np.abs(X64 @ Y64.T).max()


def test_mixed_torch_tiles_sum_float32_products_over_their_span():
    """On a GPU a mixed tile sums float32 products over narrower spans than the CPU's
    (:data:`GPU_MIXED_SPAN`); the span is a parameter, checked on torch's CPU device.

    Integer features: every float32 product over 128 of them sums below 2²⁴, so it is
    exact, and the float64 sum of the spans is the exact Gram; one float32 product over
    all 4,000 sums past 2²⁴, where float32 no longer holds every integer.
    """
    torch = pytest.importorskip("torch")
    from mmdtl2_dist.engine.torch_products import GPU_MIXED_SPAN, TorchProduct, mixed_span

    assert mixed_span("cuda:0") == GPU_MIXED_SPAN < MIXED_SPAN == mixed_span("cpu")
    assert mixed_span(torch.device("cuda", 1)) == mixed_span("cuda") == GPU_MIXED_SPAN
    with pytest.raises(ValueError, match="at least 1 feature"):
        TorchProduct((2, 2), "mixed", PhaseTimer(), "cpu", span=0)
    rng = np.random.default_rng(5)
    X = rng.integers(60, 120, (40, 4000)).astype(np.float32)
    Y = rng.integers(60, 120, (30, 4000)).astype(np.float32)
    exact = X.astype(np.float64) @ Y.astype(np.float64).T
    assert exact.max() > 2**24
    spans = TorchProduct((40, 30), "mixed", PhaseTimer(), "cpu", span=128)
    spans.add(X, Y)
    assert np.array_equal(spans.result(), exact)
    whole = TorchProduct((40, 30), "mixed", PhaseTimer(), "cpu")  # one span of 4,000
    whole.add(X, Y)
    assert not np.array_equal(whole.result(), exact)


def test_gpu_tiles_equal_the_numpy_tiles(cnn_store, tmp_path):
    """On a CUDA GPU (skipped elsewhere): page-locked reads in threads, the copy stream,
    the triangle of a 2,600-row diagonal tile, preprocessing, both precisions."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here")
    store, ref, absref = cnn_store
    exact = _gram(store, tmp_path / "n", tile_rows=64, preprocessing="l2_zscore").to_numpy()
    on_gpu = _gram(store, tmp_path / "g", tile_rows=64, preprocessing="l2_zscore", device="cuda")
    np.testing.assert_allclose(on_gpu.to_numpy(), exact, rtol=0, atol=1e-12 * np.abs(exact).max())
    mixed = _gram(store, tmp_path / "m", tile_rows=64, precision="mixed", device="cuda")
    assert (np.abs(mixed.to_numpy() - ref) <= mixed_error_bound(L_CNN) * absref).all()
    big = tmp_path / "big.zarr"
    make_synthetic_store(big, SyntheticSpec(n_source=2600, n_target=0, dim=9000, seed=5))
    X = FeatureStore.open(big).read("source", "conv3").astype(np.float64)
    for tile_rows in (2600, 1000):  # one diagonal tile in sub-blocks; then 3 x 3 tiles
        G = compute_gram(big, "conv3", tmp_path / f"big{tile_rows}", address=IN_PROCESS,
                         device="cuda", tile_rows=tile_rows, progress=False).to_numpy()  # fmt: skip
        assert np.array_equal(G, G.T)
        np.testing.assert_allclose(G, X @ X.T, rtol=0, atol=1e-13 * np.abs(G).max())


def test_torch_tiles_repair_a_damaged_tile(cnn_store, tmp_path):
    """Resumability is the tiles' markers and hashes, whatever device computed them."""
    pytest.importorskip("torch")
    store, _, _ = cnn_store
    out = tmp_path / "g"
    first = _gram(store, out, tile_rows=64, device="cpu").to_numpy()
    tile = gram_tile_plan(240, 64)[0]
    chunk = out / "gram" / "c" / str(tile.i) / str(tile.j)
    chunk.write_bytes(chunk.read_bytes()[:100])
    again = _gram(store, out, device="cpu")
    assert [r.split()[1] for r in again.last_run["repaired"]] == [tile.key]
    assert again.last_run["computed"] == 1
    assert np.array_equal(again.to_numpy(), first)


def test_missing_torch_is_named_with_the_install_command(tmp_path):
    """Without torch, GPU tiles are refused before anything starts, saying what to install."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None  # `import torch` raises ImportError
        from mmdtl2_dist.engine import IN_PROCESS, compute_gram
        from mmdtl2_dist.store import SyntheticSpec, make_synthetic_store
        make_synthetic_store({str(tmp_path / "s.zarr")!r}, SyntheticSpec(8, 0, dim=16))
        for kw in ({{"gpus": 1}}, {{"device": "cpu", "address": IN_PROCESS}}):
            try:
                compute_gram({str(tmp_path / "s.zarr")!r}, "conv3", progress=False, **kw)
            except ImportError as exc:
                print("ERR", exc)
        gs = compute_gram({str(tmp_path / "s.zarr")!r}, "conv3", address=IN_PROCESS)
        print("numpy tiles without torch:", gs.complete)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    errors = [line for line in done.stdout.splitlines() if line.startswith("ERR")]
    assert len(errors) == 2
    for line in errors:
        assert "need PyTorch" in line and "pip install '.[images]'" in line
    assert "(cuda)" in errors[0] and "(cpu)" in errors[1]
    assert "numpy tiles without torch: True" in done.stdout  # torch is optional


def test_bad_device_and_gpus_are_refused(cnn_store, tmp_path):
    pytest.importorskip("torch")
    store, _, _ = cnn_store
    with pytest.raises(ValueError, match="not a torch device.*'cuda', 'cuda:N' or 'cpu'"):
        _gram(store, tmp_path / "g", device="gpu0")
    with pytest.raises(ValueError, match="gpus must be 0 or more"):
        _gram(store, tmp_path / "g", gpus=-1)
    with pytest.raises(ValueError, match="sees only the GPU Ray gives it.*not 'cuda:1'"):
        _gram(store, tmp_path / "g", gpus=2, device="cuda:1")


def test_gpus_without_a_gpu_are_refused_before_anything_starts(cnn_store, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    store, _, _ = cnn_store
    for kw in ({"gpus": 1}, {"device": "cuda", "address": IN_PROCESS}):
        with pytest.raises(RuntimeError, match=r"need a CUDA GPU.*--device cpu"):
            compute_gram(store, "conv3", tmp_path / "g", progress=False, **kw)
        assert not (tmp_path / "g").exists()


# ------------------------------------------------------------------------ timing -----
def test_timing_breakdown_per_tile_and_worker(cnn_store, tmp_path):
    store, _, _ = cnn_store
    gs = _gram(store, tmp_path / "g", tile_rows=64)
    timing = gs.last_run["timing"]
    tiles = gram_tile_plan(240, 64)
    assert timing["tiles"] == len(tiles)
    assert set(PHASES) <= set(timing["phases"])
    assert timing["phases"]["product"] > 0 and timing["phases"]["read"] > 0
    assert sum(timing["phases"].values()) == pytest.approx(timing["busy_seconds"], rel=1e-6)
    (worker,) = timing["workers"].values()  # in-process: one worker, every tile
    assert worker["tiles"] == len(tiles) and worker["device"] == "numpy"
    assert 0 < worker["utilisation"] <= 1.0 + 1e-6
    marker = json.loads((gs.path / "tiles" / f"{tiles[0].key}.json").read_text())
    assert marker["timing"]["total"] >= marker["timing"]["product"] > 0


@pytest.mark.ray
def test_timing_names_each_ray_worker(ray_local, cnn_store, tmp_path):
    store, ref, _ = cnn_store
    gs = compute_gram(store, "conv3", tmp_path / "g", tile_rows=32, progress=False)
    timing = gs.last_run["timing"]
    assert sum(w["tiles"] for w in timing["workers"].values()) == timing["tiles"] == 36
    # The tiles ran in Ray worker processes, never in this driver. How many workers Ray
    # hands millisecond tiles to is its scheduler's choice (one may take them all), so
    # the split across workers is checked on records below, not here.
    pids = {int(name.rsplit(":", 1)[1]) for name in timing["workers"]}
    assert os.getpid() not in pids
    # Ray gives a one-CPU task one BLAS thread (OMP_NUM_THREADS): no oversubscription.
    assert {w["blas_threads"] for w in timing["workers"].values()} == {1}
    assert timing["max_wait_seconds"] >= 0
    np.testing.assert_allclose(gs.to_numpy(), ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())


def test_timing_summary_splits_tiles_by_worker():
    def record(pid, total, start):
        phases = dict.fromkeys(PHASES, total / (len(PHASES) + 1))
        return {
            **phases,
            "total": total,
            "host": "h",
            "pid": pid,
            "device": "numpy",
            "blas_threads": 1,
            "start": start,
            "submitted": 0.0,
        }

    records = [record(1, 1.0, 0.5), record(2, 2.0, 0.0), record(1, 3.0, 2.0), {}]
    summary = summarize_timing(records, wall_seconds=4.0)
    assert summary["tiles"] == 3 and set(summary["workers"]) == {"h:1", "h:2"}
    assert summary["workers"]["h:1"]["tiles"] == 2
    assert summary["workers"]["h:1"]["busy_seconds"] == pytest.approx(4.0)
    assert summary["workers"]["h:2"]["utilisation"] == pytest.approx(0.5)
    assert summary["max_wait_seconds"] == pytest.approx(2.0)
    assert summary["phases"]["other"] == pytest.approx(6.0 / (len(PHASES) + 1))
    assert "worker h:2 (numpy, 1 BLAS threads): 1 tiles" in format_timing(summary)


# -------------------------------------------------------------------- cost model -----
def test_cost_model_follows_the_tile_schedule():
    r, s = 1e10, 1e9
    # 2,000 rows in tiles of 1,024: one off-diagonal and two diagonal tiles, which two
    # workers share evenly (2 : 1 + 1), so the makespan is one off-diagonal tile.
    one = predict_gram_seconds(2000, 1000, 1, r, s, tile_rows=1024, task_overhead_s=0)
    two = predict_gram_seconds(2000, 1000, 2, r, s, tile_rows=1024, task_overhead_s=0)
    assert one["tiles"] == two["tiles"] == 3
    assert one["seconds"] == pytest.approx(one["compute_seconds"] + one["io_seconds"])
    assert one["compute_seconds"] == pytest.approx(2000**2 * 1000 / r, rel=0.01)
    assert two["balance"] > 0.95 and one["seconds"] / two["seconds"] > 1.9
    # More workers than tiles do not help: the largest tile sets the time.
    three = predict_gram_seconds(2000, 1000, 3, r, s, tile_rows=1024, task_overhead_s=0)
    four = predict_gram_seconds(2000, 1000, 4, r, s, tile_rows=1024, task_overhead_s=0)
    assert four["seconds"] == three["seconds"] and four["busy_workers"] == 3
    assert three["seconds"] == pytest.approx((2 * 1024 * 976 * 1000) / r + 2000 * 4000 / s, rel=0.1)
    # Sizing a cluster: the fewest workers that meet a deadline.
    big = dict(flops_per_s=3e10, read_bytes_per_s=2e8)
    w = workers_for(600, 50_000, 64_896, **big)
    assert predict_gram_seconds(50_000, 64_896, w, **big)["seconds"] <= 600
    assert predict_gram_seconds(50_000, 64_896, w - 1, **big)["seconds"] > 600
    assert workers_for(1.0, 50_000, 64_896, **big) is None
    with pytest.raises(ValueError, match="positive rates"):
        predict_gram_seconds(10, 10, 0, r, s)


def test_cost_model_of_a_gpu_tile_overlaps_reading_with_copies_and_products():
    """A GPU task: max(read, copy + product) + write; without the copy rate, their sum."""
    n, L, kw = 1000, 5000, dict(workers=1, tile_rows=1000, task_overhead_s=0)
    read, flops, written = n * L * 4, n * n * L, 8 * n * n  # one diagonal tile
    rates = dict(flops_per_s=1e12, read_bytes_per_s=1e9, write_bytes_per_s=5e8)
    gpu = predict_gram_seconds(n, L, **kw, **rates, transfer_bytes_per_s=1e10)
    reading, device = read / 1e9, read / 1e10 + flops / 1e12
    assert reading > device  # the host's read sets the pace
    assert gpu["seconds"] == pytest.approx(reading + written / 5e8)
    slow_device = predict_gram_seconds(n, L, **kw, **rates, transfer_bytes_per_s=1e8)
    assert slow_device["seconds"] == pytest.approx(read / 1e8 + flops / 1e12 + written / 5e8)
    cpu = predict_gram_seconds(n, L, **kw, **rates)
    assert cpu["seconds"] == pytest.approx(reading + flops / 1e12 + written / 5e8)
    assert predict_gram_seconds(n, L, 1, 1e12, 1e9, tile_rows=1000, task_overhead_s=0)[
        "seconds"
    ] == pytest.approx(reading + flops / 1e12 + written / 1e9)  # writes at the read rate


# ------------------------------------------------------------------ study specs ------
def _spec_raw(store, **gram):
    raw = {
        "study": {"name": "s"},
        "data": {"store": str(store), "space": "conv3", "pairs": "all"},
        "splits": {"protocol": "half", "samples_per_class": [1]},
        "methods": [{"method": "mmdtl2"}],
    }
    if gram:
        raw["gram"] = gram
    return raw


def test_study_spec_chooses_the_gram_precision(cnn_store, tmp_path):
    from mmdtl2_dist.study.preparation import compute_grams
    from mmdtl2_dist.study.spec import SpecError, parse_spec

    store, _, _ = cnn_store
    assert parse_spec(_spec_raw(store), output=tmp_path).gram_precision == "float64"
    spec = parse_spec(_spec_raw(store, precision="mixed"), output=tmp_path)
    assert spec.gram_precision == "mixed"
    with pytest.raises(SpecError, match=r"\[gram\] precision must be one of.*'float16'"):
        parse_spec(_spec_raw(store, precision="float16"), output=tmp_path)
    with pytest.raises(SpecError, match=r"\[gram\] unknown key\(s\) \['gpus'\]"):
        parse_spec(_spec_raw(store, gpus=1), output=tmp_path)
    raw = _spec_raw(store, precision="mixed")
    raw["data"]["gram_dir"] = str(tmp_path / "grams")
    spec = parse_spec(raw, output=tmp_path)
    (path,) = compute_grams(spec, store, address=IN_PROCESS, progress=False).values()
    assert GramStore.open(path).precision == "mixed" and "-mixed__" in path


@pytest.mark.ray
def test_cli_gram_in_mixed_precision_on_torch_cpu(ray_local, cnn_store, tmp_path, capsys):
    """`mmdtl2 gram --precision mixed --device cpu`: its own key, timing in the progress."""
    pytest.importorskip("torch")
    import argparse

    from mmdtl2_dist.commands import gram as gram_cmd

    store, ref, absref = cnn_store
    parser = argparse.ArgumentParser()
    gram_cmd.register(parser.add_subparsers())
    argv = ["gram", str(store), "--gram-dir", str(tmp_path / "grams"), "--preprocessing"]
    argv += ["none", "--precision", "mixed", "--device", "cpu", "--tile-rows", "64"]
    args = parser.parse_args([*argv, "--progress"])
    assert args.func(args) == 0
    out = capsys.readouterr()
    assert "precision 'mixed'" in out.out and "conv3__none-mixed__" in out.out
    assert "busy" in out.err and "utilisation" in out.err  # where the time went
    (path,) = (p for p in (tmp_path / "grams").iterdir() if p.is_dir())
    G = GramStore.open(path).to_numpy()
    assert (np.abs(G - ref) <= mixed_error_bound(L_CNN) * absref).all()


@pytest.mark.ray
def test_killed_torch_worker_does_not_change_the_result(ray_local, cnn_store, tmp_path):
    """SIGKILL of a Ray worker inside a torch tile: Ray retries it, the bits stay the same."""
    pytest.importorskip("torch")
    import os
    import signal
    import threading
    import time

    import psutil
    from slow_tiles import slow_gram_tiles

    store, _, _ = cnn_store
    kw = dict(tile_rows=64, device="cpu", precision="mixed", progress=False)
    clean = compute_gram(store, "conv3", tmp_path / "clean", **kw)
    probe = tmp_path / "probe"
    probe.mkdir()
    result = {}

    def run():
        try:
            result["gs"] = compute_gram(store, "conv3", tmp_path / "g", **kw)
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            result["error"] = exc

    th = threading.Thread(target=run)
    with slow_gram_tiles(probe, delay=1.5):
        th.start()
        deadline = time.monotonic() + 120
        while not list(probe.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        tile_key, pid = sorted(probe.iterdir())[0].name.rsplit(".", 1)
        os.kill(int(pid), signal.SIGKILL)
        th.join(timeout=300)
    assert not th.is_alive() and "error" not in result, result.get("error")
    assert not psutil.pid_exists(int(pid)) or psutil.Process(int(pid)).status() == "zombie"
    assert len([p for p in probe.iterdir() if p.name.startswith(tile_key + ".")]) >= 2
    assert np.array_equal(result["gs"].to_numpy(), clean.to_numpy())
    assert result["gs"].last_run["device"] == "cpu"
