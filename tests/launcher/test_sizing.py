"""Every pod asks for what it uses (components/launcher/sizing.py): CPU and memory by default,
/dev/shm below the memory request, and a bounded disk sized from the data set — from the data
step's real S3 listing to the staging volume's sizeLimit and the pod's ephemeral-storage."""

from __future__ import annotations

import math

import pytest

from components.launcher import SpecError, TrainSpec, build_pytorchjob, build_trainjob
from components.s3_sync import sync
from pipelines.dataset import inspect_dataset
from tests.image_data import write_image_folder

GI = 2**30


def documented(data_bytes: int) -> tuple[str, str]:
    """README/sizing: 1.1 x the data rounded up to GiB + 20Gi; the disk 4Gi more."""
    volume = math.ceil(math.ceil(data_bytes * 1.1) / GI) + 20
    return f"{volume}Gi", f"{volume + 4}Gi"


@pytest.mark.parametrize("data_bytes", [0, 1, 10 * 2**20, 5 * GI, 931 * GI + 17])
def test_the_staging_volume_and_the_disk_follow_the_data_sets_size(data_bytes):
    spec = TrainSpec(
        api="pytorchjob", name="j", stage_data_uri="s3://bkt/d", stage_data_bytes=data_bytes
    )
    size, disk = documented(data_bytes)
    assert (spec.stage_volume_size(), spec.disk()) == (size, disk)
    pod = build_pytorchjob(spec)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert {"name": "staged-data", "emptyDir": {"sizeLimit": size}} in pod["volumes"]
    resources = pod["containers"][0]["resources"]
    assert resources["requests"]["ephemeral-storage"] == disk
    assert resources["limits"]["ephemeral-storage"] == disk  # bounded: evicted past it


def test_unknown_size_explicit_disk_and_checkpoint_room():
    assert TrainSpec(name="j", stage_data_uri="s3://bkt/d").stage_volume_size() == "120Gi"
    room = TrainSpec(
        name="j", stage_data_uri="s3://bkt/d", stage_data_bytes=0, checkpoint_space="1Gi"
    )
    assert room.stage_volume_size() == "1Gi"
    assert TrainSpec(name="j").disk() == "4Gi"  # no staging: the container's own files
    assert TrainSpec(name="j", ephemeral_storage="200Gi").disk() == "200Gi"
    with pytest.raises(SpecError, match="ephemeral_storage"):
        TrainSpec(name="j", ephemeral_storage="lots")


def test_gpu_pods_request_cpu_and_memory_and_guaranteed_is_a_choice():
    trainer = build_trainjob(TrainSpec(name="j", gpus_per_worker=8))["spec"]["trainer"]
    requests = trainer["resourcesPerNode"]["requests"]
    assert (requests["cpu"], requests["memory"]) == ("32", "128Gi")  # Burstable, not BestEffort
    spec = TrainSpec(name="j", gpus_per_worker=2, qos="guaranteed")
    assert (spec.cpu_limit, spec.memory_limit) == (spec.cpu_request, spec.memory_request)
    assert spec.shm_size == "4Gi"  # 2Gi per process, below half the memory
    with pytest.raises(SpecError, match="qos=guaranteed needs limits equal to requests"):
        TrainSpec(name="j", qos="guaranteed", cpu_request="4", cpu_limit="8")


def test_the_data_steps_listing_sizes_the_staging_volume(bucket, s3_env, tmp_path):
    """Real S3: what the data step lists is what the volume is sized from."""
    folder = write_image_folder(tmp_path / "data", per_class=6, val_per_class=2)
    sync(str(folder), f"s3://{bucket}/cats", progress=False)
    listed = inspect_dataset(f"s3://{bucket}/cats")
    on_disk = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert listed.bytes_total == on_disk > 0
    spec = TrainSpec(
        name="j", stage_data_uri=f"s3://{bucket}/cats", stage_data_bytes=listed.bytes_total
    )
    assert (spec.stage_volume_size(), spec.disk()) == documented(on_disk)


def test_the_pipeline_hands_the_data_steps_size_to_the_training_step(tmp_path):
    import yaml
    from kfp import compiler

    from pipelines.training import build_training_pipeline

    path = tmp_path / "p.yaml"
    compiler.Compiler().compile(build_training_pipeline(), str(path))
    spec = next(yaml.safe_load_all(path.read_text()))
    dag = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    (train,) = [t for t in dag.values() if t["taskInfo"]["name"].startswith("train")]
    given = train["inputs"]["parameters"]["data_bytes"]["taskOutputParameter"]
    assert given["outputParameterKey"] == "size_bytes"
