"""Both pipelines, every step in our image, run by KFP's own local runner.

``kfp.local`` with its ``DockerRunner`` (KFP's way to run a pipeline's steps in their images),
talking to podman through its Docker-compatible socket (the container's logs read after it
exits rather than followed: see ``_run_and_collect_logs``): each step is a container of the CPU
image started with the executor's command and arguments from the compiled component and an executor
input written by kfp.local, as KFP's driver writes it. The containers run as UID 1000, read-only,
without capabilities, on a bridge of their own where the only thing to reach is the test S3
server; writable are the pipeline root (kfp.local mounts it) and the folders the launcher's pods
get as emptyDirs. The training step runs the local backend inside its container (two trainer
processes), then evaluation, the gate, publishing and the clean-up, all in the image. With
shared-volume storage the pipeline root stands in for the workspace PVC (kfp.local has no PVCs):
the data step stages the data set onto it and the trainer reads it there.
"""

from __future__ import annotations

import secrets
import time

import pytest

from components.launcher.backends.local import NODES_DIR_ENV
from components.launcher.pod_paths import SCRATCH_DIRS
from components.s3_sync import sync
from tests.image_data import write_image_folder
from tests.kfp_local import workspace_root
from tests.s3_env import use_s3_server

pytestmark = pytest.mark.slow


TEST_LABEL = "io.kfp-ddp.test"
"""On every step container of a test: the test removes them all, whatever happened."""
STEP_TIMEOUT_S = 600
STATE_POLL_S = 0.5
EXITED = ("exited", "stopped", "dead")
"""The states of a container that ran and ended (Docker's names, and podman's own)."""
ESRCH_RACE = "/cgroup: no such process"
"""What podman 4.3 says when it inspects a container whose process has just exited."""


def _has_exited(container) -> bool:
    """Reads the container's state; False while it runs, or while podman cannot tell yet.

    Podman before 4.4 answers an inspect with a 500 "read /proc/PID/cgroup: no such process" when
    the container's process exits between podman opening that file and reading it
    (containers/podman#16383, fixed by #16504). That is the container exiting, not a failure:
    the next read finds it exited. Any other error is raised.
    """
    import docker.errors

    try:
        container.reload()
    except docker.errors.APIError as error:
        if error.is_server_error() and ESRCH_RACE in str(error):
            return False
        raise
    return container.attrs["State"]["Status"] in EXITED


def _run_and_collect_logs(client, image, command, volumes, **run_args) -> int:
    """kfp.local's ``run_docker_container`` with two changes for podman 4.3's Docker API:

    - the logs are read once the container has exited instead of followed: a followed log
      stream of a container that exits sometimes never ended (seen: the clean-up step's stream
      hung for 10 minutes);
    - the exit is found by reading the container's state every ``STATE_POLL_S`` instead of
      Docker's ``wait``: podman before 4.5 answers that call by polling the container every
      microsecond (containers/podman#18150), which kept the API service at over one core for as
      long as each step ran (131 s of CPU for the two pipelines' steps, measured in CI) and
      slowed the step it waited for.
    """
    from kfp.local.docker_task_handler import add_latest_tag_if_not_present

    run_args.pop("auto_remove", None)
    container = client.containers.run(
        image=add_latest_tag_if_not_present(image), command=command, detach=True, stdout=True,
        stderr=True, volumes=volumes, **run_args,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while not _has_exited(container):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"step container still {container.attrs['State']} after {STEP_TIMEOUT_S} s"
                )
            time.sleep(STATE_POLL_S)
        print(container.logs().decode(), end="")
        return container.attrs["State"]["ExitCode"]
    finally:
        container.remove(force=True)


def _scratch_mounts(tmp_path) -> list:
    """A 0777 host folder at each path the launcher's pods mount writable (emptyDirs there)."""
    from docker.types import Mount

    mounts = []
    for scratch in SCRATCH_DIRS:
        folder = tmp_path / f"scratch-{scratch.volume}"
        folder.mkdir()
        folder.chmod(0o777)
        mounts.append(Mount(target=scratch.path, source=str(folder), type="bind"))
    return mounts


