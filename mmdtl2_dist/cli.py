"""The ``mmdtl2`` command line.

Each sub-command lives in a module of :mod:`mmdtl2_dist.commands` that defines
``register(subparsers)``; the module adds its parser and sets ``func`` (a callable taking
the parsed arguments and returning an exit status).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import sys
import warnings
from pathlib import Path

# Order is the order of ``mmdtl2 --help``.
COMMAND_MODULES = [
    "mmdtl2_dist.commands.office",
    "mmdtl2_dist.commands.submit",
    "mmdtl2_dist.commands.ingest",
    "mmdtl2_dist.commands.extract",
    "mmdtl2_dist.commands.synth",
    "mmdtl2_dist.commands.synth_images",
    "mmdtl2_dist.commands.gram",
    "mmdtl2_dist.commands.study",
    "mmdtl2_dist.commands.register",
    "mmdtl2_dist.commands.predict",
    "mmdtl2_dist.commands.serve",
]


#: What an interrupted command leaves, for the commands that write nothing half-done.
INTERRUPTED = "nothing half-written was kept; run the command again."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmdtl2",
        description="MMDTL2 domain adaptation between imaging devices, on Ray.",
    )
    from mmdtl2_dist import __version__

    parser.add_argument("--version", action="version", version=f"mmdtl2-dist {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for p in sub.choices.values():  # what a Ctrl-C leaves, unless the command says more
        if p.get_default("interrupted") is None:
            p.set_defaults(interrupted=INTERRUPTED)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    warnings.formatwarning = _one_line_warning(args.command)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        # Ctrl-C (the commands with more to say, study and office, say it themselves):
        # one line on what is kept, the shell's status for SIGINT.
        print(f"mmdtl2 {args.command}: interrupted; {args.interrupted}", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as exc:
        # User errors: one clear line, no traceback.
        print(f"mmdtl2 {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        from mmdtl2_dist.store.outputs import NO_ROOM

        if exc.errno in NO_ROOM:
            # A full disk or quota: not the user's input, but no bug either; the message
            # names the folder and what to do.
            print(f"mmdtl2 {args.command}: error: {exc}", file=sys.stderr)
            return 1
        why = path_refusal(exc)
        if why is None:
            raise
        print(f"mmdtl2 {args.command}: error: {why}", file=sys.stderr)
        return 2


def _one_line_warning(command: str):
    """``warnings`` shown as ``mmdtl2 COMMAND: warning: ...``, without the source line."""

    def show(message, category, filename, lineno, line=None) -> str:
        return f"mmdtl2 {command}: warning: {message}\n"

    return show


#: Errors of a path the user gave: no permission, a read-only file system, a file where
#: a folder must be (or the reverse).
PATH_ERRNOS = {
    errno.EACCES: "no permission",
    errno.EPERM: "not permitted",
    errno.EROFS: "a read-only file system",
    errno.EEXIST: "a file is in the way of a folder",
    errno.ENOTDIR: "a file is in the way of a folder",
    errno.EISDIR: "a folder where a file must be",
}


def path_refusal(exc: OSError) -> str | None:
    """One line on an unusable path the user gave (None for other errors).

    Names the output, not the hidden sibling it is staged under
    (:mod:`mmdtl2_dist.store.outputs`).
    """
    if exc.errno not in PATH_ERRNOS:
        return None
    if not exc.filename:  # raised by this system with its own message
        return exc.strerror
    path = Path(os.fsdecode(exc.filename))
    staged = re.fullmatch(r"\.(.+)\.(tmp|old)-.+", path.name)
    if staged:
        path = path.parent / staged[1]
    fix = (
        "choose another path"
        if exc.errno in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR)
        else "give a path in a folder you can write to"
    )
    return f"cannot use {path}: {PATH_ERRNOS[exc.errno]} ({exc.strerror}); {fix}."


if __name__ == "__main__":
    sys.exit(main())
