"""The CNN feature extractor: model cut at named layers, weights, preprocessing, decoding.

This module imports torch, torchvision, Pillow and numpy only (nothing else of this
package), so that it travels unchanged with an image-input adapter
(:mod:`mmdtl2_dist.deploy.model_code_images`).

Model and layers (:class:`ModelSpec`, ``MODEL:LAYER[,LAYER...]``): any torchvision
classification model by name and any node of its graph
(``torchvision.models.feature_extraction.get_graph_node_names``), or a short name:
AlexNet's ``conv1`` ... ``conv5`` are the outputs of its five convolutions *after their
ReLU* (what Caffe's in-place ReLU leaves in the ``convN`` blob, the features of the
paper), ``pool5`` its last max-pooling. On 224 x 224 inputs ``alexnet:conv3`` gives
384 x 13 x 13 = 64,896 features and ``alexnet:conv5`` 256 x 13 x 13 = 43,264. Every
layer's output is flattened per image (channels, then rows, then columns), float32.

Preprocessing (:class:`Preprocessing`): the ImageNet recipe of the paper and of
torchvision's pretrained weights: the image is converted to RGB, resized so that its
shorter side is ``resize`` (256; bilinear, antialiased), centre-cropped to ``crop`` x
``crop`` (224), scaled to [0, 1] and normalised with ImageNet's mean and standard
deviation. All of it is configurable and recorded with the features.

Weights (:func:`load_model`): ``imagenet`` (torchvision's default pretrained weights,
downloaded once into torch's cache, ``$TORCH_HOME``), a path to a local file holding a
state dict (``torch.save(model.state_dict(), PATH)``, loaded with ``weights_only=True``:
nothing is unpickled but tensors), or ``random:SEED`` (seeded random initialisation: for
tests and offline demonstrations only; its features mean nothing). Their identity
(:class:`WeightsIdentity`: the name and the SHA-256 of the state dict's tensors) is
recorded in the feature store and in every adapter built on it.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

#: Short layer names per model (torchvision graph node names).
LAYER_ALIASES = {
    "alexnet": {
        "conv1": "features.1",
        "conv2": "features.4",
        "conv3": "features.7",
        "conv4": "features.9",
        "conv5": "features.11",
        "pool5": "features.12",
    },
}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
RANDOM_PREFIX = "random:"


INSTALL_HINT = (
    "install the optional extra: pip install -e '.[images]' (a CPU-only machine: add "
    "--extra-index-url https://download.pytorch.org/whl/cpu for the CPU build)"
)


def require_torch() -> None:
    """Raise a ValueError saying how to install torch when it is missing."""
    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
    except ImportError as exc:
        raise ValueError(f"images need torch and torchvision ({exc}); {INSTALL_HINT}.") from None


class BadImageError(ValueError):
    """An image that cannot be decoded (the message names it and the reason)."""

    def __init__(self, where: str, reason: str):
        self.where, self.reason = where, reason
        super().__init__(f"cannot read the image {where}: {reason}")

    def __reduce__(self):
        return (BadImageError, (self.where, self.reason))


@dataclass(frozen=True)
class ModelSpec:
    """A torchvision model and the layers whose outputs are the features."""

    model: str
    layers: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """``MODEL:LAYER[,LAYER...]``, e.g. ``alexnet:conv3`` or ``resnet18:avgpool``."""
        model, sep, layers = str(text).partition(":")
        names = tuple(x.strip() for x in layers.split(",") if x.strip())
        if not sep or not model or not names:
            raise ValueError(
                f"model {text!r}: write MODEL:LAYER, e.g. alexnet:conv3, alexnet:conv3,conv5 "
                "or resnet18:avgpool."
            )
        if len(set(names)) != len(names):
            raise ValueError(f"model {text!r} names a layer twice.")
        return cls(model.strip().lower(), names)

    def node(self, layer: str) -> str:
        """The torchvision graph node of a layer name."""
        return LAYER_ALIASES.get(self.model, {}).get(layer, layer)

    def __str__(self) -> str:
        return f"{self.model}:{','.join(self.layers)}"


@dataclass(frozen=True)
class Preprocessing:
    """Resize (shorter side), centre crop, ImageNet normalisation (module docstring)."""

    resize: int = 256
    crop: int = 224
    mean: tuple[float, ...] = field(default=IMAGENET_MEAN)
    std: tuple[float, ...] = field(default=IMAGENET_STD)

    def __post_init__(self):
        if self.resize < 1 or self.crop < 1 or self.crop > self.resize:
            raise ValueError(
                f"preprocessing: need 1 <= crop <= resize, got resize={self.resize}, "
                f"crop={self.crop}."
            )
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(
                "preprocessing: mean and std need three values (R, G, B), std positive; "
                f"got mean={self.mean}, std={self.std}."
            )

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> Preprocessing:
        return cls(int(d["resize"]), int(d["crop"]), tuple(d["mean"]), tuple(d["std"]))

    def transform(self):
        """The torchvision transform: PIL RGB image -> normalised float tensor (3, crop, crop)."""
        from torchvision import transforms as T

        return T.Compose(
            [
                T.Resize(self.resize, interpolation=T.InterpolationMode.BILINEAR, antialias=True),
                T.CenterCrop(self.crop),
                T.ToTensor(),
                T.Normalize(self.mean, self.std),
            ]
        )


@dataclass(frozen=True)
class WeightsIdentity:
    """What the weights are: ``name`` as given, and the SHA-256 of their tensors."""

    name: str
    sha256: str

    @property
    def meaningful(self) -> bool:
        """False for seeded random weights (their features carry no image content)."""
        return not self.name.startswith(RANDOM_PREFIX)


def state_dict_sha256(state: dict) -> str:
    """SHA-256 over the tensors of a state dict, in sorted key order (name, dtype, shape, bytes)."""
    import torch

    h = hashlib.sha256()
    for key in sorted(state):
        t = state[key].detach().cpu().contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def load_model(name: str, weights: str):
    """A torchvision model with the given weights, in eval mode, and their identity.

    Parameters
    ----------
    name : str
        torchvision model name (``alexnet``, ``resnet18``...).
    weights : str
        ``imagenet``, ``random:SEED`` or a path to a state-dict file (module docstring).

    Raises
    ------
    ValueError
        Unknown model, weights that do not fit it, or pretrained weights that cannot be
        downloaded (with how to work offline).
    """
    import torch
    from torchvision import models

    if name not in models.list_models(module=models):
        raise ValueError(
            f"unknown torchvision model {name!r}; use one of torchvision.models.list_models(), "
            "e.g. alexnet, resnet18, vgg16."
        )
    if weights.startswith(RANDOM_PREFIX):
        seed = _seed(weights)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = models.get_model(name, weights=None)
        label = f"{RANDOM_PREFIX}{seed}"
    elif weights == "imagenet":
        model, label = _pretrained(name)
    else:
        model = models.get_model(name, weights=None)
        _load_state_dict(model, _state_dict_file(Path(weights), name), Path(weights), name)
        label = f"file:{Path(weights).name}"
    model.eval()
    return model, WeightsIdentity(label, state_dict_sha256(model.state_dict()))


def _seed(weights: str) -> int:
    try:
        return int(weights[len(RANDOM_PREFIX) :])
    except ValueError:
        raise ValueError(f"weights {weights!r}: write random:SEED with an integer SEED.") from None


def _pretrained(name: str):
    from torchvision import models

    w = models.get_model_weights(name).DEFAULT
    try:
        return models.get_model(name, weights=w), f"imagenet:{w}"
    except Exception as exc:  # noqa: BLE001 - URLError, HTTPError, a broken cache file
        raise ValueError(
            f"cannot load torchvision's pretrained weights {w} ({type(exc).__name__}: {exc}). "
            "They are downloaded once into torch's cache ($TORCH_HOME); on a machine without "
            "network access, save them elsewhere with torch.save(model.state_dict(), PATH) "
            "and give PATH as the weights (extract --weights PATH, register --with-extractor "
            "PATH)."
        ) from exc


def _state_dict_file(path: Path, name: str) -> dict:
    import torch

    if not path.is_file():
        raise ValueError(
            f"weights {str(path)!r}: no such file; give imagenet, random:SEED or the path "
            f"of a state dict of {name} saved with torch.save(model.state_dict(), PATH)."
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - not a torch file, or one holding more than tensors
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"weights {path}: cannot read it as a state dict of tensors ({why}); save it "
            "with torch.save(model.state_dict(), PATH)."
        ) from exc
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"weights {path}: holds no state dict of tensors.")
    return state


def _load_state_dict(model, state: dict, path: Path, name: str) -> None:
    """Load ``state`` into ``model``, or say in one line why it is not ``name``'s."""
    want = model.state_dict()
    missing, unexpected = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    wrong = sorted(k for k in set(want) & set(state) if want[k].shape != state[k].shape)
    if missing or unexpected or wrong:
        first = (missing or unexpected or wrong)[0]
        raise ValueError(
            f"weights {path}: not a state dict of {name} ({len(missing)} of its tensors "
            f"missing, {len(unexpected)} unknown, {len(wrong)} of another shape; first: "
            f"{first!r}); give weights saved from {name} with "
            "torch.save(model.state_dict(), PATH)."
        )
    model.load_state_dict(state)


