"""The extraction's store filled while the shards run (:mod:`mmdtl2_dist.extract.store_fill`).

The streamed store must hold the same bytes as the store written after the shards, whatever
order the shards finish in; an error of its writer thread must be the job's error and
leave no store (the work folder keeps the finished shards for the next run).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("torchvision")

from mmdtl2_dist.extract.inputs import read_images  # noqa: E402
from mmdtl2_dist.extract.job import ExtractOptions, _plan, extract, work_folder  # noqa: E402
from mmdtl2_dist.extract.model import Extractor, ModelSpec, Preprocessing  # noqa: E402
from mmdtl2_dist.extract.shards import run_shard  # noqa: E402
from mmdtl2_dist.extract.store_fill import StoreAfter, StoreJob, StreamedStore  # noqa: E402
from mmdtl2_dist.extract.synthetic import ImageSetSpec, make_image_set  # noqa: E402
from mmdtl2_dist.store.array_writer import ArrayWriter  # noqa: E402
from mmdtl2_dist.store.feature_store import FeatureStore  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SMALL = Preprocessing(resize=64, crop=64)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("img") / "images"
    make_image_set(folder, ImageSetSpec(n_source=3, n_target=2, n_classes=2, size=40))
    return folder


def store_bytes(path: Path) -> dict[str, bytes]:
    """Every file of a store; the root ``zarr.json`` without its creation time."""
    files = {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    root = json.loads(files.pop("zarr.json"))
    for attrs in root.get("attributes", {}).values():
        attrs.pop("created", None)
    files["zarr.json"] = json.dumps(root, sort_keys=True).encode()
    return files


def assert_same_store(a: Path, b: Path) -> None:
    fa, fb = FeatureStore.open(a), FeatureStore.open(b)
    assert fa.fingerprint == fb.fingerprint
    for device in fa.devices:
        for space in fa.spaces:
            np.testing.assert_array_equal(fa.read(device, space), fb.read(device, space))
    assert store_bytes(a) == store_bytes(b)


def test_streamed_store_equals_the_store_written_after_whatever_the_finishing_order(
    images, tmp_path
):
    """Shards handed over out of order (the last first) are appended in shard order; one
    finished by an earlier run goes first. The bytes equal the store written after."""
    table, spec = read_images(images), ModelSpec.parse("alexnet:conv3,conv5")
    ex = Extractor(spec, "random:0", SMALL)
    shards = _plan(table, 2, tmp_path / "shards")
    (tmp_path / "shards").mkdir()
    for s in shards:
        run_shard(ex, {**s, "batch_size": 2, "skip_bad": False})
    spaces = {"conv3": "conv3", "conv5": "conv5"}
    after = StoreJob(tmp_path / "after.zarr", table, shards, spaces, ex, SMALL)
    with StoreAfter(after) as fill:
        fill.finish()
    streamed = StoreJob(tmp_path / "streamed.zarr", table, shards, spaces, ex, SMALL)
    with StreamedStore(streamed, finished=[1]) as fill:
        for index in reversed([s["index"] for s in shards if s["index"] != 1]):
            fill.shard_done(index)
        fs = fill.finish()
    assert len(shards) == 5 and fs.shape("scope_a", "conv3") == (6, 384 * 3 * 3)
    assert fill.seconds >= fill.after_workers_seconds > 0
    assert_same_store(tmp_path / "after.zarr", tmp_path / "streamed.zarr")
    assert not list(tmp_path.glob(".streamed.zarr.*"))


@pytest.mark.ray
def test_extract_streamed_equals_extract_with_skip_bad_bit_for_bit(ray_local, images, tmp_path):
    """The same images through the whole job: streamed (no --skip-bad, 2 workers) and
    written after the shards (--skip-bad, no image is bad)."""
    spec, table = ModelSpec.parse("alexnet:conv3"), read_images(images)
    runs = {}
    for skip_bad in (False, True):
        out = tmp_path / f"s{int(skip_bad)}.zarr"
        opts = ExtractOptions(
            batch_size=2, shard_rows=2, workers=2, skip_bad=skip_bad, progress=False
        )
        runs[skip_bad] = extract(out, table, spec, "random:0", SMALL, opts)
        assert not (out / "skipped_images.csv").exists()
    assert_same_store(tmp_path / "s0.zarr", tmp_path / "s1.zarr")
    for fs in runs.values():
        assert fs.last_run["store_seconds"] >= fs.last_run["store_after_workers_seconds"] > 0
    assert runs[False].provenance == runs[True].provenance


@pytest.mark.ray
def test_an_error_of_the_writer_thread_is_the_jobs_and_leaves_no_store(
    ray_local, images, tmp_path, monkeypatch
):
    """A write that fails (a full disk) while the shards run: the job raises that error,
    no store and no staged store are left, the finished shards are kept, and the same
    call afterwards resumes them and writes the store."""
    append, calls = ArrayWriter.append, []

    def full_disk(self, block):
        calls.append(block.shape[0])
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return append(self, block)

    monkeypatch.setattr(ArrayWriter, "append", full_disk)
    out, table, spec = tmp_path / "e.zarr", read_images(images), ModelSpec.parse("alexnet:conv3")
    opts = ExtractOptions(batch_size=1, shard_rows=1, workers=1, progress=False)
    with pytest.raises(OSError, match="No space left on device"):
        extract(out, table, spec, "random:0", SMALL, opts)
    assert not out.exists() and not list(tmp_path.glob(".e.zarr.*"))
    kept = list((work_folder(out) / "shards").glob("*.npz"))
    assert len(kept) >= 2
    monkeypatch.setattr(ArrayWriter, "append", append)
    fs = extract(out, table, spec, "random:0", SMALL, opts)
    assert fs.last_run["resumed"] == len(kept) and fs.last_run["computed"] == 10 - len(kept)
    assert fs.shape("scope_a", "conv3") == (6, 384 * 3 * 3) and not work_folder(out).exists()


#: Start a command with SIGINT's default action, as a terminal does (a suite launched in
#: the background ignores SIGINT, and an ignored signal stays ignored across exec).
SIGINT_DEFAULT_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


@pytest.mark.ray
def test_ctrl_c_while_the_store_fills_discards_it_and_keeps_the_shards(images, tmp_path):
    """Ctrl-C (a real SIGINT) of a real extract while its store is being filled: the run
    itself discards the staged store (nothing is left for the next run to clean up) and
    keeps its finished shards."""
    out, shards = tmp_path / "c.zarr", work_folder(tmp_path / "c.zarr") / "shards"
    cmd = [sys.executable, "-c", SIGINT_DEFAULT_EXEC, sys.executable, "-m", "mmdtl2_dist.cli",
           "extract", str(images), str(out), "--model", "alexnet:conv3", "--weights",
           "random:0", "--shard-size", "1", "--batch-size", "1", "--workers", "1",
           "--no-progress"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list(shards.glob("*.npz"))) >= 3 and list(tmp_path.glob(".c.zarr.tmp-*")):
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, err.decode()
    assert not out.exists() and not list(tmp_path.glob(".c.zarr.*")), err.decode()
    assert len(list(shards.glob("*.npz"))) >= 3
