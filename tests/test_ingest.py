"""Ingest: exact round trips of every supported format, clear errors on bad files."""

from __future__ import annotations

import argparse

import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.io

from mmdtl2_dist.cli import main
from mmdtl2_dist.commands import ingest as ingest_cmd
from mmdtl2_dist.store import FeatureStore, IngestInput, ingest
from mmdtl2_dist.store import feature_store as fs_module

N, L = 23, 9


@pytest.fixture(params=[np.float32, np.float64], ids=["f32", "f64"])
def sample(request):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((N, L)).astype(request.param) * 1e3  # full-precision values
    y = rng.integers(1, 4, N)
    groups = np.array([f"p{i % 5}" for i in range(N)])
    ids = np.array([f"img_{i:03d}" for i in range(N)])
    return X, y, groups, ids


def _check(store, X, y=None, groups=None, ids=None, device="a", space="s"):
    fs = FeatureStore.open(store)
    got = fs.read(device, space)
    assert got.dtype == X.dtype, (got.dtype, X.dtype)
    assert np.array_equal(got, X)  # bit-exact
    md = fs.metadata[(fs.metadata.device == device) & (fs.metadata.space == space)]
    if y is not None:
        assert np.array_equal(md["label"].to_numpy(), y)
    if groups is not None:
        assert list(md["group"]) == list(groups)
    if ids is not None:
        assert list(md["sample_id"]) == list(ids)
    return fs


def test_npy_with_side_table(tmp_path, sample):
    X, y, groups, ids = sample
    np.save(tmp_path / "x.npy", X)
    pd.DataFrame({"label": y, "group": groups, "sample_id": ids}).to_csv(
        tmp_path / "m.csv", index=False
    )
    ingest(
        tmp_path / "st",
        [IngestInput("a", "s", str(tmp_path / "x.npy"), metadata_path=str(tmp_path / "m.csv"))],
    )
    _check(tmp_path / "st", X, y, groups, ids)


def test_npz_with_keys_and_class_table(tmp_path, sample):
    X, y, groups, ids = sample
    np.savez(
        tmp_path / "x.npz",
        feats=X,
        labels=y,
        groups=groups,
        ids=ids,
        class_names=np.array(["adenoma", "hyperplastic", "cancer"]),
    )
    fs = ingest(tmp_path / "st", [IngestInput("a", "s", str(tmp_path / "x.npz"))], progress=False)
    _check(tmp_path / "st", X, y, groups, ids)
    names = fs.metadata["class_name"].to_numpy()
    assert set(names[y == 1]) == {"adenoma"} and set(names[y == 3]) == {"cancer"}


def test_mat_v5(tmp_path, sample):
    X, y, groups, _ = sample
    scipy.io.savemat(
        tmp_path / "x.mat", {"fts": X, "labels": y[:, None].astype(float), "groups": groups}
    )
    ingest(tmp_path / "st", [IngestInput("a", "s", str(tmp_path / "x.mat"))])
    _check(tmp_path / "st", X, y, groups)


def _write_mat73(path, variables: dict):
    """Write like MATLAB -v7.3: HDF5 with a 512-byte user block, column-major datasets."""
    with h5py.File(path, "w", userblock_size=512) as f:
        for name, value in variables.items():
            value = np.asarray(value)
            if value.dtype.kind == "U":  # char matrix: uint16 codes, one column per string
                width = max(len(s) for s in value)
                codes = np.array([[ord(c) for c in s.ljust(width)] for s in value], np.uint16)
                d = f.create_dataset(name, data=codes.T)
                d.attrs["MATLAB_class"] = np.bytes_("char")
            else:
                value = value.reshape(value.shape[0], -1)
                d = f.create_dataset(name, data=value.T)
                d.attrs["MATLAB_class"] = np.bytes_(
                    "single" if value.dtype == np.float32 else "double"
                )


def test_mat_v73_hdf5(tmp_path, sample):
    X, y, _, _ = sample
    names = np.array([f"c{k}" for k in y])
    _write_mat73(tmp_path / "x.mat", {"X": X, "y": y.astype(float), "class_name": names})
    assert h5py.is_hdf5(tmp_path / "x.mat")
    fs = ingest(tmp_path / "st", [IngestInput("a", "s", str(tmp_path / "x.mat"))])
    _check(tmp_path / "st", X, y)
    assert list(fs.metadata["class_name"]) == list(names)


