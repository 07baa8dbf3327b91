"""Feature store: layout, atomic writes, checksums, reads, fingerprints."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mmdtl2_dist.store import CorruptChunkError, FeatureStore, StoreWriter
from mmdtl2_dist.store.layout import MIN_CHUNK_BYTES, choose_chunks


def _write(path, arrays, chunk_rows=None, **kw):
    """arrays: {(device, space): (X, labels or None)}"""
    with StoreWriter(path, **kw) as w:
        for (device, space), (X, y) in arrays.items():
            n, L = X.shape
            a = w.create_array(device, space, n, L, dtype=X.dtype, chunk_rows=chunk_rows)
            for r0 in range(0, X.shape[0], 7):  # odd block size: rebanding into chunks
                a.append(X[r0 : r0 + 7])
            if y is not None:
                a.set_metadata(label=y)
    return FeatureStore.open(path)


@pytest.fixture()
def data():
    rng = np.random.default_rng(0)
    Xa = rng.standard_normal((50, 30)).astype(np.float32)
    Xb = rng.standard_normal((20, 30)).astype(np.float32)
    Xc = rng.standard_normal((50, 12))
    ya, yb = rng.integers(0, 3, 50), rng.integers(0, 3, 20)
    return {("a", "s"): (Xa, ya), ("b", "s"): (Xb, yb), ("a", "t"): (Xc, ya)}


def test_round_trip_and_metadata(tmp_path, data):
    fs = _write(tmp_path / "st", data)
    assert fs.devices == ["a", "b"] and fs.spaces == ["s", "t"]
    assert fs.devices_in("s") == ["a", "b"] and fs.devices_in("t") == ["a"]
    for (d, s), (X, _y) in data.items():
        got = fs.read(d, s)
        assert got.dtype == X.dtype and np.array_equal(got, X)
    md = fs.metadata
    assert set(md.columns) >= {
        "device",
        "space",
        "row",
        "label",
        "class_name",
        "group",
        "sample_id",
    }
    sub = md[(md.device == "a") & (md.space == "s")]
    assert np.array_equal(sub["row"], np.arange(50))
    assert np.array_equal(sub["label"], data[("a", "s")][1])
    assert list(sub["sample_id"][:2]) == ["a/0", "a/1"]
    rows = np.array([7, 3, 3, 49, 0])
    assert np.array_equal(fs.read("a", "s", rows), data[("a", "s")][0][rows])
    assert np.array_equal(
        fs.read("a", "s", slice(5, 9), cols=slice(2, 4)), data[("a", "s")][0][5:9, 2:4]
    )


def test_fingerprint_is_a_content_hash(tmp_path, data):
    f1 = _write(tmp_path / "s1", data, chunk_rows=8).fingerprint
    f2 = _write(tmp_path / "s2", data, chunk_rows=16).fingerprint  # layout does not matter
    assert f1 == f2
    changed = dict(data)
    X, y = changed[("b", "s")]
    X = X.copy()
    X[3, 4] += 1e-3
    changed[("b", "s")] = (X, y)
    assert _write(tmp_path / "s3", changed).fingerprint != f1
    relabel = dict(data)
    relabel[("b", "s")] = (data[("b", "s")][0], (data[("b", "s")][1] + 1) % 3)
    assert _write(tmp_path / "s4", relabel).fingerprint != f1


def test_chunks_are_row_tiles_of_at_least_1mb():
    assert choose_chunks(734, 64_896, 4) == (256, 4056)  # 4056 divides 64,896
    rows, cols = choose_chunks(279, 43_264, 4)
    assert rows * cols * 4 >= MIN_CHUNK_BYTES and cols * 11 >= 43_264
    rows, cols = choose_chunks(100_000, 800, 4)
    assert cols == 800 and rows * cols * 4 >= MIN_CHUNK_BYTES
    assert choose_chunks(10, 5, 8) == (10, 5)  # clipped to small arrays
    with pytest.raises(ValueError, match="at least one row"):
        choose_chunks(0, 5, 4)


def test_failed_write_leaves_nothing(tmp_path):
    path = tmp_path / "st"
    with pytest.raises(RuntimeError, match="boom"), StoreWriter(path) as w:
        a = w.create_array("a", "s", 10, 4)
        a.append(np.ones((5, 4), np.float32))
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    # incomplete array: refused at commit, nothing left
    with pytest.raises(ValueError, match="5 rows written"), StoreWriter(path) as w:
        w.create_array("a", "s", 10, 4).append(np.ones((5, 4), np.float32))
    assert list(tmp_path.iterdir()) == []


def test_overwrite_only_replaces_on_success(tmp_path, data):
    path = tmp_path / "st"
    fs = _write(path, data)
    with pytest.raises(ValueError, match="already exists"):
        StoreWriter(path)
    with pytest.raises(ValueError, match="NaN"), StoreWriter(path, overwrite=True) as w:
        w.create_array("a", "s", 2, 2).append(np.array([[1, np.nan], [0, 0]], np.float32))
    assert FeatureStore.open(path).fingerprint == fs.fingerprint  # old store intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["st"]


def test_nan_and_inf_rows_are_named(tmp_path):
    X = np.zeros((40, 3), np.float32)
    X[[4, 17]] = np.nan
    X[30, 1] = np.inf
    with (
        pytest.raises(ValueError, match=r"3 sample\(s\).*rows 4, 17, 30"),
        StoreWriter(tmp_path / "st") as w,
    ):
        a = w.create_array("a", "s", 40, 3, source="feats.npy")
        for r0 in range(0, 40, 16):
            a.append(X[r0 : r0 + 16])
    assert not (tmp_path / "st").exists()


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_corrupted_chunk_is_detected_and_located(tmp_path, damage):
    X = np.arange(64 * 10, dtype=np.float32).reshape(64, 10)
    with StoreWriter(tmp_path / "st") as w:
        w.create_array("a", "s", 64, 10, chunk_rows=16).append(X)
    fs = FeatureStore.open(tmp_path / "st")
    assert fs.verify() == []
    chunk = tmp_path / "st" / "features" / "a" / "s" / "c" / "2" / "0"
    raw = bytearray(chunk.read_bytes())
    if damage == "flip":
        raw[11] ^= 0x40
        chunk.write_bytes(bytes(raw))
    elif damage == "truncate":
        chunk.write_bytes(bytes(raw[:-9]))
    else:
        chunk.unlink()
    assert np.array_equal(fs.read("a", "s", slice(0, 32)), X[:32])  # other chunks fine
    with pytest.raises(CorruptChunkError, match=r"\(2, 0\)") as err:
        fs.read("a", "s")
    assert err.value.chunks == [(2, 0)]
    with pytest.raises(CorruptChunkError):
        fs.read("a", "s", [40])
    problems = fs.verify()
    assert len(problems) == 1 and "(2, 0)" in problems[0]


def test_consistency_and_names(tmp_path):
    with pytest.raises(ValueError, match="one dimension"), StoreWriter(tmp_path / "x") as w:
        w.create_array("a", "s", 2, 3).append(np.ones((2, 3)))
        w.create_array("b", "s", 2, 4).append(np.ones((2, 4)))
    with pytest.raises(ValueError, match="same samples"), StoreWriter(tmp_path / "y") as w:
        w.create_array("a", "s", 2, 3).append(np.ones((2, 3)))
        w.create_array("a", "t", 3, 3).append(np.ones((3, 3)))
    with pytest.raises(ValueError, match="name"), StoreWriter(tmp_path / "z") as w:
        w.create_array("a/b", "s", 2, 3)
    with pytest.raises(ValueError, match="given twice"), StoreWriter(tmp_path / "w") as w:
        w.create_array("a", "s", 2, 3)
        w.create_array("a", "s", 2, 3)
    assert list(tmp_path.iterdir()) == []


def test_open_errors(tmp_path, data):
    with pytest.raises(FileNotFoundError, match="mmdtl2 ingest"):
        FeatureStore.open(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a"):
        FeatureStore.open(tmp_path / "empty")
    fs = _write(tmp_path / "st", data)
    with pytest.raises(ValueError, match="unknown space"):
        fs.devices_in("zzz")
    with pytest.raises(ValueError, match="no features for device"):
        fs.read("b", "t")
    with pytest.raises(ValueError, match=r"rows must lie in \[0, 20\)"):
        fs.read("b", "s", [25])
    assert isinstance(fs.metadata, pd.DataFrame)
