"""The training task's own KFP settings reach the job: ``task_config_passthroughs``.

A pipeline of someone else's design loads our component file and sets the training task's GPUs,
tolerations and a claim with KFP's calls only; the compiled spec declares the passthroughs; the
TaskConfig KFP's backend fills from that spec (``backend_task_config``: the backend's Go code,
driver.go ``initPodSpecPatch`` / k8s.go ``extendPodSpecPatch``, restated) becomes the job's, and
the real controllers create pods that carry it and pass restricted Pod Security. The merge
rules (``components.launcher.task_config``) are tested with TaskConfig JSON in the backend's
exact shape; kfp.local hands the component ``task_config=None`` and runs it as before.
"""

# No `from __future__ import annotations`: KFP reads the pipeline's real annotations.

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kfp import compiler, components, dsl, kubernetes
from kubernetes import client

from components.launcher import SpecError, job_api
from components.launcher.step import TrainingStepInputs, training_spec
from components.launcher.task_config import TaskSettings
from pipelines.component_files import COMPILED_DIR
from tests.cluster.play import JOB_LABEL
from tests.kfp_local import workspace_root
from tests.launcher.test_component import step_params, writer  # noqa: F401 (a fixture)

GPU = "nvidia.com/gpu"
TOLERATION = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
CLAIM = "team-datasets"

# What the backend hands the component for: .set_accelerator_type("nvidia.com/gpu")
# .set_accelerator_limit(2).set_cpu_request("8"), add_toleration(key=..., operator="Exists",
# effect="NoSchedule"), add_node_selector, add_node_affinity, use_secret_as_env, set_env_variable
# and mount_pvc(pvc_name="team-datasets", mount_path="/datasets"): Go's TaskConfig marshalled to
# JSON (nil slices as null, quantities as strings, numbers through protobuf's Struct as doubles).
BACKEND_TASK_CONFIG = {
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
                ]
            }
        }
    },
    "tolerations": [
        TOLERATION,
        {
            "key": "spot",
            "operator": "Equal",
            "value": "yes",
            "effect": "NoExecute",
            "tolerationSeconds": 3600.0,
        },
    ],
    "nodeSelector": {"pool": "gpu"},
    "env": [
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
    ],
    "volumes": [{"name": CLAIM, "persistentVolumeClaim": {"claimName": CLAIM}}],
    "volumeMounts": [{"name": CLAIM, "mountPath": "/datasets"}],
    "resources": {"limits": {GPU: "2"}, "requests": {"cpu": "8"}},
}


def inputs(**kw: Any) -> TrainingStepInputs:
    base = {
        "data_dir": "/workspace/data",
        "output_dir": "/workspace/train",
        "name": "job",
        "namespace": "ns",
        "image": "img:1",
        "workers": 2,
    }
    return TrainingStepInputs(**(base | kw))


def spec_of(task_config: Any, **kw: Any):
    return training_spec(inputs(task_config=task_config, **kw), run_id="run-1")


# -- the merge rules ---------------------------------------------------------------------------


def test_the_backends_task_config_becomes_the_jobs_settings():
    s = spec_of(BACKEND_TASK_CONFIG)
    assert (s.gpus_per_worker, s.gpu_resource, s.nproc_per_node) == (2, GPU, 2)
    assert s.cpu_request == "8" and s.memory_request == "32Gi"  # 16Gi per GPU: our sizing
    assert s.tolerations == [
        TOLERATION,
        {
            "key": "spot",
            "operator": "Equal",
            "value": "yes",
            "effect": "NoExecute",
            "toleration_seconds": 3600,
        },
    ]
    assert s.node_selector == {"pool": "gpu"}
    assert s.env == {"NCCL_DEBUG": "INFO"}
    assert s.pod_extras.env == [BACKEND_TASK_CONFIG["env"][1]]  # still a secretKeyRef
    assert s.pod_extras.affinity == BACKEND_TASK_CONFIG["affinity"]
    assert s.pod_extras.volume_mounts == BACKEND_TASK_CONFIG["volumeMounts"]