def feature_module(model, spec: ModelSpec):
    """``model`` cut after the spec's layers: returns a dict layer -> activation."""
    from torchvision.models.feature_extraction import (
        create_feature_extractor,
        get_graph_node_names,
    )

    nodes = get_graph_node_names(model)[1]
    unknown = [layer for layer in spec.layers if spec.node(layer) not in nodes]
    if unknown:
        aliases = sorted(LAYER_ALIASES.get(spec.model, {}))
        raise ValueError(
            f"{spec.model} has no layer {unknown[0]!r}; use "
            + (f"one of {aliases} or " if aliases else "")
            + f"a node of its graph, e.g. {', '.join(nodes[-6:])}."
        )
    return create_feature_extractor(model, {spec.node(layer): layer for layer in spec.layers})


def decode_image(data: bytes | str | Path, where: str | None = None):
    """An RGB PIL image from bytes or a path; :class:`BadImageError` naming ``where`` else."""
    from PIL import Image

    where = where or (str(data) if isinstance(data, str | Path) else "in the request")
    try:
        src = io.BytesIO(data) if isinstance(data, bytes | bytearray) else data
        with Image.open(src) as img:
            img.load()
            return img.convert("RGB")
    except FileNotFoundError:
        raise BadImageError(where, "no such file") from None
    except Image.UnidentifiedImageError:
        raise BadImageError(where, "not an image file that Pillow can identify") from None
    except Exception as exc:  # noqa: BLE001 - PIL raises many types for damaged files
        raise BadImageError(where, f"{type(exc).__name__}: {exc}") from None


