"""cluster/ and jobs/: configurations checked against the schemas of Ray and KubeRay.

- Cluster-launcher YAML: Ray's own JSON schema (``ray/autoscaler/ray-schema.json`` in
  the installed ray), then Ray's ``prepare_config`` + ``validate_config`` (what
  ``ray up`` runs before it launches anything).
- KubeRay manifests: ``cluster/kubernetes/kuberay-v1.schema.json``, a trimmed schema of
  the ray.io/v1 RayCluster / RayJob fields written from KubeRay's API types (no CRD
  ships with a pip package; see the schema's ``$comment``).
- Runtime environments: Ray's ``RuntimeEnv`` parser.
- What listens where: no configuration or documented command binds all interfaces
  (``0.0.0.0``) without a ``# exposed:`` comment saying why, and the Ray dashboard's
  address is always given explicitly (KubeRay's default is all interfaces).
"""

from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path

import pytest
import yaml

jsonschema = pytest.importorskip("jsonschema")
ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER_CONFIGS = sorted((ROOT / "cluster" / "vm").glob("*.yaml"))
KUBERAY_MANIFESTS = [
    ROOT / "cluster" / "kubernetes" / "raycluster.yaml",
    ROOT / "cluster" / "kubernetes" / "rayjob.yaml",
]
KUBERAY_SCHEMA = ROOT / "cluster" / "kubernetes" / "kuberay-v1.schema.json"