def test_dsl_task_config_reads_like_the_json():
    config = dsl.TaskConfig(
        resources={"limits": {GPU: "4"}},
        tolerations=[TOLERATION],
        volumes=BACKEND_TASK_CONFIG["volumes"],
        volume_mounts=BACKEND_TASK_CONFIG["volumeMounts"],
    )
    s = spec_of(config)
    assert s.gpus_per_worker == 4 and s.tolerations == [TOLERATION]
    assert s.pod_extras.volumes == BACKEND_TASK_CONFIG["volumes"]


@pytest.mark.parametrize("empty", [None, dsl.TaskConfig(), {"resources": {}, "env": None}])
def test_no_task_settings_change_nothing(empty):
    assert spec_of(empty).to_dict() == spec_of(None).to_dict()
    assert not TaskSettings.parse(empty)


def test_the_same_value_on_both_sides_is_fine_and_a_different_one_is_refused_naming_both():
    assert spec_of(BACKEND_TASK_CONFIG, gpus_per_worker=2).gpus_per_worker == 2
    with pytest.raises(
        SpecError,
        match=r"gpus_per_worker=4 \(the component's parameter\).*"
        r"accelerator limit nvidia.com/gpu=2 \(set_accelerator_limit\)",
    ):
        spec_of(BACKEND_TASK_CONFIG, gpus_per_worker=4)
    assert spec_of(BACKEND_TASK_CONFIG, cpu_request="8000m").cpu_request == "8000m"
    with pytest.raises(SpecError, match=r"cpu_request='4'.*cpu request '8' \(set_cpu_request\)"):
        spec_of(BACKEND_TASK_CONFIG, cpu_request="4")
    overrides = json.dumps({"gpu_resource": "amd.com/gpu"})
    with pytest.raises(
        SpecError,
        match=r"gpu_resource='amd.com/gpu' \(overrides_json\).*"
        r"accelerator type 'nvidia.com/gpu'",
    ):
        spec_of(BACKEND_TASK_CONFIG, overrides_json=overrides)


def test_lists_and_maps_are_the_union_and_a_clash_names_both():
    overrides = json.dumps(
        {
            "tolerations": ["nvidia.com/gpu:NoSchedule", "dedicated=ml:NoSchedule"],
            "node_selector": {"zone": "a"},
            "env": {"NCCL_DEBUG": "INFO"},
        }
    )
    s = spec_of(BACKEND_TASK_CONFIG, overrides_json=overrides)
    # The task's GPU toleration is the override's "nvidia.com/gpu:NoSchedule": counted once.
    assert [t["key"] for t in s.tolerations] == [GPU, "dedicated", "spot"]
    assert s.node_selector == {"zone": "a", "pool": "gpu"}
    clash = json.dumps({"node_selector": {"pool": "cpu"}})
    with pytest.raises(
        SpecError,
        match=r"node_selector=\{'pool': 'cpu'\} \(overrides_json\).*"
        "node selector pool='gpu'",
    ):
        spec_of(BACKEND_TASK_CONFIG, overrides_json=clash)
    secret_value = json.dumps({"env": {"NCCL_DEBUG": "a-value-that-must-not-be-printed"}})
    with pytest.raises(SpecError, match="env") as raised:
        spec_of(BACKEND_TASK_CONFIG, overrides_json=secret_value)
    assert "a-value-that-must-not-be-printed" not in str(raised.value)
    assert "INFO" not in str(raised.value)


def test_the_parameters_claim_mounted_where_the_task_mounts_it_counts_once():
    s = spec_of(BACKEND_TASK_CONFIG, pvc_name=CLAIM, pvc_mount_path="/datasets")
    assert [p.claim for p in s.pvcs] == [CLAIM] and s.pod_extras.volumes == []
    with pytest.raises(
        SpecError,
        match=r"pvcs=\[other:/datasets\].*volume team-datasets at "
        r"/datasets \(mount_pvc\)",
    ):
        spec_of(BACKEND_TASK_CONFIG, pvc_name="other", pvc_mount_path="/datasets")