def test_csv_and_parquet_tables(tmp_path, sample):
    X, y, groups, ids = sample
    table = pd.DataFrame(X, columns=[f"f{j}" for j in range(L)])
    table.insert(0, "label", y)
    table["group"] = groups
    table["sample_id"] = ids
    table.to_csv(tmp_path / "x.csv", index=False)
    table.to_parquet(tmp_path / "x.parquet", index=False)
    listed = pd.DataFrame({"emb": list(X), "label": y})
    listed.to_parquet(tmp_path / "l.parquet", index=False)
    # CSV text has no dtype: float32 data round-trips exactly when stored as float32.
    ingest(tmp_path / "csv", [IngestInput("a", "s", str(tmp_path / "x.csv"))], dtype=X.dtype.name)
    _check(tmp_path / "csv", X, y, groups, ids, device="a")
    ingest(
        tmp_path / "st",
        [
            IngestInput("b", "s", str(tmp_path / "x.parquet")),
            IngestInput("c", "s", str(tmp_path / "l.parquet")),
        ],
    )
    _check(tmp_path / "st", X, y, groups, ids, device="b")
    _check(tmp_path / "st", X, y, device="c")


def test_headerless_csv_keeps_every_row(tmp_path, capsys):
    (tmp_path / "f.csv").write_text("0.1,0.2\n0.3,0.4\n")
    args = ["ingest", str(tmp_path / "s.zarr"), "-i", f"a:conv3:{tmp_path / 'f.csv'}", "-q"]
    assert main(args) == 0
    got = FeatureStore.open(tmp_path / "s.zarr").read("a", "conv3")
    np.testing.assert_array_equal(got, [[0.1, 0.2], [0.3, 0.4]])
    # numbers with a gap are still a sample (refused for its NaN, never dropped)
    (tmp_path / "g.csv").write_text("0.1,,0.2\n0.3,1,0.4\n")
    with pytest.raises(ValueError, match=r"1 sample\(s\).*rows 0 "):
        ingest(tmp_path / "g", [IngestInput("a", "s", str(tmp_path / "g.csv"))])
    # a header of names is still a header
    X = np.random.default_rng(0).standard_normal((5, 3))
    pd.DataFrame(X, columns=["f0", "f1", "1.5e3x"]).to_csv(tmp_path / "h.csv", index=False)
    ingest(tmp_path / "h", [IngestInput("a", "s", str(tmp_path / "h.csv"))])
    _check(tmp_path / "h", X)


