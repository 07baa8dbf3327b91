"""``mmdtl2 gram``: compute the Gram of a feature space on Ray (resumable, shared).

The Gram goes to the store's Gram folder (``<store>.grams`` beside the store, or
``--gram-dir``), named by its key (store content, space, preprocessing), where every study
on that store finds it: compute it once, on the cluster, and studies only slice it.

Examples
--------
On a local Ray with all CPUs (the Gram a study with ``preprocessing = "l2_zscore"`` uses)::

    mmdtl2 gram study.zarr --space conv3

On a cluster (re-running the same command resumes an interrupted job)::

    mmdtl2 gram /shared/study.zarr --space conv3 --address auto

On GPUs (torch), in mixed precision (float32 products, float64 sums)::

    mmdtl2 gram /shared/study.zarr --space conv3 --address auto --gpus 4 --precision mixed
"""

from __future__ import annotations

import argparse

from mmdtl2_dist.commands import add_quiet_options, progress_choice
from mmdtl2_dist.core.preprocessing import DEFAULT_PREPROCESSING, PREPROCESSING
from mmdtl2_dist.engine.driver import compute_gram
from mmdtl2_dist.engine.plan import DEFAULT_TASK_MEMORY_MB
from mmdtl2_dist.engine.products import PRECISIONS
from mmdtl2_dist.store.feature_store import FeatureStore

#: What a Ctrl-C leaves (printed by the CLI).
INTERRUPTED = "its finished tiles are kept: the same command resumes from them."


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
        gram_dir=args.gram_dir,
        preprocessing=args.preprocessing,
        precision=args.precision,
        tile_rows=args.tile_rows,
        feature_parts=args.feature_parts,
        address=args.address,
        max_task_memory_mb=args.max_task_memory_mb,
        progress=progress_choice(args),
        num_cpus=args.num_cpus,
        gpus=args.gpus,
        device=args.device,
    )
    if not args.quiet:
        run_info = gs.last_run or {}
        repaired = run_info.get("repaired") or []
        how = "reused the complete Gram: " if gs.reused else ""
        print(
            f"{gs}\n{how}computed {run_info.get('computed', 0)} tiles"
            + (f" ({parts} feature parts)" if (parts := run_info.get("parts_computed")) else "")
            + f", skipped {run_info.get('skipped', 0)}, {run_info.get('seconds', 0.0):.1f} s"
            + (f"; {len(repaired)} damaged part(s) recomputed" if repaired else "")
        )
        if args.out is None:
            print(_study_hint(gs, args.gram_dir is not None))
    return 0


def _study_hint(gs, own_gram_dir: bool) -> str:
    """Which studies find this Gram (the spec values that select it)."""
    where = f' and gram_dir = "{gs.path.parent}" in [data]' if own_gram_dir else ""
    return (
        f"key {gs.key}: a study on this store with preprocessing = "
        f'"{gs.preprocessing}"{where} reuses it'
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "gram",
        help="compute the Gram matrix of a feature space on Ray (resumable, shared by studies)",
        description=(
            "Compute the float64 Gram of one feature space over all samples of every device "
            "in it (devices in sorted order), out of core, in Ray tasks. The Gram is kept in "
            "the store's Gram folder (<store>.grams beside the store, or --gram-dir) under "
            "its key <space>__<preprocessing>__<store fingerprint>, where every study on the "
            "same store content finds and reuses it. Re-running the command resumes a "
            "partial Gram and skips finished tiles; finished tiles are first verified, and "
            "damaged ones are named and recomputed."
        ),
        epilog="examples:\n  mmdtl2 gram study.zarr --space conv3\n"
        "  mmdtl2 gram /shared/study.zarr --space conv3 --address auto\n"
        "  mmdtl2 gram study.zarr --space conv3 --gram-dir /shared/grams",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", help="feature store")
    p.add_argument("--space", help="feature space (optional when the store has one)")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--gram-dir",
        help="Gram folder, one Gram per key (default: <store>.grams beside the store); a "
        "study finds the Gram there with [data] gram_dir",
    )
    where.add_argument(
        "--out", help="an exact Gram folder to create or resume instead (studies do not look there)"
    )
    p.add_argument(
        "--preprocessing",
        choices=PREPROCESSING,
        default=DEFAULT_PREPROCESSING,
        help="per-device preprocessing, statistics over all its samples (default "
        f"{DEFAULT_PREPROCESSING}, a study's default); a study uses the Gram of its own",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="float64",
        help="float64: the exact Gram (default); mixed: float32 block products summed in "
        "float64 (faster; relative error about 1e-7 on nonnegative features, bounded in "
        "the engine's docs); a mixed Gram has its own key and is never used as the exact one",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=0,
        help="run tiles on GPUs with torch, one GPU per tile task (a local Ray gets this "
        "many GPUs); needs pip install '.[images]'",
    )
    p.add_argument(
        "--device",
        help="torch device of the tiles: cuda, cuda:N, or cpu (torch on the CPU); default "
        "numpy on the CPU, or cuda with --gpus",
    )
    p.add_argument(
        "--tile-rows",
        type=int,
        help="rows per tile (default: up to 2048 that fit --max-task-memory-mb; on a GPU up "
        "to 16384, 5888 at the default 1 GB)",
    )
    p.add_argument(
        "--feature-parts",
        type=int,
        help="split each tile's features into this many tasks, summed in order (default: "
        "1, or enough for every worker when there are fewer tiles than workers)",
    )
    p.add_argument("--address", help="Ray cluster address (default: a local Ray)")
    p.add_argument("--num-cpus", type=int, help="CPUs of the local Ray (default: all)")
    p.add_argument(
        "--max-task-memory-mb",
        type=float,
        default=DEFAULT_TASK_MEMORY_MB,
        help=f"host memory bound of one task ({DEFAULT_TASK_MEMORY_MB}); a GPU tile's "
        "accumulator is on the GPU, so the same budget allows larger GPU tiles",
    )
    add_quiet_options(p, "progress or summary")
    p.set_defaults(func=run, interrupted=INTERRUPTED)
