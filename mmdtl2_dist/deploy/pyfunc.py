"""Log a fitted adapter as a self-contained MLflow pyfunc model ("models from code").

Layout of a logged model (``<artifact root>/.../artifacts`` of an MLflow LoggedModel)::

    MLmodel                  flavor python_function; python_model: model_code.py;
                             model_config (class names, devices, feature space, study)
    model_code.py            the pyfunc class (copied from mmdtl2_dist/deploy/model_code.py)
    artifacts/adapter/adapter.npz    X_train (M, Lt), P (K, M), b (K,), [V], [pre_mean,
                                     pre_scale], [X_neighbours (U, Lt), scores_neighbours
                                     (U, K)] (np.savez; loaded with allow_pickle=False)
    artifacts/adapter/adapter.json   format, classes, kernel, preprocessing, feature space,
                                     n_features
    code/mmdtl2_dist/...     the scoring code: AdapterState, kernels, preprocessing,
                             neighbour smoothing (numpy)
    requirements.txt, python_env.yaml, conda.yaml
    input_example.json, serving_input_example.json

Why these requirements
----------------------
``mmdtl2-dist`` is not on PyPI, so it cannot be a pip requirement that installs anywhere.
Scoring needs only :class:`~mmdtl2_dist.core.adapter.AdapterState` and the modules it
imports, which use numpy alone; they travel with the model as ``code_paths`` (prepended
to ``sys.path`` at load time). The requirements are therefore the pinned versions of what
the model code imports — ``mlflow``, ``numpy``, ``pandas`` — which install from PyPI into
a fresh virtualenv (``--env-manager virtualenv``) as well as being what ``--env-manager
local`` finds in this project's environment. Nothing is pickled: the model is code plus
an ``.npz`` of plain arrays and JSON.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from mmdtl2_dist.core.adapter import AdapterState

#: The model-from-code file logged with every adapter, and with image-input adapters.
MODEL_CODE = Path(__file__).resolve().with_name("model_code.py")
MODEL_CODE_IMAGES = Path(__file__).resolve().with_name("model_code_images.py")
#: Modules of this package that the model code needs (relative to the package root).
SHIPPED_MODULES = (
    "__init__.py",
    "core/errors.py",
    "core/kernels.py",
    "core/params.py",  # the kernels' parameter checks (pure Python, imports nothing)
    "core/preprocessing.py",
    "core/adapter.py",
    "core/neighbours.py",
    "core/threads.py",
    "deploy/__init__.py",
    "deploy/scoring.py",
)
#: What image-input adapters ship as well (torch, torchvision and Pillow only).
SHIPPED_IMAGE_MODULES = ("extract/__init__.py", "extract/model.py")


def pip_requirements(images: bool = False) -> list[str]:
    """Pinned requirements of the model code (see the module docstring).

    Image-input adapters add torch, torchvision and Pillow, pinned without the local
    build label (``2.14.1``, not ``2.14.1+cpu``) so that the pins install from PyPI.
    """
    import mlflow
    import pandas as pd

    reqs = [
        f"mlflow=={mlflow.__version__}",
        f"numpy=={np.__version__}",
        f"pandas=={pd.__version__}",
    ]
    if images:
        import PIL
        import torch
        import torchvision

        reqs += [
            f"torch=={torch.__version__.split('+')[0]}",
            f"torchvision=={torchvision.__version__.split('+')[0]}",
            f"pillow=={PIL.__version__}",
        ]
    return reqs


def class_names_for(adapter: AdapterState, names: list[str] | None) -> list[str]:
    """Unique, non-empty class names (one per class), else the labels as strings."""
    if names is not None:
        names = [str(n) for n in names]
        if len(names) != len(adapter.classes):
            raise ValueError(
                f"{len(names)} class names for {len(adapter.classes)} classes; give one name "
                "per entry of adapter.classes, in that order."
            )
        if all(names) and len(set(names)) == len(names):
            return names
    return [str(c) for c in adapter.classes.tolist()]


def adapter_signature(adapter: AdapterState, class_names: list[str]):
    """Input: a float64 tensor (-1, Lt). Output: class, label and one score per class."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema, TensorSpec

    label_type = "string" if adapter.classes.dtype.kind in "US" else "long"
    outputs = [ColSpec("string", "class"), ColSpec(label_type, "label")]
    outputs += [ColSpec("double", f"score_{n}") for n in class_names]
    return ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(np.float64), (-1, adapter.n_features))]),
        outputs=Schema(outputs),
    )


