"""MLflow "models from code" definition of an MMDTL2 adapter that takes images.

The model runs the extractor that made the study's features (the same torchvision model,
layer, weights and preprocessing, :class:`mmdtl2_dist.extract.model.Extractor`) and then
the adapter (:class:`mmdtl2_dist.core.adapter.AdapterState`), so a device-B workstation
sends an image instead of 64,896 numbers. Artifacts:

- ``adapter``: as for the feature-input model (:mod:`~mmdtl2_dist.deploy.model_code`);
- ``extractor``: ``extractor.json`` (model, layer, preprocessing, the weights' name and
  SHA-256) and ``weights.npz``, the state dict of the model cut after the layer, as
  plain arrays (``np.load(..., allow_pickle=False)``: nothing is unpickled).

Input: a column ``image`` of encoded image files (PNG, JPEG...), one per row: bytes, or
base64 text. Served, the MLflow signature's ``binary`` column makes ``mlflow models
serve`` decode base64: ``{"dataframe_split": {"columns": ["image"], "data": [["<base64>"]]}}``.
An image that cannot be decoded is a 400 that names its row and the reason. Output: the
feature-input model's table (``class``, ``label``, ``score_<class>``).
"""

from __future__ import annotations

import base64
import binascii
import json
import os

import numpy as np
import pandas as pd
from mlflow.models import set_model
from mlflow.pyfunc import PythonModel

from mmdtl2_dist.core.adapter import AdapterState
from mmdtl2_dist.deploy.scoring import class_names_of, invalid_input, predictions_frame
from mmdtl2_dist.extract.model import (
    BadImageError,
    Extractor,
    ModelSpec,
    Preprocessing,
    decode_image,
)


def image_bytes(value, row: int) -> bytes:
    """An encoded image from a request cell: bytes, or base64 text."""
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise BadImageError(f"in row {row}", "text that is not base64") from None
    raise BadImageError(f"in row {row}", f"a {type(value).__name__}, not image bytes")


def image_cells(model_input) -> list:
    """The request's images: the ``image`` column (or the only column) of its rows."""
    if isinstance(model_input, pd.DataFrame):
        if "image" in model_input.columns:
            return model_input["image"].tolist()
        if len(model_input.columns) == 1:
            return model_input.iloc[:, 0].tolist()
        raise ValueError(
            f"expected a column 'image', got columns {list(model_input.columns)}; send "
            '{"dataframe_split": {"columns": ["image"], "data": [["<base64 image>"], ...]}}.'
        )
    if isinstance(model_input, dict) and "image" in model_input:
        return list(np.atleast_1d(model_input["image"]))
    return list(np.atleast_1d(model_input))


def load_extractor(folder: str) -> Extractor:
    """The extractor stored in an ``extractor`` artifact folder."""
    import torch

    with open(os.path.join(folder, "extractor.json")) as fh:
        cfg = json.load(fh)
    with np.load(os.path.join(folder, "weights.npz"), allow_pickle=False) as z:
        state = {k: torch.from_numpy(z[k].copy()) for k in z.files}
    spec = ModelSpec(cfg["model"], (cfg["layer"],))
    return Extractor(
        spec, cfg["weights"]["name"], Preprocessing.from_dict(cfg["preprocessing"]), state=state
    )


class ImageAdapterModel(PythonModel):
    """Images in, class and scores out (see the module docstring)."""

    def load_context(self, context):
        import torch

        torch.use_deterministic_algorithms(True, warn_only=True)
        self.adapter = AdapterState.load(os.path.join(context.artifacts["adapter"], "adapter"))
        self.extractor = load_extractor(context.artifacts["extractor"])
        self.layer = self.extractor.spec.layers[0]
        self.names = class_names_of(self.adapter, context.model_config)

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None):
        try:
            images = [
                decode_image(image_bytes(v, k), f"in row {k}")
                for k, v in enumerate(image_cells(model_input))
            ]
            if not images:
                raise ValueError("the request holds no image.")
        except ValueError as exc:
            raise invalid_input(f"invalid input for the MMDTL2 image adapter: {exc}", exc) from exc
        X = self.extractor.features(images)[self.layer].astype(np.float64)
        return predictions_frame(self.adapter, self.adapter.decision_function(X), self.names)


set_model(ImageAdapterModel())
