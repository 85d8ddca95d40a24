"""build_trainjob: the mapping of every TrainSpec field, and the official TrainJob CRD (strict)."""

from __future__ import annotations

import copy
import random

import pytest
import yaml

from components import DEFAULT_IMAGE
from components.launcher import TrainSpec, build_manifest, build_trainjob
from components.launcher.names import RUN_ID_LABEL, TASK_LABEL
from components.launcher.spec import NCCL_PRESETS
from tests.crds import CRDS, require_crd, schema_errors
from tests.launcher.k8s_helpers import CPU_REQUEST_ENV, env_values


def patch_of(manifest: dict) -> dict:
    (patch,) = manifest["spec"]["runtimePatches"]
    assert patch["manager"] == "kfp-ddp.io/launcher"
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    return node["template"]["spec"]["template"]


def test_defaults_run_the_trainer_through_torchrun_on_the_torch_runtime():
    m = build_trainjob(TrainSpec(name="job", namespace="ml", args=["--epochs", "1"]))
    assert m["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and m["kind"] == "TrainJob"
    assert m["metadata"]["name"] == "job" and m["metadata"]["namespace"] == "ml"
    assert m["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "torch-distributed",
    }
    trainer = m["spec"]["trainer"]
    assert trainer["image"] == DEFAULT_IMAGE
    assert trainer["command"] == ["python", "-m", "trainer.torchrun", "-m", "trainer.train"]
    assert trainer["args"] == ["--epochs", "1"]
    assert trainer["numNodes"] == 1 and trainer["numProcPerNode"] == 1
    # HOME and TMPDIR on the scratch emptyDirs, whatever the image says (read-only root).
    assert trainer["env"] == [
        {"name": "HOME", "value": "/home/kfp-ddp"},
        {"name": "TMPDIR", "value": "/tmp"},
        CPU_REQUEST_ENV,  # for the trainer's threads: a pod without a CPU limit sees every core
    ]
    # Never BestEffort, and a bounded disk (components/launcher/sizing.py).
    assert trainer["resourcesPerNode"] == {
        "requests": {"cpu": "1", "memory": "4Gi", "ephemeral-storage": "4Gi"},
        "limits": {"ephemeral-storage": "4Gi"},
    }
    assert "suspend" not in m["spec"] and "activeDeadlineSeconds" not in m["spec"]
    pod = patch_of(m)
    # Istio sidecars never exit: off on the job and its pods; the trainer checkpoints on SIGTERM.
    assert m["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert pod["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert pod["spec"]["terminationGracePeriodSeconds"] == 120
    assert pod["spec"]["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "home", "emptyDir": {"sizeLimit": "2Gi"}},
    ]
    # Restricted Pod Security: the pod runs as the image's non-root user; nothing escalates; the
    # root file system is read-only, so /tmp and HOME are emptyDirs.
    assert pod["spec"]["containers"] == [
        {
            "name": "node",
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "readOnlyRootFilesystem": True,
            },
            "volumeMounts": [
                {"name": "dshm", "mountPath": "/dev/shm"},
                {"name": "tmp", "mountPath": "/tmp"},
                {"name": "home", "mountPath": "/home/kfp-ddp"},
            ],
        }
    ]
    assert pod["spec"]["securityContext"] == {
        "fsGroup": 1000,
        "fsGroupChangePolicy": "OnRootMismatch",
        "runAsGroup": 1000,
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_nodes_processes_and_resources():
    spec = TrainSpec(
        name="job",
        workers=4,
        nproc_per_node=8,
        gpus_per_worker=8,
        cpu_request="32",
        cpu_limit="64",
        memory_request="256Gi",
        memory_limit="512Gi",
        gpu_resource="nvidia.com/gpu",
    )
    trainer = build_trainjob(spec)["spec"]["trainer"]
    assert trainer["numNodes"] == 4 and trainer["numProcPerNode"] == 8
    assert trainer["resourcesPerNode"] == {
        "requests": {"cpu": "32", "memory": "256Gi", "ephemeral-storage": "4Gi"},
        "limits": {
            "cpu": "64",
            "memory": "512Gi",
            "ephemeral-storage": "4Gi",
            "nvidia.com/gpu": "8",
        },
    }
    # GPUs requested: our trainer is told to use CUDA (never a quiet CPU fallback).
    assert trainer["args"][-2:] == ["--device", "cuda"]


@pytest.mark.parametrize("preset", sorted(NCCL_PRESETS))
def test_env_is_the_preset_then_the_users(preset):
    m = build_trainjob(TrainSpec(name="j", nccl_preset=preset, env={"NCCL_DEBUG": "X", "A": "1"}))
    env = env_values(m["spec"]["trainer"]["env"])
    assert env.pop(CPU_REQUEST_ENV["name"]) == str(CPU_REQUEST_ENV["valueFrom"])
    preset_env = {k: v.replace("{interface}", "eth0") for k, v in NCCL_PRESETS[preset].items()}
    scratch = {"HOME": "/home/kfp-ddp", "TMPDIR": "/tmp"}
    assert env == scratch | preset_env | {"NCCL_DEBUG": "X", "A": "1"}
    assert not any(name.startswith("PET_") for name in env)


def test_pod_settings_go_through_the_runtime_patch():
    spec = TrainSpec(
        name="j",
        pvcs=["data:/data:ro", "ws:/workspace"],
        shm_size="8Gi",
        node_selector={"nvidia.com/gpu.product": "H100"},
        tolerations=[
            "nvidia.com/gpu:NoSchedule",
            {"key": "spot", "value": "1", "effect": "NoExecute", "toleration_seconds": 60},
        ],
        service_account="trainer",
        image_pull_secrets=["regcred"],
        termination_grace_period_seconds=300,
        labels={"team": "vision"},
        annotations={"example.com/owner": "me"},
        run_id="0b5c9f5e-0000-4000-8000-000000000001",
    )
    m = build_trainjob(spec)
    pod = patch_of(m)
    assert pod["spec"]["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "home", "emptyDir": {"sizeLimit": "2Gi"}},
        {"name": "pvc-0", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}},
        {"name": "pvc-1", "persistentVolumeClaim": {"claimName": "ws"}},
    ]
    assert pod["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "home", "mountPath": "/home/kfp-ddp"},
        {"name": "pvc-0", "mountPath": "/data", "readOnly": True},
        {"name": "pvc-1", "mountPath": "/workspace"},
    ]
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert pod["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "spot", "value": "1", "effect": "NoExecute", "tolerationSeconds": 60},
    ]
    assert pod["spec"]["serviceAccountName"] == "trainer"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["terminationGracePeriodSeconds"] == 300
    labels = m["metadata"]["labels"]
    assert labels == {
        "team": "vision",
        RUN_ID_LABEL: "0b5c9f5e-0000-4000-8000-000000000001",
        TASK_LABEL: "train",
    }
    assert pod["metadata"]["labels"] == labels  # the pods carry the run labels too
    assert pod["metadata"]["annotations"] == {"example.com/owner": "me"}


def test_no_shm_and_no_pvcs_leave_only_the_scratch_folders():
    pod = patch_of(build_trainjob(TrainSpec(name="j", shm_size=None)))
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["tmp", "home"]
    (container,) = pod["spec"]["containers"]
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/tmp", "/home/kfp-ddp"]
    privileged = TrainSpec(name="j", shm_size=None, pod_security="privileged", run_as_user=None)
    privileged.run_as_group = None
    (container,) = patch_of(build_trainjob(privileged))["spec"]["containers"]
    # Not a Pod Security rule: the root stays read-only at every level.
    assert container["securityContext"] == {"readOnlyRootFilesystem": True}


def test_runtime_kueue_and_deadline():
    m = build_trainjob(
        TrainSpec.flat(
            name="j",
            runtime_name="torch-h100",
            runtime_kind="TrainingRuntime",
            kueue_queue="team-a",
            active_deadline_seconds=86400,
        )
    )
    assert m["spec"]["runtimeRef"]["name"] == "torch-h100"
    assert m["spec"]["runtimeRef"]["kind"] == "TrainingRuntime"
    assert m["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert m["spec"]["suspend"] is True  # Kueue admits it by unsuspending
    assert m["spec"]["activeDeadlineSeconds"] == 86400


def test_custom_image_and_command():
    m = build_trainjob(
        TrainSpec(name="j", image="me/train:1", command=["python", "train.py"], args=["--x"])
    )
    assert m["spec"]["trainer"]["image"] == "me/train:1"
    assert m["spec"]["trainer"]["command"] == ["python", "train.py"]
    assert m["spec"]["trainer"]["args"] == ["--x"]


def test_auto_renders_a_trainjob():
    spec = TrainSpec(name="j")
    assert spec.api == "auto" and build_manifest(spec) == build_trainjob(spec)
    assert build_manifest(TrainSpec(name="j", api="pytorchjob"))["kind"] == "PyTorchJob"


def test_build_is_pure():
    spec = TrainSpec(name="j", workers=3, pvcs=["a:/a"], env={"X": "1"})
    before = spec.to_dict()
    assert build_trainjob(spec) == build_trainjob(spec)
    assert spec.to_dict() == before


# -- every manifest passes the official TrainJob CRD (strict: nothing the server would prune) --

VARIATIONS = [
    {},
    {"workers": 2},
    {"workers": 8, "nproc_per_node": 8, "gpus_per_worker": 8},
    {"cpu_request": "500m", "cpu_limit": "2", "memory_request": "1Gi", "memory_limit": "4Gi"},
    {"env": {"A": "1"}, "nccl_preset": "infiniband"},
    {"nccl_preset": "tcp"},
    {"nccl_preset": "debug"},
    {"shm_size": None},
    {"pvcs": ["data:/data:ro", "ws:/workspace"]},
    {"node_selector": {"a.b/c": "d"}},
    {
        "tolerations": [
            {"key": "k", "operator": "Exists"},
            {"effect": "NoExecute", "key": "x", "value": "y", "toleration_seconds": 3},
        ]
    },
    {"service_account": "sa", "image_pull_secrets": ["s1"]},
    {"kueue_queue": "lq"},
    {"runtime_name": "torch-distributed-volcano"},
    {"runtime_name": "mine", "runtime_kind": "TrainingRuntime"},
    {"active_deadline_seconds": 2**40},
    {"termination_grace_period_seconds": None},
    {"labels": {"x": "y"}, "annotations": {}},
    {"run_id": "3f0e", "task_name": "t", "name": ""},
    {"command": ["bash", "-c", "echo hi"], "args": []},
]


def random_spec(rng: random.Random) -> TrainSpec:
    gpus = rng.choice([0, 1, 2, 4, 8])
    kwargs: dict = {
        "api": "trainjob",
        "name": f"job-{rng.randint(0, 10**6)}",
        "workers": rng.randint(1, 64),
        "gpus_per_worker": gpus,
        "nproc_per_node": rng.randint(1, max(gpus, 1)),
    }
    optional = {
        "cpu_request": lambda: rng.choice(["1", "250m", "2.5"]),
        "memory_limit": lambda: rng.choice(["64Gi", "100G"]),
        "env": lambda: {f"V{i}": str(i) for i in range(rng.randint(0, 3))},
        "nccl_preset": lambda: rng.choice([None, *NCCL_PRESETS]),
        "shm_size": lambda: rng.choice([None, "1Gi", "16Gi"]),
        "pvcs": lambda: [f"c{i}:/m{i}" + rng.choice(["", ":ro"]) for i in range(rng.randint(0, 3))],
        "node_selector": lambda: {"pool": "gpu"},
        "tolerations": lambda: [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "service_account": lambda: "runner",
        "image_pull_secrets": lambda: ["pull"],
        "kueue_queue": lambda: "queue-1",
        "runtime_name": lambda: rng.choice(["torch-distributed", "torch-h100"]),
        "active_deadline_seconds": lambda: rng.choice([None, 60, 86400]),
        "termination_grace_period_seconds": lambda: rng.choice([None, 0, 600]),
        "args": lambda: ["--epochs", str(rng.randint(1, 9))],
        "run_id": lambda: rng.choice(["", "a1b2", "x" * 80]),
        "labels": lambda: {"team": rng.choice(["a", "b"])},
        "command": lambda: ["python", "train.py"],
        "image": lambda: "registry.example/me/train:2",
    }
    for key, make in optional.items():
        if rng.random() < 0.4:
            kwargs[key] = make()
    if kwargs.get("shm_size") == "16Gi" and kwargs.get("memory_limit"):
        kwargs["shm_size"] = "1Gi"
    return TrainSpec.flat(**kwargs)


def all_specs() -> list[TrainSpec]:
    rng = random.Random(4321)
    return [TrainSpec.flat(**({"api": "trainjob", "name": "job"} | v)) for v in VARIATIONS] + [
        random_spec(rng) for _ in range(300)
    ]


def test_every_manifest_passes_the_official_crd_schema():
    require_crd("trainjob")
    for spec in all_specs():
        errors = schema_errors("trainjob", build_trainjob(spec))
        assert not errors, (spec, errors)


def test_the_schema_check_catches_what_the_server_would_prune():
    validator = require_crd("trainjob")
    good = build_trainjob(TrainSpec(name="j", workers=2, gpus_per_worker=1))
    assert not list(validator.iter_errors(good))
    for mutate in (
        lambda m: m["spec"].pop("runtimeRef"),  # required
        lambda m: m["spec"]["trainer"].__setitem__("numNodes", "2"),  # an integer
        lambda m: m["spec"]["trainer"].__setitem__("numNodes", 2**31),  # int32
        lambda m: m["spec"]["trainer"].__setitem__("replicas", 2),  # no such field
        lambda m: patch_of(m)["spec"].__setitem__("hostNetwork", True),  # not patchable
        lambda m: patch_of(m)["spec"].__setitem__("priorityClassName", "high"),  # not patchable
        lambda m: patch_of(m)["spec"]["containers"][0].__setitem__("image", "x"),  # not patchable
        lambda m: m["spec"].__setitem__("activeDeadlineSeconds", 0),  # minimum 1
        lambda m: m.pop("kind"),
    ):
        bad = copy.deepcopy(good)
        mutate(bad)
        assert list(validator.iter_errors(bad)), mutate


def test_the_upstream_examples_pass_the_same_check():
    """The checker agrees with upstream: Trainer's own example TrainJobs are valid."""
    require_crd("trainjob")
    folder = CRDS["trainjob"].parent
    examples = sorted(folder.glob("example-*.yaml"))
    assert examples
    for path in examples:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "TrainJob":
                assert schema_errors("trainjob", doc) == [], path.name


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_rdma_gets_its_device_and_ipc_lock_only_when_asked_for(api):
    spec = TrainSpec(
        api=api,
        name="j",
        nccl_preset="infiniband",
        rdma_resource="rdma/rdma_shared_device_a",
        gpus_per_worker=8,
        capabilities=["ipc_lock"],
        pod_security="privileged",
    )
    m = build_manifest(spec)
    if api == "trainjob":
        (container,) = patch_of(m)["spec"]["containers"]
        limits = m["spec"]["trainer"]["resourcesPerNode"]["limits"]
    else:
        (container,) = m["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
        limits = container["resources"]["limits"]
    assert container["securityContext"] == {
        "capabilities": {"add": ["IPC_LOCK"]},
        "readOnlyRootFilesystem": True,
    }
    assert limits["rdma/rdma_shared_device_a"] == "1" and limits["nvidia.com/gpu"] == "8"
    assert schema_errors(api, m) == []


def test_an_mpi_runtime_gets_its_launcher_pod_patched_like_the_nodes():
    """On an MPI runtime the TrainJob's image and command run in the launcher pod: it gets the
    same pod security, scratch folders and volumes as the node pods (else restricted refuses it)."""
    program = ["python", "-m", "trainer.mpirun", "/app/train.py"]
    mpi = build_trainjob(
        TrainSpec.flat(
            name="j",
            api="trainjob",
            runtime_name="deepspeed-distributed",
            command=program,
            image="my/mpi:1",
        )
    )
    jobs = mpi["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    node, launcher = jobs["replicatedJobs"]
    assert (node["name"], launcher["name"]) == ("node", "launcher")
    assert node["template"] == launcher["template"]
    torch = build_trainjob(TrainSpec(name="j", api="trainjob"))
    jobs = torch["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    assert [job["name"] for job in jobs["replicatedJobs"]] == ["node"]


def test_our_trainer_on_an_mpi_runtime_hands_the_nodes_cpu_request_to_mpirun():
    """The ranks mpirun starts over SSH see nothing of their pod's environment: the trainer's
    env says the nodes' CPU request in whole CPUs (rounded up), which ``trainer.mpirun`` hands
    to every rank; not on a torch runtime, where each node's own Downward API value is there."""
    spec = TrainSpec.flat(
        name="j",
        api="trainjob",
        runtime_name="kfp-ddp-mpi",
        image=f"{DEFAULT_IMAGE}-mpi",
        cpu_request="2500m",
    )
    env = build_trainjob(spec)["spec"]["trainer"]["env"]
    assert {"name": "KFP_DDP_NODE_CPU_REQUEST", "value": "3"} in env
    torch = build_trainjob(TrainSpec.flat(name="j", api="trainjob", cpu_request="2500m"))
    assert "KFP_DDP_NODE_CPU_REQUEST" not in str(torch["spec"]["trainer"]["env"])
