"""The test control plane itself: real controllers turn our jobs into pods, the kubelet stand-in
serves logs through the API server, the garbage collector cleans up, and a missing binary skips
with the way to get it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kubernetes import client

from components.launcher import TrainSpec, build_pytorchjob, build_trainjob
from tests.cluster import assets
from tests.cluster.control_plane import ControlPlane
from tests.cluster.processes import StartupError


def test_a_trainjob_becomes_a_jobset_and_pods_with_the_trainers_env(k8s):
    spec = TrainSpec(api="trainjob", name="cats", namespace=k8s.name, workers=3, run_id="r")
    custom = client.CustomObjectsApi(k8s.admin())
    custom.create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", k8s.name, "trainjobs", build_trainjob(spec)
    )
    pods = k8s.job("trainjob", "cats").pods(3)
    env = {e.name: e.value for e in pods[0].spec.containers[0].env}
    assert env["PET_NNODES"] == "3" and env["PET_MASTER_ADDR"] == "cats-node-0-0.cats"
    jobset = custom.get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", k8s.name, "jobsets", "cats"
    )
    assert jobset["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"


def test_logs_go_through_the_api_server_to_the_kubelet(k8s):
    spec = TrainSpec(api="pytorchjob", name="logs", namespace=k8s.name, workers=1, run_id="r")
    client.CustomObjectsApi(k8s.admin()).create_namespaced_custom_object(
        "kubeflow.org", "v1", k8s.name, "pytorchjobs", build_pytorchjob(spec)
    )
    (pod,) = k8s.job("pytorchjob", "logs").pods(1)
    k8s.kubelet.run(pod)
    k8s.kubelet.log(pod, "hello from the master")
    text = client.CoreV1Api(k8s.admin()).read_namespaced_pod_log(
        pod.metadata.name, k8s.name, container="pytorch"
    )
    assert text == "hello from the master\n"
    assert any(
        f"/containerLogs/{k8s.name}/{pod.metadata.name}/pytorch" in p
        for p in k8s.kubelet.log_requests
    )


def test_deleting_a_trainjob_garbage_collects_jobset_jobs_and_running_pods(k8s):
    spec = TrainSpec(api="trainjob", name="gc", namespace=k8s.name, workers=2, run_id="r")
    custom = client.CustomObjectsApi(k8s.admin())
    custom.create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", k8s.name, "trainjobs", build_trainjob(spec)
    )
    job = k8s.job("trainjob", "gc")
    for pod in job.pods(2):
        k8s.kubelet.run(pod)  # bound to the node: only its kubelet can finish their deletion
    custom.delete_namespaced_custom_object(
        "trainer.kubeflow.org",
        "v1alpha1",
        k8s.name,
        "trainjobs",
        "gc",
        propagation_policy="Background",
    )
    core, batch = client.CoreV1Api(k8s.admin()), client.BatchV1Api(k8s.admin())
    deadline = time.monotonic() + 30
    while core.list_namespaced_pod(k8s.name).items or batch.list_namespaced_job(k8s.name).items:
        assert time.monotonic() < deadline, "the garbage collector left pods or Jobs"
        time.sleep(0.2)


def test_missing_binaries_are_none_and_named(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(assets, "SHARED_ENVTEST", tmp_path / "nowhere")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    found = assets.find_binaries()
    assert found.missing(("etcd", "kube-apiserver")) == ["etcd", "kube-apiserver"]
    assert "KUBEBUILDER_ASSETS" in assets.HOW_TO_GET and "setup-envtest" in assets.HOW_TO_GET


def test_kubebuilder_assets_wins(tmp_path: Path, monkeypatch):
    fake = tmp_path / "etcd"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    assert assets.find_binaries(("etcd",))["etcd"] == fake


def test_a_component_that_fails_to_start_shows_its_log(tmp_path: Path):
    binary = tmp_path / "etcd"
    binary.write_text("#!/bin/sh\necho 'etcd: bind: address already in use' >&2\nexit 1\n")
    binary.chmod(0o755)
    plane = ControlPlane(tmp_path / "plane", assets.Binaries({"etcd": binary}), parts=())
    with pytest.raises(StartupError, match="address already in use") as err:
        plane.start()
    assert "etcd exited with code 1" in str(err.value)
