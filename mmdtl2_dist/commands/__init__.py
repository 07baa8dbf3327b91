"""Sub-commands of the ``mmdtl2`` command line (one module each)."""

from __future__ import annotations

import argparse


def add_progress_option(p: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress``: default, progress lines when stderr is a terminal."""
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress lines (done/total, elapsed, ETA) on stderr; default: only when "
        "stderr is a terminal",
    )


def progress_choice(args: argparse.Namespace) -> bool | None:
    """The progress choice of parsed arguments: ``--quiet`` wins, else ``--[no-]progress``."""
    if getattr(args, "quiet", False):
        return False
    return args.progress
