"""Cluster YAMLs (``clusters/*.yaml``) and hardware profiles (``clusters/profiles.yaml``).

No cloud is touched: each cluster file is validated by Ray's own autoscaler code (the defaults it
merges in and the JSON schema ``ray up`` checks), then against this project's conventions -- no
secrets, nothing listening on 0.0.0.0 or open to 0.0.0.0/0, MLflow reachable from the workers,
the GPU extras installed, autoscaling bounded -- and against the profiles, whose ``node`` must be
what the cluster's GPU node types declare. A broken config must be rejected, so the validation
is shown to be able to fail.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from isosweep.run.submit import token_auth
from isosweep.spec.profiles import (
    load_profiles,
)
from isosweep.spec.yamlio import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "clusters"
PROFILES = CLUSTERS / "profiles.yaml"
MLFLOW_SCRIPT = CLUSTERS / "mlflow-server.sh"
CLUSTER_FILES = sorted(p for p in CLUSTERS.glob("*.yaml") if p.name != PROFILES.name)

MACHINES = {
    # machine type -> (vCPUs, GPUs) as the cloud sells it
    "p5en.48xlarge": (192, 8),
    "a3-ultragpu-8g": (224, 8),
}

COMMAND_KEYS = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
                "head_start_ray_commands", "worker_start_ray_commands")


# ---------------------------------------------------------------------------------------------
# helpers


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def ray_validate(config: dict[str, Any]) -> dict[str, Any]:
    """What ``ray up`` checks before it contacts a cloud, on a copy of ``config``.

    The user's file must match Ray's schema as written (``jsonschema``: unknown keys, wrong types,
    missing ``provider``); then ``prepare_config`` merges the provider's ``defaults.yaml`` (a file
    read, no credentials or network for aws/gcp; the local provider's node-type rewrite) and
    ``validate_config`` checks the result (schema again, head node type, min vs max workers).
    """
    import ray.autoscaler
    from ray.autoscaler._private.util import prepare_config, validate_config

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    as_written = copy.deepcopy(config)
    if (as_written.get("provider") or {}).get("type") == "local":
        as_written.pop("min_workers", None)  # the local provider moves it onto its one node type first
    jsonschema.validate(as_written, schema)
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def commands(config: dict[str, Any], head: bool | None = None) -> list[str]:
    """Every shell command of a cluster config (global and per node type); ``head`` selects the
    head's (True), the workers' (False) or all (None)."""
    keys = {True: ("initialization_commands", "setup_commands", "head_setup_commands", "head_start_ray_commands"),
            False: ("initialization_commands", "setup_commands", "worker_setup_commands", "worker_start_ray_commands"),
            None: COMMAND_KEYS}[head]
    out = [c for k in keys for c in config.get(k) or []]
    for name, node_type in (config.get("available_node_types") or {}).items():
        is_head = name == config.get("head_node_type")
        if head is None or head == is_head:
            out += [c for k in keys for c in node_type.get(k) or []]
    return out


def docker_options(config: dict[str, Any], head: bool) -> list[str]:
    docker = config.get("docker") or {}
    return list(docker.get("run_options") or []) + list(docker.get("head_run_options" if head else "worker_run_options") or [])


def strings(value: Any) -> Iterator[str]:
    """Every string in a parsed YAML document (keys and values), comments excluded."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def gpu_node_types(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: t for n, t in (config.get("available_node_types") or {}).items() if t.get("resources", {}).get("GPU", 0) > 0}


def machine_type(node_config: dict[str, Any]) -> str:
    return node_config.get("InstanceType") or node_config.get("machineType") or ""


def ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


# ---------------------------------------------------------------------------------------------
# cluster YAMLs: Ray's validator


def test_the_three_clusters_are_there():
    assert {"aws-h200.yaml", "gcp-h200.yaml", "onprem-h200.yaml"} <= set(ids(CLUSTER_FILES))
    providers = {load(p)["provider"]["type"] for p in CLUSTER_FILES}
    assert {"aws", "gcp", "local"} <= providers


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=ids(CLUSTER_FILES))
def test_ray_accepts_cluster_yaml(path: Path):
    prepared = ray_validate(load(path))
    assert prepared["head_node_type"] in prepared["available_node_types"]


BROKEN = {
    "no provider": lambda c: c.pop("provider"),
    "max_workers not an int": lambda c: c.update(max_workers="eight"),
    "idle timeout not a number": lambda c: c.update(idle_timeout_minutes="ten"),
    "unknown top-level key": lambda c: c.update(worker_nodez={}),
    "fractional node resources": lambda c: c["available_node_types"]["h200"]["resources"].update(CPU=1.5),
    "node type without node_config": lambda c: c["available_node_types"]["h200"].pop("node_config"),
    "head type not a node type": lambda c: c.update(head_node_type="nonexistent"),
    "min_workers above max_workers": lambda c: c.update(max_workers=0) or c["available_node_types"]["h200"].update(min_workers=2),
}


