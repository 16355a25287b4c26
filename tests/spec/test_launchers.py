"""Launchers beside the `ray up` clusters: the SLURM batch script and the KubeRay RayJob.

``clusters/slurm-h200.sbatch`` is parsed by bash, its ``#SBATCH`` header read as sbatch reads it, and
rehearsed on this machine: SLURM's variables set by the test, a fake ``scontrol`` and ``srun`` on the
PATH (``srun -w NODE cmd`` runs ``cmd`` here), so that the script's own ``ray start --head`` starts a
real Ray head, which the sweep command (a fake ``python``) must find at the address it is given.

``clusters/kuberay/rayjob-h200.yaml`` is walked key by key against the fields of KubeRay's RayJob CRD
(``tests/spec/data/kuberay_rayjob_fields.json``). That file was extracted by :func:`crd_fields` from
``ray-operator/config/crd/bases/ray.io_rayjobs.yaml`` of github.com/ray-project/kuberay at commit
feeaf72facab4881ba2b179248bb67315634e229 (the same CRD as release v1.7.0); to redo it for another release:

    git -C kuberay show <commit>:ray-operator/config/crd/bases/ray.io_rayjobs.yaml > /tmp/crd.yaml
    .venv/bin/python tests/spec/test_launchers.py /tmp/crd.yaml <commit> > tests/spec/data/kuberay_rayjob_fields.json
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from isosweep.trial.localhost import free_port
from sweep_helpers import processes_under

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "clusters" / "slurm-h200.sbatch"
RAYJOB = ROOT / "clusters" / "kuberay" / "rayjob-h200.yaml"
FIELDS = Path(__file__).parent / "data" / "kuberay_rayjob_fields.json"
RAY = str(Path(sys.executable).with_name("ray"))


def gpu_node() -> tuple[float, float]:
    """What the h200 profiles' nodes have (clusters/profiles.yaml): the launchers must give Ray at least this."""
    from isosweep.spec.profiles import load_profiles

    nodes = {(p.node.CPU, p.node.GPU) for p in load_profiles().values() if p.accelerator == "gpu"}
    assert len(nodes) == 1, nodes
    return nodes.pop()


# ---------------------------------------------------------------------------------------------
# SLURM: the batch script as sbatch and bash read it

SBATCH_OPTIONS = {"job-name", "partition", "account", "nodes", "exclusive", "ntasks-per-node", "cpus-per-task",
                  "gpus-per-task", "gres", "time", "output", "error", "mem", "constraint", "qos", "reservation"}
"""Long options of sbatch (``man sbatch``) a launcher like this one may set; anything else is a typo."""

DIRECTIVE = re.compile(r"^#SBATCH --(?P<option>[a-z-]+)(=(?P<value>\S+))?\s*(?P<comment>#.*)?$")


def sbatch_header(text: str) -> dict[str, tuple[str | None, str]]:
    """The ``#SBATCH`` directives sbatch reads: option -> (value, the line's comment). sbatch stops at the first
    line that is neither blank nor a comment, so a directive after it would be ignored: that is an error here."""
    directives: dict[str, tuple[str | None, str]] = {}
    in_header = True
    for number, line in enumerate(text.splitlines()[1:], start=2):
        in_header = in_header and (not line.strip() or line.startswith("#"))
        if not line.startswith("#SBATCH"):
            continue
        assert in_header, f"line {number}: #SBATCH after the first command is ignored by sbatch: {line}"
        match = DIRECTIVE.match(line)
        assert match, f"line {number}: not a directive of the form '#SBATCH --option[=value]': {line}"
        directives[match["option"]] = (match["value"], match["comment"] or "")
    return directives


def test_bash_parses_the_script():
    done = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def test_sbatch_header_is_well_formed_and_sized_for_the_profiles():
    header = sbatch_header(SBATCH.read_text())
    assert set(header) <= SBATCH_OPTIONS, set(header) - SBATCH_OPTIONS
    assert re.fullmatch(r"(\d+-)?\d{1,2}:\d{2}:\d{2}", header["time"][0]), header["time"]
    assert int(header["nodes"][0]) >= 1 and header["ntasks-per-node"][0] == "1"  # one Ray node per machine
    assert "exclusive" in header and header["exclusive"][0] is None
    cpus, gpus = gpu_node()
    assert int(header["cpus-per-task"][0]) >= cpus and int(header["gpus-per-task"][0].split(":")[-1]) == gpus