@pytest.fixture(scope="module")
def ray_schema():
    import ray.autoscaler

    path = Path(ray.autoscaler.__file__).parent / "ray-schema.json"
    schema = json.loads(path.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return schema


@pytest.fixture(scope="module")
def kuberay_validator():
    schema = json.loads(KUBERAY_SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def test_launcher_configs_exist_for_a_cloud_and_on_prem():
    providers = {yaml.safe_load(p.read_text())["provider"]["type"] for p in LAUNCHER_CONFIGS}
    assert "local" in providers
    assert providers & {"aws", "gcp", "azure"}


@pytest.mark.parametrize("path", LAUNCHER_CONFIGS, ids=lambda p: p.name)
def test_launcher_config_matches_ray_schema(path, ray_schema):
    config = yaml.safe_load(path.read_text())
    jsonschema.Draft7Validator(ray_schema).validate(config)


@pytest.mark.parametrize("path", LAUNCHER_CONFIGS, ids=lambda p: p.name)
def test_launcher_config_passes_ray_up_validation(path):
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(yaml.safe_load(path.read_text()))
    validate_config(config)
    assert config["available_node_types"]


@pytest.mark.parametrize("path", LAUNCHER_CONFIGS, ids=lambda p: p.name)
def test_launcher_config_turns_token_auth_on_everywhere(path):
    config = yaml.safe_load(path.read_text())
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in config[key] if "ray start" in c]
        assert starts and all("RAY_AUTH_MODE=token" in c for c in starts), key
    # Every node gets the same token file.
    assert "~/.ray/auth_token" in config["file_mounts"]


def test_ray_schema_rejects_a_misspelt_field(ray_schema):
    config = yaml.safe_load(LAUNCHER_CONFIGS[0].read_text())
    bad = copy.deepcopy(config)
    next(iter(bad["available_node_types"].values()))["min_worker"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(ray_schema).validate(bad)


@pytest.mark.parametrize("path", KUBERAY_MANIFESTS, ids=lambda p: p.name)
def test_kuberay_manifest_matches_kuberay_fields(path, kuberay_validator):
    manifest = yaml.safe_load(path.read_text())
    errors = [
        f"{list(e.absolute_path)}: {e.message}" for e in kuberay_validator.iter_errors(manifest)
    ]
    assert not errors, errors


@pytest.mark.parametrize(
    ("where", "field", "value"),
    [
        (("spec", "headGroupSpec"), "rayStartParam", {}),  # misspelt field
        (("spec", "headGroupSpec", "rayStartParams"), "num-cpus", 0),  # values are strings
        (("spec", "authOptions"), "mode", "password"),  # not an auth mode
        (("spec",), "workerGroupSpecs", [{"groupName": "cpu"}]),  # template missing
    ],
)
def test_kuberay_schema_rejects_bad_manifests(kuberay_validator, where, field, value):
    manifest = yaml.safe_load(KUBERAY_MANIFESTS[0].read_text())
    node = manifest
    for key in where:
        node = node[key]
    node[field] = value
    assert list(kuberay_validator.iter_errors(manifest))


def _cluster_specs():
    cluster = yaml.safe_load(KUBERAY_MANIFESTS[0].read_text())
    job = yaml.safe_load(KUBERAY_MANIFESTS[1].read_text())
    return cluster["spec"], job["spec"]["rayClusterSpec"]


def test_kuberay_manifests_agree_on_version_auth_and_storage():
    for spec in _cluster_specs():
        assert spec["rayVersion"] == ray.__version__
        assert spec["authOptions"]["mode"] == "token"
        groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
        for group in groups:
            pod = group["template"]["spec"]
            mounts = {m["mountPath"] for c in pod["containers"] for m in c["volumeMounts"]}
            # Shared storage at the same path everywhere, and an object store in RAM.
            assert {"/mnt/shared", "/dev/shm"} <= mounts
            shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
            assert shm["emptyDir"]["medium"] == "Memory"
        # The head takes no tasks: drivers and the Jobs API stay responsive.
        assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"


def test_dockerfile_uses_the_tested_ray():
    dockerfile = (ROOT / "cluster" / "kubernetes" / "Dockerfile").read_text()
    assert f"rayproject/ray:{ray.__version__}-py311" in dockerfile


def test_runtime_envs_are_valid_and_in_step():
    from ray.runtime_env import RuntimeEnv

    from mmdtl2_dist.cluster.submit import build_runtime_env

    env = build_runtime_env(working_dir=ROOT, runtime_env_file=ROOT / "cluster/runtime_env.yaml")
    RuntimeEnv(**env)  # raises on an unknown or malformed field
    assert env["working_dir"] == str(ROOT)
    assert "*.zarr" in env["excludes"] and ".venv" in env["excludes"]
    job = yaml.safe_load(KUBERAY_MANIFESTS[1].read_text())["spec"]
    job_env = yaml.safe_load(job["runtimeEnvYAML"])
    RuntimeEnv(**job_env)
    assert job_env["env_vars"].items() <= env["env_vars"].items()


def test_rayjob_entrypoint_is_a_job_script():
    job = yaml.safe_load(KUBERAY_MANIFESTS[1].read_text())["spec"]
    words = job["entrypoint"].split()
    assert words[0] == "python" and words[1].startswith("/home/ray/mmdtl2-dist/jobs/")
    assert (ROOT / "jobs" / Path(words[1]).name).is_file()
    assert job["entrypointNumCpus"] == 0


@pytest.mark.parametrize("name", ["ingest", "gram", "study", "register"])
def test_job_scripts_only_delegate_to_the_cli(name):
    """A job script is an import and one call of ``mmdtl2_dist.cli.main``: no logic."""
    tree = ast.parse((ROOT / "jobs" / f"{name}.py").read_text())
    body = [n for n in tree.body if not isinstance(n, ast.Expr)]  # docstring
    assert [type(n).__name__ for n in body] == ["Import", "ImportFrom", "If"]
    assert body[1].module == "mmdtl2_dist.cli" and body[1].names[0].name == "main"
    call = body[2].body[0].value  # sys.exit(main([...]))
    inner = call.args[0]
    assert isinstance(inner, ast.Call) and inner.func.id == "main"
    first = inner.args[0].elts[0]
    assert isinstance(first, ast.Constant) and first.value == name


# --- what listens where ----------------------------------------------------------------

CLUSTER_FILES = sorted(
    p for p in (ROOT / "cluster").rglob("*") if p.is_file() and p.suffix in {".yaml", ".ini", ""}
)
DOCS = [
    ROOT / "docs" / "run_on_a_cluster.md",
    ROOT / "docs" / "deploy.md",
    ROOT / "cluster" / "README.md",
]


def unexplained_bind_all(text: str) -> list[str]:
    """Lines that bind all interfaces (``0.0.0.0`` outside a comment) with no ``exposed:``
    reason in a comment on the line or in the comment lines just above it."""
    found, comments = [], []
    for line in text.splitlines():
        code, _, comment = line.partition("#")
        if not code.strip():
            comments.append(comment)
            continue
        if "0.0.0.0" in code and not any("exposed:" in c for c in (comment, *comments)):
            found.append(line.strip())
        comments = []
    return found


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_cluster_files_bind_all_interfaces_only_with_a_reason(path):
    assert not unexplained_bind_all(path.read_text()), path


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_commands_bind_all_interfaces_only_with_a_reason(doc):
    blocks = re.findall(r"```(?:bash|yaml|ini)\n(.*?)```", doc.read_text(), flags=re.S)
    assert blocks
    assert not [line for b in blocks for line in unexplained_bind_all(b)], doc


def test_bind_all_check_catches_a_silent_exposure():
    """The check above fails a config that exposes the dashboard without saying so."""
    manifest = KUBERAY_MANIFESTS[0].read_text()
    assert not unexplained_bind_all(manifest)
    exposed = manifest.replace('dashboard-host: "127.0.0.1"', 'dashboard-host: "0.0.0.0"')
    assert exposed != manifest and unexplained_bind_all(exposed) == ['dashboard-host: "0.0.0.0"']
    launcher = LAUNCHER_CONFIGS[0].read_text().replace("127.0.0.1", "0.0.0.0")
    assert unexplained_bind_all(launcher)
    assert unexplained_bind_all("mlflow server --host 0.0.0.0 --port 5000")
    assert not unexplained_bind_all("# exposed: behind the TLS proxy\nmlflow server --host 0.0.0.0")


@pytest.mark.parametrize("path", LAUNCHER_CONFIGS, ids=lambda p: p.name)
def test_launcher_dashboard_listens_on_loopback(path):
    config = yaml.safe_load(path.read_text())
    heads = [c for c in config["head_start_ray_commands"] if "ray start" in c]
    assert heads and all("--dashboard-host=127.0.0.1" in c for c in heads)


def test_kuberay_dashboard_address_is_explicit():
    cluster, job = _cluster_specs()
    # KubeRay binds the dashboard to all interfaces unless told otherwise.
    assert cluster["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    assert "dashboard-host" in job["headGroupSpec"]["rayStartParams"]
    for spec in (cluster, job):
        head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in head["env"]}
        for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "mmdtl2-mlflow-credentials"