def image_signature(adapter: AdapterState, class_names: list[str]):
    """Input: a binary column ``image`` (base64 when served). Output: as the adapter's."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("binary", "image")]),
        outputs=adapter_signature(adapter, class_names).outputs,
    )


def stage_code(folder: Path, modules: tuple[str, ...] = SHIPPED_MODULES) -> Path:
    """Copy ``modules`` into ``folder/mmdtl2_dist``; return that package path."""
    import mmdtl2_dist

    src = Path(mmdtl2_dist.__file__).resolve().parent
    dst = Path(folder) / "mmdtl2_dist"
    for rel in modules:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst / rel)
    return dst


def log_adapter(
    adapter: AdapterState,
    *,
    name: str = "adapter",
    class_names: list[str] | None = None,
    input_example: np.ndarray | None = None,
    model_config: dict | None = None,
    tags: dict | None = None,
    extractor=None,
):
    """Log ``adapter`` as a pyfunc model in the active MLflow run (or a new LoggedModel).

    Parameters
    ----------
    adapter : AdapterState
        The fitted scoring state (``MMDTL2().fit(...).adapter_``).
    name : str
        Name of the logged model.
    class_names : list of str, optional
        One name per ``adapter.classes`` entry (default: the labels).
    input_example : ndarray (n, Lt), optional
        Raw target features; the first row is stored (default: a row of zeros, since
        the adapter holds only *preprocessed* training samples).
    model_config : dict, optional
        Extra descriptive fields stored in ``MLmodel`` (devices, study...).
    tags : dict, optional
        Tags of the logged model.
    extractor : mmdtl2_dist.extract.model.Extractor, optional
        Log an image-input model (:mod:`~mmdtl2_dist.deploy.model_code_images`) that runs
        this extractor before the adapter; ``input_example`` is then one encoded image
        (bytes). Its ``identity`` is recorded in ``model_config``.

    Returns
    -------
    mlflow.models.model.ModelInfo
        ``model_uri`` is what :func:`mlflow.register_model` takes.
    """
    import mlflow

    names = class_names_for(adapter, class_names)
    if input_example is None:
        input_example = grey_png() if extractor else np.zeros((1, adapter.n_features))
    config = {
        "class_names": names,
        "feature_space": adapter.feature_space,
        "n_features": adapter.n_features,
        **(model_config or {}),
    }
    with tempfile.TemporaryDirectory(prefix="mmdtl2-adapter-") as tmp:
        folder = Path(tmp) / "adapter"
        folder.mkdir()
        adapter.save(folder / "adapter")
        artifacts = {"adapter": str(folder)}
        if extractor is None:
            model_code, modules = MODEL_CODE, SHIPPED_MODULES
            signature = adapter_signature(adapter, names)
            example = np.asarray(input_example, dtype=np.float64)[:1]
        else:
            model_code, modules = MODEL_CODE_IMAGES, SHIPPED_MODULES + SHIPPED_IMAGE_MODULES
            signature = image_signature(adapter, names)
            example = pd.DataFrame({"image": [bytes(input_example)]})
            artifacts["extractor"] = str(save_extractor(extractor, Path(tmp) / "extractor"))
            config.update(input="images", extractor=extractor_config(extractor))
        code = stage_code(Path(tmp) / "code", modules)
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=str(model_code),
            artifacts=artifacts,
            code_paths=[str(code)],
            signature=signature,
            input_example=example,
            pip_requirements=pip_requirements(images=extractor is not None),
            model_config=config,
            tags=tags,
        )


def grey_png(size: int = 32) -> bytes:
    """A small grey PNG: the input example of an image-input adapter."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), (128, 128, 128)).save(buf, format="PNG")
    return buf.getvalue()


def extractor_config(extractor) -> dict:
    """What an image-input adapter records about its extractor (``extractor.json``)."""
    layer = extractor.spec.layers[0]
    return {
        "model": extractor.spec.model,
        "layer": layer,
        "node": extractor.spec.node(layer),
        "n_features": extractor.dims[layer],
        "preprocessing": extractor.preprocessing.as_dict(),
        "weights": {"name": extractor.identity.name, "sha256": extractor.identity.sha256},
    }


def save_extractor(extractor, folder: Path) -> Path:
    """Write ``extractor.json`` and ``weights.npz`` (the cut model's tensors) to ``folder``."""
    import json

    folder.mkdir()
    (folder / "extractor.json").write_text(json.dumps(extractor_config(extractor), indent=1))
    state = {k: v.numpy() for k, v in extractor.cut_state().items()}
    np.savez(folder / "weights.npz", **state)
    return folder
