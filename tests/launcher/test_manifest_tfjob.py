"""build_tfjob: the mapping of every TrainSpec field, the official TFJob CRD (strict), the
operator's admission rules, and the pod template the PyTorchJob shares."""

from __future__ import annotations

import copy
import random

import pytest

from components.launcher import SpecError, TrainSpec, build_manifest, build_pytorchjob, build_tfjob
from components.launcher.names import RUN_ID_LABEL
from components.launcher.spec import NCCL_PRESETS
from components.launcher.tfjob import admission_errors
from tests.crds import require_crd, schema_errors
from tests.launcher.k8s_helpers import CPU_REQUEST_ENV, env_values
from tests.launcher.test_manifest_pytorchjob import some_options

PROGRAM = {"image": "registry.example.com/tf-mnist:1", "command": ["python", "/app/train.py"]}


def tf_spec(**kw) -> TrainSpec:
    return TrainSpec.flat(**({"api": "tfjob", "name": "tf"} | PROGRAM | kw))


def replicas(manifest: dict) -> dict:
    return manifest["spec"]["tfReplicaSpecs"]


def pod(manifest: dict, rtype: str = "Chief") -> dict:
    return replicas(manifest)[rtype]["template"]


def container(manifest: dict, rtype: str = "Chief") -> dict:
    (c,) = pod(manifest, rtype)["spec"]["containers"]
    return c


