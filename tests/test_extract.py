"""`mmdtl2 extract`: images -> CNN features -> feature store, on a real local Ray.

Weights are seeded random initialisations (no network here); the reference is a plain
single-process torch loop written independently of the product (torchvision's AlexNet
``features`` Sequential and the standard ImageNet transform).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from mmdtl2_dist.cli import main  # noqa: E402
from mmdtl2_dist.extract.inputs import read_images  # noqa: E402
from mmdtl2_dist.extract.job import ExtractOptions, extract, work_folder  # noqa: E402
from mmdtl2_dist.extract.model import Extractor, ModelSpec, Preprocessing  # noqa: E402
from mmdtl2_dist.extract.synthetic import ImageSetSpec, make_image_set  # noqa: E402
from mmdtl2_dist.store.feature_store import FeatureStore  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: AlexNet's ``features`` Sequential: conv3 is the output of its 8th module (ReLU after
#: the third convolution), conv5 of its 12th.
CUT = {"conv3": 8, "conv5": 12}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("img") / "images"
    make_image_set(folder, ImageSetSpec(n_source=3, n_target=2, n_classes=2, size=40))
    return folder


def plain_torch_features(paths, layer: str, seed: int = 0) -> np.ndarray:
    """The reference: one process, one thread, one image at a time."""
    from PIL import Image
    from torchvision import models
    from torchvision import transforms as T

    torch.set_num_threads(1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = models.alexnet(weights=None).eval()
    cut = net.features[: CUT[layer]]
    tf = T.Compose(
        [
            T.Resize(256),
            T.CenterCrop(224),
            T.ToTensor(),
            T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    rows = []
    with torch.no_grad():
        for p in paths:
            x = tf(Image.open(p).convert("RGB"))[None]
            rows.append(cut(x).reshape(1, -1).numpy())
    return np.concatenate(rows)


def store_paths(fs: FeatureStore, device: str, images_root: Path) -> list[Path]:
    meta = fs.metadata
    ids = meta[(meta.device == device) & (meta.space == fs.spaces[0])].sort_values("row")
    return [images_root / s for s in ids["sample_id"]]


def test_alexnet_conv3_conv5_widths_on_224():
    ex = Extractor(ModelSpec.parse("alexnet:conv3,conv5"), "random:0", Preprocessing())
    assert ex.dims == {"conv3": 64896, "conv5": 43264}
    from PIL import Image

    feats = ex.features([Image.new("RGB", (300, 260), (90, 20, 200))] * 2)
    assert feats["conv3"].shape == (2, 64896) and feats["conv3"].dtype == np.float32
    assert feats["conv5"].shape == (2, 43264)


def test_resnet_avgpool_and_unknown_layer():
    ex = Extractor(ModelSpec.parse("resnet18:avgpool"), "random:1", Preprocessing(64, 56))
    assert ex.dims == {"avgpool": 512}
    with pytest.raises(ValueError, match="alexnet has no layer 'conv9'; use one of"):
        Extractor(ModelSpec.parse("alexnet:conv9"), "random:0", Preprocessing())


def test_weights_file_identity_and_bad_file(tmp_path):
    from torchvision import models

    torch.manual_seed(3)
    path = tmp_path / "alexnet.pt"
    torch.save(models.alexnet(weights=None).state_dict(), path)
    a = Extractor(ModelSpec.parse("alexnet:conv5"), str(path), Preprocessing())
    assert a.identity.name == "file:alexnet.pt" and a.identity.meaningful
    b = Extractor(ModelSpec.parse("alexnet:conv5"), "random:3", Preprocessing())
    assert a.identity.sha256 == b.identity.sha256 and not b.identity.meaningful
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="cannot read it as a state dict of tensors") as e:
        Extractor(ModelSpec.parse("alexnet:conv5"), str(junk), Preprocessing())
    assert "\n" not in str(e.value)  # torch's several lines: only its first
    other = tmp_path / "resnet18.pt"  # another model's weights: one line, not torch's list
    torch.save(models.resnet18(weights=None).state_dict(), other)
    with pytest.raises(ValueError, match=r"not a state dict of alexnet \(16 of its tensors "):
        Extractor(ModelSpec.parse("alexnet:conv5"), str(other), Preprocessing())
    shapes = models.alexnet(weights=None, num_classes=7).state_dict()  # same names
    torch.save(shapes, other)
    with pytest.raises(ValueError, match=r"0 unknown, 2 of another shape; first: 'classifier"):
        Extractor(ModelSpec.parse("alexnet:conv5"), str(other), Preprocessing())


@pytest.mark.ray
def test_ray_extraction_equals_plain_torch_loop_bit_for_bit(ray_local, images, tmp_path):
    out = tmp_path / "s.zarr"
    opts = ExtractOptions(batch_size=2, shard_rows=3, workers=2, progress=False)
    fs = extract(
        out, read_images(images), ModelSpec.parse("alexnet:conv3,conv5"), "random:0", options=opts
    )
    assert fs.devices == ["scope_a", "scope_b"] and fs.spaces == ["conv3", "conv5"]
    assert fs.shape("scope_a", "conv3") == (6, 64896)
    assert fs.shape("scope_b", "conv5") == (4, 43264)
    for device in fs.devices:
        paths = store_paths(fs, device, images)
        for layer in ("conv3", "conv5"):
            got = fs.read(device, layer)
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, plain_torch_features(paths, layer))
    meta = fs.metadata[fs.metadata.space == "conv3"]
    assert sorted(set(meta.class_name)) == ["class0", "class1"]
    assert (meta.label.to_numpy() == [int(c[-1]) for c in meta.class_name]).all()
    prov = fs.provenance["extraction"]
    assert prov["weights"]["name"] == "random:0" and not prov["weights"]["meaningful"]
    assert len(prov["weights"]["sha256"]) == 64
    assert prov["preprocessing"]["resize"] == 256 and prov["preprocessing"]["crop"] == 224
    assert prov["layers"]["conv3"] == {"node": "features.7", "space": "conv3", "n_features": 64896}
    assert not work_folder(out).exists()
    assert fs.last_run["computed"] == 4 and fs.last_run["resumed"] == 0


def _cli(*args) -> list[str]:
    return [sys.executable, "-m", "mmdtl2_dist.cli", "extract", *map(str, args)]


def settled_shards(shards: Path, quiet_s: float = 10.0, limit_s: float = 120.0) -> dict:
    """The finished shard files once none has appeared for ``quiet_s`` seconds.

    The killed driver's Ray worker can still finish the shard it was computing before Ray
    stops it (one shard takes a few seconds here), so the count is taken when it stands.
    """
    seen, since, deadline = None, time.monotonic(), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        now = {p.name: p.stat().st_mtime_ns for p in shards.glob("*.npz")}
        if now != seen:
            seen, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
        time.sleep(0.1)
    return seen


@pytest.mark.ray
def test_resume_after_sigkill_of_a_real_extract(images, tmp_path):
    out = tmp_path / "k.zarr"
    cmd = _cli(images, out, "--model", "alexnet:conv3", "--weights", "random:0")
    cmd += ["--shard-size", "1", "--batch-size", "1", "--workers", "1", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    shards = work_folder(out) / "shards"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list(shards.glob("*.npz"))) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    done = settled_shards(shards)
    assert len(done) >= 3 and not out.exists()
    # the store was being filled while the shards ran: staged, with its arrays, not in place
    (staged,) = tmp_path.glob(".k.zarr.tmp-*")
    assert (staged / "features" / "scope_a" / "conv3" / "zarr.json").is_file()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "removed 1 unfinished write(s) of" in res.stderr and not staged.exists()
    # random weights are said even without progress lines (stderr is a pipe here)
    assert "mmdtl2 extract: warning: weights random:0 are random" in res.stderr
    assert not list(tmp_path.glob(".k.zarr.*"))
    assert f"{10 - len(done)} computed, {len(done)} resumed" in res.stdout
    fs = FeatureStore.open(out)
    for device in fs.devices:
        paths = store_paths(fs, device, images)
        np.testing.assert_array_equal(
            fs.read(device, "conv3"), plain_torch_features(paths, "conv3")
        )
    assert not work_folder(out).exists()


def _manifest_with_bad_image(images: Path, tmp_path: Path) -> Path:
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"truncated")
    table = read_images(images).frame
    rows = table[["path", "device", "label", "group"]].copy()
    rows = pd.concat(
        [rows, pd.DataFrame([{"path": str(bad), "device": "scope_b", "label": "", "group": "v1"}])]
    )
    manifest = tmp_path / "manifest.csv"
    rows.to_csv(manifest, index=False)
    return manifest


@pytest.mark.ray
def test_bad_image_fails_naming_it_then_skip_bad_lists_it(ray_local, images, tmp_path, capsys):
    manifest = _manifest_with_bad_image(images, tmp_path)
    out = tmp_path / "b.zarr"
    args = [
        "extract",
        str(manifest),
        str(out),
        "--weights",
        "random:0",
        "--model",
        "alexnet:conv5",
        "--shard-size",
        "4",
        "--batch-size",
        "2",
        "--no-progress",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"cannot read the image {tmp_path / 'broken.png'}: " in err
    assert not out.exists()
    assert main([*args, "--skip-bad"]) == 0
    computed, resumed = re.search(
        r"(\d+) computed, (\d+) resumed", capsys.readouterr().out
    ).groups()
    assert int(computed) + int(resumed) == 4 and int(computed) >= 1
    fs = FeatureStore.open(out)
    assert fs.shape("scope_b", "conv5") == (4, 43264)
    skipped = pd.read_csv(out / "skipped_images.csv")
    assert skipped.path.tolist() == [str(tmp_path / "broken.png")]
    assert skipped.reason[0] and f"broken.png: {skipped.reason[0]}; replace or remove it" in err
    assert fs.provenance["extraction"]["n_skipped"] == 1
    assert set(fs.metadata.group[fs.metadata.device == "scope_b"]) == {""}
    # its own side file does not stop --overwrite (only a user's files do)
    assert main([*args, "--skip-bad", "--overwrite"]) == 0, capsys.readouterr().err
    assert (out / "skipped_images.csv").is_file()


def test_missing_image_fails_fast_naming_it(images, tmp_path, capsys):
    manifest = tmp_path / "m.csv"
    pd.DataFrame({"path": ["nope.png"], "device": ["a"], "label": [0]}).to_csv(manifest)
    assert main(["extract", str(manifest), str(tmp_path / "o.zarr"), "--weights", "random:0"]) == 2
    err = capsys.readouterr().err
    assert f"1 image(s) do not exist: {tmp_path / 'nope.png'}" in err and "--skip-bad" in err
    assert not (tmp_path / "o.zarr").exists() and not work_folder(tmp_path / "o.zarr").exists()


def test_unknown_weights_file_and_random_seed_are_refused(images, tmp_path, capsys):
    out = str(tmp_path / "o.zarr")
    assert main(["extract", str(images), out, "--weights", str(tmp_path / "w.pt")]) == 2
    assert "no such file; give imagenet, random:SEED or the path" in capsys.readouterr().err
    assert main(["extract", str(images), out, "--weights", "random:x"]) == 2
    assert "write random:SEED with an integer SEED" in capsys.readouterr().err


def test_unfinished_work_of_other_inputs_is_refused_not_mixed(images, tmp_path, capsys):
    """A work folder left by a killed run with other weights: refused before any work."""
    from mmdtl2_dist.extract.job import _job_spec, _open_work

    out = tmp_path / "w.zarr"
    table, spec = read_images(images), ModelSpec.parse("alexnet:conv3")
    old = Extractor(spec, "random:1", Preprocessing())
    job = _job_spec(table, spec, old, Preprocessing(), 256)
    os.close(_open_work(work_folder(out), job, table, False)[1])  # as a killed run leaves it
    assert main(["extract", str(images), str(out), "--weights", "random:0"]) == 2
    err = capsys.readouterr().err
    assert f"{work_folder(out)} holds an unfinished extraction of other inputs" in err
    assert "weights_sha256" in err and "--restart" in err
    assert (work_folder(out) / "job.json").exists() and not out.exists()


def test_a_second_run_while_one_works_changes_nothing(images, tmp_path, capsys):
    """Even with --restart, a run for a store another run is extracting touches none of its
    work: the lock is taken before the job file is read, written or discarded."""
    from mmdtl2_dist.extract.job import _job_spec, _open_work

    out, work = tmp_path / "r.zarr", work_folder(tmp_path / "r.zarr")
    table, spec = read_images(images), ModelSpec.parse("alexnet:conv3")
    job = _job_spec(table, spec, Extractor(spec, "random:1", Preprocessing()), Preprocessing(), 8)
    _, fd = _open_work(work, job, table, False)  # the running extraction holds the lock
    try:
        (work / "shards" / "000000.npz").write_bytes(b"a finished shard")
        before = (work / "job.json").read_bytes()
        argv = ["extract", str(images), str(out), "--weights", "random:0", "--restart"]
        assert main(argv) == 2
        assert "another `mmdtl2 extract` is writing this store" in capsys.readouterr().err
        assert (work / "job.json").read_bytes() == before
        assert (work / "shards" / "000000.npz").read_bytes() == b"a finished shard"
    finally:
        os.close(fd)


def test_work_folder_of_a_run_killed_before_its_job_file_is_taken_over(images, tmp_path):
    from mmdtl2_dist.extract.job import _job_spec, _open_work

    work = work_folder(tmp_path / "k.zarr")
    work.mkdir()
    (work / ".lock").touch()  # killed between taking the lock and writing job.json
    table, spec = read_images(images), ModelSpec.parse("alexnet:conv3")
    job = _job_spec(table, spec, Extractor(spec, "random:0", Preprocessing()), Preprocessing(), 8)
    resumed, fd = _open_work(work, job, table, False)
    os.close(fd)
    assert resumed is False and json.loads((work / "job.json").read_text())["shard_rows"] == 8


def test_output_path_holding_other_files_is_refused(images, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["extract", str(images), str(out), "--weights", "random:0"]) == 2
    assert "not a feature store written by this system" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "keep me" and not work_folder(out).exists()


@pytest.mark.ray
def test_gpus_on_a_cluster_without_gpus_is_refused(ray_local, images, tmp_path):
    opts = ExtractOptions(gpus=1, progress=False)
    with pytest.raises(ValueError, match=r"--gpus 1 asks for 1 GPU\(s\) but the Ray cluster has 0"):
        extract(tmp_path / "g.zarr", read_images(images), ModelSpec.parse("alexnet:conv5"),
                "random:0", options=opts)  # fmt: skip
    assert not (tmp_path / "g.zarr").exists()


def test_device_name_that_cannot_be_stored_fails_before_work(tmp_path, capsys):
    manifest = tmp_path / "m.csv"
    img = tmp_path / "a.png"
    from PIL import Image

    Image.new("RGB", (8, 8)).save(img)
    pd.DataFrame({"path": ["a.png"], "device": ["cam a/1"]}).to_csv(manifest, index=False)
    assert main(["extract", str(manifest), str(tmp_path / "o.zarr"), "--weights", "random:0"]) == 2
    assert "device name 'cam a/1' is not allowed" in capsys.readouterr().err
    assert not work_folder(tmp_path / "o.zarr").exists()


def test_manifest_groups_class_names_and_unlabelled_rows(tmp_path):
    (tmp_path / "v").mkdir()
    rows = [
        ("v/f1.png", "old", "polyp", "video1"),
        ("v/f2.png", "old", "normal", "video1"),
        ("v/f3.png", "new", "", "video2"),
        (str(tmp_path / "v" / "f4.png"), "new", "polyp", "video3"),
    ]
    frame = pd.DataFrame(rows, columns=["path", "device", "label", "group"])
    frame.to_parquet(tmp_path / "m.parquet")
    t = read_images(tmp_path / "m.parquet").frame
    assert t.device.tolist() == ["new", "new", "old", "old"]  # grouped by device, order kept
    assert t.path.tolist() == [
        str(tmp_path / "v" / f) for f in ("f3.png", "f4.png", "f1.png", "f2.png")
    ]
    assert t.label.tolist() == [-1, 1, 1, 0] and t.class_name.tolist() == [
        "",
        "polyp",
        "polyp",
        "normal",
    ]
    assert t.group.tolist() == ["video2", "video3", "video1", "video1"]
    assert t.sample_id.tolist()[2] == "v/f1.png"
    pd.DataFrame({"file": ["a.png"]}).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(
        ValueError, match=r"the manifest lacks the column\(s\) \['path', 'device'\]"
    ):
        read_images(tmp_path / "bad.csv")


BLOCK_TORCH = """
import sys


class BlockTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torchvision"):
            raise ImportError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, BlockTorch())
"""


def test_without_torch_extract_says_how_to_install_and_synth_images_works(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCK_TORCH)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO)])}

    def run(*args):
        cmd = [sys.executable, "-m", "mmdtl2_dist.cli", *map(str, args)]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)

    res = run("synth-images", tmp_path / "imgs", "--n-source", 1, "--n-target", 1)
    assert res.returncode == 0, res.stderr
    res = run("extract", tmp_path / "imgs", tmp_path / "s.zarr")
    assert res.returncode == 2
    assert "images need torch and torchvision" in res.stderr
    assert (
        "pip install -e '.[images]'" in res.stderr and "download.pytorch.org/whl/cpu" in res.stderr
    )


def test_shard_features_are_npy_files_read_memory_mapped_and_needed_to_finish(images, tmp_path):
    """A shard's features are ``.npy`` files beside its ``.npz``, read without a copy; a
    shard missing one is not finished (it is recomputed on resume)."""
    from mmdtl2_dist.extract.job import _finished
    from mmdtl2_dist.extract.shards import read_shard, run_shard

    spec = ModelSpec.parse("alexnet:conv3,conv5")
    ex = Extractor(spec, "random:0", Preprocessing(resize=64, crop=64))
    paths = read_images(images).frame["path"].tolist()[:3]
    shard = {"file": str(tmp_path / "000000.npz"), "paths": paths, "rows": [0, 1, 2]}
    run_shard(ex, {**shard, "batch_size": 3, "skip_bad": False})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "000000.f_conv3.npy",
        "000000.f_conv5.npy",
        "000000.npz",
    ]
    conv3 = read_shard(shard["file"], "f_conv3")
    assert isinstance(conv3, np.memmap) and not conv3.flags.writeable
    np.testing.assert_array_equal(conv3, ex.features(ex_images(paths))["conv3"])
    assert _finished(shard, spec.layers)
    (tmp_path / "000000.f_conv5.npy").unlink()
    assert not _finished(shard, spec.layers)


def ex_images(paths):
    from mmdtl2_dist.extract.model import decode_image

    return [decode_image(p) for p in paths]


def test_shard_of_several_batches_with_a_bad_image_equals_batch_by_batch_features(images, tmp_path):
    """Batches prepared ahead on a second thread and written through memory maps give the
    features, kept rows and bad rows of extracting the same batches one after the other;
    a shard that fails leaves no file behind."""
    from mmdtl2_dist.extract.shards import read_shard, run_shard

    ex = Extractor(ModelSpec.parse("alexnet:conv3"), "random:0", Preprocessing(64, 64))
    paths = read_images(images).frame["path"].tolist()[:5]
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not a png")
    paths = paths[:2] + [str(bad)] + paths[2:]  # batches of 2: [0 1] [bad 2] [3 4]
    rows = [10, 11, 12, 13, 14, 15]
    shard = {"file": str(tmp_path / "000000.npz"), "paths": paths, "rows": rows}
    summary = run_shard(ex, {**shard, "batch_size": 2, "skip_bad": True})
    assert (summary["n"], summary["kept"], summary["bad"]) == (6, 5, 1)
    assert read_shard(shard["file"], "kept").tolist() == [10, 11, 13, 14, 15]
    assert read_shard(shard["file"], "bad_rows").tolist() == [12]
    good = [p for p in paths if p != str(bad)]
    batches = [good[:2], good[2:3], good[3:]]  # the same batches, in sequence
    expected = np.concatenate([ex.features(ex_images(b))["conv3"] for b in batches])
    np.testing.assert_array_equal(read_shard(shard["file"], "f_conv3"), expected)
    with pytest.raises(Exception, match="broken.png"):
        run_shard(
            ex, {**shard, "file": str(tmp_path / "1.npz"), "batch_size": 2, "skip_bad": False}
        )
    assert not (tmp_path / "1.npz").exists()
    assert not list(tmp_path.glob(".*")) and not list(tmp_path.glob("1.*"))  # nothing half-written


def test_next_batch_is_prepared_while_the_model_runs_on_the_current_one(tmp_path):
    """The model's pass over batch i waits for batch i + 1's preprocessing to start; it
    sees it only if batches are prepared ahead on another thread (else the wait times
    out after 5 s, as it did with the batches prepared in the model's thread)."""
    import threading

    from mmdtl2_dist.extract.shards import run_shard

    class Recorder:
        spec = ModelSpec.parse("alexnet:conv3")
        dims = {"conv3": 1}

        def __init__(self, n_batches):
            self.started = [threading.Event() for _ in range(n_batches)]
            self.n_prepared = self.n_run = 0
            self.saw_next_prepared = []

        def tensor(self, images):
            self.started[self.n_prepared].set()
            self.n_prepared += 1
            return torch.zeros(len(images), 1)

        def forward(self, batch):
            self.n_run += 1
            if self.n_run < len(self.started):
                self.saw_next_prepared.append(self.started[self.n_run].wait(5))
            return {"conv3": batch.numpy()}

    rec = Recorder(n_batches=3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("mmdtl2_dist.extract.model.decode_image", lambda path: path)
        task = {"paths": ["a"] * 6, "rows": range(6), "batch_size": 2, "skip_bad": False}
        run_shard(rec, {**task, "file": str(tmp_path / "000000.npz")})
    assert rec.saw_next_prepared == [True, True]


SHARD_ON_SMALL_DISK = """
import sys
from mmdtl2_dist.extract.model import Extractor, ModelSpec, Preprocessing
from mmdtl2_dist.extract.shards import run_shard
ex = Extractor(ModelSpec.parse("alexnet:conv3"), "random:0", Preprocessing(64, 64))
paths = sys.argv[2:] * 4
try:
    run_shard(ex, {"paths": paths, "rows": range(len(paths)), "batch_size": 4,
                   "skip_bad": False, "file": sys.argv[1] + "/000000.npz"})
except OSError as exc:
    print("raised:", exc)
import os
print("left:", sorted(os.listdir(sys.argv[1])))
"""


def test_shard_on_a_full_disk_raises_a_clear_error_and_leaves_no_file(images, tmp_path):
    """A shard whose features do not fit on the disk (a real 256 KiB tmpfs, mounted in a
    user namespace) raises an OSError naming the folder and what to do, and leaves nothing
    there (a write through a memory map into a file the disk has no room for would kill
    the worker with SIGBUS)."""
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("no user namespaces here to mount a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    paths = read_images(images).frame["path"].tolist()
    code = tmp_path / "shard.py"
    code.write_text(SHARD_ON_SMALL_DISK)
    mount = f'mount -t tmpfs -o size=256k tmpfs {disk} && exec "$0" "$@"'
    out = subprocess.run(
        ["unshare", "-rm", "sh", "-c", mount, sys.executable, str(code), str(disk), *paths],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert "no room for" in out.stdout and f"of features in {disk}" in out.stdout
    assert "No space left on device" in out.stdout and "free space there" in out.stdout
    assert "left: []" in out.stdout


@pytest.mark.parametrize(
    "option, message",
    [
        (["--workers", "0"], "--workers must be at least 1, got 0; leave it out for one worker"),
        (["--gpus", "-1"], "--gpus must be a number of GPUs, got -1; leave it out (or 0)"),
    ],
)
def test_no_workers_or_negative_gpus_are_refused_before_any_work(
    images, tmp_path, capsys, option, message
):
    """``--workers 0`` would start a Ray with no CPU, where no worker can be placed (the
    run would wait forever), and ``--gpus -1`` would have Ray wait on no worker: both
    are refused with what to write instead, before Ray starts or anything is written."""
    out = tmp_path / "w.zarr"
    args = ["extract", str(images), str(out), "--model", "alexnet:conv3"]
    assert main([*args, "--weights", "random:0", *option]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_full_disk_ends_the_command_in_one_line_with_exit_1(monkeypatch, capsys, tmp_path):
    """A full disk or quota (the shard's reservation, a store write) is one line naming
    the folder and what to do, exit 1; any other OS error keeps its traceback."""
    import errno

    import mmdtl2_dist.commands.extract as command

    def full(args):
        raise OSError(errno.ENOSPC, f"no room for 8.0 MiB of features in {tmp_path}; free space")

    monkeypatch.setattr(command, "run", full)
    assert main(["extract", str(tmp_path), str(tmp_path / "s.zarr")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    message = f"[Errno 28] no room for 8.0 MiB of features in {tmp_path}; free space"
    assert err == [f"mmdtl2 extract: error: {message}"]
    monkeypatch.setattr(
        command, "run", lambda args: (_ for _ in ()).throw(PermissionError(13, "no"))
    )
    with pytest.raises(PermissionError):
        main(["extract", str(tmp_path), str(tmp_path / "s.zarr")])
