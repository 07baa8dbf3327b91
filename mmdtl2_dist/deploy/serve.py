"""``mmdtl2 serve``: a registered adapter behind an HTTP endpoint, with limits.

``mlflow models serve`` runs ``uvicorn mlflow.pyfunc.scoring_server.app:app`` with one
worker, no limit on the size of a request body, a JSON reader that turns ``true`` and
``"1.5"`` into floats without a word (``np.array(rows, dtype=float64)`` under the float64
signature), and error messages that repeat a malformed body in full. This module serves
the same pyfunc model with MLflow's scoring app for everything but ``POST
/invocations``, which it answers itself:

- a body over ``max_bytes`` gets 413 before it is read (``Content-Length``) or as soon as
  a streamed body passes the limit; a body not received within ``timeout`` seconds, 408;
- JSON only, ``{"inputs": rows}``, ``{"instances": rows}`` or ``{"dataframe_split":
  {"columns": [...], "data": rows}}``, read strictly: every value a JSON number, anything
  else (a string, a boolean) a 400 that names its row and column
  (:func:`~mmdtl2_dist.core.adapter.as_numeric_array`); ``null`` is a missing value,
  reported by row with NaN and Inf; malformed JSON a 400 with the parser's position,
  never the body; more than ``max_rows`` rows a 413 before any conversion;
- a wrong feature count, a 400 naming both counts;
- the predictions are the pyfunc model's, in MLflow's response format; reading and
  scoring run in a thread so that ``/ping`` stays answered, and a request that takes more
  than ``timeout`` seconds gets 504.

The server is uvicorn with ``workers`` processes (each loads the model; one slow request
holds one of them) and at most ``limit_concurrency`` connections per worker (503 beyond).
Together with ``max_bytes`` that bounds the memory of a worker: a body being parsed takes
up to about ten times its size (a Python float per JSON number), beside the model itself
(an adapter that smooths holds its U unlabelled samples, and scores 1,024 rows at a time
against them). The settings reach the
worker processes in the environment variables of :data:`ENV`;
:mod:`mmdtl2_dist.deploy.serve_app` builds the app from them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
from dataclasses import dataclass
from io import StringIO

from mmdtl2_dist.core.adapter import check_scoring_input

#: Environment variables that carry the served configuration to uvicorn's workers.
ENV = {
    "model_path": "MMDTL2_SERVE_MODEL_PATH",
    "max_bytes": "MMDTL2_SERVE_MAX_BYTES",
    "timeout": "MMDTL2_SERVE_TIMEOUT",
    "max_rows": "MMDTL2_SERVE_MAX_ROWS",
    "server_pid": "MMDTL2_SERVE_PID",
}
#: Request keys read by ``POST /invocations``; the value of each holds the rows.
ROW_KEYS = ("inputs", "instances", "dataframe_split")


class RequestError(Exception):
    """A request the server refuses: HTTP status and message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Limits:
    """What one request may take."""

    max_bytes: int
    timeout: float
    max_rows: int

    @classmethod
    def from_env(cls) -> Limits:
        env = os.environ
        return cls(
            int(env[ENV["max_bytes"]]), float(env[ENV["timeout"]]), int(env[ENV["max_rows"]])
        )

    def to_env(self) -> dict[str, str]:
        return {ENV[k]: str(getattr(self, k)) for k in ("max_bytes", "timeout", "max_rows")}


def request_rows(body: bytes):
    """The rows of a JSON request body (see the module docstring), not yet converted."""
    try:
        payload = json.loads(body)
    except UnicodeDecodeError as exc:
        raise RequestError(400, f"the request body is not UTF-8 text ({exc.reason}).") from exc
    except json.JSONDecodeError as exc:
        raise RequestError(
            400,
            f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column "
            f'{exc.colno}; send {{"inputs": [[...], ...]}} with one row of numbers per sample.',
        ) from exc
    keys = sorted(payload) if isinstance(payload, dict) else []
    if len(keys) != 1 or keys[0] not in ROW_KEYS:
        got = f"keys {keys}" if isinstance(payload, dict) else f"a JSON {type(payload).__name__}"
        raise RequestError(
            400,
            f"expected a JSON object with one of the keys {list(ROW_KEYS)}, got {got}; send "
            '{"inputs": [[...], ...]} with one row of numbers per sample.',
        )
    rows = payload[keys[0]]
    if keys[0] == "dataframe_split":
        if not isinstance(rows, dict) or "data" not in rows:
            raise RequestError(
                400, 'dataframe_split needs a "data" list of rows (and optionally "columns").'
            )
        columns, rows = rows.get("columns"), rows["data"]
        if columns is not None and isinstance(rows, list) and rows and isinstance(rows[0], list):
            if len(columns) != len(rows[0]):
                raise RequestError(
                    400, f"dataframe_split has {len(columns)} columns but rows of {len(rows[0])}."
                )
    if not isinstance(rows, list):
        where = 'dataframe_split\'s "data"' if keys[0] == "dataframe_split" else repr(keys[0])
        raise RequestError(
            400,
            f"the request's {where} is a JSON {type(rows).__name__}, not a list of rows; "
            'send {"inputs": [[...], ...]} with one row of numbers per sample.',
        )
    if not rows:
        raise RequestError(400, "the request holds no rows; send a non-empty list of rows.")
    return rows


