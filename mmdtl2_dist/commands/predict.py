"""``mmdtl2 predict``: batch prediction with a registered (or any MLflow) adapter.

Examples
--------
Classes and scores of the samples of a ``.npy`` file, as Parquet::

    mmdtl2 predict --model models:/polyp-adapter@champion features.npy -o predictions.parquet

All samples of device ``elite`` in a feature store, CSV on stdout::

    mmdtl2 predict --model models:/polyp-adapter@champion store.zarr --device elite
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

from mmdtl2_dist.commands import add_quiet_options, add_tracking_uri_option

#: What a Ctrl-C leaves (printed by the CLI).
INTERRUPTED = (
    "an -o file is written only when complete; predictions already printed to the "
    "standard output are incomplete. Run the command again."
)


def run(args: argparse.Namespace) -> int:
    import mlflow
    import pandas as pd

    from mmdtl2_dist.core.adapter import check_width_and_values
    from mmdtl2_dist.deploy.io import check_output, iter_batches, write_predictions
    from mmdtl2_dist.deploy.registry import load_registered_model

    check_output(args.output, args.overwrite)  # before the model is loaded and run
    t0 = time.perf_counter()
    model = load_registered_model(args.model, args.tracking_uri)
    load_s = time.perf_counter() - t0
    config = model.model_config or {}
    if config.get("input") == "images":
        raise ValueError(
            f"{args.model} takes images (registered with --with-extractor), and `mmdtl2 "
            "predict` reads features; score features with the feature-input adapter of the "
            "same study (register it without --with-extractor), or send images to the model "
            "served by `mlflow models serve`."
        )
    device = args.device or config.get("target_device")
    if config.get("target_device") and device != config["target_device"]:
        warnings.warn(
            f"{args.model} adapts device {config['target_device']!r}'s features; the features "
            f"of {device!r} are scored as if they were {config['target_device']!r}'s (register "
            f"an adapter for {device!r} with --pair to score them as its own).",
            UserWarning,
            stacklevel=2,
        )
    space = args.space or config.get("feature_space")
    n_features = config.get("n_features")
    frames, n = [], 0
    t1 = time.perf_counter()
    for batch in iter_batches(args.input, args.batch_size, device=device, space=space):
        rows = f"rows {n}..{n + len(batch.X) - 1}"
        try:
            check_width_and_values(batch.X, n_features, str(args.input), f"model {args.model}")
            pred = model.predict(batch.X)
        except ValueError as exc:
            raise ValueError(f"{rows}: {exc}{_not_features(batch, n_features)}") from exc
        except mlflow.exceptions.MlflowException as exc:
            raise ValueError(f"{rows}: {exc.message}") from exc
        frames.append(pd.concat([batch.ids, pred.reset_index(drop=True)], axis=1))
        n += len(batch.X)
    if not frames:
        raise ValueError(f"{args.input} holds no samples.")
    out = pd.concat(frames, ignore_index=True)
    predict_s = time.perf_counter() - t1
    write_predictions(out, args.output, overwrite=args.overwrite)
    if not args.quiet:
        counts = out["class"].value_counts().sort_index()
        print(
            f"predict: {n} samples in {predict_s:.2f} s (model loaded in {load_s:.2f} s) -> "
            f"{args.output or 'stdout'}; classes: "
            + ", ".join(f"{k} {v}" for k, v in counts.items()),
            file=sys.stderr,
        )
    return 0


def _not_features(batch, n_features: int | None) -> str:
    """On a width mismatch, the input's columns that were not read as features."""
    other = list(batch.not_numbers)
    if not other or n_features is None or batch.X.shape[1] == n_features:
        return ""
    more = f" and {len(other) - 5} more" if len(other) > 5 else ""
    shown = ", ".join(map(repr, other[:5])) + more
    return (
        f" Its columns {shown} are not numbers, so they were copied to the output as "
        "identifiers, not read as features: store features as numbers."
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "predict",
        help="batch prediction with a registered adapter (.npy, .parquet or Zarr in)",
        description=(
            "Load an adapter logged by `mmdtl2 register` (models:/NAME@ALIAS, "
            "models:/NAME/VERSION or any MLflow model URI) and write, for every input sample, "
            "its class, label and per-class scores. Inputs: a 2-D .npy array; a .parquet "
            "file with numeric feature columns or a list column 'features' (other columns "
            "are copied); a feature store (one device, one space) or a 2-D Zarr array."
        ),
        epilog=(
            "examples:\n"
            "  mmdtl2 predict --model models:/polyp-adapter@champion X.npy -o pred.parquet\n"
            "  mmdtl2 predict --model models:/polyp-adapter@champion store.zarr --device elite"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("input", help=".npy, .parquet or Zarr store of raw target features")
    p.add_argument("--model", required=True, help="model URI, e.g. models:/NAME@champion")
    p.add_argument(
        "-o", "--output", default=None, help=".parquet or .csv file (default: CSV on stdout)"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing predictions file written by mmdtl2 predict",
    )
    p.add_argument(
        "--device", default=None, help="feature-store device (default: the model's target device)"
    )
    p.add_argument(
        "--space", default=None, help="feature-store space (default: the model's feature space)"
    )
    p.add_argument("--batch-size", type=int, default=4096, help="rows per batch (default 4096)")
    add_tracking_uri_option(p, "MLFLOW_TRACKING_URI")
    add_quiet_options(p, "summary line on stderr", progress=False)
    p.set_defaults(func=run, interrupted=INTERRUPTED)
