"""``mmdtl2 bench``: the computation-time benchmarks (paper Figure 8, solvers, end to end).

Examples
--------
The quick subset (under 5 minutes on 2 cores; results in ``benchmarks/results``)::

    mmdtl2 bench

One study of the full set (the others: ``wstep``, ``svm``, ``e2e``)::

    mmdtl2 bench --preset full --only figure8
"""

from __future__ import annotations

import argparse

from mmdtl2_dist.bench import PRESETS, STUDIES, _print, run_benchmarks


def run(args: argparse.Namespace) -> int:
    studies = STUDIES if not args.only else tuple(s.strip() for s in args.only.split(","))
    run_benchmarks(
        args.preset,
        studies=studies,
        out_dir=args.out,
        workdir=args.workdir,
        mem_limit_gb=args.mem_limit_gb,
        threads=args.threads,
        isolate=not args.in_process,
        log=(lambda *a, **k: None) if args.quiet else _print,
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="run the computation-time benchmarks (quick subset by default)",
        description=(
            "Training time and peak memory versus feature dimension (primal QP, explicit-W "
            "MMDT, dual MMDTL2), the W-step and SVM-step solvers, and a paper-scale run "
            "from a Zarr store. Every run is a fresh process (its own peak memory); runs "
            "whose memory estimate exceeds --mem-limit-gb are reported, not started. "
            "Prints tables and writes <out>/scale_<study>_<preset>.json and a PNG plot."
        ),
        epilog="examples:\n  mmdtl2 bench\n  mmdtl2 bench --preset full --only figure8,wstep",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="quick",
        help="quick (< 5 min, default), full (the BENCHMARKS.md tables, ~30 min), tiny (test)",
    )
    p.add_argument("--only", help=f"comma-separated studies among {', '.join(STUDIES)}")
    p.add_argument("--out", default="benchmarks/results", help="folder of the JSON and PNG")
    p.add_argument("--workdir", help="folder of the synthetic Zarr store (default: $TMPDIR)")
    p.add_argument(
        "--mem-limit-gb",
        type=float,
        default=10.0,
        help="do not start runs estimated above this (10)",
    )
    p.add_argument("--threads", type=int, default=1, help="BLAS threads of each run (1)")
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run every task in this process (smoke test; peak memory is not per run)",
    )
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=run)
