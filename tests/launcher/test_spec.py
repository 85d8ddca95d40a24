"""TrainSpec: every bad value names the field, the value and the fix; what each API refuses."""

from __future__ import annotations

import pytest

from components import DEFAULT_IMAGE
from components.launcher import SpecError, TrainSpec
from components.launcher.api_options import (
    OPTIONS_OF_API,
    SETTINGS_OF_APIS,
    PyTorchJobOptions,
    TFJobOptions,
    TrainJobOptions,
)

# -- validation -------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "Bad_Name"}, "name"),
        ({"name": "1abc"}, "name"),
        ({"name": "a" * 64}, "name"),
        ({"name": "a" * 55, "workers": 20}, "name"),  # a-…-worker-18 would pass 63 characters
        ({"namespace": "Not OK"}, "namespace"),
        ({"image": ""}, "image"),
        ({"image": "has space"}, "image"),
        ({"command": []}, "command"),
        ({"command": "python x.py"}, "command"),
        ({"workers": 0}, "workers"),
        ({"workers": 1.5}, "workers"),
        ({"workers": True}, "workers"),
        ({"nproc_per_node": 0}, "nproc_per_node"),
        ({"gpus_per_worker": -1}, "gpus_per_worker"),
        ({"gpus_per_worker": 2, "nproc_per_node": 4}, "nproc_per_node"),
        ({"gpu_resource": "gpu"}, "gpu_resource"),
        ({"cpu_request": "four"}, "cpu_request"),
        ({"memory_limit": "-1Gi"}, "memory_limit"),
        ({"memory_request": "2Gi", "memory_limit": "1Gi"}, "memory_request"),
        ({"cpu_request": "2", "cpu_limit": "500m"}, "cpu_request"),
        ({"shm_size": "lots"}, "shm_size"),
        ({"shm_size": "8Gi", "memory_limit": "4Gi"}, "shm_size"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"nccl_preset": "rdma"}, "nccl_preset"),
        ({"pvcs": ["nope"]}, "pvcs"),
        ({"pvcs": ["Bad_Claim:/x"]}, "pvcs"),
        ({"pvcs": ["c:relative"]}, "pvcs"),
        ({"pvcs": ["a:/x", "b:/x"]}, "pvcs"),
        ({"node_selector": {"k": "bad value"}}, "node_selector"),
        ({"labels": {"bad key!": "v"}}, "labels"),
        ({"tolerations": [{"key": "k", "operator": "Maybe"}]}, "tolerations"),
        ({"tolerations": [{"key": "k", "effect": "Never"}]}, "tolerations"),
        ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "tolerations"),
        ({"tolerations": [{"key": "k", "toleration_seconds": 5}]}, "tolerations"),
        ({"tolerations": [{"kee": "k"}]}, "tolerations"),
        ({"service_account": "Bad SA"}, "service_account"),
        ({"image_pull_secrets": ["Bad"]}, "image_pull_secrets"),
        ({"scheduler_name": "Volcano!"}, "scheduler_name"),
        ({"queue": "Q"}, "queue"),
        ({"kueue_queue": "q_1"}, "kueue_queue"),
        ({"min_available": 0}, "min_available"),
        ({"workers": 2, "min_available": 3}, "min_available"),
        ({"elastic_min_replicas": 2}, "elastic_min_replicas"),
        ({"elastic_min_replicas": 0, "elastic_max_replicas": 2}, "elastic_min_replicas"),
        ({"workers": 5, "elastic_min_replicas": 1, "elastic_max_replicas": 4}, "workers"),
        ({"max_restarts": 3}, "max_restarts"),
        ({"restart_policy": "Sometimes"}, "restart_policy"),
        ({"clean_pod_policy": "Some"}, "clean_pod_policy"),
        ({"backoff_limit": -1}, "backoff_limit"),
        ({"active_deadline_seconds": 0}, "active_deadline_seconds"),
        ({"ttl_seconds_after_finished": -5}, "ttl_seconds_after_finished"),
        ({"termination_grace_period_seconds": -1}, "termination_grace_period_seconds"),
        ({"host_network": "yes"}, "host_network"),
        ({"image": "Registry.Example.com/Team/KFP-DDP:V1"}, "image"),
        ({"image": "ghcr.io/team/ddp:1 "}, "image"),
    ],
)
def test_bad_values_name_field_value_and_fix(kwargs, field):
    with pytest.raises(SpecError) as err:
        TrainSpec.flat(**({"name": "job"} | kwargs))
    message = str(err.value)
    assert field in message
    assert "invalid" in message or "not" in message or "must" in message


