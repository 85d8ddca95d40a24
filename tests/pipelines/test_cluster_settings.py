"""Node access is an admin's compile-time choice, never a pipeline parameter: ``overrides_json``
may not set pod_security, capabilities, host_network or stage_cache_host_path; the compile-time
``cluster_settings`` (``kfp-ddp compile --cluster-settings``) may, and land as a constant in the
compiled pipeline."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from components.launcher import SpecError
from components.launcher.step import TrainingStepInputs, training_spec
from pipelines.cli import main
from pipelines.plan import cluster_settings_json
from pipelines.training import build_training_pipeline
from tests import yaml_fast

REQUIRED = ["-p", "data_uri=s3://bucket/datasets/cats", "-p", "publish_uri=s3://bucket/models"]
CACHE = {"pod_security": "privileged", "stage_cache_host_path": "/mnt/kfp-ddp-cache"}


@pytest.mark.parametrize(
    "override",
    [
        {"stage_cache_host_path": "/etc"},
        {"stage_cache_host_path": "/mnt/kfp-ddp-cache", "pod_security": "privileged"},
        {"host_network": True},
        {"capabilities": ["IPC_LOCK"]},
        {"pod_security": "baseline"},
    ],
)
def test_train_overrides_cannot_open_the_node(override):
    result = CliRunner().invoke(
        main, ["render", *REQUIRED, "-p", f"overrides_json={json.dumps(override)}"]
    )
    assert result.exit_code == 2, result.output
    assert "overrides_json=" in result.output and "open the node" in result.output
    assert "--cluster-settings" in result.output


def test_the_compile_time_cluster_settings_give_the_node_cache():
    result = CliRunner().invoke(
        main,
        ["render", *REQUIRED, "--cluster-settings", json.dumps(CACHE), "-p", "api=trainjob"],
    )
    assert result.exit_code == 0, result.output
    job = yaml_fast.safe_load(result.stdout)
    (patch,) = job["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    volumes = node["template"]["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "stage-cache",
        "hostPath": {"path": "/mnt/kfp-ddp-cache", "type": "DirectoryOrCreate"},
    } in volumes
    assert "--keep-snapshots" in job["spec"]["trainer"]["command"]  # a bounded cache


@pytest.mark.parametrize(
    "path", ["/", "/etc", "/var/lib/kubelet/pods", "/root/x", "/mnt", "/mnt/../etc"]
)
def test_system_paths_are_refused_even_for_an_admin(path):
    result = CliRunner().invoke(
        main,
        [
            "render",
            *REQUIRED,
            "--cluster-settings",
            json.dumps({"pod_security": "privileged", "stage_cache_host_path": path}),
        ],
    )
    assert result.exit_code == 2, result.output
    assert "stage_cache_host_path" in result.output


def test_cluster_settings_are_a_constant_of_the_compiled_pipeline(tmp_path):
    from kfp import compiler

    path = tmp_path / "p.yaml"
    compiler.Compiler().compile(build_training_pipeline(cluster_settings=CACHE), str(path))
    spec = next(yaml_fast.safe_load_all(path.read_text()))
    assert "cluster_settings" not in spec["root"]["inputDefinitions"]["parameters"]  # no UI knob
    text = path.read_text()
    assert json.dumps(json.dumps(CACHE, sort_keys=True))[1:-1] in text or "kfp-ddp-cache" in text
    with pytest.raises(ValueError, match="unknown TrainSpec field"):
        build_training_pipeline(cluster_settings={"hostpath": "/mnt/x"})


def test_the_component_refuses_node_access_in_overrides_but_takes_cluster_settings():
    base = {
        "data_uri": "s3://bkt/d",
        "checkpoint_uri": "s3://bkt/c",
        "backend": "kubernetes",
        "namespace": "ns",
    }
    with pytest.raises(SpecError, match="overrides_json sets \\['stage_cache_host_path'\\]"):
        training_spec(
            TrainingStepInputs(
                **base, overrides_json=json.dumps({"stage_cache_host_path": "/x/y"})
            ),
            run_id="r",
        )
    spec = training_spec(
        TrainingStepInputs(**base, cluster_settings_json=cluster_settings_json(CACHE)), run_id="r"
    )
    assert spec.stage_cache_host_path == "/mnt/kfp-ddp-cache" and spec.pod_security == "privileged"
