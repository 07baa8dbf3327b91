"""What the deployed models share: class names, the output table, the 400 error.

Shipped with every logged adapter (numpy, pandas and MLflow's exception only), and used by
both model-from-code files: :mod:`~mmdtl2_dist.deploy.model_code` (features in) and
:mod:`~mmdtl2_dist.deploy.model_code_images` (images in).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mmdtl2_dist.core.adapter import AdapterState


def class_names_of(adapter: AdapterState, model_config: dict | None) -> list[str]:
    """Class names from the model configuration, else the labels as strings."""
    names = list((model_config or {}).get("class_names") or [])
    if len(names) != len(adapter.classes):
        names = [str(c) for c in adapter.classes.tolist()]
    return names


def predictions_frame(adapter: AdapterState, scores: np.ndarray, names: list[str]) -> pd.DataFrame:
    """The output table: ``class``, ``label`` and ``score_<name>`` per class."""
    best = np.argmax(scores, axis=1)
    out = {"class": np.asarray(names, dtype=object)[best], "label": adapter.classes[best]}
    for k, name in enumerate(names):
        out[f"score_{name}"] = scores[:, k]
    return pd.DataFrame(out)


def invalid_input(message: str, cause: Exception):
    """The exception that makes MLflow's scoring server answer 400 with ``message``.

    Any other exception would be a generic 400 without it.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    err = MlflowException(message, error_code=INVALID_PARAMETER_VALUE)
    err.__cause__ = cause
    return err