def test_error_message_shape():
    with pytest.raises(SpecError, match=r"TrainSpec\.workers=0 is invalid: must be between 1"):
        TrainSpec(workers=0)
    with pytest.raises(SpecError, match="allowed: tcp, infiniband, debug"):
        TrainSpec(nccl_preset="ib")


def test_overrides_refuse_unknown_fields():
    spec = TrainSpec.from_overrides({"name": "j"}, {"workers": 3})
    assert spec.workers == 3
    with pytest.raises(SpecError, match="unknown field.*wrokers") as refused:
        TrainSpec.from_overrides({"name": "j"}, {"wrokers": 3})
    assert "'wrokers' (did you mean 'workers'?)" in str(refused.value)
    valid = str(refused.value).split("valid: ")[1].split(", ")
    assert "workers" in valid and "name" not in valid  # what the base sets is no override


# -- what an API cannot express is refused, with the alternative --------------------------------

TRAINJOB_REFUSALS = {
    "elastic_min_replicas": ({"elastic_min_replicas": 1, "elastic_max_replicas": 2}, "removed in"),
    "max_restarts": (
        {"elastic_min_replicas": 1, "elastic_max_replicas": 2, "max_restarts": 1},
        "Trainer v2.2",
    ),
    "scheduler_name": ({"scheduler_name": "volcano"}, "podGroupPolicy"),
    "min_available": ({"min_available": 1}, "podGroupPolicy"),
    "queue": ({"queue": "research"}, "kueue_queue"),
    "priority_class": ({"priority_class": "high"}, "WorkloadPriorityClass"),
    "host_network": ({"host_network": True, "pod_security": "privileged"}, "hostNetwork: true"),
    "restart_policy": ({"restart_policy": "ExitCode"}, "failurePolicy"),
    "backoff_limit": ({"backoff_limit": 2}, "failurePolicy"),
    "clean_pod_policy": ({"clean_pod_policy": "All"}, "cleanup option"),
    "ttl_seconds_after_finished": ({"ttl_seconds_after_finished": 60}, "cleanup option"),
}


@pytest.mark.parametrize("api", sorted(set(OPTIONS_OF_API) - {"rayjob"}))
def test_the_ray_heads_size_is_a_rayjobs_alone(api):
    program = {"image": "registry.example.com/p:1", "command": ["python", "p.py"]}
    for field, value in (("ray_head_cpu", "2"), ("ray_head_memory", "8Gi")):
        with pytest.raises(SpecError) as err:
            TrainSpec.flat(api=api, name="j", **program, **{field: value})
        assert err.value.field == field and "use api=rayjob" in str(err.value)


@pytest.mark.parametrize("api", sorted(OPTIONS_OF_API))
def test_every_api_says_what_it_offers_instead_of_each_other_apis_option(api):
    cls = OPTIONS_OF_API[api]
    own = {f for f, apis in SETTINGS_OF_APIS.items() if api in apis}
    assert set(cls.INSTEAD) == set(SETTINGS_OF_APIS) - own
    assert not set(cls.INSTEAD) & own


def test_every_v1_only_field_has_a_tested_refusal():
    assert set(TrainJobOptions.INSTEAD) == set(TRAINJOB_REFUSALS) | {
        "elastic_max_replicas",
        "ps_replicas",
        "pytorch_master",
        # An MPIJob's, not a PyTorchJob's: below.
        "mpi_implementation",
        "mpi_worker_command",
        "ssh_auth_mount_path",
        # A RayJob's: test_the_ray_heads_size_is_a_rayjobs_alone.
        "ray_head_cpu",
        "ray_head_memory",
    }


@pytest.mark.parametrize(
    ("setting", "trainjob_says"),
    [
        ({"mpi_implementation": "MPICH"}, "mlPolicy.mpi.mpiImplementation"),
        ({"mpi_worker_command": ["/usr/sbin/sshd", "-De"]}, "its node pods' command"),
        ({"ssh_auth_mount_path": "/home/mpiuser/.ssh"}, "mlPolicy.mpi.sshAuthMountPath"),
    ],
)
@pytest.mark.parametrize("api", ["trainjob", "pytorchjob", "rayjob"])
def test_only_an_mpijob_says_how_its_mpi_runs(api, setting, trainjob_says):
    with pytest.raises(SpecError) as err:
        TrainSpec.flat(api=api, name="j", **setting)
    (name,) = setting
    says = trainjob_says if api == "trainjob" else "api=mpijob"
    assert err.value.field == name
    assert f"api={api} cannot express it" in str(err.value) and says in str(err.value)