class Extractor:
    """Images in, features out: decoded PIL images -> {layer: float32 (n, L)}.

    Parameters
    ----------
    spec : ModelSpec
    weights : str
        As :func:`load_model` takes them.
    preprocessing : Preprocessing
    device : str
        ``cpu`` or ``cuda``.
    state : dict, optional
        State dict of the cut module (:meth:`cut_state`) instead of the whole model's
        weights (what an image-input adapter ships and Ray workers are given); the
        layers after the cut are never allocated.
    """

    def __init__(self, spec, weights, preprocessing, device="cpu", state=None):
        import torch
        from torchvision import models

        self.spec, self.preprocessing, self.device = spec, preprocessing, device
        if state is None:
            model, self.identity = load_model(spec.model, weights)
            self.module = feature_module(model, spec).eval()
        else:  # built without memory ("meta" tensors), then given the cut model's tensors
            with torch.device("meta"):
                model = models.get_model(spec.model, weights=None)
            self.module = feature_module(model, spec).eval()
            self.module.load_state_dict(state, assign=True)
            self.identity = None
        self.module.to(device)
        self._transform = preprocessing.transform()
        with torch.no_grad():
            probe = torch.zeros(1, 3, preprocessing.crop, preprocessing.crop, device=device)
            out = self.module(probe)
        self.dims = {layer: int(np.prod(out[layer].shape[1:])) for layer in spec.layers}

    def cut_state(self) -> dict:
        """The cut module's state dict (only the layers up to the features)."""
        return {k: v.detach().cpu() for k, v in self.module.state_dict().items()}

    def tensor(self, images) -> object:
        """The preprocessed batch (n, 3, crop, crop) of PIL images."""
        import torch

        return torch.stack([self._transform(img) for img in images])

    def features(self, images) -> dict[str, np.ndarray]:
        """Features of each layer, float32 (n, L), for a list of PIL images."""
        return self.forward(self.tensor(images))

    def forward(self, batch) -> dict[str, np.ndarray]:
        """Features of each layer, float32 (n, L), for a preprocessed batch (:meth:`tensor`)."""
        import torch

        with torch.no_grad():
            out = self.module(batch.to(self.device))
        return {
            layer: out[layer].reshape(len(batch), -1).float().cpu().numpy()
            for layer in self.spec.layers
        }
