"""Feature store: layout, atomic writes, checksums, reads, fingerprints."""

from __future__ import annotations

import json

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


def _craft(path, edit_entries=None, edit_table=None):
    """Rewrite a written store's array list and/or metadata table in place."""
    import zarr

    from mmdtl2_dist.store.layout import METADATA_FILE, ROOT_ATTR

    root = zarr.open_group(str(path), mode="r+")
    attrs = dict(root.attrs[ROOT_ATTR])
    if edit_entries:
        attrs["arrays"] = [dict(a) for a in attrs["arrays"]]
        edit_entries(attrs["arrays"])
        root.attrs[ROOT_ATTR] = attrs
    if edit_table:
        table = pd.read_parquet(path / METADATA_FILE)
        edit_table(table).to_parquet(path / METADATA_FILE, index=False)


def test_crafted_store_is_refused_on_open(tmp_path, data):
    """Names, paths, shapes, dtypes and row counts read from a store are checked on open."""
    import shutil

    secret = np.full((20, 30), 7.0, np.float32)  # an array outside the store
    _write(tmp_path / "outside", {("x", "s"): (secret, None)})
    _write(tmp_path / "st", data)

    def rename_b(entries):
        next(a for a in entries if a["device"] == "b")["device"] = "../../outside/features/x"

    def rename_table(table):
        table.loc[table["device"] == "b", "device"] = "../../outside/features/x"
        return table

    cases = {
        "traversal": (rename_b, rename_table, r"device name '\.\./\.\./outside"),
        "shape": (lambda e: e[0].update(n_rows=40), None, r"a/s has shape \(50, 30\)"),
        "dtype": (lambda e: e[0].update(dtype="int64"), None, "holds float32"),
        "rows": (None, lambda t: t.iloc[1:], "49 rows for a/s"),
        "extra": (
            None,
            lambda t: pd.concat([t, t.head(1).assign(device="z")]),
            r"arrays the store lacks: \[\('z', 's'\)\]",
        ),
    }
    for name, (entries, table, message) in cases.items():
        shutil.copytree(tmp_path / "st", tmp_path / name)
        _craft(tmp_path / name, entries, table)
        with pytest.raises(ValueError, match="not a valid feature store.*" + message):
            FeatureStore.open(tmp_path / name)

    # An array directory swapped for a link to data outside the store.
    shutil.copytree(tmp_path / "st", tmp_path / "link")
    shutil.rmtree(tmp_path / "link" / "features" / "b" / "s")
    (tmp_path / "link" / "features" / "b" / "s").symlink_to(tmp_path / "outside/features/x/s")
    with pytest.raises(ValueError, match="b/s resolves outside the store"):
        FeatureStore.open(tmp_path / "link")
    assert FeatureStore.open(tmp_path / "st").devices == ["a", "b"]


def test_json_written_atomically_keeps_the_old_file_when_the_new_one_fails(tmp_path):
    """The study state, trial results, split files and Gram markers go through one writer:
    a failed write leaves the old file and nothing beside it."""
    from mmdtl2_dist.store.atomic import write_json_atomic

    path = tmp_path / "study.json"
    write_json_atomic(path, {"a": 1}, indent=1)
    assert json.loads(path.read_text()) == {"a": 1} and path.read_text().startswith("{\n")
    with pytest.raises(TypeError, match="not JSON serializable"):
        write_json_atomic(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["study.json"]
