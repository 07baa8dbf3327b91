"""Blocks read straight from chunk files equal zarr's reads; damage is named, not read."""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import zarr

from mmdtl2_dist.store import CorruptChunkError, StoreWriter
from mmdtl2_dist.store.blocks import read_array_block
from mmdtl2_dist.store.chunk_files import chunk_layout, read_block


def _store(path, X, chunk_rows=16, compression="none"):
    with StoreWriter(path, compression=compression) as w:
        w.create_array("a", "s", *X.shape, dtype=X.dtype, chunk_rows=chunk_rows).append(X)
    return str(path / "features" / "a" / "s")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_direct_blocks_equal_zarrs_reads_edge_chunks_and_threads_included(tmp_path, dtype):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((75, 9000)).astype(dtype)  # 5 row chunks (last short), 3 col chunks
    path = _store(tmp_path / "st", X)
    layout = chunk_layout(path)
    assert layout is not None and layout.chunks == (16, 3000)
    arr = zarr.open_array(path, mode="r")
    with ThreadPoolExecutor(3) as pool:
        for r0, r1, c0, c1 in [(0, 75, 0, 9000), (3, 70, 2999, 6001), (64, 75, 8000, 9000)]:
            want = arr[r0:r1, c0:c1]
            out = np.full((r1 - r0, c1 - c0), np.nan, dtype=dtype)  # every entry must be written
            got = read_block(layout, r0, r1, c0, c1, out, pool)
            assert got is out and np.array_equal(got, want)
            assert np.array_equal(read_array_block(path, r0, r1, c0, c1), want)


def test_damaged_chunks_are_named_each_with_what_is_wrong(tmp_path):
    """Chunks damaged in different ways, read by a pool: each is named with its damage; a
    chunk file that cannot be read at all is an OSError naming it, not store damage."""
    X = np.arange(64 * 10, dtype=np.float32).reshape(64, 10)
    path = _store(tmp_path / "st", X)
    chunks = tmp_path / "st" / "features" / "a" / "s" / "c"
    raw = bytearray((chunks / "1" / "0").read_bytes())
    raw[11] ^= 0x40
    (chunks / "1" / "0").write_bytes(bytes(raw))
    (chunks / "2" / "0").write_bytes((chunks / "2" / "0").read_bytes() + b"\0")
    (chunks / "3" / "0").unlink()
    assert np.array_equal(read_array_block(path, 0, 16, 0, 10), X[:16])  # chunk 0 is fine
    with ThreadPoolExecutor(2) as pool:
        with pytest.raises(CorruptChunkError) as err:
            read_array_block(path, 0, 64, 0, 10, check_finite=False, pool=pool)
    assert err.value.chunks == [(1, 0), (2, 0), (3, 0)]
    message = str(err.value)
    assert "(3, 0) are missing" in message and "(1, 0) failed their CRC32C checksum" in message
    assert "(2, 0) have the wrong size (645 bytes where 644 are expected)" in message
    assert "chunk(s) (1, 0), (2, 0), (3, 0) are damaged: " in message
    (chunks / "3" / "0").mkdir()  # a chunk path that cannot be read as a file
    with pytest.raises(OSError, match=r"cannot read the chunk file .*c/3/0.*permissions"):
        read_array_block(path, 48, 64, 0, 10)


def test_blocks_outside_the_array_and_chunks_of_another_shape_are_refused(tmp_path):
    from mmdtl2_dist.store.blocks import write_array_chunk

    X = np.ones((50, 10), dtype=np.float32)
    path = _store(tmp_path / "st", X, chunk_rows=32)
    for r0, r1 in [(40, 60), (-5, 10), (60, 70)]:
        with pytest.raises(IndexError, match=r"has shape \(50, 10\); ask for a block inside"):
            read_array_block(path, r0, r1, 0, 10)
    with pytest.raises(IndexError, match="into an array of the block's shape"):
        read_array_block(path, 0, 8, 0, 10, out=np.empty((9, 10), np.float32))
    for (i, j), values in [((1, 0), np.ones((32, 10))), ((2, 0), np.ones((18, 10)))]:
        with pytest.raises(ValueError, match=r"holds \(\d+, 10\) values inside the array"):
            write_array_chunk(path, i, j, values.astype(np.float32))
    assert not (tmp_path / "st" / "features" / "a" / "s" / "c" / "2").exists()


def test_compressed_arrays_are_read_by_zarr_and_a_rewritten_array_is_looked_at_again(tmp_path):
    rng = np.random.default_rng(2)
    X = rng.random((40, 30)).astype(np.float32)
    path = _store(tmp_path / "st", X, compression="zstd")
    assert chunk_layout(path) is None
    assert np.array_equal(read_array_block(path, 5, 33, 1, 29), X[5:33, 1:29])
    Y = X + 1.0
    shutil.rmtree(tmp_path / "st")
    path = _store(tmp_path / "st", Y)  # same path, plain layout now
    assert chunk_layout(path) is not None
    assert np.array_equal(read_array_block(path, 5, 33, 1, 29), Y[5:33, 1:29])