@pytest.mark.parametrize("breakage", list(BROKEN), ids=list(BROKEN))
def test_ray_rejects_broken_cluster_yaml(breakage: str):
    config = load(CLUSTERS / "aws-h200.yaml")
    BROKEN[breakage](config)
    with pytest.raises((jsonschema.ValidationError, ValueError, KeyError, RuntimeError)):
        ray_validate(config)


# ---------------------------------------------------------------------------------------------
# cluster YAMLs: this project's conventions

SECRET_PATTERNS = {
    "AWS access key id": re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),
    "AWS secret key setting": re.compile(r"(?i)aws_secret_access_key"),
    "private key block": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "credentials in a URL": re.compile(r"://[^/\s:@'\"]+:[^@\s/'\"$]+@"),
    "password/token assigned a literal": re.compile(r"(?i)\b\w*(password|passwd|secret|token)\s*=\s*(?![\s\"']*\$)[\"']?[^\s\"'$]+"),
    "GCP credentials in the provider": re.compile(r"gcp_credentials"),
}
SECRET_KEYS = re.compile(r"(?i)(password|passwd|secret|token|api_key|access_key|credentials)$")


@pytest.mark.parametrize("path", [*CLUSTER_FILES, PROFILES, MLFLOW_SCRIPT], ids=ids([*CLUSTER_FILES, PROFILES, MLFLOW_SCRIPT]))
def test_no_secrets(path: Path):
    text = path.read_text()
    for what, pattern in SECRET_PATTERNS.items():
        match = pattern.search(text)
        assert match is None, f"{path.name}: {what}: {match.group(0)!r}"
    if path.suffix == ".yaml":

        def walk(value: Any, where: str) -> None:
            if isinstance(value, dict):
                for k, v in value.items():
                    a_path = isinstance(v, str) and v == k and v.startswith("~/")  # a file mount: where a secret goes
                    if SECRET_KEYS.search(str(k)) and isinstance(v, str | int) and not str(v).startswith("$") \
                            and not a_path:
                        raise AssertionError(f"{path.name}: key {where}{k} holds a literal secret")
                    walk(v, f"{where}{k}.")
            elif isinstance(value, list):
                for i, v in enumerate(value):
                    walk(v, f"{where}{i}.")

        walk(load(path), "")


