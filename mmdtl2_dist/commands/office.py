"""``mmdtl2 office``: the Office-Caltech10 reference protocol on the bundled data."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mmdtl2_dist.commands import add_progress_option, progress_choice


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "office",
        help="run Hoffman et al.'s Office-Caltech10 protocol (12 shifts x 20 splits) "
        "for every method and print the table",
        description="Run the Office-Caltech10 SURF benchmark on the bundled data: 12 shifts, "
        "Hoffman et al.'s 20 fixed splits, 3 labelled target samples per class; print "
        "the study report's table: mean accuracy ± standard deviation over the splits per "
        "shift and method, with one-tailed Welch t-test marks against the source and "
        "target SVM columns.",
    )
    p.add_argument("--trials", type=int, default=20, help="number of splits per shift (1-20)")
    p.add_argument(
        "--shifts",
        nargs="+",
        metavar="SRC-TGT",
        help="subset of shifts, e.g. amazon-webcam dslr-webcam (default: all 12)",
    )
    p.add_argument(
        "--methods",
        nargs="+",
        metavar="LABEL",
        help="subset of columns by label (default: all); see --list",
    )
    p.add_argument("--list", action="store_true", help="list the columns and exit")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default 2)")
    p.add_argument("--out", type=Path, help="write the table (.md) and results (.json) here")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    add_progress_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mmdtl2_dist.datasets.office_caltech import DOMAINS, SHIFTS
    from mmdtl2_dist.office import DEFAULT_COLUMNS, format_table, run_protocol

    if args.list:
        for c in DEFAULT_COLUMNS:
            print(f"{c.label!r}: method={c.method} params={c.params}")
        return 0
    if not 1 <= args.trials <= 20:
        raise ValueError(f"--trials must be between 1 and 20, got {args.trials}.")
    shifts = SHIFTS
    if args.shifts:
        shifts = []
        for s in args.shifts:
            parts = s.split("-")
            if len(parts) != 2 or parts[0] not in DOMAINS or parts[1] not in DOMAINS:
                raise ValueError(f"bad shift {s!r}; use SRC-TGT with domains from {DOMAINS}.")
            shifts.append((parts[0], parts[1]))
    columns = DEFAULT_COLUMNS
    if args.methods:
        labels = {c.label: c for c in DEFAULT_COLUMNS}
        bad = [m for m in args.methods if m not in labels]
        if bad:
            raise ValueError(f"unknown column(s) {bad}; choose from {list(labels)}.")
        columns = tuple(labels[m] for m in args.methods)
    result = run_protocol(
        columns, shifts, range(args.trials), workers=args.workers, progress=progress_choice(args)
    )
    table = format_table(result)
    print(table)
    print(f"\n{len(shifts)} shifts x {args.trials} splits, {result['wall_s']:.0f} s wall time.")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "office_caltech10.md").write_text(table + "\n")
        serial = {
            "columns": result["columns"],
            "wall_s": result["wall_s"],
            "acc": {f"{s}-{t}|{lab}": v for ((s, t), lab), v in result["acc"].items()},
            "chosen": {f"{s}-{t}|{lab}": v for ((s, t), lab), v in result["chosen"].items()},
            "mean_fit_time_s": {k: sum(v) / len(v) for k, v in result["fit_time"].items()},
        }
        (args.out / "office_caltech10.json").write_text(json.dumps(serial, indent=1))
    return 0
