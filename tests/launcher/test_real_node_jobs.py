"""The launcher on a real node, as users run it: the pipeline's ServiceAccount with the rendered
Role, a namespace enforcing ``restricted``, our CPU image pulled from the loopback registry.

A TrainJob of 2 nodes and a Workers-only PyTorchJob of 2 replicas train for real: each pod's
staging init container downloads the data set from S3, torchrun's ranks meet across the two
pods (the TrainJob's through its headless Service's DNS name, the PyTorchJob's by c10d
rendezvous at worker 0's Service), checkpoints and the model go to S3, the launcher follows the
kubelet's logs to the end; then the evaluation reads that model from S3.
"""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from components.launcher import JobFailed, job_api, run_job
from components.launcher.backends.kubernetes import granted_permissions
from components.launcher.spec_rules import NODE_OUTPUT, STAGED_DATA
from components.s3_sync import sync
from tests.cluster.plugin import Namespace
from tests.image_data import write_image_folder
from tests.launcher.k8s_helpers import OPTIONAL_READS, calls, jobs, options, refused, spec
from tests.launcher.node_runs import (
    SHARED_CPU,
    NodeRun,
    Planned,
    in_background,
    started_together,
)
from tests.s3_env import use_s3_server

# One real node serves them all: files named test_real_node* run on one xdist worker
# (tests/node_scheduling.py).
pytestmark = [pytest.mark.node, pytest.mark.slow]

SECRET = "s3-credentials"
DATASET_BYTES = 30_000
"""At least the bytes of :func:`upload_dataset`'s data set (36 PNGs, ~20 kB)."""
TINY = ["--model", "mobilenet_v3_small", "--image-size", "16", "--log-interval", "1"]


def s3_secret(ns, s3) -> None:
    """The S3 keys as the pipeline's users keep them: a Secret the pods read by reference."""
    from kubernetes import client

    data = {k: base64.b64encode(v.encode()).decode() for k, v in s3.env().items() if "KEY" in k}
    client.CoreV1Api(ns.admin()).create_namespaced_secret(
        ns.name, {"metadata": {"name": SECRET}, "data": data}
    )


def use_node_s3(env: pytest.MonkeyPatch, node_cluster, folder: Path) -> None:
    """The node's S3 keys and a sync cache in ``folder``, in this process's environment (what
    ``sync`` reads)."""
    use_s3_server(env, node_cluster.s3, folder / "sync-cache")


def upload_dataset(node_cluster, folder: Path) -> str:
    """A tiny ImageFolder in a new bucket of the node's S3 server (uploaded from here, where it
    is reachable); its ``s3://`` URI."""
    with pytest.MonkeyPatch.context() as env:
        use_node_s3(env, node_cluster, folder)
        bucket = node_cluster.s3.create_bucket(f"data-{secrets.token_hex(4)}")
        sync(str(write_image_folder(folder / "data", per_class=8)), f"s3://{bucket}/data")
    return f"s3://{bucket}"


@pytest.fixture
def dataset(node_cluster, tmp_path, monkeypatch) -> str:
    """:func:`upload_dataset` for one test, the node's S3 left in its environment."""
    use_node_s3(monkeypatch, node_cluster, tmp_path)
    return upload_dataset(node_cluster, tmp_path)


def trainer_spec(ns, api: str, node_cluster, bucket_uri: str, *, extra: Sequence[str] = (), **kw):
    return spec(
        ns,
        api,
        image=kw.pop("image", node_cluster.image),
        stage_data_uri=f"{bucket_uri}/data",
        s3_endpoint=node_cluster.s3.endpoint_url,
        s3_credentials_secret=SECRET,
        # The data set's size, as the pipeline's sync step reports it: the pods' disk is sized
        # from it (6Gi each, not 124Gi), so that the jobs started together fit the node's disk.
        stage_data_bytes=DATASET_BYTES,
        checkpoint_space="1Gi",
        cpu_request=kw.pop("cpu_request", "500m"),
        memory_request=kw.pop("memory_request", "1Gi"),
        termination_grace_period_seconds=30,
        args=[
            *("--data-dir", STAGED_DATA, "--output-dir", f"{NODE_OUTPUT}/run"),
            *(*TINY, "--batch-size", "4", "--epochs", "2", "--checkpoint-every-steps", "2"),
            *("--checkpoint-uri", f"{bucket_uri}/run/checkpoints"),
            *("--output-uri", f"{bucket_uri}/run/output"),
            *extra,
        ],
        **kw,
    )


TRAINING_APIS = ("trainjob", "pytorchjob")


