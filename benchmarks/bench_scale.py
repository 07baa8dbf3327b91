"""Computation time of MMDTL2 and the scale envelope (issue 7; paper Figure 8).

Seeded; each study prints a table and writes ``benchmarks/results/scale_<study>_<preset>.json``
(``figure8`` also ``scale_figure8_<preset>.png``). All logic is in
:mod:`mmdtl2_dist.bench`; ``mmdtl2 bench`` runs the same code.

Usage::

    python benchmarks/bench_scale.py                       # full set, every study (~20 min)
    python benchmarks/bench_scale.py --only figure8        # one study
    python benchmarks/bench_scale.py --preset quick        # = mmdtl2 bench (< 5 min)
    python benchmarks/bench_scale.py --only wstep --threads 2
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from mmdtl2_dist.bench import PRESETS, STUDIES, run_benchmarks  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="full")
    ap.add_argument("--only", help=f"comma-separated among {STUDIES}")
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads per run (1)")
    ap.add_argument("--mem-limit-gb", type=float, default=10.0)
    ap.add_argument("--workdir", default="/tmp/mmdtl2_bench")
    ap.add_argument("--prefix", default="scale", help="JSON/PNG name prefix (scale)")
    args = ap.parse_args()
    studies = STUDIES if not args.only else tuple(args.only.split(","))
    run_benchmarks(
        args.preset,
        studies=studies,
        out_dir=HERE / "results",
        workdir=args.workdir,
        mem_limit_gb=args.mem_limit_gb,
        threads=args.threads,
        prefix=args.prefix,
    )


if __name__ == "__main__":
    main()