def test_s3_keys_the_task_gives_from_the_same_secret_count_once():
    keys = [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": "s3", "key": k, "optional": False}}}
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    ]
    staged = {
        "data_dir": "",
        "data_uri": "s3://bkt/data",
        "checkpoint_uri": "s3://bkt/ckpt",
        "output_dir": "",
        "s3_credentials_secret": "s3",
    }
    s = spec_of({"env": keys}, **staged)
    assert s.s3_credentials_secret == "s3" and s.pod_extras.env == []
    with pytest.raises(SpecError, match=r"s3_credentials_secret='other'.*AWS_ACCESS_KEY_ID"):
        spec_of({"env": keys}, **(staged | {"s3_credentials_secret": "other"}))


def test_a_task_gpu_count_names_its_own_output_folder():
    from components.launcher.step import run_key

    assert "-n2x2-" in run_key(inputs(task_config=BACKEND_TASK_CONFIG))
    assert "-n2x1-" in run_key(inputs())


def test_volumes_obey_the_pod_security_level():
    host = {
        "volumes": [{"name": "cache", "hostPath": {"path": "/mnt/cache"}}],
        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
    }
    with pytest.raises(SpecError, match="hostPath.*restricted Pod Security.*privileged"):
        spec_of(host)
    privileged = json.dumps({"pod_security": "privileged"})
    assert spec_of(host, cluster_settings_json=privileged).pod_extras.volumes
    system = {
        "volumes": [{"name": "etc", "hostPath": {"path": "/etc/kubernetes"}}],
        "volumeMounts": [{"name": "etc", "mountPath": "/host-etc"}],
    }
    with pytest.raises(SpecError, match="inside /etc, a system folder"):
        spec_of(system, cluster_settings_json=privileged)
    nfs = {
        "volumes": [{"name": "n", "nfs": {"server": "nfs", "path": "/x"}}],
        "volumeMounts": [{"name": "n", "mountPath": "/n"}],
    }
    with pytest.raises(SpecError, match="nfs volumes are refused by the restricted"):
        spec_of(nfs)
    assert spec_of(nfs, cluster_settings_json=json.dumps({"pod_security": "baseline"}))
    by_override = json.dumps({"pod_extras": host})
    with pytest.raises(SpecError, match="overrides_json sets pod_extras with a hostPath"):
        spec_of(None, overrides_json=by_override, cluster_settings_json=privileged)
    clash = {
        "volumes": [{"name": "s", "secret": {"secretName": "s"}}],
        "volumeMounts": [{"name": "s", "mountPath": "/dev/shm"}],
    }
    with pytest.raises(SpecError, match="a path the spec mounts too"):
        spec_of(clash)