def test_csv_first_row_0_to_L_minus_1_needs_a_choice(tmp_path, capsys):
    X = np.random.default_rng(0).standard_normal((5, 3))
    pd.DataFrame(X).to_csv(tmp_path / "p.csv", index=False)  # header "0,1,2"
    args = ["ingest", str(tmp_path / "s.zarr"), "-i", f"a:s:{tmp_path / 'p.csv'}", "-q"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "the first row 0,1,2 may be column names" in err and "--no-header" in err
    assert not (tmp_path / "s.zarr").exists()
    assert main([*args, "--header"]) == 0
    _check(tmp_path / "s.zarr", X)
    assert main([*args[:1], str(tmp_path / "n.zarr"), *args[2:], "--no-header"]) == 0
    got = FeatureStore.open(tmp_path / "n.zarr").read("a", "s")
    np.testing.assert_array_equal(got, np.vstack([[0, 1, 2], X]))


@pytest.mark.parametrize(
    ("to_csv", "match"),
    [
        ({}, "the first column has no name in the header row (its values are 0..n-1)"),
        ({"header": False}, "the first column holds 0, 1, ..., n-1 in a file without a header"),
    ],
    ids=["named-columns", "no-header"],
)
def test_csv_row_index_of_pandas_is_never_a_feature(tmp_path, capsys, sample, to_csv, match):
    X, y, _, _ = sample
    table = pd.DataFrame(X, columns=[f"f{j}" for j in range(L)])
    table.to_csv(tmp_path / "x.csv", **to_csv)  # pandas' default index=True
    args = ["ingest", str(tmp_path / "s.zarr"), "-i", f"a:s:{tmp_path / 'x.csv'}", "-q"]
    assert main([*args, "--dtype", X.dtype.name]) == 2
    err = capsys.readouterr().err
    assert match in err and "df.to_csv(path, index=False)" in err and "--index" in err
    assert not (tmp_path / "s.zarr").exists()
    assert main([*args, "--dtype", X.dtype.name, "--index"]) == 0
    _check(tmp_path / "s.zarr", X)
    kept = ["ingest", str(tmp_path / "k.zarr"), *args[2:], "--no-index"]
    assert main([*kept, "--dtype", X.dtype.name]) == 0
    got = FeatureStore.open(tmp_path / "k.zarr").read("a", "s")
    np.testing.assert_array_equal(got, np.hstack([np.arange(N)[:, None], X]).astype(X.dtype))


def test_csv_of_unnamed_columns_with_pandas_index_is_refused(tmp_path, capsys):
    X = np.random.default_rng(0).standard_normal((5, 3))
    pd.DataFrame(X).to_csv(tmp_path / "p.csv")  # header ",0,1,2", then "0,x,x,x", ...
    args = ["ingest", str(tmp_path / "s.zarr"), "-i", f"a:s:{tmp_path / 'p.csv'}", "-q"]
    assert main(args) == 2
    assert "the first column has no name in the header row" in capsys.readouterr().err
    assert main([*args, "--index"]) == 0
    _check(tmp_path / "s.zarr", X)


def test_csv_row_index_used_as_sample_ids_is_metadata(tmp_path, sample):
    X, y, _, _ = sample
    pd.DataFrame(X).assign(label=y).to_csv(tmp_path / "x.csv")
    keys = {"sample_id": "Unnamed: 0"}
    inp = IngestInput("a", "s", str(tmp_path / "x.csv"), keys=keys)
    fs = ingest(tmp_path / "st", [inp], dtype=X.dtype.name)
    _check(tmp_path / "st", X, y)
    assert list(fs.metadata["sample_id"].astype(int)) == list(range(N))


def test_parquet_pandas_index_is_not_a_feature(tmp_path, sample):
    X, y, _, _ = sample
    order = np.random.default_rng(2).permutation(N)  # a shuffled index is stored as a column
    table = pd.DataFrame(X, columns=[f"f{j}" for j in range(L)]).assign(label=y).iloc[order]
    table.to_parquet(tmp_path / "x.parquet")
    ingest(tmp_path / "st", [IngestInput("a", "s", str(tmp_path / "x.parquet"))])
    _check(tmp_path / "st", X[order], y[order])


def test_integer_features_become_exact_float64_and_transpose(tmp_path):
    X = np.arange(N * L, dtype=np.int32).reshape(N, L)
    np.save(tmp_path / "t.npy", X.T)
    ingest(tmp_path / "st", [IngestInput("a", "s", str(tmp_path / "t.npy"), transpose=True)])
    _check(tmp_path / "st", X.astype(np.float64))


@pytest.mark.parametrize(
    ("name", "content", "kwargs", "match"),
    [
        ("x.txt", b"1,2", {}, "unsupported format"),
        ("x.npy", b"not a numpy file", {}, "cannot read it as .npy"),
        ("v.npy", np.arange(5.0), {}, "expected a 2-D array"),
        ("x.npz", {"a": np.ones((4, 3)), "b": np.ones((4, 2))}, {}, "cannot tell which"),
        (
            "y.npz",
            {"a": np.ones((4, 3))},
            {"features_key": "zz"},
            "no variable 'zz'; it has \\['a'\\]. --features-key applies to every input",
        ),
        ("z.npz", {"X": np.ones((4, 3)), "labels": np.ones(5)}, {}, "label has 5 entries"),
        ("s.csv", "f0,f1,kind\n1,2,x\n3,4,y\n", {}, "non-numeric feature column"),
        ("e.csv", "f0,f1\n", {}, "no samples"),
        (
            "l.npz",
            {"X": np.ones((4, 3)), "labels": np.array([0.5, 1, 2, 3])},
            {},
            "labels must be integers",
        ),
    ],
)
def test_bad_files_give_clear_errors(tmp_path, name, content, kwargs, match):
    path = tmp_path / name
    if isinstance(content, dict):
        np.savez(path, **content)
    elif isinstance(content, np.ndarray):
        np.save(path, content)
    else:
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    with pytest.raises(ValueError, match=match):
        ingest(tmp_path / "st", [IngestInput("a", "s", str(path), **kwargs)])
    assert not (tmp_path / "st").exists()


def test_missing_file_and_nan_rows(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ingest(tmp_path / "st", [IngestInput("a", "s", str(tmp_path / "none.npy"))])
    good = np.ones((6, 3), np.float32)
    bad = np.ones((300, 3), np.float32)
    bad[[2, 257]] = np.nan
    np.save(tmp_path / "good.npy", good)
    np.save(tmp_path / "bad.npy", bad)
    with pytest.raises(ValueError, match=r"bad\.npy: 2 sample.*rows 2, 257"):
        ingest(
            tmp_path / "st",
            [
                IngestInput("a", "s", str(tmp_path / "good.npy")),
                IngestInput("b", "s", str(tmp_path / "bad.npy")),
            ],
        )
    assert list(p.name for p in tmp_path.iterdir() if p.is_dir()) == []  # no half store


def test_cli_ingest_with_progress(tmp_path, sample, monkeypatch, capsys):
    X, y, _, _ = sample
    np.savez(tmp_path / "x.npz", X=X, y=y)
    np.save(tmp_path / "z.npy", X[:, :4])
    pd.DataFrame({"label": y}).to_parquet(tmp_path / "m.parquet")
    monkeypatch.setattr(fs_module, "PROGRESS_MIN_BYTES", 0)
    parser = argparse.ArgumentParser()
    ingest_cmd.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "ingest",
            str(tmp_path / "st"),
            "-i",
            f"a:s:{tmp_path / 'x.npz'}",
            "-i",
            f"a:t:{tmp_path / 'z.npy'}",
            "--metadata",
            f"a:{tmp_path / 'm.parquet'}",
            "--chunk-rows",
            "8",
            "--compression",
            "zstd",
            "--progress",  # stderr is not a terminal here
        ]
    )
    assert args.func(args) == 0
    out = capsys.readouterr()
    assert "ingest a/s:" in out.err and "fingerprint" in out.out
    fs = _check(tmp_path / "st", X, y)
    assert fs.array("a", "s").chunks[0] == 8
    with pytest.raises(ValueError, match="DEVICE:SPACE:PATH"):
        args = parser.parse_args(["ingest", str(tmp_path / "st2"), "-i", "a:x.npy"])
        args.func(args)


