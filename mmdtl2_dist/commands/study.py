"""``mmdtl2 study``: run, resume and report studies (sweeps tracked in MLflow).

The trials run in worker processes of this machine (``--executor local``, the default)
or as Ray Tune trials on a local Ray or a cluster (``--executor ray``, the default with
``--address``); both give the same results, bit for bit.

Examples
--------
Run the bundled Office-Caltech10 study (12 shifts x 20 Hoffman splits) and print its
table::

    mmdtl2 study run studies/office_caltech10.toml
    mlflow ui --backend-store-uri sqlite:///mmdtl2-studies/office_caltech10/mlflow.db

Continue an interrupted study, then rebuild its report::

    mmdtl2 study resume mmdtl2-studies/office_caltech10
    mmdtl2 study report mmdtl2-studies/office_caltech10

Write the JSON Schema of a spec, for an editor's completion and checks::

    mmdtl2 study schema > study.schema.json
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from mmdtl2_dist.commands import (
    add_quiet_options,
    add_tracking_uri_option,
    help_text,
    progress_choice,
)
from mmdtl2_dist.study.executors import EXECUTORS

#: What a Ctrl-C leaves (printed by the CLI).
INTERRUPTED = (
    "finished Gram tiles and trials are kept: `mmdtl2 study resume DIR` (DIR: the study's "
    "output folder) continues once the study has begun (DIR holds study.json); before "
    "that, run the same command again."
)


def _spec_path(arg: str) -> Path:
    """A spec path, or the name of a bundled study (``studies/<name>.toml``)."""
    p = Path(arg)
    if p.exists() or p.suffix:
        return p
    bundled = Path(__file__).resolve().parents[2] / "studies" / f"{arg}.toml"
    return bundled if bundled.exists() else p


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--executor",
        choices=sorted(EXECUTORS),
        default=None,
        help="where the trials run: 'local' (worker processes on this machine, no Ray) or "
        "'ray' (Ray Tune on a local Ray or the --address cluster); the same results "
        "either way. Default: ray with --address, else local",
    )
    p.add_argument(
        "--address",
        default=None,
        help="Ray cluster address, for the ray executor (default: a local Ray with "
        "--num-cpus CPUs)",
    )
    p.add_argument(
        "--num-cpus",
        type=int,
        default=None,
        help="CPUs of the local Ray, or worker processes of the local executor (default: all)",
    )
    add_tracking_uri_option(p, "the spec's, else sqlite:///<output>/mlflow.db")
    add_quiet_options(p, "progress lines")


def _print_result(rep: dict) -> None:
    print(rep["summary"])
    print()
    print(f"report: {rep['files'][0]}")
    tables = [str(f) for f in rep["files"] if str(f).endswith("table.csv")]
    if tables:
        print(f"table:  {tables[0]}")
    pngs = [str(f) for f in rep["files"] if str(f).endswith(".png")]
    if pngs:
        print("plots:  " + "\n        ".join(pngs))
    if rep.get("tracking_uri"):
        print(f"MLflow: experiment {rep['experiment']!r} in {rep['tracking_uri']}")
        if rep["tracking_uri"].startswith("sqlite:"):
            print(f"        mlflow ui --backend-store-uri {shlex.quote(rep['tracking_uri'])}")
    if rep.get("missing"):
        print(
            f"warning: {len(rep['missing'])} trials have no result yet; continue the study "
            "with `mmdtl2 study resume`.",
            file=sys.stderr,
        )


def _resume_command(output: Path, args) -> str:
    """The ``mmdtl2 study resume`` command that continues this study as it was run."""
    cmd = ["mmdtl2", "study", "resume", str(output)]
    for flag, value in (
        ("--executor", args.executor),
        ("--address", args.address),
        ("--num-cpus", args.num_cpus),
        ("--tracking-uri", args.tracking_uri),
    ):
        if value is not None:
            cmd += [flag, str(value)]
    return shlex.join(cmd)


def _run_or_resume(args, run) -> int:
    """Run ``run()``; on SIGINT/SIGTERM say how to resume and exit 130/143, as shells do."""
    from mmdtl2_dist.study.interrupt import StudyInterrupted

    try:
        rep = run()
    except StudyInterrupted as exc:
        where = f"mmdtl2 study {args.study_command}"
        report = shlex.join(["mmdtl2", "study", "report", str(exc.output)])
        hint = (
            f"Continue it with:\n    {_resume_command(exc.output, args)}\n"
            f"(`{report}` writes a report of the finished trials.)"
            if exc.resumable
            else "It stopped before it began; run the same command again."
        )
        print(f"{where}: {exc}.\n{hint}", file=sys.stderr)
        return exc.exit_code
    _print_result(rep)
    return 0


def _run(args) -> int:
    from mmdtl2_dist.study.runner import run_study
    from mmdtl2_dist.study.spec import load_spec

    spec = load_spec(_spec_path(args.spec), output=args.output)
    return _run_or_resume(
        args,
        lambda: run_study(
            spec,
            executor=args.executor,
            address=args.address,
            num_cpus=args.num_cpus,
            tracking_uri=args.tracking_uri,
            progress=progress_choice(args),
        ),
    )


def _resume(args) -> int:
    from mmdtl2_dist.study.runner import resume_study

    return _run_or_resume(
        args,
        lambda: resume_study(
            args.folder,
            executor=args.executor,
            address=args.address,
            num_cpus=args.num_cpus,
            tracking_uri=args.tracking_uri,
            progress=progress_choice(args),
        ),
    )


def _report(args) -> int:
    from mmdtl2_dist.study.folder import refuse_if_running
    from mmdtl2_dist.study.runner import report_study

    refuse_if_running(Path(args.folder).expanduser().absolute())  # its report is the run's
    rep = report_study(
        args.folder, tracking_uri=args.tracking_uri, log=not args.no_mlflow, progress=False
    )
    _print_result(rep)
    return 0


def _validate(args) -> int:
    from mmdtl2_dist.study.preparation import validate_data
    from mmdtl2_dist.study.spec import load_spec

    spec = load_spec(_spec_path(args.spec))
    data = validate_data(spec)
    print(
        f"{spec.name}: {len(spec.trials())} trials ({len(spec.configs())} method "
        f"configurations x {len(spec.samples_per_class)} sample counts); output "
        f"{spec.output}\n{data}"
    )
    return 0


def _schema(_args) -> int:
    import json

    from mmdtl2_dist.study.spec_schema import SCHEMA

    print(json.dumps(SCHEMA, indent=2))
    return 0


def register(subparsers) -> None:
    """Add ``mmdtl2 study {run,resume,report,validate,schema}``."""
    p = subparsers.add_parser(
        "study",
        help="run, resume and report studies (local worker processes or Ray Tune; MLflow)",
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="study_command", metavar="ACTION")
    r = sub.add_parser("run", help="run a study spec (TOML/YAML) end to end")
    r.add_argument("spec", help="study spec file, or the name of a bundled study")
    r.add_argument(
        "--output",
        default=None,
        help="study folder (default: [study] output, else ./mmdtl2-studies/<name>)",
    )
    _common(r)
    r.set_defaults(func=_run)
    s = sub.add_parser("resume", help="continue an interrupted study (runs the missing trials)")
    s.add_argument("folder", help="the study folder written by `study run`")
    _common(s)
    s.set_defaults(func=_resume)
    t = sub.add_parser("report", help="(re)write the tables and plots of a study")
    t.add_argument("folder", help="the study folder")
    add_tracking_uri_option(t, "the spec's, else sqlite:///<folder>/mlflow.db")
    t.add_argument("--no-mlflow", action="store_true", help="do not log the report to MLflow")
    t.set_defaults(func=_report)
    v = sub.add_parser(
        "validate", help="check a study spec against its data (no compute) and count its trials"
    )
    v.add_argument("spec", help="study spec file")
    v.set_defaults(func=_validate)
    j = sub.add_parser(
        "schema", help="print the JSON Schema of a study spec (for editors, e.g. taplo or yaml-ls)"
    )
    j.set_defaults(func=_schema)

    def _help(_args, p=p) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=_help, interrupted=INTERRUPTED)
