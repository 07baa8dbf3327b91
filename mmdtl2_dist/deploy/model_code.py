"""MLflow "models from code" definition of a deployed MMDTL2 adapter.

MLflow copies this file into the logged model and executes it when the model is loaded
(``mlflow.pyfunc.load_model``, ``mlflow models serve``); nothing is pickled. The fitted
state is the artifact folder ``adapter``, written by :meth:`AdapterState.save`:

- ``adapter.npz``: the arrays (``np.load(..., allow_pickle=False)``): the M preprocessed
  training target samples ``X_train`` (M, Lt), the coefficients ``P`` (K, M) and ``b``
  (K,), the optional prior term ``V``, the preprocessing statistics and, for a
  ``select="auto"`` adapter of a hard shift, the unlabelled targets ``X_neighbours`` and
  their scores ``scores_neighbours`` that every score is smoothed over;
- ``adapter.json``: the format tag, class labels, kernel parameters, preprocessing method,
  feature-space name and feature dimension.

``model_config`` (in the ``MLmodel`` file) holds descriptive fields: ``class_names``,
``target_device``, ``source_device``, ``study``.

The scoring code is :class:`mmdtl2_dist.core.adapter.AdapterState`, shipped with the model
as ``code_paths`` (numpy only), so a served model scores exactly as the in-process
estimator.

Input: a float array (n, Lt) of raw target-device features (``{"inputs": [[...]]}`` when
served). Output: a table with ``class`` (class name), ``label`` (class label) and one
``score_<class name>`` column per class (the decision values ``P k(x̂) + x̂ᵀV + b``,
smoothed over the neighbours where the adapter keeps them).
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
from mlflow.models import set_model
from mlflow.pyfunc import PythonModel

from mmdtl2_dist.core.adapter import AdapterState
from mmdtl2_dist.deploy.scoring import class_names_of, invalid_input, predictions_frame


def as_feature_rows(model_input):
    """The request's rows, unconverted: an array, a DataFrame or nested lists.

    Conversion to float64 is :meth:`AdapterState.decision_function`'s, which refuses
    strings and booleans instead of coercing them. A DataFrame with one list-valued
    column (``features``) gives its lists; a dict must hold exactly one input tensor.
    """
    if isinstance(model_input, pd.DataFrame):
        if len(model_input.columns) == 1 and model_input.dtypes.iloc[0].kind == "O":
            return model_input.iloc[:, 0].tolist()  # one list-valued column
        return model_input
    if isinstance(model_input, dict):
        if len(model_input) != 1:
            raise ValueError(
                f"expected one input tensor, got named inputs {sorted(model_input)}; "
                'send {"inputs": [[...], ...]} with one row per sample.'
            )
        return next(iter(model_input.values()))
    return model_input


class AdapterModel(PythonModel):
    """Raw target features in, class and scores out (see the module docstring)."""

    def load_context(self, context):
        self.adapter = AdapterState.load(os.path.join(context.artifacts["adapter"], "adapter"))
        self.names = class_names_of(self.adapter, context.model_config)

    def predict(self, context, model_input: np.ndarray, params: dict | None = None) -> pd.DataFrame:
        # The type hint is what the float64 tensor signature delivers; np.ndarray is one of
        # the hints from which MLflow infers no signature of its own, so the logged one stays.
        try:
            scores = self.adapter.decision_function(as_feature_rows(model_input))
        except ValueError as exc:
            raise invalid_input(
                f"invalid input for the MMDTL2 adapter ({self.adapter.feature_space}, "
                f"{self.adapter.n_features} features): {exc}",
                exc,
            ) from exc
        return predictions_frame(self.adapter, scores, self.names)


set_model(AdapterModel())
