"""The ``mmdtl2`` command line.

Each sub-command lives in a module of :mod:`mmdtl2_dist.commands` that defines
``register(subparsers)``; the module adds its parser and sets ``func`` (a callable taking
the parsed arguments and returning an exit status).
"""

from __future__ import annotations

import argparse
import importlib
import os
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
    env_before = os.environ.get("MLFLOW_LOGGING_LEVEL")
    if getattr(args, "quiet", False) and env_before is None:  # MLflow's INFO lines too,
        os.environ["MLFLOW_LOGGING_LEVEL"] = "WARNING"  # here and in the workers
    shown_before = warnings.formatwarning
    warnings.formatwarning = _one_line_warning(args.command, shown_before)
    try:
        status = int(args.func(args) or 0)
        if sys.stdout is not None:  # None when started with stdout closed
            sys.stdout.flush()  # here, where a reader gone away is caught, not at exit
        return status
    except KeyboardInterrupt:
        # Ctrl-C (the commands with more to say, study and office, say it themselves):
        # one line on what is kept, the shell's status for SIGINT.
        print(f"mmdtl2 {args.command}: interrupted; {args.interrupted}", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as exc:
        # User errors: one clear line, no traceback.
        print(f"mmdtl2 {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        # The reader of our output went away (`| head`): stop quietly, as a shell tool
        # does on SIGPIPE; stdout goes to /dev/null so that its last flush cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except OSError as exc:
        from mmdtl2_dist.store.outputs import NO_ROOM

        if exc.errno not in NO_ROOM:
            raise
        # A full disk or quota: not the user's input, but no bug either; the message
        # names the folder and what to do.
        print(f"mmdtl2 {args.command}: error: {exc}", file=sys.stderr)
        return 1
    finally:
        warnings.formatwarning = shown_before
        if env_before is None:
            os.environ.pop("MLFLOW_LOGGING_LEVEL", None)


def _stdout_reader_gone() -> bool:
    """Whether stdout's reader has gone (a pipe: poll's error; a socket: its hang-up)."""
    import select

    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _one_line_warning(command: str, other):
    """A ``warnings`` formatter: mmdtl2's own as ``mmdtl2 COMMAND: warning: ...``.

    Their source line says nothing to a user; other libraries' warnings are formatted by
    ``other``.
    """
    package = Path(__file__).resolve().parent

    def show(message, category, filename, lineno, line=None) -> str:
        if category is UserWarning and Path(filename).resolve().is_relative_to(package):
            return f"mmdtl2 {command}: warning: {message}\n"
        return other(message, category, filename, lineno, line)

    return show


if __name__ == "__main__":
    sys.exit(main())