@pytest.mark.parametrize("storage", ["object-store", "shared-volume"])
def test_every_step_of_the_pipeline_runs_in_the_image(
    podman,
    cpu_image,
    docker_socket,
    private_network,
    bridge_s3,
    tmp_path,
    monkeypatch,
    storage,
    request,
):
    from kfp import local

    from pipelines.local_run import collect_local_run
    from pipelines.training import PIPELINE_NAME, build_training_pipeline

    monkeypatch.setenv("DOCKER_HOST", docker_socket.docker_host)
    monkeypatch.setattr("kfp.local.docker_task_handler.run_docker_container", _run_and_collect_logs)
    bucket = bridge_s3.create_bucket(f"pipeline-in-image-{storage}")
    data = write_image_folder(tmp_path / "data", per_class=8)
    use_s3_server(monkeypatch, bridge_s3, tmp_path / "sync-cache")
    sync(str(data), f"s3://{bucket}/data")

    # This run's containers, to remove at the end: not tmp_path.name, which pytest cuts to 30
    # characters (both parametrizations were "test_every_step_of_the_pipelin0" on their workers,
    # and one test's clean-up removed the other's running step).
    run_label = secrets.token_hex(8)
    workspace = tmp_path / "ws"  # the pipeline root: kfp.local mounts it at the same path
    workspace.mkdir()
    workspace.chmod(0o777)
    runner = local.DockerRunner(
        network_mode=private_network.name,
        user="1000:1000",
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        shm_size="256m",
        labels={TEST_LABEL: run_label},
        mounts=_scratch_mounts(tmp_path),
        environment={**bridge_s3.env(), NODES_DIR_ENV: str(workspace / "nodes")},
    )
    local.init(
        runner=runner,
        pipeline_root=str(workspace),
        workspace_root=workspace_root(tmp_path),
        raise_on_error=True,
    )
    pipeline = build_training_pipeline(
        image=cpu_image, backend="local", workspace_path=str(workspace), storage=storage
    )
    request.addfinalizer(
        lambda: podman.run(
            "rm", "--force", "--filter", f"label={TEST_LABEL}={run_label}", check=False
        )
    )
    pipeline(
        data_uri=f"s3://{bucket}/data",
        s3_endpoint=bridge_s3.endpoint_url,
        workers=2,
        gpus_per_worker=0,
        model="mobilenet_v3_small",
        image_size=16,
        epochs=1,
        batch_size=4,
        accuracy_threshold=0.0,
        publish_uri=f"s3://{bucket}/models",
    )
    (run_dir,) = [p for p in workspace.iterdir() if p.name.startswith(PIPELINE_NAME)]
    run = collect_local_run(run_dir, workspace)
    assert run.passed is True
    assert run.data_sync["files"] == 3 * (8 + 4)
    assert run.training["world_size"] == 2 and run.training["steps"] > 0
    assert run.published_uri and run.published_uri.startswith(f"s3://{bucket}/models/")
    key = run.published_uri.removeprefix(f"s3://{bucket}/") + "/weights.pt"
    assert bridge_s3.client().head_object(Bucket=bucket, Key=key)["ContentLength"] > 0


class _ExitingContainer:
    """A container whose inspect hits podman 4.3's exit race once, then finds it exited."""

    def __init__(self, error_message: str):
        self.error_message = error_message
        self.attrs = {"State": {"Status": "running"}}
        self.reads = 0

    def reload(self) -> None:
        import docker.errors
        import requests

        self.reads += 1
        if self.reads == 1:
            response = requests.Response()
            response.status_code = 500
            raise docker.errors.APIError("500 Server Error", response, self.error_message)
        self.attrs = {"State": {"Status": "exited", "ExitCode": 0}}


def test_a_container_exiting_mid_inspect_is_read_again_and_other_errors_are_raised():
    import docker.errors

    racing = _ExitingContainer("read /proc/5287/cgroup: no such process")
    assert _has_exited(racing) is False
    assert _has_exited(racing) is True and racing.reads == 2

    broken = _ExitingContainer("no such container")
    with pytest.raises(docker.errors.APIError, match="500 Server Error"):
        _has_exited(broken)