def test_chunks_written_straight_to_their_files_read_back_through_zarr(tmp_path):
    """write_array_chunk writes a whole chunk (an edge chunk padded with the fill value) that
    zarr reads and checks as its own, and leaves no temporary file behind."""
    from zarr.codecs import Crc32cCodec

    from mmdtl2_dist.store.blocks import write_array_chunk

    path = str(tmp_path / "g")
    zarr.create_array(store=path, shape=(50, 50), chunks=(32, 32), dtype="float64",
                      compressors=[Crc32cCodec()], fill_value=np.nan)  # fmt: skip
    rng = np.random.default_rng(3)
    G = rng.standard_normal((50, 50))
    for i, j in [(0, 0), (0, 1), (1, 1)]:
        write_array_chunk(path, i, j, G[i * 32 : (i + 1) * 32, j * 32 : (j + 1) * 32])
    arr = zarr.open_array(path, mode="r")
    assert np.array_equal(arr[:32, :], G[:32, :]) and np.array_equal(arr[32:, 32:], G[32:, 32:])
    assert np.isnan(arr[32:, :32]).all()  # never written: the fill value
    assert not list((tmp_path / "g").rglob("*.tmp"))


def test_a_chunk_write_returns_the_crc32c_of_the_values_only_where_the_file_holds_their_bytes(
    tmp_path,
):
    """The CRC32C a chunk write returns is the values' own (what a tile's marker records,
    computed independently by engine.tasks.checksum) for a chunk inside the array; an edge
    chunk (padded) or values of another dtype (cast) give None, so the caller computes it."""
    from zarr.codecs import Crc32cCodec

    from mmdtl2_dist.engine.tasks import checksum
    from mmdtl2_dist.store.blocks import write_array_chunk

    path = str(tmp_path / "g")
    zarr.create_array(store=path, shape=(50, 50), chunks=(32, 32), dtype="float64",
                      compressors=[Crc32cCodec()], fill_value=np.nan)  # fmt: skip
    G = np.random.default_rng(4).standard_normal((50, 50))
    inner = G[:32, :32]
    assert write_array_chunk(path, 0, 0, inner) == checksum(inner)
    assert write_array_chunk(path, 0, 1, G[:32, 32:]) is None  # edge: padded with NaN
    assert write_array_chunk(path, 0, 0, inner.astype(np.float32)) is None  # cast
    stored = (tmp_path / "g" / "c" / "0" / "0").read_bytes()
    assert int.from_bytes(stored[-4:], "little") == checksum(inner.astype(np.float32).astype(float))


def test_a_chunk_write_killed_midway_leaves_the_old_chunk_and_a_temporary_file_removed_later(
    tmp_path,
):
    """SIGKILL of a process writing a chunk over and over: the chunk reads back whole (the
    old values or the new, never a part), and the temporary file the kill left is removed
    by remove_stray_writes (as a Gram's next run does), which touches nothing else."""
    import signal
    import subprocess
    import sys
    import time

    from zarr.codecs import Crc32cCodec

    from mmdtl2_dist.store.chunk_files import remove_stray_writes

    path = str(tmp_path / "g")
    n = 2048
    zarr.create_array(store=path, shape=(n, n), chunks=(n, n), dtype="float64",
                      compressors=[Crc32cCodec()], fill_value=np.nan)  # fmt: skip
    from mmdtl2_dist.store.blocks import write_array_chunk

    write_array_chunk(path, 0, 0, np.full((n, n), 5.0))
    code = (
        "import sys, numpy as np\n"
        "from mmdtl2_dist.store.blocks import write_array_chunk\n"
        f"for k in range(100000): write_array_chunk({path!r}, 0, 0, np.full(({n}, {n}), k % 2))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    chunk_dir = tmp_path / "g" / "c" / "0"
    try:
        deadline = time.monotonic() + 60
        while not list(chunk_dir.glob(".0.*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.001)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    left = list(chunk_dir.glob(".0.*.tmp"))
    (tmp_path / "g" / "c" / "0" / ".notes.tmp").write_text("not ours")
    values = zarr.open_array(path, mode="r")[:]
    assert np.unique(values).size == 1 and values[0, 0] in (5.0, 0.0, 1.0)
    if left:  # the kill fell during a write (almost always: writing is most of the loop)
        assert remove_stray_writes(path) == left
    assert not list(chunk_dir.glob(".0.*.tmp")) and (chunk_dir / ".notes.tmp").exists()


def test_a_thread_keeps_no_scratch_buffer_for_large_chunks(tmp_path, monkeypatch):
    """Chunks above KEPT_SCRATCH are read into a buffer of their own (a GPU Gram's chunk
    is up to 2 GB), not kept by the reading thread; the values are the same."""
    from mmdtl2_dist.store import chunk_files

    X = np.random.default_rng(5).random((40, 30)).astype(np.float32)
    path = _store(tmp_path / "st", X)  # chunks of 16 x 30 float32: 1,924 bytes with CRC
    monkeypatch.setattr(chunk_files, "KEPT_SCRATCH", 1000)
    monkeypatch.setattr(chunk_files, "_SCRATCH", threading.local())
    assert np.array_equal(read_array_block(path, 3, 40, 0, 30), X[3:])
    assert getattr(chunk_files._SCRATCH, "buf", None) is None
