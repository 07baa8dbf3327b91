"""Seeded synthetic two-device images: textured patches, a colour and blur device shift.

A class is a texture: oriented stripes whose angle and spatial frequency depend on the
class, with random phase, a little jitter of angle and frequency, and pixel noise per
image. The *source* device shows them as they are; the *target* device sees the same
kinds of patches through another camera: its colours are mixed and shifted (a fixed
3 x 3 colour matrix and offset) and the image is blurred. Classes stay separable on each
device, while features learnt on one device fit the other less well: the setting of
domain adaptation between imaging devices.

Written as the folder layout ``mmdtl2 extract`` reads (``DIR/<device>/<class>/<k>.png``,
every image labelled, so that a study can test on the target device's labels). Uses numpy
and Pillow only (no torch).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from mmdtl2_dist.store.outputs import OutputKind, StagedOutput, claim_output

MARKER = ".mmdtl2-synthetic-images"


@dataclass(frozen=True)
class ImageSetSpec:
    """Sizes, classes, device names and the shift of a synthetic image set."""

    n_source: int = 20  # images per class on the source device
    n_target: int = 10  # images per class on the target device
    n_classes: int = 3
    size: int = 64
    blur: float = 1.5  # Gaussian blur radius of the target device, pixels
    noise: float = 0.08
    seed: int = 0
    source_device: str = "scope_a"
    target_device: str = "scope_b"


def _image_set_files(path: Path) -> set[str]:
    """The files an image set's marker lists, with the marker.

    A set written before markers listed their images (a marker holding the spec's
    ``repr``) is taken to hold the images its layout names, ``DEVICE/classK/NNNNN.png``.
    """
    try:
        text = (path / MARKER).read_text()
    except OSError:
        return {MARKER}
    try:
        files = json.loads(text).get("files")
    except (ValueError, AttributeError):
        files = None
    if files is None and text.startswith("ImageSetSpec("):
        layout = re.compile(r"[^/]+/class[0-9]+/[0-9]{5}\.png")
        files = [p.relative_to(path).as_posix() for p in path.rglob("*.png")]
        files = [f for f in files if layout.fullmatch(f)]
    return {MARKER, *(f for f in files or [] if isinstance(f, str))}


IMAGE_SET = OutputKind(
    "synthetic image set",
    is_dir=True,
    recognise=lambda p: (p / MARKER).is_file(),
    replace_hint="pass --overwrite to replace it",
    written=_image_set_files,
)


def _texture(rng: np.random.Generator, cls: int, spec: ImageSetSpec) -> np.ndarray:
    """One grey texture patch of class ``cls`` in [0, 1], shape (size, size)."""
    angle = np.pi * cls / spec.n_classes + rng.normal(0, 0.08)
    freq = (2.0 + 1.5 * cls) * (1 + rng.normal(0, 0.05)) / spec.size
    y, x = np.mgrid[0 : spec.size, 0 : spec.size]
    phase = rng.uniform(0, 2 * np.pi)
    wave = np.sin(2 * np.pi * freq * (x * np.cos(angle) + y * np.sin(angle)) + phase)
    return np.clip(0.5 + 0.4 * wave + rng.normal(0, spec.noise, wave.shape), 0, 1)


def _colour(grey: np.ndarray, rng: np.random.Generator, cls: int, n_classes: int) -> np.ndarray:
    """An RGB patch: a class tint of the texture (H, W, 3) in [0, 1]."""
    tint = 0.6 + 0.4 * np.array([np.cos(cls), np.sin(cls + 1), 0.5]) ** 2
    return np.clip(grey[..., None] * tint * (1 + rng.normal(0, 0.03, 3)), 0, 1)


_DEVICE_MIX = np.array([[0.7, 0.25, 0.05], [0.1, 0.6, 0.3], [0.15, 0.1, 0.75]])
_DEVICE_OFFSET = np.array([0.12, -0.05, 0.08])


def _target_view(rgb: np.ndarray, blur: float):
    """The target device's view of a patch: mixed, shifted colours, then blurred."""
    from PIL import Image, ImageFilter

    mixed = np.clip(rgb @ _DEVICE_MIX.T + _DEVICE_OFFSET, 0, 1)
    img = Image.fromarray((mixed * 255).round().astype(np.uint8))
    return img.filter(ImageFilter.GaussianBlur(blur)) if blur > 0 else img


def make_image_set(out: str | os.PathLike, spec: ImageSetSpec, overwrite: bool = False) -> Path:
    """Write the image set (module docstring) atomically; return its folder."""
    from PIL import Image

    sizes = {"--n-source": spec.n_source, "--n-target": spec.n_target,
             "--classes": spec.n_classes, "--size": spec.size}  # fmt: skip
    bad = {flag: v for flag, v in sizes.items() if v < 1}
    if bad:
        raise ValueError(f"image set sizes must be at least 1, got {bad}.")
    if spec.source_device == spec.target_device:
        raise ValueError(
            f"the two devices need two names, got {spec.source_device!r} for both; change "
            "--source-device or --target-device."
        )
    out = Path(out).expanduser().absolute()
    replace = claim_output(out, IMAGE_SET, overwrite=overwrite)
    rng = np.random.default_rng(spec.seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    with StagedOutput(out, replace=replace) as tmp:
        for device, n in ((spec.source_device, spec.n_source), (spec.target_device, spec.n_target)):
            for cls in range(spec.n_classes):
                folder = tmp / device / f"class{cls}"
                folder.mkdir(parents=True)
                for k in range(n):
                    rgb = _colour(_texture(rng, cls, spec), rng, cls, spec.n_classes)
                    img = (
                        Image.fromarray((rgb * 255).round().astype(np.uint8))
                        if device == spec.source_device
                        else _target_view(rgb, spec.blur)
                    )
                    img.save(folder / f"{k:05d}.png")
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*.png"))
        (tmp / MARKER).write_text(json.dumps({"spec": asdict(spec), "files": files}) + "\n")
    return out
