"""Tiles split into feature parts: the plan, equality with the unsplit Gram, resume, damage.

A Gram of few rows and many features (2,000 x 64,896: one tile) keeps its workers busy by
splitting each tile's feature blocks into parts, one task each, summed in part order by
a combine task (``mmdtl2_dist.engine.plan``, ``mmdtl2_dist.engine.running``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from mmdtl2_dist.engine import IN_PROCESS, GramStore, compute_gram, feature_blocks, gram_tile_plan
from mmdtl2_dist.engine.cost import predict_gram_seconds
from mmdtl2_dist.engine.plan import (
    DEFAULT_TASK_MEMORY_MB,
    choose_parts,
    choose_tile_rows,
    part_blocks,
    plan_summary,
    task_memory_bytes,
)
from mmdtl2_dist.store import StoreWriter

REPO = Path(__file__).resolve().parents[1]
#: 12 column chunks of 4,096: six feature blocks of 8,192, so up to six parts per tile.
L_WIDE = 49_152


def _wide_store(path, sizes=(30, 18), seed=0) -> np.ndarray:
    """Nonnegative, sparse features of ``L_WIDE`` columns on two devices; the rows, stacked."""
    rng = np.random.default_rng(seed)
    rows = []
    with StoreWriter(path) as w:
        for d, n in zip(("a", "b"), sizes, strict=True):
            X = rng.random((n, L_WIDE), dtype=np.float32)
            X[rng.random((n, L_WIDE)) < 0.5] = 0
            w.create_array(d, "s", n, L_WIDE, chunk_rows=16).append(X)
            rows.append(X)
    return np.concatenate(rows).astype(np.float64)


def _close(G, ref):
    np.testing.assert_allclose(G, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())


# ---------------------------------------------------------------- plan (no Ray) -----
def _paper_plan(n: int, workers: int) -> dict:
    """The plan the engine picks for n x 64,896 float32 features in chunks (256, 4056)."""
    tile_rows = choose_tile_rows(n, 256, 4056, DEFAULT_TASK_MEMORY_MB, 4)
    blocks = feature_blocks(64_896, 4056, tile_rows, DEFAULT_TASK_MEMORY_MB, 4)
    tiles = gram_tile_plan(n, tile_rows)
    parts = choose_parts(len(tiles), len(blocks), workers)
    span = max(c1 - c0 for c0, c1 in blocks)
    return {
        "tile_rows": tile_rows,
        "blocks": len(blocks),
        "memory": task_memory_bytes(tile_rows, span),
        **plan_summary(n, 64_896, tiles, blocks, parts),
    }


def test_plan_splits_the_features_of_few_tiles_among_the_workers():
    one, two = _paper_plan(2000, 1), _paper_plan(2000, 2)
    # One tile of all 2,000 rows: every row read once (not twice, as 3 tiles of 1,024 would).
    assert one["tile_rows"] == two["tile_rows"] == 2000 and one["tiles"] == 1
    assert one["read_amplification"] == two["read_amplification"] == 1.0
    assert (one["parts"], one["tasks"]) == (1, 1)
    assert (two["parts"], two["tasks"]) == (2, 3)  # two parts of 4 blocks, one combine
    assert one["blocks"] == 8 and one["memory"] <= DEFAULT_TASK_MEMORY_MB * 2**20
    big = _paper_plan(20_000, 2)  # 55 tiles keep any small cluster busy: no split
    assert (big["tile_rows"], big["tiles"], big["parts"]) == (2048, 55, 1)
    assert big["memory"] <= DEFAULT_TASK_MEMORY_MB * 2**20
    assert _paper_plan(2000, 16)["parts"] == 8  # at most one part per feature block
    assert choose_parts(3, 8, 2) == 1  # 1 off-diagonal tile : 2 diagonal ones, balanced


def test_part_blocks_are_contiguous_balanced_and_bounded():
    blocks = [(c, c + 10) for c in range(0, 70, 10)]
    groups = part_blocks(blocks, 3)
    assert [len(g) for g in groups] == [3, 2, 2]
    assert [b for g in groups for b in g] == blocks  # in order, each block once
    assert part_blocks(blocks, 1) == [blocks]
    with pytest.raises(ValueError, match=r"feature_parts must lie in \[1, 7\].*at most 7"):
        part_blocks(blocks, 8)


def test_cost_model_counts_parts_and_their_combine():
    r, s = 1e10, 1e9
    kw = dict(tile_rows=2000, task_overhead_s=0)
    whole = predict_gram_seconds(2000, 64_896, 2, r, s, **kw)
    split = predict_gram_seconds(2000, 64_896, 2, r, s, parts=2, **kw)
    assert (whole["tasks"], split["tasks"]) == (1, 3)
    assert whole["busy_workers"] == 1  # one tile: the second worker idles
    # Two parts on two workers: about half the time, plus writing and summing the parts.
    assert 0.5 < split["seconds"] / whole["seconds"] < 0.56
    assert split["compute_seconds"] == pytest.approx(whole["compute_seconds"])


# ------------------------------------------------------- results (in this process) ---
def test_split_gram_equals_the_unsplit_one_and_numpy(tmp_path):
    Z = _wide_store(tmp_path / "st")
    ref = Z @ Z.T
    kw = dict(address=IN_PROCESS, progress=False)
    whole = compute_gram(tmp_path / "st", "s", tmp_path / "g1", **kw)
    split = compute_gram(tmp_path / "st", "s", tmp_path / "g4", feature_parts=4, **kw)
    assert (whole.job["parts"], split.job["parts"]) == (1, 4)  # stored with the job
    assert split.last_run["parts_computed"] == 4 and split.last_run["tasks"] == 5
    _close(split.to_numpy(), whole.to_numpy())
    _close(split.to_numpy(), ref)
    assert not list((split.path / "tiles" / "parts").iterdir())  # the combine tidied up
    (marker,) = split.finished_tiles().values()
    assert len(marker["parts"]) == 4  # the attempts it summed
    # Diagonal and off-diagonal tiles, exact and mixed: the same plan gives the same bits.
    tiled = dict(feature_parts=3, tile_rows=16, **kw)
    a = compute_gram(tmp_path / "st", "s", tmp_path / "t1", **tiled).to_numpy()
    b = compute_gram(tmp_path / "st", "s", tmp_path / "t2", **tiled).to_numpy()
    assert np.array_equal(a, b)
    _close(a, ref)
    mixed = compute_gram(tmp_path / "st", "s", tmp_path / "m", precision="mixed", **tiled)
    assert np.abs(mixed.to_numpy() - ref).max() / np.abs(ref).max() <= 1e-6
    with pytest.raises(ValueError, match=r"feature_parts must lie in \[1, 6\]"):
        compute_gram(tmp_path / "st", "s", tmp_path / "x", feature_parts=7, **kw)
    # A partial job keeps its plan: another split is refused, naming it.
    job = json.loads((tmp_path / "g4" / "job.json").read_text())
    (tmp_path / "g4" / "job.json").write_text(json.dumps({**job, "complete": False}))
    with pytest.raises(ValueError, match=r"other parameters.*'parts': \(4, 2\)"):
        compute_gram(tmp_path / "st", "s", tmp_path / "g4", feature_parts=2, **kw)


def test_torch_tiles_with_parts(tmp_path):
    pytest.importorskip("torch")
    Z = _wide_store(tmp_path / "st", sizes=(20, 10))
    kw = dict(address=IN_PROCESS, progress=False, feature_parts=3, tile_rows=16)
    on_torch = compute_gram(tmp_path / "st", "s", tmp_path / "t", device="cpu", **kw)
    _close(on_torch.to_numpy(), Z @ Z.T)
    assert on_torch.last_run["parts_computed"] == 9 and on_torch.last_run["device"] == "cpu"


def _parts_of_a_job_stopped_before_its_combine(tmp_path):
    """Run a 4-part in-process job that stops before its combine: (Z, out, compute kwargs)."""
    from mmdtl2_dist.engine import tasks

    Z = _wide_store(tmp_path / "st")
    kw = dict(address=IN_PROCESS, progress=False, feature_parts=4)
    out = tmp_path / "g"
    real = tasks.gram_combine_task

    def stopped(*args):
        raise KeyboardInterrupt  # the job stops before its combine

    tasks.gram_combine_task = stopped
    try:
        with pytest.raises(KeyboardInterrupt):
            compute_gram(tmp_path / "st", "s", out, **kw)
    finally:
        tasks.gram_combine_task = real
    return Z, out, kw


def test_damaged_or_missing_part_files_are_recomputed_never_summed(tmp_path, capsys):
    """Parts left by an interrupted job: a part whose file is damaged or missing, or that
    has no marker, is recomputed; the intact ones are kept."""

    Z, out, kw = _parts_of_a_job_stopped_before_its_combine(tmp_path)
    parts_dir = out / "tiles" / "parts"
    before = {p.name: json.loads(p.read_text()) for p in parts_dir.glob("*.json")}
    assert sorted(before) == [f"0_0.{k}.json" for k in range(4)]
    flipped = parts_dir / "0_0.1.npy"
    raw = bytearray(flipped.read_bytes())
    raw[-5] ^= 0x01
    flipped.write_bytes(bytes(raw))
    (parts_dir / "0_0.2.npy").unlink()
    (parts_dir / "0_0.3.json").unlink()  # a file without its marker: stopped before it
    (parts_dir / ".0_0.3.npy.0123abcd.tmp").write_bytes(b"partial")
    capsys.readouterr()
    gs = compute_gram(tmp_path / "st", "s", out, **kw)
    err = capsys.readouterr().err
    assert "part 0_0.1 of tile 0_0" in err and "holds other values" in err
    assert "part 0_0.2 of tile 0_0" in err and "cannot be read" in err
    assert (gs.last_run["parts_resumed"], gs.last_run["parts_computed"]) == (1, 3)
    assert len(gs.last_run["repaired"]) == 2
    (marker,) = gs.finished_tiles().values()
    assert marker["parts"][0] == before["0_0.0.json"]["attempt"]  # kept, not recomputed
    assert marker["parts"][1] != before["0_0.1.json"]["attempt"]
    _close(gs.to_numpy(), Z @ Z.T)
    assert not list(parts_dir.iterdir())
    # A damaged chunk of the finished Gram: its tile is recomputed, part by part.
    chunk = out / "gram" / "c" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:100])
    again = compute_gram(tmp_path / "st", "s", out, **kw)
    assert len(again.last_run["repaired"]) == 1 and again.last_run["parts_computed"] == 4
    assert np.array_equal(again.to_numpy(), gs.to_numpy())


def test_lost_feature_chunk_is_named_by_the_part_that_reads_it(tmp_path):
    from mmdtl2_dist.engine import tasks
    from mmdtl2_dist.store import CorruptChunkError, FeatureStore

    _wide_store(tmp_path / "st")
    array = FeatureStore.open(tmp_path / "st").array_path("b", "s")
    (Path(array) / "c" / "0" / "9").unlink()  # columns 36,864-40,960: the last part's
    with pytest.raises(CorruptChunkError, match=r"chunk\(s\) \(0, 9\)"):
        compute_gram(tmp_path / "st", "s", tmp_path / "g", address=IN_PROCESS, feature_parts=3)
    parts = tmp_path / "g" / "tiles" / tasks.PARTS_DIR
    assert sorted(p.name for p in parts.glob("*.json")) == ["0_0.0.json", "0_0.1.json"]
    assert not list((tmp_path / "g" / "tiles").glob("*.json"))


def test_an_empty_part_file_or_a_marker_without_its_checksum_is_recomputed(tmp_path, capsys):
    """A part file left empty (a crash between its rename and the data reaching the disk)
    and a marker that records no CRC32C (damaged, or written by an older version) are
    named and recomputed; neither stops the run nor is summed."""

    Z, out, kw = _parts_of_a_job_stopped_before_its_combine(tmp_path)
    parts_dir = out / "tiles" / "parts"
    (parts_dir / "0_0.0.npy").write_bytes(b"")
    old = json.loads((parts_dir / "0_0.1.json").read_text())
    old["blake2b"] = "0" * 32
    del old["crc32c"]
    (parts_dir / "0_0.1.json").write_text(json.dumps(old))
    (parts_dir / ".0_0.2.json.0123abcd.tmp").write_text("{")  # a marker write cut short
    capsys.readouterr()
    gs = compute_gram(tmp_path / "st", "s", out, **kw)
    err = capsys.readouterr().err
    assert "part 0_0.0 of tile 0_0" in err and "cannot be read" in err
    assert "part 0_0.1 of tile 0_0" in err and "records no CRC32C checksum" in err
    assert (gs.last_run["parts_resumed"], gs.last_run["parts_computed"]) == (2, 2)
    _close(gs.to_numpy(), Z @ Z.T)
    assert not list(parts_dir.iterdir())


def test_a_part_damaged_before_its_combine_is_named_and_removed(tmp_path):
    from mmdtl2_dist.engine import tasks

    Z = _wide_store(tmp_path / "st", sizes=(12, 6))
    kw = dict(address=IN_PROCESS, progress=False, feature_parts=2)
    real = tasks.gram_combine_task

    def damage_then_combine(job, tile, *markers):
        data, _ = tasks.part_paths(job["tiles_dir"], tile, 1)
        np.save(data, np.load(data) * 2)  # a valid file of other values
        return real(job, tile, *markers)

    tasks.gram_combine_task = damage_then_combine
    try:
        with pytest.raises(tasks.DamagedPartError, match=r"0_0\.1\.npy holds other values"):
            compute_gram(tmp_path / "st", "s", tmp_path / "g", **kw)
    finally:
        tasks.gram_combine_task = real
    assert not (tmp_path / "g" / "tiles" / "parts" / "0_0.1.json").exists()
    gs = compute_gram(tmp_path / "st", "s", tmp_path / "g", **kw)
    assert (gs.last_run["parts_resumed"], gs.last_run["parts_computed"]) == (1, 1)
    _close(gs.to_numpy(), Z @ Z.T)


def test_a_tile_whose_marker_is_unreadable_or_missing_is_recomputed(tmp_path, capsys):
    """A finished split tile's marker cut short (or removed) is named and the tile
    recomputed, not reported verified, and its combine does not stop at the marker."""
    Z = _wide_store(tmp_path / "st", sizes=(12, 6))
    kw = dict(address=IN_PROCESS, progress=False, feature_parts=2)
    first = compute_gram(tmp_path / "st", "s", tmp_path / "g", **kw).to_numpy()
    marker = tmp_path / "g" / "tiles" / "0_0.json"
    chunk = tmp_path / "g" / "gram" / "c" / "0" / "0"
    for damage, why in ((lambda: marker.write_text("{"), "has an unreadable marker"),
                        (marker.unlink, "has no marker")):  # fmt: skip
        damage()
        capsys.readouterr()
        gs = compute_gram(tmp_path / "st", "s", tmp_path / "g", **kw)
        assert f"tile 0_0 (chunk file {chunk}) {why}" in capsys.readouterr().err
        assert gs.last_run["repaired"] == [f"tile 0_0 (chunk file {chunk}) {why}"]
        assert gs.last_run["parts_computed"] == 2 and json.loads(marker.read_text())["parts"]
        assert np.array_equal(gs.to_numpy(), first)
    _close(first, Z @ Z.T)


# ------------------------------------------------------------------------ on Ray ------
@pytest.mark.ray
def test_ray_job_splits_one_tile_between_two_workers(ray_local, tmp_path):
    Z = _wide_store(tmp_path / "st")
    gs = compute_gram(tmp_path / "st", "s", tmp_path / "g", progress=False)
    assert (gs.tile_rows, gs.job["parts"]) == (48, 2)  # 2 CPUs in ray_local
    timing = gs.last_run["timing"]
    assert timing["tiles"] == 3  # records: two parts and the combine
    here = compute_gram(
        tmp_path / "st", "s", tmp_path / "h", address=IN_PROCESS, feature_parts=2, progress=False
    )
    assert np.array_equal(gs.to_numpy(), here.to_numpy())  # same plan, same bits
    _close(gs.to_numpy(), Z @ Z.T)


_DRIVER = textwrap.dedent(
    """
    import contextlib, json, sys
    sys.path[:0] = [{repo!r}, {tests!r}]
    from mmdtl2_dist.engine import compute_gram
    from slow_tiles import slow_gram_tiles
    delay = float(sys.argv[1])
    with slow_gram_tiles({probe!r}, delay) if delay else contextlib.nullcontext():
        gs = compute_gram({store!r}, "s", {out!r}, feature_parts=6, num_cpus=1,
                          progress=False)
    print(json.dumps(gs.last_run))
    """
)


@pytest.mark.ray
def test_killed_driver_resumes_only_the_missing_parts(tmp_path):
    """SIGKILL of the driver (its whole session) while parts run: the next run keeps the
    finished parts (their attempts are the ones summed) and computes only the others."""
    from test_engine import kill_session

    Z = _wide_store(tmp_path / "st")
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
        )  # fmt: skip
    )
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(
        [sys.executable, str(script), "0.8"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    parts_dir = out / "tiles" / "parts"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if parts_dir.exists() and len(list(parts_dir.glob("*.json"))) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    kill_session(proc)
    before = {p.name: json.loads(p.read_text()) for p in parts_dir.glob("*.json")}
    assert 2 <= len(before) < 6 and not (out / "tiles" / "0_0.json").exists()

    done = subprocess.run(
        [sys.executable, str(script), "0"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last["parts_resumed"] == len(before) and last["parts_computed"] == 6 - len(before)
    gs = GramStore.open(out)
    (marker,) = gs.finished_tiles().values()
    kept = {m["attempt"] for m in before.values()}
    assert kept <= set(marker["parts"])  # the finished parts were summed, not recomputed
    _close(gs.to_numpy(), Z @ Z.T)
