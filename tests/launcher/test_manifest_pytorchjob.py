"""build_pytorchjob: every field, the official PyTorchJob CRD schema, the admission rules."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import pytest

from components import DEFAULT_IMAGE
from components.launcher import (
    PvcMount,
    SpecError,
    TrainSpec,
    admission_errors,
    build_pytorchjob,
)
from components.launcher.names import RUN_ID_LABEL, TASK_LABEL, derive_job_name
from components.launcher.spec import NCCL_PRESETS
from tests.crds import require_crd, schema_errors
from tests.launcher.k8s_helpers import CPU_REQUEST_ENV, env_values


def pod(manifest: dict, rtype: str | None = None) -> dict:
    """The pod template of ``rtype`` (default: the first replica type, Master or Worker)."""
    replicas = manifest["spec"]["pytorchReplicaSpecs"]
    return replicas[rtype or next(iter(replicas))]["template"]


def container(manifest: dict, rtype: str | None = None) -> dict:
    (c,) = pod(manifest, rtype)["spec"]["containers"]
    return c


RENDEZVOUS = ("PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID")
CPU_REQUEST = CPU_REQUEST_ENV["name"]


def env_of(manifest: dict) -> dict[str, str]:
    """The container's env, but for the Workers-only layout's rendezvous (tested on its own)."""
    env = env_values(container(manifest).get("env", []))
    return {k: v for k, v in env.items() if k not in RENDEZVOUS and k != CPU_REQUEST}


# -- defaults and the shape of the job ---------------------------------------------------------


def test_defaults_run_the_trainer_through_torchrun_on_one_worker():
    m = build_pytorchjob(TrainSpec(name="job", namespace="ml", args=["--epochs", "1"]))
    assert m["apiVersion"] == "kubeflow.org/v1" and m["kind"] == "PyTorchJob"
    assert m["metadata"]["name"] == "job" and m["metadata"]["namespace"] == "ml"
    # Workers only: no Master, so the operator adds no init-pytorch container (which restricted
    # Pod Security refuses); torchrun meets at worker-0 by c10d.
    assert set(m["spec"]["pytorchReplicaSpecs"]) == {"Worker"} and "elasticPolicy" not in m["spec"]
    worker = m["spec"]["pytorchReplicaSpecs"]["Worker"]
    # ExitCode: bad config/data (1-127) is never restarted; preemption and lost peers are.
    assert worker["replicas"] == 1 and worker["restartPolicy"] == "ExitCode"
    c = container(m)
    assert c["name"] == "pytorch" and c["image"] == DEFAULT_IMAGE
    assert c["command"] == ["python", "-m", "trainer.torchrun", "-m", "trainer.train"]
    assert c["args"] == ["--epochs", "1"]
    assert m["spec"]["nprocPerNode"] == "1"
    # A failed job kept for inspection goes after a week.
    assert m["spec"]["runPolicy"] == {
        "backoffLimit": 3,
        "cleanPodPolicy": "Running",
        "ttlSecondsAfterFinished": 604800,
    }
    # Istio sidecars never exit and keep finished pods alive: off by default, job and pods.
    assert m["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert pod(m)["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert pod(m)["spec"]["terminationGracePeriodSeconds"] == 120
    # /dev/shm is a memory-backed emptyDir by default (DataLoader workers).
    vols = {v["name"]: v for v in pod(m)["spec"]["volumes"]}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_workers_meet_at_worker_0_by_c10d_rendezvous():
    m = build_pytorchjob(TrainSpec(name="job", workers=4, nproc_per_node=8, gpus_per_worker=8))
    assert {k: v["replicas"] for k, v in m["spec"]["pytorchReplicaSpecs"].items()} == {"Worker": 4}
    assert m["spec"]["nprocPerNode"] == "8"
    env = env_values(container(m)["env"])
    assert env["PET_RDZV_BACKEND"] == "c10d" and env["PET_RDZV_ID"] == "job"
    assert env["PET_RDZV_ENDPOINT"] == "job-worker-0:29400"  # worker-0's hostname hosts it
    mine = TrainSpec(name="job", workers=2, env={"PET_RDZV_ENDPOINT": "elsewhere:1"})
    mine_env = env_values(container(build_pytorchjob(mine))["env"])
    assert mine_env["PET_RDZV_ENDPOINT"] == "elsewhere:1"  # the spec's env wins


def test_pytorch_master_gives_one_master_and_n_minus_one_workers():
    spec = TrainSpec.flat(
        name="job", workers=4, nproc_per_node=8, gpus_per_worker=8, pytorch_master=True
    )
    m = build_pytorchjob(spec)
    replicas = m["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 3
    assert m["spec"]["nprocPerNode"] == "8"
    assert "nProcPerNode" not in m["spec"].get("elasticPolicy", {})
    assert container(m, "Worker")["resources"] == {
        "requests": {"cpu": "32", "memory": "128Gi", "ephemeral-storage": "4Gi"},
        "limits": {"nvidia.com/gpu": "8", "ephemeral-storage": "4Gi"},
    }
    assert container(m, "Worker") == container(m, "Master")
    # The operator's MASTER_ADDR/RANK, no rendezvous of ours: HOME and TMPDIR (read-only root),
    # the CPU request for the trainer's threads.
    assert [e["name"] for e in container(m)["env"]] == ["HOME", "TMPDIR", CPU_REQUEST]


def test_resources_requests_and_limits():
    spec = TrainSpec(
        name="job",
        cpu_request="4",
        cpu_limit="8",
        memory_request="16Gi",
        memory_limit="32Gi",
        gpus_per_worker=2,
        nproc_per_node=2,
        gpu_resource="amd.com/gpu",
    )
    assert container(build_pytorchjob(spec))["resources"] == {
        "requests": {"cpu": "4", "memory": "16Gi", "ephemeral-storage": "4Gi"},
        "limits": {"cpu": "8", "memory": "32Gi", "amd.com/gpu": "2", "ephemeral-storage": "4Gi"},
    }


@pytest.mark.parametrize("preset", sorted(NCCL_PRESETS))
def test_nccl_presets_and_env_override(preset):
    env = env_of(build_pytorchjob(TrainSpec(name="j", nccl_preset=preset, env={"NCCL_DEBUG": "X"})))
    for key, value in NCCL_PRESETS[preset].items():
        assert env[key] == ("X" if key == "NCCL_DEBUG" else value.replace("{interface}", "eth0"))
    if preset == "tcp":
        # The pod's interface, pinned for NCCL and gloo alike (not "anything but lo/docker").
        assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_SOCKET_IFNAME"] == "eth0"
        assert env["GLOO_SOCKET_IFNAME"] == "eth0"
    if preset == "infiniband":
        assert env["NCCL_IB_DISABLE"] == "0"
        assert {"NCCL_NET_GDR_LEVEL", "NCCL_IB_QPS_PER_CONNECTION"} <= set(env)
    if preset == "debug":
        assert NCCL_PRESETS[preset]["NCCL_DEBUG"] == "INFO"


def test_env_without_preset():
    assert env_of(build_pytorchjob(TrainSpec(name="j", env={"A": "1", "B_2": "x y"}))) == {
        "HOME": "/home/kfp-ddp",
        "TMPDIR": "/tmp",
        "A": "1",
        "B_2": "x y",
    }
    # The user's value wins over ours (then it is theirs to make writable: a volume's folder).
    mine = TrainSpec(name="j", env={"HOME": "/workspace/home"}, pvcs=["ws:/workspace"])
    assert env_of(build_pytorchjob(mine))["HOME"] == "/workspace/home"


def test_shm_size_and_none():
    m = build_pytorchjob(TrainSpec(name="j", shm_size="8Gi"))
    assert pod(m)["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] == "8Gi"
    m = build_pytorchjob(TrainSpec(name="j", shm_size=None))
    assert "dshm" not in [v["name"] for v in pod(m)["spec"]["volumes"]]
    assert "/dev/shm" not in [mount["mountPath"] for mount in container(m)["volumeMounts"]]


def test_pvc_mounts_from_objects_strings_and_dicts():
    spec = TrainSpec(
        name="j",
        pvcs=[
            PvcMount(claim="data", path="/data", read_only=True),
            "workspace:/workspace",
            {"claim": "cache", "path": "/cache", "read_only": False},
        ],
    )
    m = build_pytorchjob(spec)
    vols = {v["name"]: v for v in pod(m)["spec"]["volumes"]}
    assert vols["pvc-0"]["persistentVolumeClaim"] == {"claimName": "data", "readOnly": True}
    assert vols["pvc-1"]["persistentVolumeClaim"] == {"claimName": "workspace"}
    assert vols["pvc-2"]["persistentVolumeClaim"] == {"claimName": "cache"}
    mounts = {v["mountPath"]: v for v in container(m)["volumeMounts"]}
    assert mounts["/data"] == {"name": "pvc-0", "mountPath": "/data", "readOnly": True}
    assert mounts["/workspace"] == {"name": "pvc-1", "mountPath": "/workspace"}
    assert PvcMount.parse("c:/p:ro") == PvcMount(claim="c", path="/p", read_only=True)
    assert TrainSpec(name="j", pvcs=[("c", "/p", True)]).pvcs == [PvcMount.parse("c:/p:ro")]
    with pytest.raises(SpecError, match="pvcs"):
        TrainSpec(name="j", pvcs=[42])


def test_host_network_sets_dns_policy():
    privileged = TrainSpec.flat(name="j", host_network=True, pod_security="privileged")
    p = pod(build_pytorchjob(privileged))["spec"]
    assert p["hostNetwork"] is True and p["dnsPolicy"] == "ClusterFirstWithHostNet"
    p = pod(build_pytorchjob(TrainSpec(name="j")))["spec"]
    assert "hostNetwork" not in p and "dnsPolicy" not in p


def test_placement_identity_and_pull_secrets():
    spec = TrainSpec(
        name="j",
        node_selector={"nvidia.com/gpu.product": "H100"},
        tolerations=[
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "spot", "value": "true", "effect": "NoExecute", "toleration_seconds": 60},
        ],
        service_account="trainer",
        image_pull_secrets=["regcred", "other"],
    )
    p = pod(build_pytorchjob(spec))["spec"]
    assert p["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert p["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "spot", "value": "true", "effect": "NoExecute", "tolerationSeconds": 60},
    ]
    assert p["serviceAccountName"] == "trainer"
    strings = TrainSpec(name="j", tolerations=["nvidia.com/gpu:NoSchedule", "spot=true"])
    assert strings.tolerations == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Equal", "value": "true"},
    ]
    assert p["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other"}]


def test_gang_scheduling_with_a_scheduler():
    m = build_pytorchjob(
        TrainSpec.flat(
            name="j", workers=4, scheduler_name="volcano", queue="team-a", priority_class="hi"
        )
    )
    assert pod(m)["spec"]["schedulerName"] == "volcano"
    assert pod(m, "Worker")["spec"]["schedulerName"] == "volcano"
    assert m["spec"]["runPolicy"]["schedulingPolicy"] == {
        "minAvailable": 4,
        "queue": "team-a",
        "priorityClass": "hi",
    }
    m = build_pytorchjob(
        TrainSpec.flat(name="j", workers=4, scheduler_name="volcano", min_available=2)
    )
    assert m["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 2}
    assert "schedulingPolicy" not in build_pytorchjob(TrainSpec(name="j"))["spec"]["runPolicy"]


def test_kueue_queue_label():
    m = build_pytorchjob(TrainSpec(name="j", kueue_queue="user-queue"))
    assert m["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "user-queue"


def test_elastic_policy_uses_workers_only_and_c10d():
    m = build_pytorchjob(
        TrainSpec.flat(
            name="j",
            workers=3,
            elastic_min_replicas=2,
            elastic_max_replicas=4,
            max_restarts=5,
            nproc_per_node=2,
        )
    )
    assert m["spec"]["elasticPolicy"] == {
        "minReplicas": 2,
        "maxReplicas": 4,
        "maxRestarts": 5,
        "rdzvBackend": "c10d",
    }
    assert set(m["spec"]["pytorchReplicaSpecs"]) == {"Worker"}
    assert m["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    assert m["spec"]["nprocPerNode"] == "2"  # and never elasticPolicy.nProcPerNode as well


def test_run_policy_and_restart_policy():
    spec = TrainSpec.flat(
        name="j",
        workers=2,
        backoff_limit=0,
        active_deadline_seconds=3600,
        clean_pod_policy="All",
        ttl_seconds_after_finished=600,
        restart_policy="ExitCode",
    )
    m = build_pytorchjob(spec)
    assert m["spec"]["runPolicy"] == {
        "backoffLimit": 0,
        "activeDeadlineSeconds": 3600,
        "cleanPodPolicy": "All",
        "ttlSecondsAfterFinished": 600,
    }
    assert {r["restartPolicy"] for r in m["spec"]["pytorchReplicaSpecs"].values()} == {"ExitCode"}
    # Unset: the launcher's defaults (the operator itself would restart without a limit).
    defaults = build_pytorchjob(TrainSpec(name="j"))["spec"]
    assert defaults["runPolicy"]["backoffLimit"] == 3
    assert defaults["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] == "ExitCode"


def test_labels_annotations_and_run_labels():
    spec = TrainSpec(
        name="j",
        labels={"team": "vision"},
        annotations={"example.com/owner": "me"},
        run_id="0b5c9f5e-0000-4000-8000-000000000001",
        task_name="train-step",
    )
    m = build_pytorchjob(spec)
    labels = m["metadata"]["labels"]
    assert labels["team"] == "vision"
    assert labels[RUN_ID_LABEL] == "0b5c9f5e-0000-4000-8000-000000000001"
    assert labels[TASK_LABEL] == "train-step"
    assert pod(m)["metadata"]["labels"] == labels
    # Annotations given explicitly replace the default; Istio injection can be turned back on.
    assert m["metadata"]["annotations"] == {"example.com/owner": "me"}
    on = build_pytorchjob(TrainSpec(name="j", annotations={"sidecar.istio.io/inject": "true"}))
    assert on["metadata"]["annotations"]["sidecar.istio.io/inject"] == "true"


def test_custom_command():
    m = build_pytorchjob(TrainSpec(name="j", command=["python", "train.py"], args=["--x"]))
    assert container(m)["command"] == ["python", "train.py"] and container(m)["args"] == ["--x"]


def test_default_name_is_stable_per_run_and_task():
    a = TrainSpec(run_id="run-1", task_name="training-job-component")
    b = TrainSpec(run_id="run-1", task_name="training-job-component")
    c = TrainSpec(run_id="run-2", task_name="training-job-component")
    assert a.name == b.name != c.name
    assert a.name.startswith("training-job-component-")
    assert derive_job_name("r", "123-Weird_Task!").startswith("job-123-weird-task")
    assert TrainSpec().name != TrainSpec().name  # no run: a fresh name each time
    for name in (a.name, derive_job_name("x" * 300, "T" * 300)):
        assert not admission_errors(build_pytorchjob(TrainSpec(name=name, workers=100)))


def test_long_run_ids_become_valid_label_values():
    m = build_pytorchjob(TrainSpec(name="j", run_id="x" * 100, task_name="a b"))
    assert len(m["metadata"]["labels"][RUN_ID_LABEL]) <= 63


def test_namespace_defaults_to_default_outside_a_cluster():
    assert TrainSpec(name="j").namespace == "default"


# -- every manifest passes the official CRD schema and the operator's admission rules ----------

VARIATIONS = [
    {},
    {"workers": 2},
    {"workers": 8, "nproc_per_node": 8, "gpus_per_worker": 8},
    {"cpu_request": "500m", "cpu_limit": "2", "memory_request": "1Gi", "memory_limit": "4Gi"},
    {"env": {"A": "1"}, "nccl_preset": "infiniband"},
    {"nccl_preset": "tcp"},
    {"nccl_preset": "debug"},
    {"shm_size": None},
    {"shm_size": "512Mi"},
    {"pvcs": ["data:/data:ro", "ws:/workspace"]},
    {"host_network": True, "pod_security": "privileged"},
    {"pytorch_master": True, "workers": 3},
    {"pod_security": "baseline", "run_as_user": None, "run_as_group": None},
    {"node_selector": {"a.b/c": "d"}},
    {
        "tolerations": [
            {"key": "k", "operator": "Exists"},
            {"effect": "NoExecute", "key": "x", "value": "y", "toleration_seconds": 3},
        ]
    },
    {"service_account": "sa", "image_pull_secrets": ["s1"]},
    {"scheduler_name": "volcano", "workers": 3},
    {"scheduler_name": "volcano", "queue": "q", "priority_class": "p", "min_available": 1},
    {"kueue_queue": "lq"},
    {"elastic_min_replicas": 1, "elastic_max_replicas": 3, "workers": 2},
    {"elastic_min_replicas": 1, "elastic_max_replicas": 1, "max_restarts": 0},
    {"restart_policy": "ExitCode", "backoff_limit": None},
    {"restart_policy": "Never", "clean_pod_policy": "None"},
    {"restart_policy": "Always", "clean_pod_policy": "All"},
    {"active_deadline_seconds": 2**40, "ttl_seconds_after_finished": 0},
    {"termination_grace_period_seconds": None},
    {"labels": {"x": "y"}, "annotations": {}},
    {"run_id": "3f0e", "task_name": "t", "name": ""},
    {"command": ["bash", "-c", "echo hi"], "args": []},
]


def v1_options(rng: random.Random) -> dict[str, Callable[[], Any]]:
    """Makers of random values for the optional fields every Training Operator v1 job takes."""
    return {
        "cpu_request": lambda: rng.choice(["1", "250m", "2.5"]),
        "memory_limit": lambda: rng.choice(["64Gi", "100G"]),
        "env": lambda: {f"V{i}": str(i) for i in range(rng.randint(0, 3))},
        "nccl_preset": lambda: rng.choice([None, *NCCL_PRESETS]),
        "shm_size": lambda: rng.choice([None, "1Gi", "16Gi"]),
        "pvcs": lambda: [f"c{i}:/m{i}" + rng.choice(["", ":ro"]) for i in range(rng.randint(0, 3))],
        "host_network": lambda: rng.random() < 0.5,
        "node_selector": lambda: {"pool": "gpu"},
        "tolerations": lambda: [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "service_account": lambda: "runner",
        "image_pull_secrets": lambda: ["pull"],
        "scheduler_name": lambda: "volcano",
        "queue": lambda: "research",
        "priority_class": lambda: "high",
        "kueue_queue": lambda: "queue-1",
        "restart_policy": lambda: rng.choice(["OnFailure", "ExitCode", "Never", "Always"]),
        "backoff_limit": lambda: rng.choice([None, 0, 10]),
        "active_deadline_seconds": lambda: rng.choice([None, 60, 86400]),
        "clean_pod_policy": lambda: rng.choice(["Running", "All", "None"]),
        "ttl_seconds_after_finished": lambda: rng.choice([None, 0, 3600]),
        "args": lambda: ["--epochs", str(rng.randint(1, 9))],
        "run_id": lambda: rng.choice(["", "a1b2", "x" * 80]),
    }


def some_options(rng: random.Random) -> dict[str, Any]:
    """A random ~40% of ``v1_options``, with values that go together."""
    kwargs = {key: make() for key, make in v1_options(rng).items() if rng.random() < 0.4}
    if kwargs.get("shm_size") == "16Gi" and kwargs.get("memory_limit"):
        kwargs["shm_size"] = "1Gi"
    if kwargs.get("host_network"):
        kwargs["pod_security"] = "privileged"
    return kwargs


def random_spec(rng: random.Random) -> TrainSpec:
    workers = rng.randint(1, 16)
    kwargs: dict = {"name": f"job-{rng.randint(0, 10**6)}", "workers": workers}
    gpus = rng.choice([0, 1, 2, 4, 8])
    kwargs |= {"gpus_per_worker": gpus, "nproc_per_node": rng.randint(1, max(gpus, 1))}
    kwargs |= some_options(rng)
    if rng.random() < 0.3:
        kwargs["pytorch_master"] = True
    if rng.random() < 0.25:
        lo = rng.randint(1, workers)
        kwargs |= {"elastic_min_replicas": lo, "elastic_max_replicas": workers + rng.randint(0, 4)}
        if rng.random() < 0.5:
            kwargs["max_restarts"] = rng.randint(0, 10)
    return TrainSpec.flat(api="pytorchjob", **kwargs)


def all_specs() -> list[TrainSpec]:
    rng = random.Random(1234)
    return [TrainSpec.flat(**({"api": "pytorchjob", "name": "job"} | v)) for v in VARIATIONS] + [
        random_spec(rng) for _ in range(300)
    ]


def test_every_manifest_passes_the_official_crd_schema():
    require_crd("pytorchjob")
    for spec in all_specs():
        errors = schema_errors("pytorchjob", build_pytorchjob(spec))
        assert not errors, (spec, errors)


def test_every_manifest_passes_the_admission_rules():
    for spec in all_specs():
        assert admission_errors(build_pytorchjob(spec)) == [], spec


def test_the_schema_check_catches_mistakes():
    crd_validator = require_crd("pytorchjob")
    good = build_pytorchjob(TrainSpec(name="j", workers=2))
    assert not list(crd_validator.iter_errors(good))
    for mutate in (
        lambda m: m["spec"].pop("pytorchReplicaSpecs"),
        lambda m: m["spec"].__setitem__("nprocPerNode", 2),  # must be a string
        lambda m: m["spec"]["runPolicy"].__setitem__("backoffLimit", "3"),
        lambda m: m["spec"]["runPolicy"].__setitem__("backoffLimit", 2**31),  # int32
        lambda m: m["spec"].__setitem__("elasticPolicy", {"minReplica": 1}),  # typo
        lambda m: container(m).__setitem__("resources", {"limits": {"cpu": "four"}}),
        lambda m: pod(m)["spec"].__setitem__("containers", [{"image": "x"}]),  # name required
        lambda m: m.pop("kind"),
    ):
        bad = copy.deepcopy(good)
        mutate(bad)
        assert list(crd_validator.iter_errors(bad)), mutate


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda m: m["metadata"].__setitem__("name", "Job_1"), "DNS-1035"),
        (lambda m: container(m).__setitem__("name", "main"), "named 'pytorch'"),
        (lambda m: container(m).__setitem__("image", ""), "image: must be set"),
        (lambda m: m["spec"]["pytorchReplicaSpecs"]["Master"].__setitem__("replicas", 2), "be 1"),
        (lambda m: m["spec"]["pytorchReplicaSpecs"]["Worker"].__setitem__("replicas", 0), "least"),
        (lambda m: m["spec"]["pytorchReplicaSpecs"].pop("Worker"), None),
        (lambda m: m["spec"].__setitem__("elasticPolicy", {"nProcPerNode": 2}), "nprocPerNode"),
        (lambda m: m["spec"]["pytorchReplicaSpecs"].__setitem__("Chief", {}), "Master or Worker"),
        (lambda m: pod(m)["spec"].__setitem__("containers", []), "must be specified"),
        (lambda m: m["spec"]["runPolicy"].__setitem__("cleanPodPolicy", "Some"), "cleanPodPolicy"),
        (lambda m: m["spec"]["runPolicy"].__setitem__("backoffLimit", -1), "non-negative"),
    ],
)
def test_admission_rules_catch_what_the_operator_refuses(mutate, message):
    bad = copy.deepcopy(build_pytorchjob(TrainSpec.flat(name="j", workers=2, pytorch_master=True)))
    mutate(bad)
    errors = admission_errors(bad)
    if message is None:  # dropping the Worker is fine without an elastic policy
        assert errors == []
        bad["spec"]["elasticPolicy"] = {"minReplicas": 1, "maxReplicas": 1}
        assert any("elasticPolicy" in e for e in admission_errors(bad))
    else:
        assert any(message in e for e in errors), errors


def test_build_is_pure():
    spec = TrainSpec(name="j", workers=3, pvcs=["a:/a"], env={"X": "1"})
    before = spec.to_dict()
    assert build_pytorchjob(spec) == build_pytorchjob(spec)
    assert spec.to_dict() == before
