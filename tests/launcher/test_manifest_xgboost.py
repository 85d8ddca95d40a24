"""XGBoost jobs, pure: what a spec of ``api="xgboostjob"`` (or a TrainJob on an XGBoost runtime)
refuses, the XGBoostJob manifest against the official CRD (strict) and the operator's admission
rules, the TrainJob on ``xgboost-distributed``, and the env contract the local backend gives each
replica."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest

from components import DEFAULT_IMAGE
from components.launcher import (
    SpecError,
    TrainSpec,
    XGBoostJobOptions,
    build_manifest,
    build_trainjob,
    build_xgboostjob,
)
from components.launcher.backends.contracts import node_contract, replica_names
from components.launcher.xgboostjob import DMLC_FROM_OPERATOR, admission_errors
from tests.crds import require_crd, schema_errors
from tests.launcher.test_manifest_pytorchjob import some_options

PROGRAM = {"image": "registry.example.com/xgb:1", "command": ["python", "/app/train.py"]}
HOSTFILE = Path("/unused")


def xgb_spec(**kw) -> TrainSpec:
    return TrainSpec.flat(**({"api": "xgboostjob", "name": "xgb"} | PROGRAM | kw))


def on_runtime(**kw) -> TrainSpec:
    base = {"api": "trainjob", "name": "xgb", "runtime_name": "xgboost-distributed"}
    return TrainSpec.flat(**(base | PROGRAM | kw))


def replicas(manifest: dict) -> dict:
    return manifest["spec"]["xgbReplicaSpecs"]


def container(manifest: dict, rtype: str = "Master") -> dict:
    (c,) = replicas(manifest)[rtype]["template"]["spec"]["containers"]
    return c


# -- the spec --------------------------------------------------------------------------------------

XGBOOSTJOB_REFUSALS = {
    "mpi_implementation": ({"mpi_implementation": "Intel"}, "api=mpijob"),
    "mpi_worker_command": ({"mpi_worker_command": ["sshd"]}, "api=mpijob"),
    "ssh_auth_mount_path": ({"ssh_auth_mount_path": "/home/u/.ssh"}, "api=mpijob"),
    "ray_head_cpu": ({"ray_head_cpu": "2"}, "api=rayjob"),
    "ray_head_memory": ({"ray_head_memory": "8Gi"}, "api=rayjob"),
    "runtime_name": ({"runtime_name": "xgboost-distributed"}, "runtime_name=xgboost-distributed"),
    "runtime_kind": ({"runtime_kind": "TrainingRuntime"}, "use api=trainjob"),
    "ml_policy": ({"ml_policy": "xgboost"}, "an mlPolicy (MPI, XGBoost...)"),
    "elastic_min_replicas": ({"elastic_min_replicas": 1, "elastic_max_replicas": 2}, "tracker"),
    "max_restarts": (
        {"elastic_min_replicas": 1, "elastic_max_replicas": 2, "max_restarts": 1},
        "fixed number of workers",
    ),
    "ps_replicas": ({"ps_replicas": 1}, "use api=tfjob"),
    "pytorch_master": ({"pytorch_master": True}, "its Master (always there)"),
}


def test_every_xgboostjob_refusal_is_tested():
    assert set(XGBoostJobOptions.INSTEAD) == set(XGBOOSTJOB_REFUSALS) | {"elastic_max_replicas"}


@pytest.mark.parametrize("field", sorted(XGBOOSTJOB_REFUSALS))
def test_an_xgboostjob_refuses_what_it_cannot_express(field):
    kwargs, alternative = XGBOOSTJOB_REFUSALS[field]
    with pytest.raises(SpecError) as err:
        xgb_spec(**kwargs)
    assert "api=xgboostjob cannot express it" in str(err.value) and alternative in str(err.value)
    assert err.value.field in kwargs  # the first setting given that it lacks


@pytest.mark.parametrize("make", [xgb_spec, on_runtime], ids=["xgboostjob", "trainjob"])
@pytest.mark.parametrize(
    ("kwargs", "field", "fix"),
    [
        ({"image": DEFAULT_IMAGE}, "image", "set image to one with xgboost"),
        ({"nproc_per_node": 2}, "nproc_per_node", "keep nproc_per_node=1"),
    ],
)
def test_an_xgboost_job_runs_the_users_program_once_per_pod(make, kwargs, field, fix):
    with pytest.raises(SpecError) as err:
        make(**kwargs)
    assert f"TrainSpec.{field}=" in str(err.value) and fix in str(err.value)


def test_without_a_command_the_xgboost_job_names_what_to_set():
    with pytest.raises(SpecError, match=r"TrainSpec.command=None.*\['python', '/app/train.py'\]"):
        xgb_spec(command=None)
    # On Trainer's runtime our trainer is refused by the runtime's name, with the fix.
    with pytest.raises(SpecError) as err:
        on_runtime(command=None)
    assert err.value.field == "runtime_name" and "it is an XGBoost runtime" in str(err.value)


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (xgb_spec, "RANK"),
        (xgb_spec, "MASTER_ADDR"),
        (xgb_spec, "DMLC_TASK_ID"),  # the XGBoostJob's command sets it from RANK
        (on_runtime, "DMLC_TASK_ID"),
    ],
)
def test_the_controllers_own_variables_are_refused_in_env(make, name):
    with pytest.raises(SpecError, match=rf"TrainSpec.env=.*\['{name}'\] are set by the"):
        make(env={name: "0"})


def test_gpus_do_not_multiply_the_processes_of_an_xgboost_pod():
    assert xgb_spec(gpus_per_worker=4).nproc_per_node == 1
    assert on_runtime(gpus_per_worker=1).nproc_per_node == 1
    # api=auto with a runtime_name can only become a TrainJob: sized as one already
    auto = on_runtime(api="auto", gpus_per_worker=1)
    assert auto.nproc_per_node == 1 and auto.for_api("trainjob").nproc_per_node == 1
    # The Trainer's XGBoost runtime counts a worker per GPU but starts one process per node.
    with pytest.raises(SpecError, match="DMLC_NUM_WORKER = nodes x 4") as err:
        on_runtime(gpus_per_worker=4)
    assert err.value.field == "gpus_per_worker" and "api=xgboostjob" in str(err.value)
    assert TrainSpec.flat(name="t", gpus_per_worker=4).nproc_per_node == 4  # torchrun's
    assert xgb_spec().framework == on_runtime().framework == "xgboost"
    assert TrainSpec.flat(name="t", runtime_name="deepspeed-distributed", **PROGRAM).framework == (
        "pytorch"
    )


def test_the_runtime_policy_is_known_from_trainers_own_runtimes_or_said():
    assert on_runtime().runtime.policy == "xgboost"
    mine = TrainSpec.flat(api="trainjob", name="j", runtime_name="my-xgb", **PROGRAM)
    assert mine.runtime.policy is None  # pre-flight reads it from the cluster
    said = TrainSpec.flat(
        api="trainjob", name="j", runtime_name="my-xgb", ml_policy="xgboost", **PROGRAM
    )
    assert said.runtime.is_xgboost and said.nproc_per_node == 1
    with pytest.raises(SpecError, match=r"TrainSpec.ml_policy='horovod'.*allowed: torch, mpi"):
        TrainSpec.flat(api="trainjob", name="j", ml_policy="horovod", **PROGRAM)


# -- the XGBoostJob ------------------------------------------------------------------------------


def test_a_master_and_workers_run_the_users_program_with_the_operators_port():
    m = build_xgboostjob(xgb_spec(namespace="ml", workers=3, args=["--epochs", "5"]))
    assert m["apiVersion"] == "kubeflow.org/v1" and m["kind"] == "XGBoostJob"
    assert {k: v["replicas"] for k, v in replicas(m).items()} == {"Master": 1, "Worker": 2}
    for rtype in ("Master", "Worker"):
        c = container(m, rtype)
        assert c["name"] == "xgboost" and c["image"] == PROGRAM["image"]
        # The program under sh, which sets the DMLC_* contract from the operator's variables.
        assert c["command"] == ["sh", "-c", DMLC_FROM_OPERATOR, "sh", *PROGRAM["command"]]
        assert c["args"] == ["--epochs", "5"]
        # The operator reads MASTER_PORT (the tracker's) from this port of the xgboost container.
        assert {"name": "xgboostjob-port", "containerPort": 9999, "protocol": "TCP"} in c["ports"]
        assert replicas(m)[rtype]["restartPolicy"] == "Never"  # the operator's XGBoost default
    assert m["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    assert build_manifest(xgb_spec())["kind"] == "XGBoostJob"
    one = build_xgboostjob(xgb_spec(workers=1))
    assert list(replicas(one)) == ["Master"]


def test_metrics_ports_come_after_the_operators():
    c = container(build_xgboostjob(xgb_spec(metrics_port=9400)))
    assert [p["name"] for p in c["ports"]] == ["xgboostjob-port", "metrics-0"]


VARIATIONS = [
    {},
    {"workers": 2},
    {"workers": 8, "gpus_per_worker": 1},
    {"cpu_request": "500m", "memory_request": "1Gi", "memory_limit": "4Gi"},
    {"pvcs": ["data:/data:ro", "ws:/workspace"]},
    {"scheduler_name": "volcano", "queue": "q", "min_available": 2, "workers": 2},
    {"restart_policy": "OnFailure", "backoff_limit": 0, "clean_pod_policy": "All"},
    {"kueue_queue": "lq", "active_deadline_seconds": 3600},
    {"run_id": "3f0e", "task_name": "t", "name": ""},
]


def all_specs() -> list[TrainSpec]:
    rng = random.Random(2024)
    randoms = [
        xgb_spec(
            name=f"xgb-{rng.randint(0, 10**6)}",
            workers=rng.randint(1, 16),
            gpus_per_worker=rng.choice([0, 1, 2]),
            **some_options(rng),
        )
        for _ in range(200)
    ]
    return [xgb_spec(**v) for v in VARIATIONS] + randoms


def test_every_manifest_passes_the_official_crd_schema_and_the_admission_rules():
    require_crd("xgboostjob")
    for spec in all_specs():
        manifest = build_xgboostjob(spec)
        assert schema_errors("xgboostjob", manifest) == [], spec
        assert admission_errors(manifest) == [], spec
        counts = {k: v["replicas"] for k, v in replicas(manifest).items()}
        assert sum(counts.values()) == spec.workers and counts["Master"] == 1


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda m: m["metadata"].__setitem__("name", "Xgb_1"), "DNS-1035"),
        (lambda m: container(m).__setitem__("name", "main"), "named 'xgboost'"),
        (lambda m: replicas(m).pop("Master"), "[Master]: must be present"),
        (lambda m: replicas(m)["Master"].__setitem__("replicas", 2), "replicas: must be 1"),
        (lambda m: replicas(m).__setitem__("Chief", replicas(m)["Master"]), "must be Master or"),
        (lambda m: container(m, "Worker").__setitem__("image", ""), "image: must be set"),
    ],
)
def test_admission_rules_catch_what_the_operator_refuses(mutate, message):
    bad = copy.deepcopy(build_xgboostjob(xgb_spec(workers=2)))
    mutate(bad)
    assert any(message in e for e in admission_errors(bad)), admission_errors(bad)


# -- the TrainJob on xgboost-distributed -----------------------------------------------------------


def test_the_trainjob_names_the_runtime_and_leaves_the_workers_per_node_to_it():
    m = build_trainjob(on_runtime(workers=3, gpus_per_worker=1))
    assert schema_errors("trainjob", m) == []
    assert m["spec"]["runtimeRef"]["name"] == "xgboost-distributed"
    trainer = m["spec"]["trainer"]
    assert trainer["numNodes"] == 3 and "numProcPerNode" not in trainer
    assert trainer["command"] == PROGRAM["command"] and trainer["image"] == PROGRAM["image"]
    assert not any(e["name"].startswith("DMLC_") for e in trainer.get("env") or [])


# -- the env contract of each replica, locally ---------------------------------------------------


def test_the_xgboostjob_contract_is_the_operators_on_loopback():
    spec = xgb_spec(workers=3)
    assert replica_names(spec) == ["master-0", "worker-0", "worker-1"]
    ports = [7000, 7001, 7002]
    envs = [node_contract(spec, rank, ports, mpi_hostfile=HOSTFILE) for rank in range(3)]
    for rank, env in enumerate(envs):
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "7000"
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "3"
        assert env["WORKER_ADDRS"] == "127.0.0.1,127.0.0.1"
        assert (env["DMLC_TRACKER_URI"], env["DMLC_TRACKER_PORT"]) == ("127.0.0.1", "7000")
        assert (env["DMLC_TASK_ID"], env["DMLC_NUM_WORKER"]) == (str(rank), "3")
    alone = node_contract(xgb_spec(), 0, [7000], mpi_hostfile=HOSTFILE)
    assert "WORKER_ADDRS" not in alone and alone["WORLD_SIZE"] == "1"


def test_the_xgboost_runtime_contract_is_trainers_on_loopback():
    spec = on_runtime(workers=2)
    assert replica_names(spec) == ["node-0", "node-1"]
    envs = [node_contract(spec, rank, [7100, 7101], mpi_hostfile=HOSTFILE) for rank in (0, 1)]
    assert envs == [
        {
            "DMLC_TRACKER_URI": "127.0.0.1",
            "DMLC_TRACKER_PORT": "7100",
            "DMLC_TASK_ID": str(rank),
            "DMLC_NUM_WORKER": "2",
        }
        for rank in (0, 1)
    ]
    jax = TrainSpec.flat(api="trainjob", name="j", runtime_name="jax-distributed", **PROGRAM)
    with pytest.raises(ValueError, match="local backend runs torch, mpi and xgboost runtimes"):
        node_contract(jax, 0, [7200], mpi_hostfile=HOSTFILE)


def test_the_xgboostjobs_sh_line_sets_the_dmlc_contract_from_the_operators_variables(tmp_path):
    """The container's command as the kubelet runs it (argv: command, then args), with the
    operator's env: the program sees Trainer's DMLC_* variables, and its exit code."""
    import subprocess
    import sys

    (command,) = {
        tuple(container(build_xgboostjob(xgb_spec(workers=3)), r)["command"])
        for r in ("Master", "Worker")
    }
    program = [
        sys.executable,
        "-c",
        "import os, sys; print(*(os.environ[k] for k in sys.argv[1:])); sys.exit(3)",
    ]
    names = ["DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER"]
    argv = [*command[:4], *program, *names]
    env = {
        "PATH": "/usr/bin:/bin",
        "MASTER_ADDR": "xgb-master-0",
        "MASTER_PORT": "9999",
        "RANK": "2",
        "WORLD_SIZE": "3",
    }
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert done.stdout.split() == ["xgb-master-0", "9999", "2", "3"] and done.returncode == 3
