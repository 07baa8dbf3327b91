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

from mmdtl2_dist.store.synthetic import (
    CONV3_DIM,
    PAPER_SOURCE,
    PAPER_TARGET,
    SyntheticSpec,
    make_synthetic_store,
)


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
        progress=not args.quiet,
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
    p.add_argument("--n-source", type=int, default=PAPER_SOURCE, help="source samples (734)")
    p.add_argument("--n-target", type=int, default=PAPER_TARGET, help="target samples (279)")
    p.add_argument("--classes", type=int, default=3, help="number of classes (3)")
    p.add_argument("--dim", type=int, default=CONV3_DIM, help="shared space dimension (64896)")
    p.add_argument("--target-dim", type=int, help="give the target its own space of this size")
    p.add_argument("--shift", type=float, default=1.0, help="device shift, 0 = none (1.0)")
    p.add_argument("--class-sep", type=float, default=1.5, help="class separation (1.5)")
    p.add_argument("--groups", type=int, default=40, help="groups (patients) per device (40)")
    p.add_argument("--noise", type=float, default=0.5, help="feature noise (0.5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--source-device", default="source")
    p.add_argument("--target-device", default="target")
    p.add_argument("--space", default="conv3", help="name of the shared space (conv3)")
    p.add_argument("--target-space", default="conv5", help="name of the target's own space")
    p.add_argument("--chunk-rows", type=int, help="rows per chunk")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=run)