@pytest.mark.parametrize("field", sorted(TRAINJOB_REFUSALS))
def test_trainjob_refuses_what_it_cannot_express(field):
    kwargs, alternative = TRAINJOB_REFUSALS[field]
    TrainSpec.flat(api="pytorchjob", name="j", **kwargs)  # fine as a PyTorchJob
    with pytest.raises(SpecError) as err:
        TrainSpec.flat(api="trainjob", name="j", **kwargs)
    message = str(err.value)
    assert "api=trainjob cannot express it" in message and alternative in message
    # auto is decided at submit time; binding it to the TrainJob refuses the same way
    auto = TrainSpec.flat(api="auto", name="j", **kwargs)
    with pytest.raises(SpecError, match="api=trainjob cannot express it"):
        auto.for_api("trainjob")


def test_trainjob_refuses_reserved_pet_env():
    with pytest.raises(SpecError, match=r"\['PET_NNODES'\] are set by the Trainer controller"):
        TrainSpec(api="trainjob", name="j", env={"PET_NNODES": "2", "OK": "1"})
    TrainSpec(api="pytorchjob", name="j", env={"OK": "1"})


def test_pytorchjob_refuses_runtime_settings():
    with pytest.raises(SpecError, match="runtime_name.*api=pytorchjob cannot express it"):
        TrainSpec.flat(api="pytorchjob", name="j", runtime_name="torch-distributed")


def test_the_api_is_one_of_the_known_ones():
    with pytest.raises(SpecError, match="allowed: auto, trainjob, pytorchjob, tfjob"):
        TrainSpec(api="tfjobs", name="j")


@pytest.mark.parametrize(
    ("api", "longest"), [("trainjob", "-node-9-0"), ("pytorchjob", "-worker-8")]
)
def test_names_leave_room_for_the_controllers_pod_hostnames(api, longest):
    room = 63 - len(longest)
    TrainSpec(api=api, name="a" * room, workers=10)
    with pytest.raises(SpecError, match="too long for its pod hostnames"):
        TrainSpec(api=api, name="a" * (room + 1), workers=10)


def test_gpus_make_our_trainer_use_cuda_or_fail():
    assert TrainSpec(name="j", gpus_per_worker=1).container_args() == ["--device", "cuda"]
    assert TrainSpec(name="j", gpus_per_worker=1, args=["--device", "cpu"]).container_args() == [
        "--device",
        "cpu",
    ]
    assert TrainSpec(name="j").container_args() == []
    custom = TrainSpec(name="j", gpus_per_worker=1, command=["python", "x.py"], args=["a"])
    assert custom.container_args() == ["a"]  # not our trainer: its flags are its own


# -- defaults that keep GPUs busy -------------------------------------------------------------


def test_one_process_per_gpu_by_default():
    assert TrainSpec(name="j", gpus_per_worker=8).nproc_per_node == 8
    assert TrainSpec(name="j").nproc_per_node == 1
    assert TrainSpec(name="j", gpus_per_worker=8).warnings() == []
    fewer = TrainSpec(name="j", gpus_per_worker=8, nproc_per_node=2)
    (warning,) = fewer.warnings()
    assert "6 GPU(s) per node stay idle" in warning


def test_shm_grows_with_the_processes_and_stays_below_the_memory_request():
    assert TrainSpec(name="j").shm_size == "2Gi"
    assert TrainSpec(name="j", gpus_per_worker=8).shm_size == "16Gi"
    assert TrainSpec(name="j", gpus_per_worker=8, memory_limit="20Gi").shm_size == "10Gi"
    assert TrainSpec(name="j", gpus_per_worker=8, memory_request="20Gi").shm_size == "10Gi"
    assert TrainSpec(name="j", memory_limit="3Gi").shm_size == "1536Mi"
    assert TrainSpec(name="j", shm_size="").shm_size is None
    # An explicit /dev/shm is memory too: the default request grows by it.
    explicit = TrainSpec(name="j", shm_size="8Gi")
    assert (explicit.shm_size, explicit.memory_request) == ("8Gi", "12Gi")
    with pytest.raises(SpecError, match="shm_size.*counts against the pod's memory"):
        TrainSpec(name="j", shm_size="8Gi", memory_request="8Gi")