def score_request(model, body: bytes, n_features: int, feature_space: str, max_rows: int) -> str:
    """The JSON response of ``POST /invocations`` for ``body`` (MLflow's format)."""
    from mlflow.exceptions import MlflowException
    from mlflow.pyfunc.scoring_server import predictions_to_json

    rows = request_rows(body)
    if len(rows) > max_rows:
        raise RequestError(
            413,
            f"the request has {len(rows):,} rows, over the server's limit of {max_rows:,} per "
            "request; send fewer rows per request, or score files with `mmdtl2 predict`.",
        )
    try:
        X = check_scoring_input(rows, n_features, "the request", f"the model ({feature_space})")
    except ValueError as exc:
        raise RequestError(400, str(exc)) from exc
    try:
        predictions = model.predict(X)
    except MlflowException as exc:
        raise RequestError(exc.get_http_status_code(), exc.message) from exc
    out = StringIO()
    predictions_to_json(predictions, out)
    return out.getvalue()


async def _read_body(receive, max_bytes: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestError(400, "the client disconnected before sending the whole body.")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise RequestError(413, _too_large(max_bytes))
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(max_bytes: int) -> str:
    return (
        f"the request body exceeds the server's limit of {max_bytes:,} bytes; send fewer rows "
        "per request, or score files in batches with `mmdtl2 predict`."
    )


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_json(send, status: int, body: str) -> None:
    data = body.encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def _error_json(status: int, message: str) -> str:
    codes = {400: "INVALID_PARAMETER_VALUE", 408: "REQUEST_TIMEOUT", 413: "REQUEST_TOO_LARGE"}
    codes |= {415: "UNSUPPORTED_MEDIA_TYPE", 504: "DEADLINE_EXCEEDED"}
    return json.dumps({"error_code": codes.get(status, "BAD_REQUEST"), "message": message})


def invocations_app(model, fallback, limits: Limits):
    """ASGI app: ``POST /invocations`` answered here, every other request by ``fallback``."""
    config = model.model_config or {}
    n_features = int(config["n_features"])
    space = str(config.get("feature_space", "target"))

    async def answer(scope, receive) -> tuple[int, str]:
        content_type = dict(scope.get("headers", [])).get(b"content-type", b"").decode()
        if content_type.split(";")[0].strip() != "application/json":
            return 415, f"send Content-Type: application/json, got {content_type or 'none'!r}."
        length = _content_length(scope)
        if length is not None and length > limits.max_bytes:
            return 413, _too_large(limits.max_bytes)
        try:
            body = await asyncio.wait_for(_read_body(receive, limits.max_bytes), limits.timeout)
        except TimeoutError:
            return 408, f"the request body did not arrive within {limits.timeout:g} s."
        work = asyncio.to_thread(score_request, model, body, n_features, space, limits.max_rows)
        try:
            return 200, await asyncio.wait_for(work, limits.timeout)
        except TimeoutError:
            return 504, f"scoring took longer than the server's limit of {limits.timeout:g} s."

    async def app(scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/invocations" or scope["method"] != "POST":
            await fallback(scope, receive, send)
            return
        try:
            status, body = await answer(scope, receive)
        except RequestError as exc:
            status, body = exc.status, exc.message
        await _send_json(send, status, body if status == 200 else _error_json(status, body))

    return app


def app_from_env():
    """The served app of a uvicorn worker, configured by the variables of :data:`ENV`."""
    from mlflow.pyfunc import load_model
    from mlflow.pyfunc.scoring_server import init

    model = load_model(os.environ[ENV["model_path"]])
    stop_when_orphaned(int(os.environ.pop(ENV["server_pid"], "0")))  # not for our children
    return invocations_app(model, init(model), Limits.from_env())


def stop_when_orphaned(server_pid: int) -> None:
    """Stop this worker of ``server_pid`` (SIGTERM: uvicorn's shutdown) once it is gone.

    A server killed outright (SIGKILL, the OOM killer) cannot stop its workers, which
    would otherwise go on answering on its port with the model it served. Nothing is
    watched in the server's own process (one worker: uvicorn serves in-process). A worker
    that finds its server gone already (killed while the worker loaded its model) stops
    at once.
    """
    from mmdtl2_dist.lifecycle import process_runs, when_parent_is_gone

    if server_pid <= 0 or server_pid == os.getpid():
        return  # the server's own process
    if os.getppid() != server_pid and process_runs(server_pid):
        return  # not a worker the server started: it runs, and is not this one's parent

    def stop() -> None:
        print(
            f"mmdtl2 serve: worker {os.getpid()} stops: its server (process {server_pid}) is gone.",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGTERM)

    when_parent_is_gone(server_pid, stop, "mmdtl2-serve-orphan-watch")


def check_settings(limits: Limits, workers: int, limit_concurrency: int) -> None:
    """Refuse settings that cannot serve a request (the flag names are the command's)."""
    for flag, value in (
        ("--workers", workers),
        ("--limit-concurrency", limit_concurrency),
        ("--max-rows", limits.max_rows),
    ):
        if value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}.")
    if limits.max_bytes < 1024:
        raise ValueError(f"--max-request-mb must allow at least 1 KiB, got {limits.max_bytes} B.")
    if limits.timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {limits.timeout}.")


def check_port_free(host: str, port: int) -> None:
    """Refuse, before the model is downloaded, a port another server holds.

    uvicorn would start, fail to bind, and exit 3 with "Address already in use".
    """
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            hint = (
                "Another server (a running `mmdtl2 serve` or `mlflow models serve`?) holds "
                "the port: stop it, or pass another --port."
                if exc.errno == errno.EADDRINUSE
                else "Pass a --host of this machine (127.0.0.1 by default) and a --port it "
                "may bind (ports below 1024 need privileges)."
            )
            raise ValueError(
                f"cannot serve on {host}:{port}: {exc.strerror or exc}. {hint}"
            ) from None


#: The server's defaults (``mmdtl2 serve`` shows them): loopback only; 32 MiB is about 25
#: rows of 64,896 features as JSON.
DEFAULTS = {
    "host": "127.0.0.1", "port": 5001, "workers": 2, "max_bytes": 32 * 2**20,
    "max_rows": 10_000, "timeout": 60.0, "limit_concurrency": 8,
}  # fmt: skip


def serve(
    model_uri: str,
    *,
    tracking_uri: str | None = None,
    host: str = DEFAULTS["host"],
    port: int = DEFAULTS["port"],
    workers: int = DEFAULTS["workers"],
    max_bytes: int = DEFAULTS["max_bytes"],
    max_rows: int = DEFAULTS["max_rows"],
    timeout: float = DEFAULTS["timeout"],
    limit_concurrency: int = DEFAULTS["limit_concurrency"],
) -> None:
    """Download ``model_uri`` and serve it until interrupted.

    The model's code runs only in the worker processes: this process reads its ``MLmodel``
    file to check that it is an adapter, so that the workers, which uvicorn starts with
    this process's ``sys.path``, import this package and not the model's copy of it.
    """
    import uvicorn
    from mlflow.models import Model

    from mmdtl2_dist.deploy.registry import download_registered_model

    limits = Limits(max_bytes, timeout, max_rows)
    check_settings(limits, workers, limit_concurrency)
    check_port_free(host, port)
    with tempfile.TemporaryDirectory(prefix="mmdtl2-serve-") as tmp:
        path = download_registered_model(model_uri, tracking_uri, tmp)
        config = Model.load(path).flavors.get("python_function", {}).get("config") or {}
        if "n_features" not in config:
            raise ValueError(f"{model_uri!r} is not an MMDTL2 adapter logged by `mmdtl2 register`.")
        if config.get("input") == "images":
            raise ValueError(
                f"{model_uri!r} takes images (registered with --with-extractor), and `mmdtl2 "
                "serve` serves feature-input adapters; serve it with `mlflow models serve -m "
                f"{model_uri} --env-manager local`, or register the study without "
                "--with-extractor for a feature-input adapter."
            )
        os.environ.update(
            {ENV["model_path"]: path, ENV["server_pid"]: str(os.getpid()), **limits.to_env()}
        )
        uvicorn.run(
            "mmdtl2_dist.deploy.serve_app:app",
            host=host,
            port=port,
            workers=workers,
            limit_concurrency=limit_concurrency,
            timeout_keep_alive=5,
            log_level="info",
        )