@pytest.mark.parametrize("column", ["Label", "class", "target"])
def test_a_label_column_under_another_name_is_refused_not_ingested_as_a_feature(
    tmp_path, capsys, sample, column
):
    """Labels in a column not named label/labels/y would become one more feature and every
    sample unlabelled, found only when a study has no labelled sample: refused, naming
    the column and --labels-key; with it, the labels are read. The CLI prints per device
    how many samples are labelled, and names a device without any."""
    X, y, _, _ = sample
    table = pd.DataFrame(X, columns=[f"f{j}" for j in range(L)])
    table[column] = y
    table.to_csv(tmp_path / "x.csv", index=False)
    table.drop(columns=column).to_csv(tmp_path / "u.csv", index=False)
    rc = main(["ingest", str(tmp_path / "st"), "-i", f"a:s:{tmp_path / 'x.csv'}"])
    err = capsys.readouterr().err
    assert rc == 2 and f"column {column!r} looks like the labels" in err
    assert f"--labels-key {column!r}" in err and not (tmp_path / "st").exists()
    args = ["ingest", str(tmp_path / "st"), "-i", f"a:s:{tmp_path / 'x.csv'}"]
    assert main([*args, "--labels-key", column, "--dtype", X.dtype.name]) == 0
    _check(tmp_path / "st", X, y)
    assert f"a: {N} samples, {N} labelled (3 classes)" in capsys.readouterr().out
    assert main(["ingest", str(tmp_path / "u"), "-i", f"b:s:{tmp_path / 'u.csv'}"]) == 0
    assert f"b: {N} samples, 0 labelled (0 classes); no label column" in capsys.readouterr().out


def test_label_like_feature_names_are_fine_with_labels_from_a_side_table(tmp_path, capsys):
    """A feature column named like labels is refused only when no labels come from
    anywhere: with a side table holding them it is a feature. A device ingested in two
    spaces is counted once. A --labels-key missing from the side table is named."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((12, 3))
    pd.DataFrame(X, columns=["f0", "Target", "f2"]).to_csv(tmp_path / "x.csv", index=False)
    pd.DataFrame({"label": np.arange(12) % 3}).to_csv(tmp_path / "m.csv", index=False)
    np.save(tmp_path / "z.npy", X[:, :2])
    args = ["ingest", str(tmp_path / "st"), "-i", f"a:s:{tmp_path / 'x.csv'}"]
    args += ["-i", f"a:t:{tmp_path / 'z.npy'}", "--metadata", f"a:{tmp_path / 'm.csv'}"]
    assert main(args) == 0
    assert "a: 12 samples, 12 labelled (3 classes)" in capsys.readouterr().out
    assert FeatureStore.open(tmp_path / "st").shape("a", "s") == (12, 3)
    bad = ["ingest", str(tmp_path / "st2"), "-i", f"a:s:{tmp_path / 'x.csv'}"]
    assert main([*bad, "--metadata", f"a:{tmp_path / 'm.csv'}", "--labels-key", "y2"]) == 2
    assert "no column 'y2' for label" in capsys.readouterr().err
