"""``mmdtl2 submit``: run a command as a job on a Ray cluster (Ray Jobs API).

Examples
--------
Upload the project directory and run a study on the cluster, streaming its logs::

    mmdtl2 submit --address http://HEAD_IP:8265 --working-dir . --runtime-env
        cluster/runtime_env.yaml -- python jobs/study.py run ...

With the package installed on every node, upload nothing::

    mmdtl2 submit --address http://HEAD_IP:8265 --installed -- mmdtl2 gram ...

Stop a job::

    mmdtl2 submit --address http://HEAD_IP:8265 --stop raysubmit_XXXX

The exit status is the job's: 0 SUCCEEDED, 1 FAILED, 3 STOPPED (130: interrupted, and the
job stopped).
"""

from __future__ import annotations

import argparse
import logging
import sys

EPILOG = (
    "exit status: 0 job SUCCEEDED, 1 FAILED, 3 STOPPED, 2 usage or connection error, "
    "130 interrupted (the job is stopped unless --detach-on-interrupt). "
    "Token authentication: the token is read from --auth-token-file, RAY_AUTH_TOKEN, "
    "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "submit",
        help="run a command as a job on a Ray cluster, stream its logs, return its status",
        description=(
            "Submit ENTRYPOINT (the words after `--`) to a Ray cluster's Jobs API, stream "
            "the job's logs and exit with its final status; or stop / follow a job."
        ),
        epilog=EPILOG,
    )
    p.add_argument(
        "--address",
        help="the head node's Jobs API, http://HEAD_IP:8265 "
        "(default: $RAY_API_SERVER_ADDRESS, then $RAY_ADDRESS)",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--working-dir",
        metavar="DIR",
        help="upload DIR (minus caches, venvs and local stores) and run the job in its copy",
    )
    where.add_argument(
        "--installed",
        action="store_true",
        help="upload nothing: mmdtl2-dist is installed on every node",
    )
    p.add_argument(
        "--runtime-env",
        metavar="FILE",
        help="Ray runtime environment YAML (e.g. cluster/runtime_env.yaml)",
    )
    p.add_argument(
        "--env",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="environment variable for the job and its tasks (repeatable), "
        "e.g. MLFLOW_TRACKING_URI=http://MLFLOW_HOST:5000",
    )
    p.add_argument("--submission-id", help="job id to use (default: generated)")
    p.add_argument(
        "--entrypoint-num-cpus",
        type=float,
        default=0.0,
        help="CPUs reserved for the job's driver (default 0: all CPUs go to its tasks)",
    )
    p.add_argument("--auth-token-file", metavar="FILE", help="file holding the cluster token")
    p.add_argument("--no-wait", action="store_true", help="print the job id and return at once")
    p.add_argument(
        "--detach-on-interrupt",
        action="store_true",
        help="on Ctrl-C leave the job running (default: stop it)",
    )
    action = p.add_mutually_exclusive_group()
    action.add_argument("--stop", metavar="JOB_ID", help="stop a job and wait until it ends")
    action.add_argument(
        "--follow", metavar="JOB_ID", help="stream an existing job's logs until it ends"
    )
    p.add_argument(
        "entrypoint",
        nargs=argparse.REMAINDER,
        help="-- COMMAND ARGS...: the command the job runs",
    )
    p.set_defaults(func=run)


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--env {pair!r} is not KEY=VALUE")
        out[key] = value
    return out


# Ray logs every file it leaves out of an upload and each closed log stream (INFO), and
# warns that it leaves out .git and .venv, which DEFAULT_EXCLUDES leaves out anyway.
_QUIET_LOGGERS = {
    "ray._private.runtime_env.packaging": logging.WARNING,
    "ray._private.runtime_env.working_dir": logging.ERROR,
    "ray.dashboard.modules.dashboard_sdk": logging.WARNING,
    "ray.dashboard.modules.job.sdk": logging.WARNING,
}


def run(args: argparse.Namespace) -> int:
    from mmdtl2_dist.cluster import submit as sub

    for name, level in _QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)

    entrypoint = list(args.entrypoint)
    if entrypoint[:1] == ["--"]:
        entrypoint = entrypoint[1:]
    if args.stop or args.follow:
        client = sub.connect(args.address, sub.auth_headers(args.auth_token_file))
        if args.stop:
            status = sub.stop_job(client, args.stop)
            print(f"job {args.stop}: {status.value}", file=sys.stderr)
            return 0 if status.is_terminal() else 4
        sub.check_job(client, args.follow)
        return _follow(sub, client, args.follow, args.detach_on_interrupt)

    if not args.working_dir and not args.installed:
        raise ValueError(
            "choose what the cluster runs: --working-dir DIR uploads DIR, --installed "
            "uses the mmdtl2-dist installed on the nodes"
        )
    if not entrypoint:
        raise ValueError(
            "no command to run: put it after `--`, e.g. "
            "`mmdtl2 submit --address http://HEAD_IP:8265 --working-dir . -- mmdtl2 gram ...`"
        )
    runtime_env = sub.build_runtime_env(
        working_dir=args.working_dir,
        runtime_env_file=args.runtime_env,
        env_vars=_env_pairs(args.env),
    )
    if args.installed and "working_dir" in runtime_env:
        raise ValueError(
            f"--installed, but {args.runtime_env} sets working_dir; drop one of the two"
        )
    client = sub.connect(args.address, sub.auth_headers(args.auth_token_file))
    job_id = sub.submit_job(
        client,
        entrypoint,
        runtime_env,
        submission_id=args.submission_id,
        entrypoint_num_cpus=args.entrypoint_num_cpus,
    )
    where = runtime_env.get("working_dir", "the installed package")
    announce = f"submitted job {job_id} (code from {where})"
    if args.no_wait:
        print(announce, file=sys.stderr)
        print(job_id)
        return 0
    return _follow(sub, client, job_id, args.detach_on_interrupt, announce)


def _follow(sub, client, job_id: str, detach_on_interrupt: bool, announce: str = "") -> int:
    try:
        # Announce inside the try: a Ctrl-C right after the line is printed must still
        # stop the job rather than escape as a traceback.
        if announce:
            print(announce, file=sys.stderr)
        status = sub.follow_job(client, job_id)
    except KeyboardInterrupt:
        if detach_on_interrupt:
            print(f"\ndetached; job {job_id} keeps running", file=sys.stderr)
            return 130
        print(f"\ninterrupted: stopping job {job_id} ...", file=sys.stderr)
        status = sub.stop_job(client, job_id)
        print(f"job {job_id}: {status.value}", file=sys.stderr)
        return 130
    print(f"job {job_id}: {status.value}", file=sys.stderr)
    return sub.exit_code(status)