def test_secret_scan_can_fail():
    """The patterns above catch what they are for (on made-up values)."""
    bad = ["AKIA" + "ABCDEFGHIJKLMNOP", "aws_secret_access_key: x", "-----BEGIN OPENSSH PRIVATE KEY-----",
           "postgresql://mlflow:hunter2@db:5432/mlflow", "POSTGRES_PASSWORD=hunter2"]
    for text in bad:
        assert any(p.search(text) for p in SECRET_PATTERNS.values()), text
    fine = ["POSTGRES_PASSWORD_FILE=/run/secrets/db-password", 'PGPASSWORD="$MLFLOW_DB_PASSWORD"',
            "postgresql://mlflow@127.0.0.1:5432/mlflow", "-v /x/db-password:/run/secrets/db-password:ro"]
    for text in fine:
        assert not any(p.search(text) for p in SECRET_PATTERNS.values()), text


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=ids(CLUSTER_FILES))
def test_nothing_open_to_the_world(path: Path):
    config = load(path)
    everything = list(strings(config))  # comments may explain 0.0.0.0/0; settings may not use it
    assert not [s for s in everything if "0.0.0.0/0" in s or "::/0" in s], f"{path.name}: an 0.0.0.0/0 or ::/0 range"
    assert not [c for c in commands(config) if "0.0.0.0" in c], f"{path.name}: a command binds 0.0.0.0"
    for rule in config["provider"].get("security_group", {}).get("IpPermissions", []):
        ranges = [r.get("CidrIp") for r in rule.get("IpRanges", [])] + [r.get("CidrIpv6") for r in rule.get("Ipv6Ranges", [])]
        if "0.0.0.0/0" in ranges or "::/0" in ranges:
            assert (rule.get("FromPort"), rule.get("ToPort")) == (22, 22), f"{path.name}: world-open rule {rule}"
    if config["provider"]["type"] == "aws":
        # Without SecurityGroupIds Ray creates a group whose SSH rule is open to 0.0.0.0/0.
        for name, node_type in config["available_node_types"].items():
            node_config = node_type["node_config"]
            groups = node_config.get("SecurityGroupIds") or [g for ni in node_config.get("NetworkInterfaces", []) for g in ni["Groups"]]
            assert groups, f"{path.name}: node type {name!r} gets Ray's default security group (SSH from 0.0.0.0/0)"
    if config["provider"]["type"] == "gcp":
        for name, node_type in gpu_node_types(config).items():
            nics = node_type["node_config"]["networkInterfaces"]
            assert not any(nic.get("accessConfigs") for nic in nics), f"{path.name}: GPU node type {name!r} has an external IP"


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=ids(CLUSTER_FILES))
def test_dashboard_and_mlflow_stay_private(path: Path):
    config = load(path)
    head_start = " ".join(config["head_start_ray_commands"])
    host = re.search(r"--dashboard-host[= ](\S+)", head_start)
    assert host and host.group(1) in ("127.0.0.1", "localhost"), f"{path.name}: dashboard host {host and host.group(1)}"
    assert "mlflow-server.sh" in head_start or "mlflow server" in head_start, f"{path.name}: no MLflow server on the head"
    for command in commands(config):
        mlflow_host = re.search(r"mlflow server.*--host[= ]+(\S+)", command)
        assert not mlflow_host or mlflow_host.group(1).strip("'\"") not in ("0.0.0.0", "::"), f"{path.name}: {command}"
    # Workers log to the head's server: its private address, which `ray start` workers know as RAY_HEAD_IP.
    worker_start = " ".join(config["worker_start_ray_commands"])
    assert "MLFLOW_TRACKING_URI=http://$RAY_HEAD_IP:5000" in worker_start, f"{path.name}: workers lack MLFLOW_TRACKING_URI"
    assert "MLFLOW_TRACKING_URI=" in head_start
    if config["provider"]["type"] == "local":  # several networks: MLflow must listen where RAY_HEAD_IP points
        assert f"--env=MLFLOW_HOST={config['provider']['head_ip']}" in docker_options(config, head=True)
    # The backend store is PostgreSQL on the head, bound to loopback.
    init = " ".join(commands(config, head=True))
    assert "postgres" in init and "listen_addresses=127.0.0.1" in init, f"{path.name}: no loopback PostgreSQL"
    assert "/run/secrets/mlflow-db-password" in " ".join(docker_options(config, head=True))


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=ids(CLUSTER_FILES))
def test_ray_runs_with_token_authentication(path: Path):
    """Every node starts Ray with RAY_AUTH_MODE=token and gets the laptop's token by file_mounts; the header
    says how to make it."""
    config = load(path)
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in config[key] if "ray start" in c]
        assert starts and all("export RAY_AUTH_MODE=token;" in c for c in starts), f"{path.name}: {key}"
    assert config["file_mounts"].get("~/.ray/auth_token") == "~/.ray/auth_token", path.name
    assert "ray get-auth-token --generate" in path.read_text().split("cluster_name:")[0], path.name


def test_submit_to_a_token_cluster_needs_the_token_here(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "auth_token"))
    cluster = CLUSTER_FILES[0]
    with pytest.raises(ConfigError, match=r"no token .*run `ray get-auth-token --generate`, then `ray up"):
        token_auth(cluster)
    (tmp_path / "auth_token").write_text("x" * 32)
    assert token_auth(cluster)
    plain = tmp_path / "plain.yaml"
    plain.write_text("cluster_name: x\n")
    assert not token_auth(plain)