def test_every_place_to_edit_is_marked():
    text = SBATCH.read_text()
    header = sbatch_header(text)
    for option in ("partition", "account", "nodes", "cpus-per-task", "gpus-per-task", "time"):
        assert header[option][1].startswith("# EDIT"), f"#SBATCH --{option} lacks its '# EDIT' marker"
    for variable in ("SWEEP", "BUDGET", "SHARED", "MLFLOW_TRACKING_URI"):
        line = next(li for li in text.splitlines() if li.startswith(f'{variable}="${{{variable}:-'))
        assert "# EDIT" in line, f"{variable}: no '# EDIT' marker"
    assert re.search(r"# EDIT: load this project's environment.*\n.*activate", text)


def test_script_keeps_ray_and_mlflow_private():
    text = SBATCH.read_text()
    commands = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not [c for c in commands if "0.0.0.0" in c], "a command binds 0.0.0.0"
    assert "--dashboard-host=127.0.0.1" in text and 'mlflow server --host "$head_node_ip"' in text
    assert "export RAY_AUTH_MODE=token" in text
    # the token is made when the job runs, never written here
    assert all("$" in line.split("=", 1)[1] for line in commands if re.match(r"\s*(export )?RAY_AUTH_TOKEN=", line))


# ---------------------------------------------------------------------------------------------
# SLURM: the rehearsal

FAKE_SCONTROL = """#!/bin/bash
# scontrol show hostnames LIST: one node a line (the test's node lists are comma-separated names)
[ "$1 $2" = "show hostnames" ] && tr ',' '\\n' <<<"$3"
"""

FAKE_SRUN = """#!{python}
# srun [options] -w NODE command...: logs what it was asked, then runs the command here in its place (same pid).
import json, os, sys
args = sys.argv[1:]
options = []
while args[0].startswith("-"):
    options += args[:2] if args[0] == "-w" else args[:1]
    args = args[2:] if args[0] == "-w" else args[1:]
keep = ("MLFLOW_TRACKING_URI", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "PYTHONPATH")
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({{"options": options, "command": args, "pid": os.getpid(),
                          "env": {{k: os.environ.get(k) for k in keep}}}}) + "\\n")
if args[0] == "hostname" or args[1:3] == ["start", "--head"]:
    os.execvp(args[0], args)
if args[:2] == ["mlflow", "server"]:  # a stand-in that opens the port the script waits for
    host, port = args[args.index("--host") + 1], args[args.index("--port") + 1]
    os.execv(sys.executable, [sys.executable, "-m", "http.server", port, "--bind", host])
if args[1:2] == ["start"]:  # a worker: logged only (see the test)
    sys.exit(0)
sys.exit(f"fake srun: unexpected command {{args}}")
"""

FAKE_PYTHON = """#!{python}
# The sweep (`python -u -m isosweep.cli sweep ...`): records its arguments and environment, and asks the Ray
# head at the --address it was given for its status.
import json, os, subprocess, sys
args = sys.argv[1:]
status = subprocess.run([os.environ["RAY"], "status", "--address", args[args.index("--address") + 1]],
                        capture_output=True, text=True, timeout=300)
keep = ("MLFLOW_TRACKING_URI", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "PYTHONPATH")
with open(os.environ["FAKE_SWEEP"], "w") as out:
    json.dump({{"argv": args, "env": {{k: os.environ.get(k) for k in keep}}, "status_rc": status.returncode,
               "status": status.stdout + status.stderr}}, out)
"""


