"""Blocks read straight from chunk files equal zarr's reads; damage is named, not read."""

from __future__ import annotations

import shutil
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


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("flip", "failed their CRC32C checksum"),
        ("truncate", "have the wrong size"),
        ("append", "have the wrong size"),
        ("delete", "are missing"),
    ],
)
def test_a_damaged_chunk_is_named_with_what_is_wrong(tmp_path, damage, reason):
    X = np.arange(64 * 10, dtype=np.float32).reshape(64, 10)
    path = _store(tmp_path / "st", X)
    chunk = tmp_path / "st" / "features" / "a" / "s" / "c" / "2" / "0"
    raw = bytearray(chunk.read_bytes())
    if damage == "flip":
        raw[11] ^= 0x40
        chunk.write_bytes(bytes(raw))
    elif damage == "truncate":
        chunk.write_bytes(bytes(raw[:-9]))
    elif damage == "append":
        chunk.write_bytes(bytes(raw) + b"\0")
    else:
        chunk.unlink()
    assert np.array_equal(read_array_block(path, 0, 32, 0, 10), X[:32])  # other chunks fine
    with ThreadPoolExecutor(2) as pool:
        with pytest.raises(CorruptChunkError, match=reason) as err:
            read_array_block(path, 0, 64, 0, 10, check_finite=False, pool=pool)
    assert err.value.chunks == [(2, 0)]


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
