"""``mmdtl2 serve``: serve a registered adapter over HTTP with request limits.

Example
-------
On loopback, two workers, requests up to 32 MB::

    mmdtl2 serve --model models:/polyp-adapter@champion --port 5001

Then ``curl -s http://127.0.0.1:5001/invocations -H 'Content-Type: application/json'
-d '{"inputs": [[...]]}'``. What is accepted and refused: :mod:`mmdtl2_dist.deploy.serve`.
"""

from __future__ import annotations

import argparse

from mmdtl2_dist.commands import add_tracking_uri_option
from mmdtl2_dist.deploy.serve import DEFAULTS


def run(args: argparse.Namespace) -> int:
    from mmdtl2_dist.deploy.serve import serve

    serve(
        args.model,
        tracking_uri=args.tracking_uri,
        host=args.host,
        port=args.port,
        workers=args.workers,
        max_bytes=int(args.max_request_mb * 2**20),
        max_rows=args.max_rows,
        timeout=args.timeout,
        limit_concurrency=args.limit_concurrency,
    )
    return 0


def _port(text: str) -> int:
    """A TCP port number (an argparse type: a wrong one is a usage error, exit 2)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0-65535)")
    return port


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a registered adapter over HTTP (loopback by default, with request limits)",
        description=(
            "Serve an adapter logged by `mmdtl2 register` with MLflow's scoring app: "
            'POST /invocations takes JSON rows of raw target features ({"inputs": [[...]]} '
            "or dataframe_split) and answers classes and scores; /ping and /health answer "
            "when the model is loaded. Requests over --max-request-mb or --max-rows get 413, "
            "values that "
            "are not numbers (strings, booleans) or a wrong feature count 400, scoring over "
            "--timeout seconds 504."
        ),
        epilog=(
            "example:\n"
            "  mmdtl2 serve --model models:/office-adapter@champion --port 5001\n"
            "Bind to another address than 127.0.0.1 only behind a proxy that authenticates "
            "clients (docs/deploy.md, 'Serve')."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = DEFAULTS
    p.add_argument("--model", required=True, help="model URI, e.g. models:/NAME@champion")
    p.add_argument("--host", default=d["host"], help=f"address to bind (default {d['host']})")
    p.add_argument(
        "-p", "--port", type=_port, default=d["port"], help=f"port, 0-65535 (default {d['port']})"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=d["workers"],
        help=f"server processes, each with the model (default {d['workers']})",
    )
    mb = d["max_bytes"] / 2**20
    p.add_argument(
        "--max-request-mb",
        type=float,
        default=mb,
        help=f"largest request body in MiB (default {mb:g}: about 25 rows of 64,896 features)",
    )
    p.add_argument(
        "--max-rows",
        type=int,
        default=d["max_rows"],
        help=f"most rows (samples) in one request (default {d['max_rows']:,})",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=d["timeout"],
        help=f"seconds to receive and score one request (default {d['timeout']:g})",
    )
    p.add_argument(
        "--limit-concurrency",
        type=int,
        default=d["limit_concurrency"],
        help=f"open connections per worker before 503 (default {d['limit_concurrency']})",
    )
    add_tracking_uri_option(p, "MLFLOW_TRACKING_URI")
    p.set_defaults(func=run)
