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


def add_store_output_options(p: argparse.ArgumentParser) -> None:
    """Compression, overwrite, quiet and progress: the options of a feature store writer."""
    p.add_argument(
        "--compression",
        choices=["none", "zstd"],
        default="none",
        help="chunk compression (a CRC32C checksum is always stored)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing feature store (nothing else is ever replaced)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress or summary")
    add_progress_option(p)


def progress_choice(args: argparse.Namespace) -> bool | None:
    """The progress choice of parsed arguments: ``--quiet`` wins, else ``--[no-]progress``."""
    if getattr(args, "quiet", False):
        return False
    return args.progress
