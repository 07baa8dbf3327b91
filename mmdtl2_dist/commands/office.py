"""``mmdtl2 office``: the Office-Caltech10 reference protocol on the bundled data.

A study (:func:`mmdtl2_dist.office.office_spec`) run on the local executor: the same
runner, trials and report as ``mmdtl2 study run --executor local``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from mmdtl2_dist.commands import add_quiet_options, positive_int, progress_choice


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "office",
        help="run Hoffman et al.'s Office-Caltech10 protocol (12 shifts x 20 splits) "
        "for every method and print the table",
        description="Run the Office-Caltech10 SURF benchmark on the bundled data: 12 shifts, "
        "Hoffman et al.'s 20 fixed splits, 3 labelled target samples per class, as a "
        "study on the local executor (worker processes, no Ray); print the study "
        "report's table (mean accuracy ± standard deviation over the splits per shift "
        "and method, with one-tailed Welch t-test marks against the source and target "
        "SVM columns).",
    )
    p.add_argument(
        "--trials", type=int, default=None, help="number of splits per shift (1-20; default all)"
    )
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
    p.add_argument(
        "--workers", type=positive_int, default=None, help="worker processes (default: all CPUs)"
    )
    p.add_argument(
        "--out",
        type=Path,
        help="write the table (.md) and per-split results (.json) here, and keep the "
        "study folder in OUT/study (MLflow runs included; `mmdtl2 study report` and "
        "`resume` work on it); default: the study runs in a temporary folder",
    )
    add_quiet_options(p, "progress lines")
    p.set_defaults(func=run)


def _shifts(args: argparse.Namespace) -> list[tuple[str, str]]:
    from mmdtl2_dist.datasets.office_caltech import DOMAINS, SHIFTS

    if not args.shifts:
        return list(SHIFTS)
    shifts = []
    for s in args.shifts:  # SRC-TGT, or SRC->TGT as the tables print it
        parts = s.replace("->", "-").split("-")
        if len(parts) != 2 or parts[0] not in DOMAINS or parts[1] not in DOMAINS:
            raise ValueError(
                f"bad shift {s!r}; use SRC-TGT (or 'SRC->TGT', quoted) with domains from {DOMAINS}."
            )
        shifts.append((parts[0], parts[1]))
    return shifts


def _count(n: int, word: str) -> str:
    """``n word``, the word plural unless ``n`` is 1."""
    return f"{n} {word}{'s' * (n != 1)}"


def run(args: argparse.Namespace) -> int:
    from mmdtl2_dist.datasets.office_caltech import N_TRIALS
    from mmdtl2_dist.office import (
        COLUMNS,
        columns_named,
        office_results,
        office_spec,
        run_office,
        study_folder,
    )
    from mmdtl2_dist.study.interrupt import StudyInterrupted

    if args.list:
        for c in COLUMNS:
            extra = {k: c[k] for k in ("params", "select", "unlabelled") if k in c}
            print(f"{c['label']!r}: method={c['method']} {extra}")
        return 0
    columns, shifts = columns_named(args.methods), _shifts(args)
    n_splits = N_TRIALS if args.trials is None else args.trials
    with study_folder(args.out) as folder:
        spec = office_spec(columns, shifts, n_splits, output=folder)
        try:
            rep = run_office(
                spec,
                workers=args.workers,
                track=args.out is not None,
                progress=progress_choice(args),
            )
        except StudyInterrupted as exc:
            _say_stopped(exc, kept=args.out is not None)
            return exc.exit_code
        results = office_results(spec)
    wall = rep["timing"]["study_wall_s"]
    print(rep["summary"])
    runs = f"{_count(len(shifts), 'shift')} x {_count(n_splits, 'split')}"
    print(f"\n{runs}, {wall:.0f} s wall time.")
    if args.out:
        (args.out / "office_caltech10.md").write_text(rep["summary"] + "\n")
        serial = {"columns": results["columns"], "wall_s": wall, **results}
        (args.out / "office_caltech10.json").write_text(json.dumps(serial, indent=1))
    return 0


def _say_stopped(exc, *, kept: bool) -> None:
    """Where a stopped office run stands, and how to go on."""
    if kept and exc.resumable:
        resume = shlex.join(["mmdtl2", "study", "resume", str(exc.output), "--executor", "local"])
        hint = f"Its study goes on with:\n    {resume}"
    else:
        hint = "Run the same command again (add --out DIR to keep a resumable study)."
    print(f"mmdtl2 office: {exc}.\n{hint}", file=sys.stderr)