def test_infiniband_needs_its_device_or_says_what_is_missing():
    spec = TrainSpec(name="j", nccl_preset="infiniband", gpus_per_worker=8)
    assert any("without rdma_resource" in w for w in spec.warnings())
    ok = TrainSpec(
        name="j",
        nccl_preset="infiniband",
        gpus_per_worker=8,
        rdma_resource="rdma/ib",
        capabilities=["IPC_LOCK"],
        pod_security="privileged",
    )
    assert ok.warnings() == []
    no_lock = TrainSpec(name="j", nccl_preset="infiniband", gpus_per_worker=8, rdma_resource="r/ib")
    (warning,) = no_lock.warnings()  # restricted by default: says what RDMA may still need
    assert "capabilities=['IPC_LOCK']" in warning and "pod_security=privileged" in warning
    with pytest.raises(SpecError, match="only with nccl_preset=infiniband"):
        TrainSpec(name="j", rdma_resource="rdma/ib")
    with pytest.raises(SpecError, match="rdma_resource"):
        TrainSpec(name="j", nccl_preset="infiniband", rdma_resource="nope")


def test_the_network_interface_is_pinned_for_nccl_and_gloo():
    env = TrainSpec(name="j", nccl_preset="tcp", network_interface="ens5").merged_env()
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ens5"
    assert (
        TrainSpec(name="j", nccl_preset="tcp", env={"NCCL_SOCKET_IFNAME": "ib0"}).merged_env()[
            "NCCL_SOCKET_IFNAME"
        ]
        == "ib0"
    )
    with pytest.raises(SpecError, match="network_interface"):
        TrainSpec(name="j", network_interface="eth0 ; rm")


# -- a TFJob runs the user's TensorFlow program -------------------------------------------------

TF = {
    "api": "tfjob",
    "name": "j",
    "image": "registry.example.com/tf:1",
    "command": ["python", "t.py"],
}
TFJOB_REFUSALS = {
    "mpi_implementation": ({"mpi_implementation": "Intel"}, "api=mpijob"),
    "mpi_worker_command": ({"mpi_worker_command": ["sshd"]}, "api=mpijob"),
    "ssh_auth_mount_path": ({"ssh_auth_mount_path": "/home/u/.ssh"}, "api=mpijob"),
    "ray_head_cpu": ({"ray_head_cpu": "2"}, "api=rayjob"),
    "ray_head_memory": ({"ray_head_memory": "8Gi"}, "api=rayjob"),
    "runtime_name": ({"runtime_name": "torch-distributed"}, "no TensorFlow runtime"),
    "runtime_kind": ({"runtime_kind": "TrainingRuntime"}, "Training Operator v1"),
    "ml_policy": ({"ml_policy": "mpi"}, "an mlPolicy (MPI, XGBoost...) is a Kubeflow Trainer v2"),
    "elastic_min_replicas": ({"elastic_min_replicas": 1, "elastic_max_replicas": 2}, "BackupAndRe"),
    "max_restarts": (
        {"elastic_min_replicas": 1, "elastic_max_replicas": 2, "max_restarts": 1},
        "fixed number of workers",
    ),
}


def test_every_tfjob_refusal_is_tested():
    assert set(TFJobOptions.INSTEAD) == set(TFJOB_REFUSALS) | {
        "elastic_max_replicas",
        "pytorch_master",
    }


@pytest.mark.parametrize("field", sorted(TFJOB_REFUSALS))
def test_tfjob_refuses_what_it_cannot_express(field):
    kwargs, alternative = TFJOB_REFUSALS[field]
    with pytest.raises(SpecError) as err:
        TrainSpec.flat(**(TF | kwargs))
    assert "api=tfjob cannot express it" in str(err.value) and alternative in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "field", "fix"),
    [
        ({"image": DEFAULT_IMAGE}, "image", "set image to one with TensorFlow"),
        ({"command": None}, "command", "['python', '/app/train.py']"),
        ({"nproc_per_node": 2, "gpus_per_worker": 2}, "nproc_per_node", "keep nproc_per_node=1"),
        ({"env": {"TF_CONFIG": "{}"}}, "env", "set by the Training Operator"),
    ],
)
def test_tfjob_needs_the_users_program_and_one_process_per_pod(kwargs, field, fix):
    with pytest.raises(SpecError) as err:
        TrainSpec.flat(**(TF | kwargs))
    assert f"TrainSpec.{field}=" in str(err.value) and fix in str(err.value)