def test_the_task_config_refuses_what_a_node_cannot_be_given():
    with pytest.raises(SpecError, match="several accelerators"):
        spec_of({"resources": {"limits": {GPU: "1", "amd.com/gpu": "1"}}})
    with pytest.raises(SpecError, match="whole number"):
        spec_of({"resources": {"limits": {GPU: "500m"}}})
    with pytest.raises(SpecError, match="names no volume"):
        spec_of({"volumeMounts": [{"name": "x", "mountPath": "/x"}]})
    with pytest.raises(SpecError, match="PET_"):
        spec_of(
            {"env": [{"name": "PET_NNODES", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]},
            api="trainjob",
        )


# -- a pipeline of someone else's design -------------------------------------------------------


def load_training_job(path: Path):
    """The component file loaded as the README shows: kfp 2.17's loader drops the file's
    taskConfigPassthroughs (``ComponentSpec.from_ir_dicts``), so they are put back from it."""
    train_op = components.load_component_from_file(str(path))
    component = next(yaml.safe_load_all(path.read_text()))["components"]
    declared = component["comp-training-job-component"]["taskConfigPassthroughs"]
    train_op.component_spec.task_config_passthroughs = [
        dsl.TaskConfigPassthrough(
            field=dsl.TaskConfigField[d["field"]], apply_to_task=d.get("applyToTask", False)
        )
        for d in declared
    ]
    return train_op


def test_kfps_loader_drops_the_files_passthroughs():
    """Why load_training_job puts them back (when this fails, KFP keeps them: drop the step)."""
    train_op = components.load_component_from_file(str(COMPILED_DIR / "training_job.yaml"))
    assert train_op.component_spec.task_config_passthroughs is None
    train = load_training_job(COMPILED_DIR / "training_job.yaml")
    assert len(train.component_spec.task_config_passthroughs) == 6


def someone_elses_pipeline():
    """Loads our component file and sets the training task with KFP's calls only."""
    train_op = load_training_job(COMPILED_DIR / "training_job.yaml")

    @dsl.pipeline(name="their-training")
    def their_training(data_dir: str = "/datasets/cats"):
        train = train_op(data_dir=data_dir, output_dir="/datasets/out", workers=2, name="theirs")
        train.set_accelerator_type(GPU).set_accelerator_limit(2).set_cpu_request("8")
        kubernetes.add_toleration(train, key=GPU, operator="Exists", effect="NoSchedule")
        kubernetes.mount_pvc(train, pvc_name=CLAIM, mount_path="/datasets")

    return their_training


def compiled(tmp_path: Path) -> tuple[dict, dict]:
    """(PipelineSpec, kubernetes platform spec) of someone_elses_pipeline."""
    path = tmp_path / "theirs.yaml"
    compiler.Compiler().compile(someone_elses_pipeline(), str(path))
    pipeline, platform = yaml.safe_load_all(path.read_text())
    return pipeline, platform["platforms"]["kubernetes"]


def backend_task_config(pipeline: dict, platform: dict, task: str) -> dict[str, Any]:
    """The TaskConfig the KFP backend (2.15+) fills for ``task``: the accelerator limit and
    CPU/memory from the executor's container resources (driver.go initPodSpecPatch); the
    tolerations, and per pvcMount a volume named after the claim with its mount (k8s.go
    extendPodSpecPatch, makeVolumeMountPatch); every field as Go's json.Marshal writes it."""
    executor = pipeline["root"]["dag"]["tasks"][task]["componentRef"]["name"].replace(
        "comp-", "exec-"
    )
    resources = pipeline["deploymentSpec"]["executors"][executor]["container"]["resources"]
    accelerator = resources.get("accelerator") or {}
    limits = {accelerator["resourceType"]: accelerator["resourceCount"]} if accelerator else {}
    requests = {
        name: resources[key]
        for name, key in (("cpu", "resourceCpuRequest"), ("memory", "resourceMemoryRequest"))
        if key in resources
    }
    k8s = platform["deploymentSpec"]["executors"][executor]
    volumes, mounts = [], []
    for mount in k8s.get("pvcMount", []):
        claim = mount["pvcNameParameter"]["runtimeValue"]["constant"]
        volumes.append({"name": claim, "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": claim, "mountPath": mount["mountPath"]})
    return {
        "affinity": None,
        "tolerations": k8s.get("tolerations"),
        "nodeSelector": None,
        "env": None,
        "volumes": volumes or None,
        "volumeMounts": mounts or None,
        "resources": {"limits": limits, "requests": requests},
    }


def test_the_component_file_declares_the_passthroughs(tmp_path: Path):
    pipeline, _ = compiled(tmp_path)
    component = pipeline["components"]["comp-training-job-component"]
    task_config = component["inputDefinitions"]["parameters"]["task_config"]
    assert task_config == {"isOptional": True, "parameterType": "TASK_CONFIG"}
    assert component["taskConfigPassthroughs"] == [
        {"field": "RESOURCES"},
        {"field": "ENV", "applyToTask": True},
        {"field": "KUBERNETES_TOLERATIONS"},
        {"field": "KUBERNETES_NODE_SELECTOR"},
        {"field": "KUBERNETES_AFFINITY"},
        {"field": "KUBERNETES_VOLUMES", "applyToTask": True},
    ]


def their_spec(tmp_path: Path, namespace: str, api: str):
    """The spec the training step of their pipeline submits, with the backend's TaskConfig."""
    pipeline, platform = compiled(tmp_path)
    task = next(iter(pipeline["root"]["dag"]["tasks"]))
    arguments = pipeline["root"]["dag"]["tasks"][task]["inputs"]["parameters"]
    given = {k: v["runtimeValue"]["constant"] for k, v in arguments.items() if "runtimeValue" in v}
    given = {k: int(v) if isinstance(v, float) else v for k, v in given.items()}  # ints as 2.0
    step = inputs(
        **given,
        data_dir="/datasets/cats",
        namespace=namespace,
        api=api,
        task_config=backend_task_config(pipeline, platform, task),
    )
    return training_spec(step, run_id="run-1")


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_their_tasks_gpus_tolerations_and_claim_are_in_the_rendered_job(tmp_path, api):
    manifest = job_api(api).build(their_spec(tmp_path, "ns", api))
    if api == "trainjob":
        resources = manifest["spec"]["trainer"]["resourcesPerNode"]
        patch = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
        pod = patch["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        mounts = pod["containers"][0]["volumeMounts"]
    else:
        pod = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
        resources, mounts = pod["containers"][0]["resources"], pod["containers"][0]["volumeMounts"]
    assert resources["limits"][GPU] == "2" and resources["requests"]["cpu"] == "8"
    assert TOLERATION in pod["tolerations"]
    assert {"name": CLAIM, "persistentVolumeClaim": {"claimName": CLAIM}} in pod["volumes"]
    assert {"name": CLAIM, "mountPath": "/datasets"} in mounts


@pytest.fixture
def restricted(cluster, request):
    name = cluster.create_namespace(request.node.name, pod_security="restricted")
    yield name
    cluster.clear_namespace(name)


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_the_controllers_pods_carry_them_under_restricted(cluster, restricted, tmp_path, api):
    s = their_spec(tmp_path, restricted, api)
    jobs = job_api(api)
    client.CustomObjectsApi(cluster.clients()).create_namespaced_custom_object(
        jobs.group, jobs.version, restricted, jobs.plural, jobs.build(s), field_validation="Strict"
    )
    pods = created_pods(cluster, restricted, f"{JOB_LABEL[api]}={s.name}", count=2)
    for pod in pods:
        container = pod.spec.containers[0]
        assert container.resources.limits[GPU] == "2"
        assert container.resources.requests["cpu"] == "8"
        assert any(
            (t.key, t.operator, t.effect) == (GPU, "Exists", "NoSchedule")
            for t in pod.spec.tolerations
        )
        claims = {v.name: v.persistent_volume_claim for v in pod.spec.volumes}
        assert claims[CLAIM].claim_name == CLAIM
        assert any(m.name == CLAIM and m.mount_path == "/datasets" for m in container.volume_mounts)


def created_pods(cluster, namespace: str, selector: str, count: int, timeout: float = 30.0):
    """The pods the controller created, once there are ``count`` (a Pod Security refusal: the
    controller's event says why)."""
    core = client.CoreV1Api(cluster.clients())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
        if len(pods) >= count:
            return pods
        for event in core.list_namespaced_event(namespace).items:
            assert "violates PodSecurity" not in (event.message or ""), event.message
        time.sleep(0.2)
    raise TimeoutError(f"no {count} pods for {selector} in {timeout} s")


# -- kfp.local -------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:You may be attemping to run a task:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:Task .* have no effect in the current local runner")
def test_kfp_local_hands_no_task_config_and_the_parameters_decide(tmp_path: Path, writer):  # noqa: F811
    """kfp.local passes task_config=None (executor input ``"task_config": null``), warns that
    resources have no effect and ignores kfp-kubernetes settings: the job runs as before."""
    from kfp import local

    from components.kfp.launcher import make_training_job_op

    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "root"),
        workspace_root=workspace_root(tmp_path),
    )
    train_op = make_training_job_op()
    params = step_params(tmp_path, writer)

    @dsl.pipeline(name="local-task-config")
    def local_pipeline() -> dsl.Model:
        train = train_op(**params)
        train.set_accelerator_type(GPU).set_accelerator_limit(8).set_cpu_request("4")
        kubernetes.add_toleration(train, key=GPU, operator="Exists", effect="NoSchedule")
        kubernetes.mount_pvc(train, pvc_name=CLAIM, mount_path="/datasets")
        return train.outputs["model"]

    with pytest.warns(UserWarning, match="have no effect in the current local runner"):
        model = local_pipeline().output
    assert (Path(model.path) / "weights.pt").read_bytes() == b"weights"
    assert model.metadata["world_size"] == 2  # 2 nodes x 1 process: not the task's 8 GPUs
