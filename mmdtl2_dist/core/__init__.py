"""The mathematics of MMDTL2 and its baselines, on Gram matrices (numpy, scipy, osqp, POT).

Nothing here imports another part of the package, nor Ray, Zarr or MLflow: the import
contracts in ``pyproject.toml`` (``lint-imports``) hold that. The entry point of a study
trial is :func:`mmdtl2_dist.core.methods.fit_predict`.
"""
