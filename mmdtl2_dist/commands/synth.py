"""``mmdtl2 synth``: write a seeded synthetic two-device study to a feature store.

Examples
--------
The paper's sizes (734 source, 279 target, 64,896-d conv3)::

    mmdtl2 synth paper.zarr --seed 0

A heterogeneous pair (target in a 43,264-d conv5 space) and a larger source::

    mmdtl2 synth big.zarr --n-source 20000 --target-dim 43264
"""

from __future__ import annotations

import argparse

from mmdtl2_dist.commands import add_quiet_options, progress_choice
from mmdtl2_dist.store.synthetic import SyntheticSpec, make_synthetic_store


def run(args: argparse.Namespace) -> int:
    spec = SyntheticSpec(
        n_source=args.n_source,
        n_target=args.n_target,
        n_classes=args.classes,
        dim=args.dim,
        target_dim=args.target_dim,
        shift=args.shift,
        class_sep=args.class_sep,
        n_groups=args.groups,
        noise=args.noise,
        seed=args.seed,
        source_device=args.source_device,
        target_device=args.target_device,
        space=args.space,
        target_space=args.target_space,
    )
    fs = make_synthetic_store(
        args.store,
        spec,
        overwrite=args.overwrite,
        chunk_rows=args.chunk_rows,
        progress=progress_choice(args),
    )
    if not args.quiet:
        print(f"{fs}\nfingerprint {fs.fingerprint}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "synth",
        help="write seeded synthetic CNN-like features of two devices to a feature store",
        description=(
            "Seeded synthetic conv-like features (sparse, non-negative, low-rank class "
            "structure, controllable device shift), written shard by shard."
        ),
        epilog="examples:\n  mmdtl2 synth paper.zarr --seed 0\n"
        "  mmdtl2 synth big.zarr --n-source 20000 --target-dim 43264",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", help="directory of the feature store to create")
    d = SyntheticSpec()  # the Python API's defaults are the command's
    p.add_argument(
        "--n-source", type=int, default=d.n_source, help=f"source samples ({d.n_source})"
    )
    p.add_argument(
        "--n-target", type=int, default=d.n_target, help=f"target samples ({d.n_target})"
    )
    p.add_argument("--classes", type=int, default=d.n_classes, help=f"classes ({d.n_classes})")
    p.add_argument("--dim", type=int, default=d.dim, help=f"shared space dimension ({d.dim})")
    p.add_argument("--target-dim", type=int, help="give the target its own space of this size")
    p.add_argument(
        "--shift", type=float, default=d.shift, help=f"device shift, 0 = none ({d.shift})"
    )
    p.add_argument(
        "--class-sep",
        type=float,
        default=d.class_sep,
        help=f"class separation ({d.class_sep}: the source device decides the result; "
        "from about 0.8 every method scores 97-100 %%)",
    )
    p.add_argument(
        "--groups",
        type=int,
        default=d.n_groups,
        help=f"groups (patients) per device ({d.n_groups})",
    )
    p.add_argument("--noise", type=float, default=d.noise, help=f"feature noise ({d.noise})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"random seed ({d.seed})")
    p.add_argument(
        "--source-device", default=d.source_device, help=f"source device name ({d.source_device})"
    )
    p.add_argument(
        "--target-device", default=d.target_device, help=f"target device name ({d.target_device})"
    )
    p.add_argument("--space", default=d.space, help=f"name of the shared space ({d.space})")
    p.add_argument(
        "--target-space",
        default=d.target_space,
        help=f"name of the target's own space ({d.target_space})",
    )
    p.add_argument(
        "--chunk-rows",
        type=int,
        help="rows per chunk (default: 256, more until a chunk holds 1 MiB)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a feature store it wrote")
    add_quiet_options(p, "progress or summary")
    p.set_defaults(func=run)
