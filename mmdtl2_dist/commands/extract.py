"""``mmdtl2 extract``: CNN features of images into a feature store, on Ray.

Examples
--------
The paper's conv3 features (64,896-d) of a folder ``images/DEVICE/CLASS/*.png``::

    mmdtl2 extract images study.zarr --model alexnet:conv3 --weights imagenet

conv3 and conv5 in one pass, from a manifest, with local weights on an offline cluster::

    mmdtl2 extract frames.csv study.zarr --model alexnet:conv3,conv5 --weights alexnet.pt
"""

from __future__ import annotations

import argparse

from mmdtl2_dist.commands import add_store_output_options, progress_choice

#: What a Ctrl-C leaves (printed by the CLI).
INTERRUPTED = "its finished shards are kept: the same command resumes from them."


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected R,G,B numbers, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from mmdtl2_dist.extract.model import require_torch

    require_torch()
    from mmdtl2_dist.extract.inputs import read_images
    from mmdtl2_dist.extract.job import ExtractOptions, extract
    from mmdtl2_dist.extract.model import ModelSpec, Preprocessing

    spec = ModelSpec.parse(args.model)
    pre = Preprocessing(args.resize, args.crop, args.mean, args.std)
    opts = ExtractOptions(
        batch_size=args.batch_size,
        shard_rows=args.shard_size,
        skip_bad=args.skip_bad,
        workers=args.workers,
        gpus=args.gpus,
        address=args.address,
        space=args.space,
        overwrite=args.overwrite,
        restart=args.restart,
        compression=args.compression,
        progress=progress_choice(args),
    )
    fs = extract(args.store, read_images(args.images), spec, args.weights, pre, opts)
    if not args.quiet:
        run_ = fs.last_run
        w = fs.provenance["extraction"]["weights"]
        print(f"{fs}\nfingerprint {fs.fingerprint}")
        print(f"weights {w['name']} sha256 {w['sha256']}")
        print(
            f"shards {run_['computed']} computed, {run_['resumed']} resumed, "
            f"{run_['seconds']:.1f} s"
        )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "extract",
        help="CNN features of images (folder or manifest) into a feature store, on Ray",
        description=(
            "Run a torchvision CNN cut at named layers over images and write the features "
            "(float32, one space per layer) to a new feature store. Shards of images run on "
            "Ray workers; a killed run resumes where it stopped (run the same command). "
            "Preprocessing: resize the shorter side, centre crop, ImageNet normalisation."
        ),
        epilog=(
            "inputs: a folder DEVICE/CLASS/IMAGE (DEVICE/IMAGE: unlabelled) or a .csv/.parquet "
            "manifest with columns path, device[, label, class_name, group, sample_id]\n"
            "examples:\n"
            "  mmdtl2 extract images study.zarr --model alexnet:conv3 --weights imagenet\n"
            "  mmdtl2 extract frames.csv study.zarr --model alexnet:conv3,conv5 "
            "--weights alexnet.pt"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("images", help="folder DEVICE/CLASS/IMAGE, or a .csv / .parquet manifest")
    p.add_argument("store", help="directory of the feature store to create")
    p.add_argument(
        "-m",
        "--model",
        default="alexnet:conv3",
        metavar="MODEL:LAYER[,LAYER]",
        help="torchvision model and layer(s) (default alexnet:conv3: 64,896 features; "
        "alexnet:conv5: 43,264; e.g. resnet18:avgpool)",
    )
    p.add_argument(
        "--weights",
        default="imagenet",
        help="imagenet (torchvision's, downloaded once), PATH of a state dict file, or "
        "random:SEED (tests and demos only: meaningless features); default imagenet",
    )
    p.add_argument("--resize", type=int, default=256, help="shorter side after resizing (256)")
    p.add_argument("--crop", type=int, default=224, help="centre crop size (224)")
    p.add_argument(
        "--mean",
        type=_floats,
        default=(0.485, 0.456, 0.406),
        help="R,G,B mean of the input normalisation (default: ImageNet's, 0.485,0.456,0.406)",
    )
    p.add_argument(
        "--std",
        type=_floats,
        default=(0.229, 0.224, 0.225),
        help="R,G,B standard deviation (default: ImageNet's, 0.229,0.224,0.225)",
    )
    p.add_argument("--space", help="name of the feature space (default: the layer's name)")
    p.add_argument("--batch-size", type=int, default=32, help="images per forward pass (32)")
    p.add_argument("--shard-size", type=int, help="images per shard (default: <= 64 MB)")
    p.add_argument("--workers", type=int, help="CPU workers (default: the cluster's CPUs)")
    p.add_argument("--gpus", type=int, default=0, help="run one worker per GPU on N GPUs")
    p.add_argument("--address", help="Ray cluster address (default: a local Ray)")
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="leave unreadable images out (listed in STORE/skipped_images.csv) instead of stopping",
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="discard an unfinished extraction of other inputs for this store",
    )
    add_store_output_options(p)
    p.set_defaults(func=run, interrupted=INTERRUPTED)
