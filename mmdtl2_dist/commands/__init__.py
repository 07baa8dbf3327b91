"""Sub-commands of the ``mmdtl2`` command line (one module each)."""

from __future__ import annotations

import argparse
import re


def help_text(doc: str) -> str:
    """A module docstring as ``--help`` shows it: reStructuredText markup made plain.

    ````x```` becomes ``x``, a line ending in ``::`` ends in ``:``, and a section title's
    underline goes (the title ends in ``:``, as argparse's own headings do).
    """
    text = re.sub(r"``([^`]+)``", r"\1", doc)
    text = re.sub(r"::$", ":", text, flags=re.MULTILINE)
    return re.sub(r"^(\S[^\n]*)\n-{3,}$", r"\1:", text, flags=re.MULTILINE)


def add_progress_option(p: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress``: default, progress lines when stderr is a terminal."""
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress lines (done/total, elapsed, ETA) on stderr; default: only when "
        "stderr is a terminal",
    )


def add_quiet_options(p: argparse.ArgumentParser, silences: str, progress: bool = True) -> None:
    """``-q``/``--quiet`` (no ``silences``) and, unless ``progress`` is False, ``--progress``."""
    p.add_argument("-q", "--quiet", action="store_true", help=f"no {silences}")
    if progress:
        add_progress_option(p)


def add_tracking_uri_option(p: argparse.ArgumentParser, default: str) -> None:
    """``--tracking-uri``; ``default`` says where the command looks without it."""
    p.add_argument("--tracking-uri", default=None, help=f"MLflow tracking URI (default: {default})")


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
    add_quiet_options(p, "progress or summary")


def progress_choice(args: argparse.Namespace) -> bool | None:
    """The progress choice of parsed arguments: ``--quiet`` wins, else ``--[no-]progress``."""
    if getattr(args, "quiet", False):
        return False
    return args.progress


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (else a usage error naming the flag)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