MPI_PROGRAM = {"command": ["python", "/app/train.py"], "image": "my/mpi:1"}


@pytest.mark.parametrize(
    ("kwargs", "field", "fix"),
    [
        # Our default image has no Ray, no OpenMPI and no sshd.
        ({"api": "rayjob"}, "image", f"{DEFAULT_IMAGE}-ray, or make image-local-ray"),
        ({"runtime_name": "kfp-ddp-mpi"}, "image", f"{DEFAULT_IMAGE}-mpi"),
        (
            {"runtime_name": "deepspeed-distributed", **MPI_PROGRAM, "image": DEFAULT_IMAGE},
            "image",
            "the launcher pod runs mpirun",
        ),
        # Your program on an MPI runtime runs in the launcher pod alone: so would the staging.
        (
            {
                "runtime_name": "deepspeed-distributed",
                **MPI_PROGRAM,
                "stage_data_uri": "s3://bucket/data",
            },
            "stage_data_uri",
            "only the launcher pod runs the command",
        ),
        # The RayJob CRD's activeDeadlineSeconds is an int32.
        (
            {"api": "rayjob", "image": "r:1", "active_deadline_seconds": 2**31},
            "active_deadline_seconds",
            "2147483647",
        ),
        # The Trainer's MPI plugin sets OpenMPI's hostfile in the pods.
        (
            {
                "runtime_name": "deepspeed-distributed",
                **MPI_PROGRAM,
                "env": {"OMPI_MCA_orte_default_hostfile": "/h"},
            },
            "env",
            "set by the Trainer",
        ),
    ],
    ids=["ray-image", "mpi-image", "mpi-launcher-image", "mpi-staging", "ray-deadline", "mpi-env"],
)
def test_what_an_mpi_runtime_or_a_rayjob_needs_is_refused_naming_the_setting(kwargs, field, fix):
    base = {"api": "trainjob", "name": "j"}
    with pytest.raises(SpecError) as err:
        TrainSpec.flat(**(base | kwargs))
    assert err.value.field == field and fix in str(err.value)
    assert f"TrainSpec.{field}=" in str(err.value)


def test_a_tfjob_takes_every_v1_pod_and_run_policy_setting():
    spec = TrainSpec.flat(
        **TF,
        workers=4,
        ps_replicas=2,
        gpus_per_worker=2,
        host_network=True,
        pod_security="privileged",
        scheduler_name="volcano",
        queue="q",
        priority_class="high",
        min_available=6,  # the 4 workers and 2 parameter servers, all at once
        restart_policy="ExitCode",
        backoff_limit=1,
        clean_pod_policy="All",
        ttl_seconds_after_finished=60,
        kueue_queue="team-a",
        nccl_preset="tcp",
    )
    assert spec.pod_count == 6
    with pytest.raises(SpecError, match=r"min_available.*must be <= the job's pods \(6\)"):
        TrainSpec.flat(**TF, workers=4, ps_replicas=2, min_available=7)


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob", "auto"])
def test_parameter_servers_are_for_tfjobs_only(api):
    with pytest.raises(SpecError, match="ps_replicas.*use api=tfjob"):
        TrainSpec.flat(api=api, name="j", ps_replicas=1).for_api(
            api if api != "auto" else "trainjob"
        )
    with pytest.raises(SpecError, match="ps_replicas"):
        TrainSpec.flat(**TF, ps_replicas=-1)


@pytest.mark.parametrize(
    ("kw", "longest"),
    [({"workers": 10}, "-worker-8"), ({"workers": 1, "ps_replicas": 3}, "-chief-0")],
)
def test_tfjob_names_leave_room_for_every_replicas_hostname(kw, longest):
    room = 63 - len(longest)
    TrainSpec.flat(**(TF | kw | {"name": "a" * room}))
    with pytest.raises(SpecError, match="too long for its pod hostnames"):
        TrainSpec.flat(**(TF | kw | {"name": "a" * (room + 1)}))


def test_a_tfjob_with_gpus_runs_one_process_per_pod_by_default():
    assert TrainSpec.flat(**TF, gpus_per_worker=4).nproc_per_node == 1


