r"""``mmdtl2 register``: fit a study's chosen adapter and register it in MLflow.

Examples
--------
The recommended configuration (MMDTL2 with ``select="auto"``, the frozen selection rule
of :mod:`mmdtl2_dist.core.auto`), as version N+1 of ``polyp-adapter`` with the alias
``champion``::

    mmdtl2 register mmdtl2-studies/nbi_conv3 --name polyp-adapter --pair 'lucera->elite'

The best MMDTL2 configuration of the study by its mean accuracy on the pair::

    mmdtl2 register mmdtl2-studies/nbi_conv3 --name polyp-adapter --pair 'lucera->elite' \
        --metric accuracy_pair/lucera_to_elite

Explicit parameters instead of the best trial::

    mmdtl2 register mmdtl2-studies/nbi_conv3 --name polyp-adapter --method mmdtl2 \
        --param kernel=rbf --param c_d=1.0 --alias challenger

Then ``mmdtl2 predict --model models:/polyp-adapter@champion features.npy``, or
``mmdtl2 serve --model models:/polyp-adapter@champion``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import sys
import warnings

from mmdtl2_dist.commands import (
    add_quiet_options,
    add_tracking_uri_option,
    progress_choice,
)
from mmdtl2_dist.progress import Progress

#: What a Ctrl-C leaves (printed by the CLI).
INTERRUPTED = (
    "a model version may have been registered without its description or alias: check "
    "the registry (mlflow ui) before running it again, which registers another version."
)


def parse_param(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` with VALUE read as JSON when it parses (numbers, true), else a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--param wants KEY=VALUE, got {text!r}; e.g. --param c_d=0.5.")
    try:
        return key.strip(), json.loads(value)
    except ValueError:
        return key.strip(), value


def parse_select(text: str) -> tuple[str, list]:
    """``KEY=V1,V2,...`` for a cross-validation grid."""
    key, sep, values = text.partition("=")
    if text == "auto":
        raise ValueError("--select auto stands alone: give it without other --select values.")
    if not sep or not key or not values:
        raise ValueError(f"--select wants KEY=V1,V2,..., got {text!r}; e.g. --select c_d=0.1,1.")
    return key.strip(), [parse_param(f"{key}={v}")[1] for v in values.split(",")]


def serve_command(tracking_uri: str, model_uri: str, images: bool) -> str:
    """The shell command that serves a registered model, quoted for pasting."""
    env = f"MLFLOW_TRACKING_URI={shlex.quote(tracking_uri)}"
    if not images:
        return f"{env} mmdtl2 serve --model {shlex.quote(model_uri)}"
    return (
        f"{env} mlflow models serve -m {shlex.quote(model_uri)} --env-manager local "
        "-h 127.0.0.1 -p 5001"
    )


def run(args: argparse.Namespace) -> int:
    from mmdtl2_dist.deploy.registry import mlflow_errors_explained
    from mmdtl2_dist.deploy.training import open_study

    handle = open_study(args.study, tracking_uri=args.tracking_uri)
    needs = f"write access to experiment {handle.experiment!r} and to model {args.name!r}"
    with mlflow_errors_explained(handle.tracking_uri, f"register {args.name!r}", needs):
        return _register(args, handle)


def _register(args: argparse.Namespace, handle) -> int:
    from mmdtl2_dist.deploy.registry import register_adapter
    from mmdtl2_dist.deploy.training import (
        best_trial,
        choose_pair,
        explicit_config,
        fit_adapter,
        pair_metric,
        recommended_config,
        study_extractor,
        study_pairs,
    )

    source, target = choose_pair(handle, args.pair)
    extractor = study_extractor(handle, args.with_extractor) if args.with_extractor else None
    pm = pair_metric(source, target)
    if args.method is not None:
        if args.metric or args.label:
            raise ValueError("--metric/--label choose a trial; leave them out with --method.")
        params = dict(parse_param(p) for p in args.param)
        select = "auto" if args.select == ["auto"] else dict(parse_select(s) for s in args.select)
        cfg = explicit_config(handle, args.method, params, select, pair_metric_name=pm)
    elif args.param or args.select:
        raise ValueError("--param/--select need --method (explicit parameters).")
    elif args.metric or args.label:
        metric, n_pairs = args.metric, len(study_pairs(handle))
        if metric is None:
            metric = pm if n_pairs > 1 else "accuracy"
        elif metric == "accuracy" and n_pairs > 1:
            warnings.warn(
                f"--metric accuracy is the mean over the study's {n_pairs} device pairs; the "
                f"pair {source}->{target}'s own is --metric {pm}.",
                UserWarning,
                stacklevel=2,
            )
        cfg = best_trial(handle, metric, label=args.label, pair_metric_name=pm)
    else:
        cfg = recommended_config(handle, pair_metric_name=pm)
    bar = Progress("register", enabled=progress_choice(args))
    bar.say(
        f"register: {cfg.selected_by}: {cfg.method} {json.dumps(cfg.params, default=str)}"
        + (f" ({cfg.label}, {cfg.metric} = {cfg.metric_value:.4f})" if cfg.metric else "")
    )
    fitting = f"fitting on all labelled samples of {source} -> {target}"
    bar.say(f"register: {fitting} ...")
    with bar.ticking(fitting):
        fitted = fit_adapter(handle, (source, target), cfg)
    bar.say(bar.line(f"fitted on {fitted.n_source} + {fitted.n_target} samples"))
    with bar.ticking("logging and registering the model"), registry_notices_dropped():
        mv = register_adapter(
            handle,
            cfg,
            fitted,
            name=args.name,
            alias=None if args.no_alias else args.alias,
            export_w=args.export_w,
            extractor=extractor,
        )
    if args.no_alias:
        uri, note = f"models:/{args.name}/{mv.version}", ""
    else:
        uri, note = f"models:/{args.name}@{args.alias}", f" (alias {args.alias!r})"
    print(f"registered {args.name!r} version {mv.version}{note}")
    print(f"model:    {uri}")
    print(f"tracking: {handle.tracking_uri}")
    print(f"serve:    {serve_command(handle.tracking_uri, uri, images=extractor is not None)}")
    if extractor is None:
        return 0
    print(
        'request:  {"dataframe_split": {"columns": ["image"], "data": [["<base64 of a PNG '
        'or JPEG file>"]]}}'
    )
    return 0


#: The starts of the lines MLflow's ``register_model`` prints to stderr (outside its
#: logging, so its log level does not silence them); ``mmdtl2 register`` prints its own.
REGISTRY_NOTICES = ("Successfully registered model ", "Registered model ", "Created version ")


class LinesDropped(io.TextIOBase):
    """A text stream passing whole lines on to ``out``, but not those with ``prefixes``.

    Text that cannot start such a line (a progress line's carriage-return update) goes
    on at once; a line that may is passed or dropped when its newline arrives (or at
    :meth:`flush`).
    """

    def __init__(self, out, prefixes: tuple[str, ...]) -> None:
        self.out, self.prefixes, self.pending = out, prefixes, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            if not line.startswith(self.prefixes):
                self.out.write(line + "\n")
        if not any(self.pending.startswith(p) or p.startswith(self.pending) for p in self.prefixes):
            self.out.write(self.pending)
            self.pending = ""
        return len(text)

    def flush(self) -> None:
        if self.pending and not self.pending.startswith(self.prefixes):
            self.out.write(self.pending)
        self.pending = ""
        self.out.flush()


@contextlib.contextmanager
def registry_notices_dropped():
    """Stderr without MLflow's registration notices (:data:`REGISTRY_NOTICES`) inside.

    The command prints the version it registered itself, on stdout, and says nothing on
    stderr with ``--quiet``. Every other line, warnings included, still reaches stderr.
    """
    stream = LinesDropped(sys.stderr, REGISTRY_NOTICES)
    try:
        with contextlib.redirect_stderr(stream):
            yield
    finally:
        stream.flush()


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "register",
        help="fit a study's chosen adapter on all labelled data and register it in MLflow",
        description=(
            "Choose a configuration (by default the recommended one, MMDTL2 with "
            "select='auto'; the study's best MMDTL2/MMDT trial with --metric or --label; or "
            "explicit --method/--param), fit it on every labelled sample of the pair's "
            "source and target devices with the study's preprocessing, log it as an MLflow "
            "pyfunc model, register it as the next version of --name and point --alias at "
            "it. The version's tags and description record the study, data fingerprint, "
            "parameters and the study's accuracy for the configuration."
        ),
        epilog=(
            "examples:\n"
            "  mmdtl2 register mmdtl2-studies/office_caltech10 --name office-adapter "
            "--pair 'amazon->webcam'\n"
            "  mmdtl2 register STUDY --name NAME --metric accuracy   # the best trial\n"
            "  mmdtl2 register STUDY --name NAME --method mmdtl2 --param kernel=rbf "
            "--param c_d=1 --alias challenger"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_target_arguments(p)
    _add_configuration_arguments(p)
    _add_output_arguments(p)
    p.set_defaults(func=run, interrupted=INTERRUPTED)


def _add_target_arguments(p: argparse.ArgumentParser) -> None:
    """The study, the registered model and the device pair."""
    p.add_argument("study", help="study folder written by `mmdtl2 study run` (its output)")
    p.add_argument("--name", required=True, help="registered model name")
    p.add_argument("--alias", default="champion", help="alias to set (default: champion)")
    p.add_argument("--no-alias", action="store_true", help="register without moving an alias")
    p.add_argument(
        "--pair",
        default=None,
        help="SOURCE->TARGET device pair (required when the study has several pairs)",
    )


def _add_configuration_arguments(p: argparse.ArgumentParser) -> None:
    """Which configuration: the recommended one, the best trial, or explicit."""
    p.add_argument(
        "--metric",
        default=None,
        help=(
            "register the study's best trial by this metric instead of the recommended "
            "configuration: accuracy (the mean over the study's pairs) or "
            "accuracy_pair/<pair> (one pair's); with --label alone: accuracy_pair/<pair> "
            "when the study has several pairs, else accuracy"
        ),
    )
    p.add_argument(
        "--label", default=None, help="the best trial of this method label (see --metric)"
    )
    p.add_argument(
        "--method",
        choices=("mmdtl2", "mmdt"),
        default=None,
        help="explicit configuration instead of the best trial",
    )
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="explicit parameter (repeat), e.g. --param kernel=rbf --param c_d=0.5",
    )
    p.add_argument(
        "--select",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help=(
            "choose KEY among values by cross-validation on the labelled target samples; "
            "or --select auto: the recommended selection rule (--method mmdtl2)"
        ),
    )


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    """What is logged, where, and the progress lines."""
    p.add_argument(
        "--export-w",
        action="store_true",
        help="also log the explicit transform W as W/W.npy of the run (linear kernel, small L)",
    )
    p.add_argument(
        "--with-extractor",
        metavar="WEIGHTS",
        help="log a model that takes images: it runs the extractor that made the study's "
        "features (from `mmdtl2 extract`; WEIGHTS: the same imagenet / PATH / random:SEED, "
        "checked by SHA-256) before the adapter",
    )
    add_tracking_uri_option(
        p,
        "the study's: the spec's, else sqlite:///<study>/mlflow.db; give the one "
        "`study run` was given, if any",
    )
    add_quiet_options(p, "progress lines")