def test_mlflow_script_binds_the_private_ip_never_all_interfaces():
    text = MLFLOW_SCRIPT.read_text()
    default = re.search(r'HOST="\$\{MLFLOW_HOST:-(.*)\}"', text)
    assert default and "hostname -I" in default.group(1), "MLflow's default host is not the head's private IP"
    assert re.search(r'--host "\$HOST"', text)
    assert "--backend-store-uri" in text and "postgresql://" in text and "--artifacts-destination" in text
    for host in ("0.0.0.0", "::"):  # the guard runs before anything else: no server, no database needed
        run = subprocess.run(["bash", str(MLFLOW_SCRIPT), "s3://bucket/x"], check=False, env={"MLFLOW_HOST": host, "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, timeout=30)
        assert run.returncode == 1 and "refusing" in run.stderr, (host, run.stderr)


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=ids(CLUSTER_FILES))
def test_autoscaling_is_bounded(path: Path):
    config = load(path)
    assert isinstance(config.get("idle_timeout_minutes"), int | float) and config["idle_timeout_minutes"] > 0
    prepared = ray_validate(config)
    assert prepared["max_workers"] >= sum(t.get("min_workers", 0) for t in prepared["available_node_types"].values())
    for name, node_type in prepared["available_node_types"].items():
        assert node_type.get("max_workers", 0) >= node_type.get("min_workers", 0), f"{path.name}: {name}"
    if config["provider"]["type"] == "local":
        assert config.get("min_workers", 0) <= config["max_workers"] <= len(config["provider"]["worker_ips"])
    else:
        for name, node_type in gpu_node_types(config).items():
            assert node_type.get("min_workers", 0) == 0, f"{path.name}: {name} keeps idle GPU nodes"
            assert 0 < node_type["max_workers"] <= config["max_workers"]


NCCL = {
    # provider -> what a GPU worker's container and `ray start` must set for multi-node NCCL
    "aws": ["--device=/dev/infiniband", "-v /opt/amazon:/opt/amazon", "FI_PROVIDER=efa", "FI_EFA_USE_DEVICE_RDMA=1",
            "NCCL_PROTO=simple", "/opt/amazon/efa/lib"],
    "gcp": ["--device=/dev/infiniband", "-v /usr/local/gib:/usr/local/gib", "NCCL_NET=gIB", "NCCL_CROSS_NIC=0",
            "/usr/local/gib/lib64", "/usr/local/gib/scripts/set_nccl_env.sh", "nccl-plugin-gib"],
    "local": ["--device=/dev/infiniband", "NCCL_SOCKET_IFNAME=", "NCCL_IB_HCA="],
}


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=ids(CLUSTER_FILES))
def test_image_project_and_nccl(path: Path):
    config = load(path)
    assert config["file_mounts"].get("~/isosweep") == ".", f"{path.name}: the project is not mounted at ~/isosweep"
    assert (config.get("docker") or {}).get("image"), f"{path.name}: no docker image"
    setup = commands(config)
    assert any(re.search(r"cd ~/isosweep && .*pip install .*-e '\.\[gpu\]'", c) for c in setup), f"{path.name}: '.[gpu]' not installed"
    assert any(re.search(r"ray\[[^]]*default[^]]*\]==" + re.escape(_ray_version()), c) for c in setup), \
        f"{path.name}: the cluster's Ray is not pinned to this Ray ({_ray_version()})"
    worker = " ".join(docker_options(config, head=False) + commands(config, head=False))
    assert "--ipc=host" in worker or "--shm-size" in worker
    missing = [s for s in NCCL[config["provider"]["type"]] if s not in worker]
    assert not missing, f"{path.name}: worker NCCL setup lacks {missing}"


def _ray_version() -> str:
    import ray

    return ray.__version__


# ---------------------------------------------------------------------------------------------
# cluster YAMLs against the profiles


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=ids(CLUSTER_FILES))
def test_cluster_node_types_match_a_profile(path: Path):
    """A GPU node type is a machine some profile was sized for, declaring at least that profile's
    ``node`` (and no more than the machine has): the autoscaler then launches a node for a trial
    exactly when the trial's bundles fit one."""
    config = load(path)
    gpu_profiles = [p for p in load_profiles().values() if p.accelerator == "gpu"]
    if config["provider"]["type"] == "local":
        # One node type whose resources Ray detects; the GPU count is pinned in `ray start`.
        starts = config["head_start_ray_commands"] + config["worker_start_ray_commands"]
        gpus = {int(m) for c in starts for m in re.findall(r"--num-gpus[= ](\d+)", c)}
        assert gpus and all(any(g == p.node.GPU for p in gpu_profiles) for g in gpus), f"{path.name}: --num-gpus {gpus}"
        return
    node_types = gpu_node_types(config)
    assert node_types, f"{path.name}: no GPU node type"
    for name, node_type in node_types.items():
        machine = machine_type(node_type["node_config"])
        matching = [p for p in gpu_profiles if machine in p.node_types]
        assert matching, f"{path.name}: node type {name!r} ({machine}) is in no profile's node_types"
        declared = node_type["resources"]
        cpus, gpus = MACHINES[machine]
        assert declared["CPU"] <= cpus and declared["GPU"] <= gpus, f"{path.name}: {name} declares more than a {machine}"
        for profile in matching:
            assert declared["GPU"] == profile.node.GPU and declared["CPU"] >= profile.node.CPU, \
                f"{path.name}: {name} declares {declared}, profile node is {profile.node}"
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0 and head["resources"].get("CPU", 0) == 0, "trials belong on the GPU nodes"


def test_every_gpu_profile_runs_on_every_cloud():
    offered = {machine_type(t["node_config"]) for p in CLUSTER_FILES for t in gpu_node_types(load(p)).values()}
    for name, profile in load_profiles().items():
        if profile.accelerator == "gpu":
            assert set(profile.node_types) <= offered and profile.node_types, name
            for machine in profile.node_types:
                cpus, gpus = MACHINES[machine]
                assert profile.node.CPU <= cpus and profile.node.GPU == gpus, (name, machine)