@pytest.fixture(scope="module")
def training_runs(node_cluster_for_module, tmp_path_factory) -> Iterator[dict[str, NodeRun]]:
    """A TrainJob and a PyTorchJob of 2 pods each, started together (node_runs.py)."""
    node_cluster = node_cluster_for_module

    def plan(api: str) -> Callable[[Namespace], Planned]:
        def planned(ns: Namespace) -> Planned:
            s3_secret(ns, node_cluster.s3)
            dataset = upload_dataset(node_cluster, tmp_path_factory.mktemp(api))
            job = trainer_spec(ns, api, node_cluster, dataset, cpu_request=SHARED_CPU)
            return Planned(job, {"timeout_s": 600, "cleanup": "never"}, dataset)

        return planned

    with started_together(node_cluster, {api: plan(api) for api in TRAINING_APIS}) as runs:
        yield runs


@pytest.mark.parametrize("api", TRAINING_APIS)
def test_a_job_of_two_pods_trains_on_the_real_node_and_the_evaluation_reads_its_model(
    node_cluster, training_runs, api, tmp_path, monkeypatch
):
    run = training_runs[api]
    dataset = run.dataset
    assert dataset is not None
    result = run.outcome.result(timeout=600)
    log = run.log
    assert result.phase == "Succeeded", f"{result.reason}\n{log[-5000:]}"
    # Both pods staged the data set from S3 (a TrainJob node before torchrun, in its log; a
    # PyTorchJob replica in its init container) and trained together (world size 2).
    pods = _job_pods(run.ns, api)
    assert len(pods) == 2
    for pod in pods:
        staged = _staging_log(run.ns, pod) if api == "pytorchjob" else log
        assert "stage: transferred 36 of 36 files" in staged, staged[-3000:]
    summary = _summary(node_cluster, dataset)
    assert summary["world_size"] == 2 and summary["steps"] > 0
    assert summary["replicas_in_sync"] is True
    # The model and the checkpoints are in S3; the evaluation reads the model from there.
    bucket = dataset.removeprefix("s3://")
    keys = [o["Key"] for o in node_cluster.s3.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert "run/output/model/weights.pt" in keys
    assert any(k.startswith("run/checkpoints/step-") and k.endswith("/COMPLETE") for k in keys)
    from components.evaluate.evaluate import evaluate

    use_node_s3(monkeypatch, node_cluster, tmp_path)
    sync(f"{dataset}/run/output/model", str(tmp_path / "model"))
    sync(f"{dataset}/data/val", str(tmp_path / "data" / "val"))
    scored = evaluate(tmp_path / "model", tmp_path / "data")
    assert scored.num_samples == 12 and 0.0 <= scored.accuracy <= 1.0
    # The launcher needed no RBAC beyond the rendered Role: every request it made was allowed
    # and is one the Role grants (the API server's audit log; discovery and the optional reads
    # aside).
    assert refused(run.ns) <= OPTIONAL_READS, refused(run.ns)
    assert calls(run.ns) - OPTIONAL_READS <= granted_permissions()


def _staging_log(ns, pod) -> str:
    from kubernetes import client

    (init,) = [c.name for c in pod.spec.init_containers or []]
    return client.CoreV1Api(ns.admin()).read_namespaced_pod_log(
        pod.metadata.name, ns.name, container=init
    )


def _summary(node_cluster, bucket_uri: str) -> dict:
    """The trainer's summary.json, uploaded by rank 0 (--output-uri)."""
    body = node_cluster.s3.client().get_object(
        Bucket=bucket_uri.removeprefix("s3://"), Key="run/output/summary.json"
    )["Body"]
    return json.loads(body.read())


# -- faults, for real --------------------------------------------------------------------------
def _job_pods(ns, api: str, name: str = "job") -> list:
    from kubernetes import client

    from components.launcher import job_api

    label = job_api(api).pod_job_label
    pods = (
        client.CoreV1Api(ns.admin())
        .list_namespaced_pod(ns.name, label_selector=f"{label}={name}")
        .items
    )
    return sorted(pods, key=lambda p: p.metadata.name)


def _wait_for(predicate, timeout: float, what: str, poll: float = 0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _checkpoints(node_cluster, bucket_uri: str) -> list[str]:
    bucket = bucket_uri.removeprefix("s3://")
    listing = node_cluster.s3.client().list_objects_v2(Bucket=bucket, Prefix="run/checkpoints/")
    return [o["Key"] for o in listing.get("Contents", []) if o["Key"].endswith("/COMPLETE")]


def _resumed_at(lines: list[str]) -> int | None:
    """The step the last resume started at (``... resuming at step N ...``), if any yet."""
    found = [x.split("resuming at step ")[1].split()[0] for x in lines if "resuming at step" in x]
    return int(found[-1]) if found else None


def _newest(checkpoints: list[str]) -> int:
    """The highest step of ``run/checkpoints/step-N/COMPLETE`` keys (0 for none)."""
    return max((int(k.split("/step-")[1].split("/")[0]) for k in checkpoints), default=0)


def _newest_step(node_cluster, bucket_uri: str) -> int:
    return _newest(_checkpoints(node_cluster, bucket_uri))


def _container_id(pod) -> str:
    (status,) = [s for s in pod.status.container_statuses or [] if s.state.running]
    return status.container_id.split("://", 1)[1]


SLOW_STEPS = ["--epochs", "7", "--stop-check-every-steps", "1"]
"""Long enough to be interrupted twice (3 steps an epoch: the faults come at about steps 2 and 4
of 21; the test fails, never passes, if the job ends first); a SIGTERM acts at the next step."""


def test_a_deleted_pod_and_a_killed_container_both_resume_from_s3(node_cluster, node_k8s, dataset):
    """Two faults in one run of a PyTorchJob. Worker 1's pod deleted: the SIGTERM makes its
    trainer checkpoint and exit 143 within the grace period, the Training Operator recreates it
    (and worker 0, which lost its peer), both resume from the checkpoint in S3. Then worker 0's
    container SIGKILLed (what an OOM kill does; worker 0 hosts the c10d store): 137 and the
    peer's lost rendezvous are retryable, the replicas are recreated and resume again. The job
    succeeds and the launcher counts the restarts."""
    s3_secret(node_k8s, node_cluster.s3)
    lines: list[str] = []
    began = time.monotonic()

    def phase(name: str) -> None:  # where the time goes (pytest -s shows it)
        print(f"[{time.monotonic() - began:6.1f} s] {name}", flush=True)

    job = trainer_spec(node_k8s, "pytorchjob", node_cluster, dataset, extra=SLOW_STEPS)
    future = in_background(
        run_job, job, backend="kubernetes", options=options(node_k8s, lines, timeout_s=600)
    )
    _wait_for(lambda: _checkpoints(node_cluster, dataset) or future.done(), 300, "a checkpoint")
    assert not future.done(), "\n".join(lines)[-3000:]
    phase("first checkpoint in S3: deleting worker 1's pod")
    from kubernetes import client

    deleted = _job_pods(node_k8s, "pytorchjob")[1]
    client.CoreV1Api(node_k8s.admin()).delete_namespaced_pod(deleted.metadata.name, node_k8s.name)
    resumed = _wait_for(lambda: future.done() or _resumed_at(lines), 300, "the resume")
    phase(f"resumed at step {resumed}")
    _wait_for(
        lambda: future.done() or _newest_step(node_cluster, dataset) > resumed, 300,
        "a checkpoint after the resume",
    )  # fmt: skip
    assert not future.done(), "\n".join(lines)[-3000:]
    phase("a checkpoint after the resume: SIGKILL to worker 0's container")
    killed = _job_pods(node_k8s, "pytorchjob")[0]
    ctr = ["ctr", "--address", str(node_cluster.node.socket), "--namespace", "k8s.io"]
    subprocess.run([*ctr, "tasks", "kill", "--signal", "SIGKILL", _container_id(killed)],
                   check=True, capture_output=True, timeout=30)  # fmt: skip
    result = future.result(timeout=600)
    phase(f"the job ended: {result.phase}")
    log = "\n".join(lines)
    assert result.phase == "Succeeded", log[-5000:]
    assert "stopped by SIGTERM at step" in log and "exiting 143" in log, log[-5000:]
    summary = _summary(node_cluster, dataset)
    resumes = [x for x in lines if "resuming at step" in x or "137" in x or "exiting 200" in x]
    assert summary["restarts"] >= 2 and summary["resumed_from_step"] is not None, resumes
    assert result.restarts >= 2


BAD_INPUT = "bad input: no such column"
SMALL_JOB = {"workers": 1, "cpu_request": "250m", "memory_request": "512Mi"}
FILL_TMP = "dd if=/dev/zero of=/tmp/fill bs=1M count=1100 status=none; sleep 300"  # /tmp: 1Gi


def _failing_jobs(node_cluster) -> dict[str, tuple[dict, dict]]:
    """Each failing job's spec arguments and launcher options, by name."""
    image = node_cluster.image
    watchdog = {"timeout_s": 240, "pending_timeout_s": 10, "watchdog_fails": True}
    exit_3 = f"echo '{BAD_INPUT}' >&2; exit 3"  # a program's own error
    as_root = {"run_as_user": None, "run_as_group": None}  # runAsNonRoot, no runAsUser given
    return {
        "exit-3": ({"image": image, "command": ["sh", "-c", exit_3]}, {"timeout_s": 300}),
        "evicted": ({"image": image, "command": ["sh", "-c", FILL_TMP]}, {"timeout_s": 240}),
        "missing-image": ({"image": image.rsplit(":", 1)[0] + ":no-such-tag"}, watchdog),
        "root-image": (
            {"image": node_cluster.root_image, "command": ["/pause"], **as_root},
            watchdog,
        ),
    }


@pytest.fixture(scope="module")
def failing_jobs(node_cluster_for_module) -> Iterator[dict[str, NodeRun]]:
    """The jobs that fail, started together (node_runs.py): each waits on the kubelet (an exit,
    an eviction, a pull, a refusal) rather than on the CPU, so together they take about as long
    as the slowest (~20 s) instead of the sum (~45 s)."""
    node_cluster = node_cluster_for_module

    def plan(job_kw: dict, option_kw: dict) -> Callable[[Namespace], Planned]:
        return lambda ns: Planned(spec(ns, "trainjob", **SMALL_JOB, **job_kw), option_kw)

    plans = {name: plan(*settings) for name, settings in _failing_jobs(node_cluster).items()}
    with started_together(node_cluster, plans) as runs:
        yield runs


def test_a_permanent_failure_is_suspended_and_its_retry_creates_nothing(node_cluster, failing_jobs):
    """Exit 3 (a program's own error): no restart, the job suspended (its pods gone) and kept
    with the reason; the step's retry re-attaches, reads it and fails in seconds."""
    run = failing_jobs["exit-3"]
    error = run.failure()
    assert isinstance(error, JobFailed), error
    assert "exit code 3" in str(error) and BAD_INPUT in str(error)
    (kept,) = jobs(run.ns, "trainjob")
    api = job_api("trainjob")
    assert api.suspended(kept) and api.permanent_failure(kept)
    _wait_for(lambda: not _job_pods(run.ns, "trainjob"), 60, "the suspended job's pods to go")
    began = time.monotonic()
    with pytest.raises(JobFailed, match="exit code 3"):
        run_job(run.job, backend="kubernetes", options=options(run.ns, timeout_s=300))
    assert time.monotonic() - began < 20
    assert not _job_pods(run.ns, "trainjob")  # nothing allocated again
    (again,) = jobs(run.ns, "trainjob")
    assert again["metadata"]["uid"] == kept["metadata"]["uid"]


def test_a_pod_over_its_emptydir_size_limit_is_evicted_and_the_launcher_says_so(
    node_cluster, failing_jobs
):
    """A program filling /tmp past its emptyDir's sizeLimit: the kubelet evicts the pod. It would
    be evicted again on every restart (seen: the Job made a new pod every ~15 s, each evicted),
    so the launcher stops the job at once (suspended, kept, the reason recorded), naming the
    eviction, the volume and the disk."""
    run = failing_jobs["evicted"]
    error = run.failure()
    assert isinstance(error, JobFailed), error
    message = str(error)
    assert "a node was evicted for its own disk use" in message, message
    assert 'Evicted: Usage of EmptyDir volume "tmp" exceeds the limit "1Gi"' in message
    assert "the node's disk" in message and "not retried" in message
    (kept,) = jobs(run.ns, "trainjob")
    assert job_api("trainjob").suspended(kept) and job_api("trainjob").permanent_failure(kept)


def test_an_image_that_does_not_exist_is_named_by_the_watchdog(node_cluster, failing_jobs):
    run = failing_jobs["missing-image"]
    message = str(run.failure())  # the watchdog's failure, whatever its class
    assert "no-such-tag" in message and ("ErrImagePull" in message or "ImagePullBackOff" in message)
    assert run.outcome.done() and time.monotonic() - run.began < 90


def test_an_image_whose_user_is_root_is_refused_under_run_as_non_root(node_cluster, failing_jobs):
    """The kubelet refuses to start a root image under runAsNonRoot (no runAsUser given): the
    launcher names the kubelet's reason."""
    message = str(failing_jobs["root-image"].failure())
    assert "CreateContainerConfigError" in message, message
    assert "container has runAsNonRoot and image will run as root" in message
