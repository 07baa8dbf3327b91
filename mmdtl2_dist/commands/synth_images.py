"""``mmdtl2 synth-images``: write a seeded synthetic two-device image set (PNG files).

Example: 3 texture classes, 20 source and 10 target images per class, then features::

    mmdtl2 synth-images images
    mmdtl2 extract images demo.zarr --model alexnet:conv3 --weights imagenet
"""

from __future__ import annotations

import argparse

from mmdtl2_dist.commands import add_quiet_options
from mmdtl2_dist.extract.synthetic import ImageSetSpec


def run(args: argparse.Namespace) -> int:
    from mmdtl2_dist.extract.synthetic import make_image_set

    spec = ImageSetSpec(
        n_source=args.n_source,
        n_target=args.n_target,
        n_classes=args.classes,
        size=args.size,
        blur=args.blur,
        seed=args.seed,
        source_device=args.source_device,
        target_device=args.target_device,
    )
    out = make_image_set(args.folder, spec, overwrite=args.overwrite)
    n = (spec.n_source + spec.n_target) * spec.n_classes
    if not args.quiet:
        print(f"{n} images in {out}/{{{spec.source_device},{spec.target_device}}}/CLASS/*.png")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "synth-images",
        help="write a seeded synthetic two-device image set (textures; colour + blur shift)",
        description=(
            "Write PNG texture patches of a few classes as seen by two devices: the target "
            "device mixes and shifts the colours and blurs. Folder layout "
            "FOLDER/DEVICE/CLASS/K.png, ready for `mmdtl2 extract`."
        ),
    )
    d = ImageSetSpec()
    p.add_argument("folder", help="folder to create")
    p.add_argument(
        "--n-source", type=int, default=d.n_source, help=f"source images per class ({d.n_source})"
    )
    p.add_argument(
        "--n-target", type=int, default=d.n_target, help=f"target images per class ({d.n_target})"
    )
    p.add_argument(
        "--classes", type=int, default=d.n_classes, help=f"number of classes ({d.n_classes})"
    )
    p.add_argument("--size", type=int, default=d.size, help=f"image side in pixels ({d.size})")
    p.add_argument("--blur", type=float, default=d.blur, help=f"target blur radius ({d.blur} px)")
    p.add_argument("--seed", type=int, default=d.seed, help=f"random seed ({d.seed})")
    p.add_argument(
        "--source-device", default=d.source_device, help=f"source device name ({d.source_device})"
    )
    p.add_argument(
        "--target-device", default=d.target_device, help=f"target device name ({d.target_device})"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an image set it wrote")
    add_quiet_options(p, "summary line", progress=False)
    p.set_defaults(func=run)