def test_a_tfjob_with_gpus_gets_no_trainer_flags():
    assert TrainSpec.flat(**TF, gpus_per_worker=1, args=["--epochs", "2"]).container_args() == [
        "--epochs",
        "2",
    ]


# -- the API options objects ---------------------------------------------------------------------


def test_an_option_an_api_lacks_cannot_be_given_to_it():
    with pytest.raises(TypeError, match="backoff_limit"):
        TrainJobOptions(backoff_limit=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="runtime_name"):
        PyTorchJobOptions(runtime_name="torch-distributed")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="elastic_min_replicas"):
        TFJobOptions(elastic_min_replicas=1)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: TrainJobOptions(runtime_kind="Runtime"), "runtime_kind"),
        (lambda: TrainJobOptions(runtime_name="Bad Name"), "runtime_name"),
        (lambda: PyTorchJobOptions(restart_policy="Sometimes"), "restart_policy"),
        (lambda: PyTorchJobOptions(elastic_max_replicas=3), "elastic_min_replicas"),
        (lambda: PyTorchJobOptions(max_restarts=2), "max_restarts"),
        (lambda: PyTorchJobOptions(pytorch_master="yes"), "pytorch_master"),
        (lambda: TFJobOptions(ps_replicas=-1), "ps_replicas"),
        (lambda: TFJobOptions(clean_pod_policy="Some"), "clean_pod_policy"),
    ],
)
def test_each_options_object_checks_its_own_values(build, field):
    with pytest.raises(SpecError) as err:
        build()
    assert err.value.field == field and f"TrainSpec.{field}=" in str(err.value)


def test_a_concrete_api_always_has_its_options_object():
    assert TrainSpec(name="j", api="trainjob").api_options == TrainJobOptions()
    assert TrainSpec(name="j", api="pytorchjob").api_options == PyTorchJobOptions()
    assert TrainSpec(name="j").api_options is None  # auto: the cluster decides
    assert TrainSpec(name="j").for_api("pytorchjob").api_options == PyTorchJobOptions()


def test_options_of_another_api_are_moved_or_refused_naming_the_setting():
    # the Training Operator's settings a PyTorchJob and a TFJob share are kept
    moved = TrainSpec(**(TF | {"api_options": PyTorchJobOptions(queue="team-a")}))
    assert moved.api_options == TFJobOptions(queue="team-a")
    # defaults move anywhere
    assert TrainSpec(name="j", api="trainjob", api_options=PyTorchJobOptions()).api_options == (
        TrainJobOptions()
    )
    with pytest.raises(SpecError) as err:
        TrainSpec(name="j", api="trainjob", api_options=PyTorchJobOptions(backoff_limit=2))
    assert err.value.field == "backoff_limit" and "failurePolicy" in str(err.value)


def test_auto_keeps_the_options_and_the_cluster_api_must_express_them():
    options = PyTorchJobOptions(elastic_min_replicas=1, elastic_max_replicas=4)
    spec = TrainSpec(name="j", workers=2, api_options=options)
    assert spec.api == "auto" and spec.elastic
    assert spec.for_api("pytorchjob").api_options == options
    with pytest.raises(SpecError, match="api=trainjob cannot express it: elastic training"):
        spec.for_api("trainjob")


def test_the_flat_form_sorts_settings_into_the_api_options():
    flat = TrainSpec.flat(name="j", api="pytorchjob", backoff_limit=0, queue="team-a")
    assert flat.api_options == PyTorchJobOptions(backoff_limit=0, queue="team-a")
    # auto: the first of TrainJob, PyTorchJob that has every setting given
    assert TrainSpec.flat(name="j", runtime_name="mine").api_options == TrainJobOptions(
        runtime_name="mine"
    )
    assert TrainSpec.flat(name="j", backoff_limit=0).api_options == PyTorchJobOptions(
        backoff_limit=0
    )
    # settings at their defaults (the CLI passes every flag) choose nothing
    assert TrainSpec.flat(name="j", ps_replicas=0, host_network=False).api_options is None
    with pytest.raises(SpecError, match="neither can express"):
        TrainSpec.flat(name="j", runtime_name="mine", backoff_limit=1)
    with pytest.raises(SpecError, match="inside api_options"):
        TrainSpec.flat(name="j", api_options=TrainJobOptions(), runtime_name="mine")
