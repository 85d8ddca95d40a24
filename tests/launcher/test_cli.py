"""CLI: ``python -m components.launcher render [flags] -- TRAINER ARGS``, ``run``, ``rbac``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from components.launcher import TrainSpec, build_pytorchjob, build_tfjob, build_trainjob
from components.launcher.__main__ import cli
from tests.crds import schema_errors

REPO = Path(__file__).resolve().parents[2]


def render(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["render", *args])
    return result.exit_code, result.output


def test_render_every_flag_matches_the_same_spec_in_python():
    code, out = render(
        "--api",
        "pytorchjob",
        "--name",
        "resnet-ddp",
        "--namespace",
        "ml",
        "--image",
        "reg/img:1",
        "--workers",
        "4",
        "--nproc-per-node",
        "2",
        "--gpus-per-worker",
        "2",
        "--cpu-request",
        "8",
        "--cpu-limit",
        "16",
        "--memory-request",
        "32Gi",
        "--memory-limit",
        "64Gi",
        "--shm-size",
        "8Gi",
        "--pvc",
        "ws:/workspace",
        "--pvc",
        "ds:/data:ro",
        "--env",
        "A=1",
        "--nccl-preset",
        "infiniband",
        "--host-network",
        "--pod-security",
        "privileged",
        "--capability",
        "IPC_LOCK",
        "--run-as-user",
        "2000",
        "--pytorch-master",
        "--ephemeral-storage",
        "50Gi",
        "--node-selector",
        "pool=gpu",
        "--toleration",
        "nvidia.com/gpu:NoSchedule",
        "--toleration",
        "spot=true:NoExecute",
        "--service-account",
        "runner",
        "--image-pull-secret",
        "regcred",
        "--scheduler-name",
        "volcano",
        "--queue",
        "research",
        "--priority-class",
        "high",
        "--min-available",
        "3",
        "--kueue-queue",
        "lq",
        "--restart-policy",
        "ExitCode",
        "--backoff-limit",
        "5",
        "--active-deadline-seconds",
        "7200",
        "--clean-pod-policy",
        "All",
        "--ttl-seconds-after-finished",
        "60",
        "--label",
        "team=cv",
        "--run-id",
        "r-1",
        "--task-name",
        "fit",
        "--gpu-resource",
        "amd.com/gpu",
        "--termination-grace-period-seconds",
        "300",
        "--annotation",
        "example.com/owner=me",
        "--",
        "--data-dir",
        "/workspace/data",
        "--epochs",
        "3",
    )
    assert code == 0, out
    manifest = yaml.safe_load(out)
    expected = TrainSpec.flat(
        api="pytorchjob",
        name="resnet-ddp",
        namespace="ml",
        image="reg/img:1",
        workers=4,
        nproc_per_node=2,
        gpus_per_worker=2,
        cpu_request="8",
        cpu_limit="16",
        memory_request="32Gi",
        memory_limit="64Gi",
        shm_size="8Gi",
        pvcs=["ws:/workspace", "ds:/data:ro"],
        env={"A": "1"},
        nccl_preset="infiniband",
        host_network=True,
        pod_security="privileged",
        capabilities=["IPC_LOCK"],
        run_as_user=2000,
        pytorch_master=True,
        ephemeral_storage="50Gi",
        node_selector={"pool": "gpu"},
        tolerations=[
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute"},
        ],
        service_account="runner",
        image_pull_secrets=["regcred"],
        scheduler_name="volcano",
        queue="research",
        priority_class="high",
        min_available=3,
        kueue_queue="lq",
        restart_policy="ExitCode",
        backoff_limit=5,
        active_deadline_seconds=7200,
        clean_pod_policy="All",
        ttl_seconds_after_finished=60,
        labels={"team": "cv"},
        run_id="r-1",
        task_name="fit",
        gpu_resource="amd.com/gpu",
        termination_grace_period_seconds=300,
        annotations={"sidecar.istio.io/inject": "false", "example.com/owner": "me"},
        args=["--data-dir", "/workspace/data", "--epochs", "3"],
    )
    assert manifest == build_pytorchjob(expected)
    assert schema_errors("pytorchjob", manifest) == []


def test_every_trainspec_field_has_a_flag():
    from components.launcher.__main__ import SPEC_FLAGS

    names = {p.name for p in cli.commands["render"].params}
    assert set(SPEC_FLAGS) - {"args"} <= names  # args are the trailing TRAINER ARGS


def test_render_a_trainjob_with_runtime_flags():
    code, out = render(
        "--api",
        "trainjob",
        "--name",
        "tj",
        "--workers",
        "3",
        "--nproc-per-node",
        "2",
        "--gpus-per-worker",
        "2",
        "--runtime-name",
        "torch-h100",
        "--kueue-queue",
        "team-a",
        "--pvc",
        "ws:/workspace",
        "--",
        "--epochs",
        "2",
    )
    assert code == 0, out
    manifest = yaml.safe_load(out)
    expected = TrainSpec.flat(
        api="trainjob",
        name="tj",
        workers=3,
        nproc_per_node=2,
        gpus_per_worker=2,
        runtime_name="torch-h100",
        kueue_queue="team-a",
        pvcs=["ws:/workspace"],
        args=["--epochs", "2"],
    )
    assert manifest == build_trainjob(expected)
    assert schema_errors("trainjob", manifest) == []


def test_render_auto_prints_a_trainjob_and_says_so():
    result = CliRunner().invoke(cli, ["render", "--name", "a"])
    assert result.exit_code == 0
    assert "--api auto: rendering a TrainJob" in result.stderr
    assert yaml.safe_load(result.stdout)["kind"] == "TrainJob"


def test_render_a_tfjob_with_the_users_image_and_command():
    code, out = render(
        "--api",
        "tfjob",
        "--name",
        "tf",
        "--image",
        "registry.example.com/tf-mnist:1",
        "--command",
        '["python", "/app/train.py"]',
        "--workers",
        "3",
        "--ps-replicas",
        "1",
        "--gpus-per-worker",
        "1",
        "--",
        "--epochs",
        "2",
    )
    assert code == 0, out
    manifest = yaml.safe_load(out)
    expected = TrainSpec.flat(
        api="tfjob",
        name="tf",
        image="registry.example.com/tf-mnist:1",
        command=["python", "/app/train.py"],
        workers=3,
        ps_replicas=1,
        gpus_per_worker=1,
        args=["--epochs", "2"],
    )
    assert manifest == build_tfjob(expected)
    assert schema_errors("tfjob", manifest) == []
    assert list(manifest["spec"]["tfReplicaSpecs"]) == ["Chief", "Worker", "PS"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "--image: TrainSpec.image="),
        (("--image", "tf:1"), "--command: TrainSpec.command=None is invalid: api=tfjob needs"),
        (
            ("--image", "tf:1", "--command", '["python", "t.py"]', "--nproc-per-node", "2"),
            "one TensorFlow process per pod",
        ),
    ],
)
def test_render_a_tfjob_without_the_users_program_exits_2(args, message):
    code, out = render("--api", "tfjob", "--name", "tf", *args)
    assert code == 2 and message in out, out


def test_render_refuses_what_the_api_cannot_express_naming_the_flag():
    code, out = render("--api", "trainjob", "--name", "a", "--scheduler-name", "volcano")
    assert code == 2 and "--scheduler-name:" in out and "podGroupPolicy" in out


def test_render_elastic_flags():
    code, out = render(
        "--api",
        "pytorchjob",
        "--name",
        "el",
        "--workers",
        "2",
        "--elastic-min-replicas",
        "1",
        "--elastic-max-replicas",
        "4",
        "--max-restarts",
        "3",
    )
    assert code == 0, out
    spec = yaml.safe_load(out)["spec"]
    assert spec["elasticPolicy"] == {
        "minReplicas": 1,
        "maxReplicas": 4,
        "maxRestarts": 3,
        "rdzvBackend": "c10d",
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "0"], "--workers: TrainSpec.workers=0 is invalid"),
        (["--cpu-request", "lots"], "--cpu-request: TrainSpec.cpu_request='lots'"),
        (["--workers", "two"], "'two' is not a valid integer"),
        (["--name", "Bad_Name"], "DNS-1035"),
        (["--pvc", "nocolon"], "CLAIM:PATH[:ro]"),
        (["--nccl-preset", "rdma"], "'rdma' is not one of"),
        (["--shm-size", "big"], "shm_size"),
        (["--env", "NOEQUALS"], "KEY=VALUE"),
        (["--max-restarts", "2"], "elastic"),
        (["--api", "tfjobz"], "'tfjobz' is not one of"),
        (["--elastic-min-replicas", "1"], "elastic_max_replicas"),
        (["--backoff-limit", "-1"], "backoff_limit"),
        (["--active-deadline-seconds", "0"], "active_deadline_seconds"),
        (["--gpus-per-worker", "1", "--nproc-per-node", "2"], "nproc_per_node"),
        (["--command", "not json"], "not JSON"),
    ],
)
def test_bad_flag_values_exit_2_with_a_clear_message(args, message):
    code, out = render(*args)
    assert code == 2, out
    assert message in out
    assert "Traceback" not in out


def test_module_entry_point_prints_yaml_without_a_cluster():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "components.launcher",
            "render",
            "--api",
            "pytorchjob",
            "--name",
            "x",
            "--workers",
            "2",
            "--",
            "--epochs",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "KUBECONFIG": "/nonexistent"},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    manifest = yaml.safe_load(proc.stdout)
    assert manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2  # Workers only
    assert manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "args"
    ] == ["--epochs", "1"]
    bad = subprocess.run(
        [sys.executable, "-m", "components.launcher", "render", "--workers", "-3"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert bad.returncode == 2 and "workers" in bad.stderr


def test_run_local_through_the_cli(tmp_path: Path):
    script = tmp_path / "hello.py"
    script.write_text("import os; print('rank', os.environ['RANK'])\n")
    result = CliRunner().invoke(
        cli,
        [
            "run",
            "--backend",
            "local",
            "--api",
            "pytorchjob",
            "--name",
            "hello",
            "--pytorch-master",  # the script reads RANK: the Master layout's contract
            "--workers",
            "2",
            "--command",
            json.dumps(["python", str(script)]),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "[worker-0] rank 1" in result.output and '"phase": "Succeeded"' in result.output
    failing = CliRunner().invoke(
        cli,
        [
            "run",
            "--backend",
            "local",
            "--api",
            "pytorchjob",
            "--name",
            "bad",
            "--restart-policy",
            "Never",
            "--command",
            json.dumps(["python", "-c", "raise SystemExit(4)"]),
        ],
    )
    assert failing.exit_code == 1 and "exited with code 4" in failing.output


def test_rbac_command():
    result = CliRunner().invoke(cli, ["rbac", "--namespace", "team-a", "--service-account", "sa"])
    assert result.exit_code == 0
    docs = list(yaml.safe_load_all(result.output))
    assert [d["kind"] for d in docs] == ["Role", "RoleBinding"]  # no cluster-scoped objects
    assert docs[1]["subjects"][0] == {"kind": "ServiceAccount", "name": "sa", "namespace": "team-a"}
    bad = CliRunner().invoke(cli, ["rbac", "--namespace", "Bad NS"])
    assert bad.exit_code == 2 and "namespace='Bad NS'" in bad.output


@pytest.mark.parametrize(
    ("old", "new", "value", "field"),
    [
        ("--cpu", "--cpu-request", "8", ("resources", "requests", "cpu")),
        ("--memory", "--memory-request", "32Gi", ("resources", "requests", "memory")),
        # A PyTorchJob option (PyTorchJobOptions): its old flag has the new one's type.
        ("--elastic-min", "--elastic-min-replicas", "2", ("elasticPolicy", "minReplicas")),
    ],
)
def test_a_flag_renamed_in_0_2_works_by_its_old_name_with_a_warning(old, new, value, field):
    args = ["render", "--api", "pytorchjob", "--name", "resnet-ddp", "--workers", "2"]
    args += ["--elastic-max-replicas", "4"] if "elastic" in old else []
    by_old = CliRunner().invoke(cli, [*args, old, value])
    by_new = CliRunner().invoke(cli, [*args, new, value])
    assert by_old.exit_code == 0 and by_new.exit_code == 0, by_old.output + by_new.output
    assert f"WARNING: {old} is now {new}" in by_old.stderr and "WARNING" not in by_new.stderr
    manifest = yaml.safe_load(by_new.stdout)
    assert yaml.safe_load(by_old.stdout) == manifest
    found = manifest["spec"]
    if field[0] == "resources":
        found = found["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    for key in field:
        found = found[key]
    assert str(found) == value
    both = CliRunner().invoke(cli, ["render", old, value, new, value])
    assert both.exit_code == 2 and f"give {new} alone" in both.output
