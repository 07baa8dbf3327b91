"""Running on a Ray cluster: job submission through the Ray Jobs API.

The cluster definitions themselves (launcher YAML, KubeRay manifests, runtime
environment) live in the repository's ``cluster/`` folder; this package holds the
client side used by ``mmdtl2 submit``.
"""

from mmdtl2_dist.cluster.submit import (
    DEFAULT_EXCLUDES,
    auth_headers,
    auth_token,
    build_runtime_env,
    check_address,
    connect,
    exit_code,
    follow_job,
    stop_job,
    submit_job,
)

__all__ = [
    "DEFAULT_EXCLUDES",
    "auth_headers",
    "auth_token",
    "build_runtime_env",
    "check_address",
    "connect",
    "exit_code",
    "follow_job",
    "stop_job",
    "submit_job",
]