def write_tool(path: Path, text: str) -> Path:
    path.write_text(text.format(python=sys.executable) if "{python}" in text else text)
    path.chmod(0o755)
    return path


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop(pids: list[int]) -> None:
    """Stop these processes (this rehearsal's only: `ray stop` would stop every Ray on the machine)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in [p for p in pids if alive(p)]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)


def role(step: dict) -> str:
    """What an srun step of the script is: hostname, mlflow, head or worker."""
    command = step["command"]
    return command[0] if command[0] in ("hostname", "mlflow") else "head" if "--head" in command else "worker"


def run_script(env: dict[str, str], cwd: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """bash SBATCH in its own process group, which is killed if it runs past ``timeout_s``."""
    proc = subprocess.Popen(["bash", str(SBATCH)], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.slow
def test_rehearsal_the_script_starts_a_ray_head_and_runs_the_sweep_against_it(tmp_path):
    """Two nodes, gpu-a (the head) and gpu-b. The head's `ray start --head` and MLflow's stand-in really run;
    gpu-b's `ray start --address` is only logged and checked: a second raylet on this machine would cost tens of
    seconds on a busy runner (tests/run/test_submit.py rehearses a two-node cluster)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_tool(bin_dir / "scontrol", FAKE_SCONTROL)
    write_tool(bin_dir / "srun", FAKE_SRUN)
    python = write_tool(bin_dir / "fake-python", FAKE_PYTHON)
    ray_tmp = tempfile.mkdtemp(prefix="isl-")  # short: Ray's socket paths must stay under ~107 bytes
    shared, log, sweep_log = tmp_path / "shared", tmp_path / "srun.jsonl", tmp_path / "sweep.json"
    head_port, dashboard_port, mlflow_port = free_port(), free_port(), free_port()
    env = {
        "PATH": os.pathsep.join([str(bin_dir), str(Path(RAY).parent), "/usr/bin", "/bin"]),
        "HOME": str(tmp_path), "LANG": "C.UTF-8",
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu-a,gpu-b", "SLURM_JOB_NUM_NODES": "2",
        "SLURM_CPUS_PER_TASK": "1", "SLURM_GPUS_PER_TASK": "0", "SLURM_SUBMIT_DIR": str(ROOT),
        "SWEEP": "sweeps/smoke.yaml", "BUDGET": "2048", "SHARED": str(shared),
        "HEAD_PORT": str(head_port), "DASHBOARD_PORT": str(dashboard_port), "MLFLOW_PORT": str(mlflow_port),
        "NODES_WAIT_S": "0",  # gpu-b never joins (see above): go on at once
        # Ray's fixed default ports that another Ray on this machine holds (the "multi-tenant" case of Ray's guide)
        "RAY_START_ARGS": f"--dashboard-agent-listen-port={free_port()} --ray-client-server-port={free_port()}",
        "RAY": RAY, "PYTHON": str(python), "RAY_TMPDIR": ray_tmp, "FAKE_LOG": str(log), "FAKE_SWEEP": str(sweep_log),
    }
    started = time.monotonic()
    try:
        done = run_script(env, cwd=tmp_path, timeout_s=540)
        steps = [json.loads(line) for line in log.read_text().splitlines()]
        left = [s["pid"] for s in steps if alive(s["pid"])] + processes_under(ray_tmp)
    finally:
        logged = [json.loads(line)["pid"] for line in log.read_text().splitlines()] if log.exists() else []
        stop(processes_under(ray_tmp) + logged)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not left, f"still running after the script ended: {left}"  # its trap stopped Ray and MLflow
    print(f"rehearsal: {time.monotonic() - started:.0f} s")

    ips = subprocess.run(["hostname", "--ip-address"], capture_output=True, text=True, check=True).stdout.split()
    ip = next((a for a in ips if "." in a), ips[0])
    by_role = {role(s): s for s in steps}
    assert sorted(role(s) for s in steps) == ["head", "hostname", "mlflow", "worker"], [s["command"] for s in steps]
    mlflow = by_role["mlflow"]
    assert "--overlap" in mlflow["options"] and ["-w", "gpu-a"] == mlflow["options"][-2:]
    assert mlflow["command"][mlflow["command"].index("--host") + 1] == ip  # the head's address, not 0.0.0.0
    assert f"--backend-store-uri sqlite:///{shared}/mlflow/mlflow.db" in " ".join(mlflow["command"])
    assert mlflow["env"]["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    head, worker = by_role["head"], by_role["worker"]
    assert head["options"] == ["--nodes=1", "--ntasks=1", "--cpus-per-task=1", "-w", "gpu-a"]
    assert worker["options"] == ["--nodes=1", "--ntasks=1", "--cpus-per-task=1", "-w", "gpu-b"]
    assert {f"--node-ip-address={ip}", f"--port={head_port}", "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard_port}"} <= set(head["command"])
    assert worker["command"][:3] == [RAY, "start", f"--address={ip}:{head_port}"]
    for step in (head, worker):
        # SLURM's CPUs and GPUs per task, then RAY_START_ARGS as separate words, and --block at the end
        tail = ["--num-cpus", "1", "--num-gpus", "0", "--disable-usage-stats", *env["RAY_START_ARGS"].split(),
                "--block"]
        assert step["command"][-len(tail):] == tail, step["command"]
        # what every Ray process inherits: MLflow on the head, the job's token, this checkout's code
        assert step["env"]["MLFLOW_TRACKING_URI"] == f"http://{ip}:{mlflow_port}"
        assert step["env"]["RAY_AUTH_MODE"] == "token" and re.fullmatch(r"[0-9a-f]{64}", step["env"]["RAY_AUTH_TOKEN"])
        assert step["env"]["PYTHONPATH"].split(":")[0] == str(ROOT / "platform")
    assert head["env"]["RAY_AUTH_TOKEN"] == worker["env"]["RAY_AUTH_TOKEN"]
    assert "1 of 2 Ray nodes joined" in done.stderr

    sweep = json.loads(sweep_log.read_text())
    assert sweep["argv"] == ["-u", "-m", "isosweep.cli", "sweep", "sweeps/smoke.yaml", "--address", f"{ip}:{head_port}",
                             "--runs", f"{shared}/runs", "--no-dashboards", "--budget", "2048"]
    assert all(sweep["env"][k] == head["env"][k] for k in ("MLFLOW_TRACKING_URI", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN"))
    # the head answered the sweep at that address, with the job's token, with the CPUs SLURM gave the node
    assert sweep["status_rc"] == 0 and " node_" in sweep["status"] and "/1.0 CPU" in sweep["status"], sweep["status"]


# ---------------------------------------------------------------------------------------------
# KubeRay: the fields of the RayJob CRD


def _is_pod_template(node: dict) -> bool:
    props = node.get("properties") or {}
    return set(props) == {"metadata", "spec"} and "containers" in (props["spec"].get("properties") or {})


def crd_fields(crd: dict, levels: int = 4, pod_levels: int = 3) -> dict[str, str]:
    """Every field path of a RayJob CRD's ``v1`` schema (``openAPIV3Schema``, less ``status``) with its kind.

    Paths are dotted; ``[]`` stands for an array's items, ``{}`` for a map's values. Kinds: a JSON type
    (``string``, ``integer``, ``boolean``, ``number``), ``int-or-string``, ``object`` (its fields are listed),
    ``array``, ``map``, ``pod`` (a Kubernetes pod template: its fields are listed once, under ``pod.``, for
    the three templates the CRD embeds) and ``unchecked``: the top-level ``metadata`` (ObjectMeta, which the
    API server checks itself), and an object more than ``levels`` fields below the top (``pod_levels``
    below a pod template's ``metadata`` and ``spec``), left out to keep the file small.
    """
    root = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]
    fields: dict[str, str] = {"": "object"}
    pods: list[dict] = []

    def walk(node: dict, path: str, left: int) -> None:
        if _is_pod_template(node) and not path.startswith("pod."):
            fields[path] = "pod"
            pods.append(node)
        elif node.get("type") == "array":
            fields[path] = "array"
            walk(node["items"], f"{path}[]", left)
        elif "properties" in node and left == 0:
            fields[path] = "unchecked"
        elif "properties" in node:
            fields[path] = "object"
            for key, child in node["properties"].items():
                walk(child, f"{path}.{key}" if path else key, left - 1)
        elif isinstance(node.get("additionalProperties"), dict):
            fields[path] = "map"
            walk(node["additionalProperties"], f"{path}{{}}", left)
        elif node.get("x-kubernetes-int-or-string"):
            fields[path] = "int-or-string"
        else:
            fields[path] = "unchecked" if node.get("type") == "object" else node["type"]

    for key, child in root["properties"].items():
        if key != "status":
            walk(child, key, levels)
    if pods:
        assert all(p == pods[0] for p in pods), "the CRD's pod templates differ: list them one by one"
        fields["pod"] = "object"
        for key, child in pods[0]["properties"].items():
            walk(child, f"pod.{key}", pod_levels)
    return dict(sorted(fields.items()))


KINDS = {"string": (str,), "integer": (int,), "boolean": (bool,), "number": (int, float), "int-or-string": (int, str)}


def unknown_fields(doc: Any, fields: dict[str, str]) -> list[str]:
    """What of ``doc`` (a parsed RayJob manifest) KubeRay's RayJob has no field for, or types otherwise: one
    ``path: why`` each, the path as in the manifest (``spec.rayClusterSpec.workerGroupSpecs[0].replicas``)."""
    errors: list[str] = []

    def check(value: Any, where: str, path: str) -> None:
        kind = fields[path]
        if kind == "pod":
            check(value, where, "pod")
        elif kind in ("object", "map"):
            if not isinstance(value, dict):
                errors.append(f"{where}: an object expected, not {value!r}")
                return
            for key, child in value.items():
                inner = f"{path}{{}}" if kind == "map" else f"{path}.{key}" if path else key
                at = f"{where}.{key}" if where else key
                if inner in fields:
                    check(child, at, inner)
                else:
                    errors.append(f"{at}: no such field in KubeRay's RayJob (ray.io/v1)")
        elif kind == "array":
            if not isinstance(value, list):
                errors.append(f"{where}: a list expected, not {value!r}")
                return
            for i, item in enumerate(value):
                check(item, f"{where}[{i}]", f"{path}[]")
        elif kind != "unchecked" and (isinstance(value, bool) != (kind == "boolean")
                                      or not isinstance(value, KINDS[kind])):
            errors.append(f"{where}: {kind} expected, not {value!r}")

    check(doc, "", "")
    return errors


def kuberay() -> dict:
    return json.loads(FIELDS.read_text())


def rayjob() -> dict:
    return yaml.safe_load(RAYJOB.read_text())


def test_the_fields_file_names_the_crd_it_came_from():
    data = kuberay()
    assert re.fullmatch(r"github\.com/ray-project/kuberay@[0-9a-f]{40} \S+ray\.io_rayjobs\.yaml", data["source"])
    assert (data["group"], data["version"], data["kind"]) == ("ray.io", "v1", "RayJob")
    assert data["fields"]["spec.shutdownAfterJobFinishes"] == "boolean"
    assert data["fields"]["spec.rayClusterSpec.workerGroupSpecs[].template"] == "pod"


def test_crd_fields_reads_a_schema_as_documented():
    container = {"type": "object", "properties": {"name": {"type": "string"},
                                                  "env": {"type": "array", "items": {"type": "object", "properties": {
                                                      "valueFrom": {"type": "object", "properties": {
                                                          "x": {"type": "string"}}}}}}}}
    pod = {"type": "object", "properties": {"metadata": {"type": "object", "properties": {}},
                                            "spec": {"type": "object", "properties": {
                                                "containers": {"type": "array", "items": container}}}}}
    schema = {"type": "object", "properties": {
        "metadata": {"type": "object"}, "status": {"type": "object", "properties": {"a": {"type": "string"}}},
        "spec": {"type": "object", "properties": {
            "replicas": {"type": "integer"}, "port": {"x-kubernetes-int-or-string": True, "anyOf": []},
            "params": {"type": "object", "additionalProperties": {"type": "string"}},
            "deep": {"type": "object", "properties": {"deeper": {"type": "object", "properties": {}}}},
            "template": pod, "other": pod}}}}
    crd = {"spec": {"versions": [{"name": "v1alpha1"}, {"name": "v1", "schema": {"openAPIV3Schema": schema}}]}}
    assert crd_fields(crd, levels=2, pod_levels=3) == {
        "": "object", "metadata": "unchecked", "spec": "object", "spec.replicas": "integer",
        "spec.port": "int-or-string", "spec.params": "map", "spec.params{}": "string", "spec.deep": "object",
        "spec.deep.deeper": "unchecked", "spec.template": "pod", "spec.other": "pod", "pod": "object",
        "pod.metadata": "object", "pod.spec": "object", "pod.spec.containers": "array",
        "pod.spec.containers[]": "object", "pod.spec.containers[].name": "string",
        "pod.spec.containers[].env": "array", "pod.spec.containers[].env[]": "object",
        "pod.spec.containers[].env[].valueFrom": "unchecked"}


def test_every_key_of_the_rayjob_is_a_kuberay_field():
    data = kuberay()
    doc = rayjob()
    assert (doc["apiVersion"], doc["kind"]) == (f"{data['group']}/{data['version']}", data["kind"])
    assert unknown_fields(doc, data["fields"]) == []


WORKER = ("spec", "rayClusterSpec", "workerGroupSpecs", 0)
HEAD_POD = ("spec", "rayClusterSpec", "headGroupSpec", "template", "spec")
MISTAKES = {
    # where (keys down from the top), what is put there -> the start of the one error the check must report
    "a misspelled RayJob field": (("spec",), "shutdownAfterJobFinish", True,
                                  "spec.shutdownAfterJobFinish: no such field"),
    "a misspelled group field": (WORKER, "replica", 2,
                                 "spec.rayClusterSpec.workerGroupSpecs[0].replica: no such field"),
    "a misspelled container field": (
        (*HEAD_POD, "containers", 0), "imagePulPolicy", "Always",
        "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].imagePulPolicy: no such field"),
    "a misspelled volume field": (
        (*WORKER, "template", "spec", "volumes", 0, "persistentVolumeClaim"), "claimname", "x",
        "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.volumes[0].persistentVolumeClaim.claimname: no such"),
    "a number where KubeRay wants a string": (
        (*WORKER, "rayStartParams"), "num-cpus", 192,
        "spec.rayClusterSpec.workerGroupSpecs[0].rayStartParams.num-cpus: string expected"),
    "a string where KubeRay wants a boolean": (("spec",), "shutdownAfterJobFinishes", "yes",
                                               "spec.shutdownAfterJobFinishes: boolean expected"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES), ids=list(MISTAKES))
def test_the_field_check_names_a_mistake(mistake: str):
    where, key, value, expected = MISTAKES[mistake]
    doc = json.loads(json.dumps(rayjob()))  # without YAML's aliases: the groups share their env, mounts and volumes
    node = doc
    for step in where:
        node = node[step]
    node[key] = value
    errors = unknown_fields(doc, kuberay()["fields"])
    assert len(errors) == 1 and errors[0].startswith(expected), errors


# ---------------------------------------------------------------------------------------------
# KubeRay: what the RayJob runs, and on what


def containers(doc: dict) -> list[dict]:
    cluster = doc["spec"]["rayClusterSpec"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_the_job_runs_the_sweep_as_make_submit_does():
    from isosweep.run.submit import EXCLUDES, entrypoint

    spec = rayjob()["spec"]
    words = shlex.split(spec["entrypoint"])
    option = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
    assert words == entrypoint(words[6], option.get("--budget"), option["--runs"])
    assert option["--address"] == "auto"
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert runtime_env["working_dir"] and runtime_env["excludes"] == EXCLUDES
    # trial folders go to the claim every pod mounts, at the same place
    shared = {m["mountPath"] for c in containers(rayjob()) for m in c["volumeMounts"] if m["name"] == "shared"}
    assert len(shared) == 1 and option["--runs"].startswith(shared.pop() + "/")


def test_the_cluster_is_sized_for_the_profiles_and_kept_private():
    import ray

    doc = rayjob()
    spec, cluster = doc["spec"], doc["spec"]["rayClusterSpec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    assert cluster["rayVersion"] == ray.__version__  # the Ray the code was tested with
    assert cluster["authOptions"]["mode"] == "token"
    head = cluster["headGroupSpec"]
    assert head.get("serviceType", "ClusterIP") == "ClusterIP" and not head.get("enableIngress")
    assert head["rayStartParams"]["num-cpus"] == "0"  # trials belong on the GPU pods
    cpus, gpus = gpu_node()
    for group in cluster["workerGroupSpecs"]:
        # the sweep sizes its concurrency from the cluster at its start: a fixed number of pods
        assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] >= 1
        assert float(group["rayStartParams"]["num-cpus"]) >= cpus
        pod = group["template"]["spec"]
        assert pod["nodeSelector"], "GPU pods without a node selector"
        assert [c["resources"]["limits"]["nvidia.com/gpu"] for c in pod["containers"]] == [gpus]
    assert not cluster.get("enableInTreeAutoscaling")
    uris = {e["value"] for c in containers(doc) for e in c["env"] if e["name"] == "MLFLOW_TRACKING_URI"}
    assert len(uris) == 1 and len(containers(doc)) == 1 + len(cluster["workerGroupSpecs"])
    assert all({"/dev/shm"} <= {m["mountPath"] for m in c["volumeMounts"]} for c in containers(doc))


def test_every_place_to_edit_in_the_rayjob_is_marked():
    lines = RAYJOB.read_text().splitlines()
    for start in ("  name:", "  entrypoint:", "    rayVersion:", "image: &image", "value: http://", "claimName:",
                  "replicas:", "node.kubernetes.io/instance-type:"):
        marked = [li for li in lines if li.strip().startswith(start.strip())]
        assert marked and all("# EDIT" in li for li in marked), f"{start.strip()} lacks its '# EDIT' marker"
    text = RAYJOB.read_text()
    assert not re.search(r"(?i)(password|secret|token)\s*:\s*[\"']?[A-Za-z0-9+/=_-]{16,}", text)


if __name__ == "__main__":  # the extraction the module docstring describes
    crd_file, commit = sys.argv[1:3]
    crd = yaml.safe_load(Path(crd_file).read_text())
    json.dump({"source": f"github.com/ray-project/kuberay@{commit} ray-operator/config/crd/bases/ray.io_rayjobs.yaml",
               "group": crd["spec"]["group"], "version": "v1", "kind": crd["spec"]["names"]["kind"],
               "fields": crd_fields(crd)}, sys.stdout, indent=1)
    print()
