"""The trainer in our image across two containers: 2 nodes x 1 process on a private bridge.

Each container runs ``torchrun --nnodes 2`` meeting the other by c10d rendezvous at node 0's
name (each node's name resolves to its address, as the replicas' Services make it on a
cluster); checkpoints are mirrored to the test S3 server on the bridge (``--checkpoint-uri``),
the outputs uploaded (``--output-uri``).
Node 1 is killed (SIGKILL) once a checkpoint is complete in S3; node 0 then fails for want of its
peer. Both start again as fresh containers (no local state: what a rescheduled pod has) and the
run resumes from S3 and finishes. Locked down as the pods are: UID 1000, read-only root, no
capabilities, writable only where the launcher mounts volumes.
"""

from __future__ import annotations

import json
import secrets
import time

import pytest

from components.launcher.pod_paths import SCRATCH_DIRS

pytestmark = pytest.mark.slow

STEPS = 40
TRAIN = [
    "--synthetic", "--model", "mobilenet_v3_small", "--image-size", "32", "--batch-size", "8",
    "--num-classes", "3", "--synthetic-size", "64", "--epochs", "1000", "--max-steps", str(STEPS),
    "--checkpoint-every-steps", "10", "--log-interval", "10", "--output-dir", "/tmp/out",
    "--init-timeout-s", "60", "--collective-timeout-s", "20", "--checkpoint-upload-timeout-s", "10",
]  # fmt: skip


def _start(
    *, podman, image, network, s3, bucket: str, node: int, run: str, tmp_path, names: list[str]
) -> str:
    """Start ``node`` of ``run``; its container's name goes into ``names`` before it starts (the
    test removes them all, also when a later start fails). The name is unique to this session:
    rootful podman's container names are the host's, and an interrupted session's may be left."""
    name = f"kfp-ddp-ddp-{run}-{node}-{secrets.token_hex(4)}"
    names.append(name)
    folders = []
    for path in (scratch.path for scratch in SCRATCH_DIRS):  # the pods' emptyDirs
        folder = tmp_path / f"{name}{path.replace('/', '-')}"
        folder.mkdir()
        folder.chmod(0o777)
        folders += ["-v", f"{folder}:{path}"]
    # Each node's name resolves to its address, as a replica's Service makes it on a cluster:
    # c10d's rendezvous hands out the hostnames.
    hosts = [f"--add-host=node-{n}:{network.address(10 + n)}" for n in (0, 1)]
    env = []
    for key, value in {**s3.env(), "GLOO_SOCKET_IFNAME": "eth0"}.items():
        env += ["-e", f"{key}={value}"]
    command = [
        "python", "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
        "--node-rank", str(node), "--rdzv-backend", "c10d", "--rdzv-id", run,
        "--rdzv-endpoint", "node-0:29400", "--max-restarts", "0",
        "-m", "trainer.train", *TRAIN,
        "--checkpoint-uri", f"s3://{bucket}/run/checkpoints",
        "--output-uri", f"s3://{bucket}/run/output",
    ]  # fmt: skip
    # --cpus 1: a pod's CPU limit, which the trainer sizes its threads by. Without one each node
    # took both cores of this machine (2 x 2 threads on 2 cores): 9 images/s against 175.
    podman.run(
        "run", "-d", "--name", name, "--network", network.name, "--ip", network.address(10 + node),
        "--hostname", f"node-{node}", *hosts,
        "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "--user", "1000:1000", "--shm-size", "256m", "--cpus", "1", *folders, *env, image, *command,
    )  # fmt: skip
    return name


def _keys(s3, bucket: str, prefix: str = "run/") -> list[str]:
    listing = s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for o in listing.get("Contents", []))


def _complete_checkpoints(s3, bucket: str) -> list[str]:
    return [k for k in _keys(s3, bucket, "run/checkpoints/") if k.endswith("/COMPLETE")]


def _wait(podman, name: str, timeout: float) -> int:
    result = podman.run("wait", name, timeout=timeout)
    return int(result.stdout.strip().splitlines()[-1])


def _logs(podman, name: str) -> str:
    result = podman.run("logs", name, check=False)
    return result.stdout + result.stderr


def test_two_containers_train_together_and_resume_from_s3_after_one_is_killed(
    podman, cpu_image, private_network, bridge_s3, tmp_path
):
    bucket = bridge_s3.create_bucket(f"ddp-{time.monotonic_ns() % 10**6}")
    names: list[str] = []
    node = dict(podman=podman, image=cpu_image, network=private_network, s3=bridge_s3,
                bucket=bucket, tmp_path=tmp_path, names=names)  # fmt: skip
    started = time.monotonic()

    def phase(what: str) -> None:  # shown with the captured output when the test fails
        print(f"[{time.monotonic() - started:6.1f} s] {what}")

    try:
        first = [_start(**node, node=n, run="a") for n in (0, 1)]
        deadline = time.monotonic() + 240
        while not _complete_checkpoints(bridge_s3, bucket):
            running = podman.run("ps", "-q", "--filter", f"name={first[1]}").stdout.strip()
            assert running and time.monotonic() < deadline, _logs(podman, first[0])[:3000]
            time.sleep(0.2)
        phase(f"checkpoint complete in S3: {_complete_checkpoints(bridge_s3, bucket)}")
        podman.run("kill", "--signal", "KILL", first[1])
        assert _wait(podman, first[1], 60) == 137
        phase("node 1 killed")
        assert _wait(podman, first[0], 180) != 0  # its peer is gone: the job fails, to be retried
        phase("node 0 failed")
        killed_at = _complete_checkpoints(bridge_s3, bucket)
        assert killed_at and not _keys(bridge_s3, bucket, "run/output/")

        second = [_start(**node, node=n, run="b") for n in (0, 1)]
        codes = [_wait(podman, name, 300) for name in second]
        phase(f"the second pair exited {codes}")
        assert codes == [0, 0], _logs(podman, second[0])[-4000:] + _logs(podman, second[1])[-2000:]
        log = _logs(podman, second[0])
        summary = json.loads(
            bridge_s3.client()
            .get_object(Bucket=bucket, Key="run/output/summary.json")["Body"]
            .read()
        )
        resumed = summary["resumed_from_step"]
        assert resumed is not None and 10 <= resumed < STEPS and resumed % 10 == 0, summary
        assert summary["steps"] == STEPS and summary["world_size"] == 2
        assert summary["replicas_in_sync"] is True and summary["restarts"] == 1
        assert f"resuming at step {resumed}" in log
        assert "run/output/model/weights.pt" in _keys(bridge_s3, bucket)
    finally:
        podman.remove_containers(*names)