def test_one_worker_is_a_lone_chief_running_the_users_program():
    m = build_tfjob(tf_spec(namespace="ml", args=["--epochs", "1"]))
    assert m["apiVersion"] == "kubeflow.org/v1" and m["kind"] == "TFJob"
    assert m["metadata"]["name"] == "tf" and m["metadata"]["namespace"] == "ml"
    assert {k: v["replicas"] for k, v in replicas(m).items()} == {"Chief": 1}
    assert replicas(m)["Chief"]["restartPolicy"] == "OnFailure"
    c = container(m)
    assert c["name"] == "tensorflow"  # the operator adds TF_CONFIG to the container of this name
    assert c["image"] == PROGRAM["image"] and c["command"] == PROGRAM["command"]
    assert c["args"] == ["--epochs", "1"]
    # The user's image, whatever its HOME: its home and temporary files go to the emptyDirs.
    assert c["env"] == [
        {"name": "HOME", "value": "/home/kfp-ddp"},
        {"name": "TMPDIR", "value": "/tmp"},
        CPU_REQUEST_ENV,
    ]
    # a finished job is garbage-collected after a week unless ttl_seconds_after_finished says
    assert m["spec"]["runPolicy"] == {
        "backoffLimit": 3,
        "cleanPodPolicy": "Running",
        "ttlSecondsAfterFinished": 7 * 24 * 3600,
    }
    assert "nprocPerNode" not in m["spec"] and "elasticPolicy" not in m["spec"]
    assert m["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert pod(m)["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert pod(m)["spec"]["terminationGracePeriodSeconds"] == 120
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_chief_workers_and_parameter_servers():
    m = build_tfjob(tf_spec(workers=4, ps_replicas=2, gpus_per_worker=2, cpu_request="8"))
    assert {k: v["replicas"] for k, v in replicas(m).items()} == {"Chief": 1, "Worker": 3, "PS": 2}
    assert container(m, "Worker") == container(m, "Chief")
    disk = {"ephemeral-storage": "4Gi"}
    assert container(m)["resources"] == {
        "requests": {"cpu": "8", "memory": "32Gi", **disk},  # memory: 16Gi per GPU by default
        "limits": {"nvidia.com/gpu": "2", **disk},
    }
    # Parameter servers hold variables and apply updates on their CPUs: no GPUs for them.
    assert container(m, "PS")["resources"] == {
        "requests": {"cpu": "8", "memory": "32Gi", **disk},
        "limits": disk,
    }
    assert {k: v for k, v in container(m, "PS").items() if k != "resources"} == {
        k: v for k, v in container(m).items() if k != "resources"
    }
    # Nothing is added to the user's program's flags (no --device: that is our trainer's).
    assert "args" not in container(m)


def test_the_pod_template_and_run_policy_are_the_pytorchjobs():
    shared = {
        "name": "job",
        "workers": 2,
        "image": PROGRAM["image"],
        "command": PROGRAM["command"],
        "args": ["--x"],
        "env": {"A": "1"},
        "nccl_preset": "tcp",
        "pvcs": ["ws:/workspace:ro"],
        "host_network": True,
        "pod_security": "privileged",
        "node_selector": {"pool": "gpu"},
        "tolerations": ["nvidia.com/gpu:NoSchedule"],
        "service_account": "runner",
        "image_pull_secrets": ["regcred"],
        "scheduler_name": "volcano",
        "queue": "q",
        "restart_policy": "ExitCode",
        "backoff_limit": 0,
        "active_deadline_seconds": 600,
        "clean_pod_policy": "All",
        "ttl_seconds_after_finished": 60,
        "labels": {"team": "vision"},
        "run_id": "r-1",
    }
    tf = build_tfjob(TrainSpec.flat(api="tfjob", **shared))
    torch = build_pytorchjob(TrainSpec.flat(api="pytorchjob", pytorch_master=True, **shared))
    assert tf["spec"]["runPolicy"] == torch["spec"]["runPolicy"]
    assert tf["metadata"] == torch["metadata"] and tf["metadata"]["labels"][RUN_ID_LABEL] == "r-1"
    chief, master = copy.deepcopy(pod(tf)), copy.deepcopy(torch["spec"]["pytorchReplicaSpecs"])
    master = master["Master"]["template"]
    assert chief["spec"]["containers"][0].pop("name") == "tensorflow"
    assert master["spec"]["containers"][0].pop("name") == "pytorch"
    assert chief == master


def test_gang_scheduling_counts_every_pod():
    m = build_tfjob(tf_spec(workers=3, ps_replicas=2, scheduler_name="volcano", queue="team-a"))
    assert m["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 5, "queue": "team-a"}
    assert all(r["template"]["spec"]["schedulerName"] == "volcano" for r in replicas(m).values())


@pytest.mark.parametrize("preset", sorted(NCCL_PRESETS))
def test_env_is_the_preset_then_the_users(preset):
    env = container(build_tfjob(tf_spec(nccl_preset=preset, env={"TF_CPP_MIN_LOG_LEVEL": "2"})))
    values = env_values(env["env"])
    assert values.pop(CPU_REQUEST_ENV["name"]) == str(CPU_REQUEST_ENV["valueFrom"])
    # the preset pins the pods' interface (network_interface, eth0 by default)
    preset_env = {k: v.replace("{interface}", "eth0") for k, v in NCCL_PRESETS[preset].items()}
    scratch = {"HOME": "/home/kfp-ddp", "TMPDIR": "/tmp"}
    assert values == scratch | preset_env | {"TF_CPP_MIN_LOG_LEVEL": "2"}


def test_build_manifest_builds_a_tfjob_for_api_tfjob_and_refuses_what_it_cannot_express():
    assert build_manifest(tf_spec())["kind"] == "TFJob"
    with pytest.raises(SpecError, match="api=tfjob cannot express it"):
        build_tfjob(TrainSpec.flat(name="tf", **PROGRAM, runtime_name="torch-distributed"))


# -- every manifest passes the official CRD schema and the operator's admission rules ----------

VARIATIONS = [
    {},
    {"workers": 2},
    {"workers": 8, "ps_replicas": 4, "gpus_per_worker": 8},
    {"ps_replicas": 1},
    {"cpu_request": "500m", "cpu_limit": "2", "memory_request": "1Gi", "memory_limit": "4Gi"},
    {"env": {"A": "1"}, "nccl_preset": "infiniband"},
    {"shm_size": None},
    {"pvcs": ["data:/data:ro", "ws:/workspace"]},
    {"host_network": True, "pod_security": "privileged"},
    {"node_selector": {"a.b/c": "d"}, "tolerations": [{"key": "k", "operator": "Exists"}]},
    {"service_account": "sa", "image_pull_secrets": ["s1"]},
    {"scheduler_name": "volcano", "queue": "q", "priority_class": "p", "min_available": 1},
    {"kueue_queue": "lq"},
    {"restart_policy": "ExitCode", "backoff_limit": None},
    {"restart_policy": "Never", "clean_pod_policy": "None"},
    {"active_deadline_seconds": 2**40, "ttl_seconds_after_finished": 0},
    {"termination_grace_period_seconds": None},
    {"labels": {"x": "y"}, "annotations": {}},
    {"run_id": "3f0e", "task_name": "t", "name": ""},
    {"command": ["bash", "-c", "python train.py"], "args": []},
]


def random_spec(rng: random.Random) -> TrainSpec:
    kwargs: dict = {
        "name": f"tf-{rng.randint(0, 10**6)}",
        "workers": rng.randint(1, 16),
        "ps_replicas": rng.choice([0, 0, 1, 2, 8]),
        "gpus_per_worker": rng.choice([0, 1, 2, 4, 8]),
    }
    return tf_spec(**(kwargs | some_options(rng)))


def all_specs() -> list[TrainSpec]:
    rng = random.Random(4321)
    return [tf_spec(**v) for v in VARIATIONS] + [random_spec(rng) for _ in range(300)]


def test_every_manifest_passes_the_official_crd_schema_and_the_admission_rules():
    require_crd("tfjob")
    for spec in all_specs():
        manifest = build_tfjob(spec)
        assert schema_errors("tfjob", manifest) == [], spec
        assert admission_errors(manifest) == [], spec
        counts = {k: v["replicas"] for k, v in replicas(manifest).items()}
        assert sum(counts.values()) == spec.pod_count and counts["Chief"] == 1


def test_the_schema_check_catches_mistakes():
    crd_validator = require_crd("tfjob")
    good = build_tfjob(tf_spec(workers=2))
    assert not list(crd_validator.iter_errors(good))
    for mutate in (
        lambda m: m["spec"].__setitem__("nprocPerNode", "1"),  # a PyTorchJob field
        lambda m: m["spec"].__setitem__("pytorchReplicaSpecs", m["spec"]["tfReplicaSpecs"]),
        lambda m: m["spec"]["runPolicy"].__setitem__("backoffLimit", "3"),
        lambda m: m["spec"].__setitem__("enableDynamicWorker", "yes"),
        lambda m: container(m).__setitem__("resources", {"limits": {"cpu": "four"}}),
        lambda m: pod(m)["spec"].__setitem__("containers", [{"image": "x"}]),  # name required
    ):
        bad = copy.deepcopy(good)
        mutate(bad)
        assert list(crd_validator.iter_errors(bad)), mutate


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda m: m["metadata"].__setitem__("name", "Tf_1"), "DNS-1035"),
        (lambda m: container(m).__setitem__("name", "main"), "named 'tensorflow'"),
        (lambda m: container(m, "Worker").__setitem__("image", ""), "image: must be set"),
        (lambda m: replicas(m).__setitem__("Master", replicas(m)["Chief"]), "more than 1 Chief"),
        (lambda m: replicas(m).__setitem__("Launcher", replicas(m)["Chief"]), "must be Chief,"),
        (lambda m: pod(m)["spec"].__setitem__("containers", []), "must be specified"),
        (lambda m: m["spec"].pop("tfReplicaSpecs"), "must be set"),
        (lambda m: m["spec"]["runPolicy"].__setitem__("cleanPodPolicy", "Some"), "cleanPodPolicy"),
    ],
)
def test_admission_rules_catch_what_the_operator_refuses(mutate, message):
    bad = copy.deepcopy(build_tfjob(tf_spec(workers=2)))
    mutate(bad)
    assert any(message in e for e in admission_errors(bad)), admission_errors(bad)


def test_build_is_pure():
    spec = tf_spec(workers=3, ps_replicas=1, pvcs=["a:/a"], env={"X": "1"})
    before = spec.to_dict()
    assert build_tfjob(spec) == build_tfjob(spec)
    assert spec.to_dict() == before
