"""``mmdtl2 gram``: compute the Gram of a feature space on Ray (resumable).

Examples
--------
On a local Ray with all CPUs::

    mmdtl2 gram study.zarr --space conv3 --out grams/conv3 --preprocessing l2_zscore

On a cluster (re-running the same command resumes an interrupted job)::

    mmdtl2 gram study.zarr --space conv3 --out /shared/grams/conv3 --address auto
"""

from __future__ import annotations

import argparse

from mmdtl2_dist.commands import add_progress_option, progress_choice
from mmdtl2_dist.core.preprocessing import PREPROCESSING
from mmdtl2_dist.engine.driver import compute_gram
from mmdtl2_dist.engine.plan import DEFAULT_TASK_MEMORY_MB
from mmdtl2_dist.store.feature_store import FeatureStore


def run(args: argparse.Namespace) -> int:
    space = args.space
    if space is None:
        spaces = FeatureStore.open(args.store).spaces
        if len(spaces) != 1:
            raise ValueError(f"the store has spaces {spaces}; choose one with --space.")
        space = spaces[0]
    gs = compute_gram(
        args.store,
        space,
        args.out,
        preprocessing=args.preprocessing,
        tile_rows=args.tile_rows,
        address=args.address,
        max_task_memory_mb=args.max_task_memory_mb,
        progress=progress_choice(args),
        num_cpus=args.num_cpus,
    )
    if not args.quiet:
        run_info = gs.last_run or {}
        repaired = run_info.get("repaired") or []
        print(
            f"{gs}\ncomputed {run_info.get('computed', 0)} tiles, skipped "
            f"{run_info.get('skipped', 0)}, {run_info.get('seconds', 0.0):.1f} s"
            + (f"; {len(repaired)} damaged part(s) recomputed" if repaired else "")
        )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "gram",
        help="compute the Gram matrix of a feature space on Ray (resumable)",
        description=(
            "Compute the float64 Gram of one feature space over all samples of every device "
            "in it (devices in sorted order), out of core, in Ray tasks. Re-running the "
            "command on a partial output resumes it and skips finished tiles; finished "
            "tiles are first verified, and damaged ones are named and recomputed."
        ),
        epilog="examples:\n  mmdtl2 gram study.zarr --space conv3 --out grams/conv3\n"
        "  mmdtl2 gram study.zarr --space conv3 --out grams/conv3 --address auto",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", help="feature store")
    p.add_argument("--space", help="feature space (optional when the store has one)")
    p.add_argument("--out", required=True, help="Gram store to create or resume")
    p.add_argument(
        "--preprocessing",
        choices=PREPROCESSING,
        default="none",
        help="per-device preprocessing (statistics over all its samples)",
    )
    p.add_argument("--tile-rows", type=int, help="rows per tile (default: up to 2048)")
    p.add_argument("--address", help="Ray cluster address (default: a local Ray)")
    p.add_argument("--num-cpus", type=int, help="CPUs of the local Ray (default: all)")
    p.add_argument(
        "--max-task-memory-mb",
        type=float,
        default=DEFAULT_TASK_MEMORY_MB,
        help=f"memory bound of one task ({DEFAULT_TASK_MEMORY_MB})",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress or summary")
    add_progress_option(p)
    p.set_defaults(func=run)
