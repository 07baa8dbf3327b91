"""Deployed adapters: MLflow pyfunc model, registry, batch prediction.

- :mod:`~mmdtl2_dist.deploy.model_code`: the "models from code" pyfunc (shipped with the
  model; numpy-only scoring through :class:`~mmdtl2_dist.core.adapter.AdapterState`);
- :mod:`~mmdtl2_dist.deploy.pyfunc`: :func:`log_adapter` (artifacts, signature,
  requirements);
- :mod:`~mmdtl2_dist.deploy.training`: choose a study's configuration and fit it on all
  labelled data;
- :mod:`~mmdtl2_dist.deploy.registry`: register, tag, alias;
- :mod:`~mmdtl2_dist.deploy.io`: inputs and outputs of ``mmdtl2 predict``.
"""
