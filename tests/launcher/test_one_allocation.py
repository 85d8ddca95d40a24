"""A permanent failure costs one allocation: the job that failed for good (a program exit 1-127)
is suspended — its pods, and so its GPUs, released — and kept with the reason recorded; the
pipeline step's retry re-attaches, reads it and fails within seconds, creating nothing. A job
that failed for a retryable reason is created again by the retry, which resumes. Against the
real controllers (tests/cluster) and for the local backend."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from components.launcher import JobFailed, LocalOptions, TrainSpec, job_api, run_job
from components.launcher.names import PERMANENT_FAILURE
from tests.cluster.play import JobPods
from tests.launcher.k8s_helpers import APIS, jobs, once_recreated, run, spec, succeed
from tests.launcher.test_k8s_backend import oom_until_failed


def bad_config(job: JobPods) -> None:
    """Node 1's program refuses its configuration (exit 2) and would be restarted forever
    (OnFailure), or is failed by the operator (a PyTorchJob's ExitCode policy)."""
    first, second = job.pods(2)
    job.run(first)
    job.run(second)
    job.log(second, "[trainer] error: data set has one class")
    job.sleep(0.3)
    if job.api == "pytorchjob":
        job.exit(second, 2, reason="Error")
    else:
        job.crash(second, 2, restarts=1)
    job.sleep(60)


def creates(ns, api: str) -> list[int]:
    """The answers to every create of ``api``'s jobs in the namespace (the audit log)."""
    plural = job_api(api).plural
    return [
        e["responseStatus"]["code"]
        for e in ns.cluster.plane.audit_events(namespace=ns.name)
        if e["verb"] == "create" and e["objectRef"].get("resource") == plural
    ]


@pytest.mark.parametrize("api", APIS)
def test_a_retried_step_after_a_permanent_failure_allocates_nothing(k8s, api):
    s = spec(k8s, api)
    with pytest.raises(JobFailed) as first:
        run(k8s, s, None, bad_config)
    assert "data set has one class" in str(first.value)
    (job,) = jobs(k8s, api)  # kept, as evidence and as the record
    reason = job["metadata"]["annotations"][PERMANENT_FAILURE]
    assert "exit code 2" in reason
    # Its pods are gone: the GPUs are free (suspended, or failed and not restarted).
    selector = JobPods(k8s.kubelet, k8s.name, api, "job").selector
    deadline = time.monotonic() + 30
    while [p for p in k8s.kubelet.pods(k8s.name, selector) if p.status.phase == "Running"]:
        assert time.monotonic() < deadline, "the failed job still holds running pods"
        time.sleep(0.2)
    pods_before = {p.metadata.uid for p in k8s.kubelet.pods(k8s.name, selector)}

    started = time.monotonic()
    with pytest.raises(JobFailed) as retry:
        run(k8s, s)  # the KFP retry of the step: same run, same name
    assert time.monotonic() - started < 10
    message = str(retry.value)
    assert "an earlier attempt of this step failed for good" in message and "exit code 2" in message
    assert "not retried, nothing allocated" in message and f"kubectl delete {api}" in message
    assert creates(k8s, api) == [201, 409]  # one job ever created
    assert {p.metadata.uid for p in k8s.kubelet.pods(k8s.name, selector)} <= pods_before


def test_a_retryable_failure_is_created_again_by_the_retry_and_succeeds(k8s):
    """The Job controller gave up after OOM kills (137: retryable): the retry starts over (the
    trainer resumes from its checkpoints) instead of reporting the old failure."""
    s = spec(k8s, "trainjob", workers=1)
    with pytest.raises(JobFailed, match="OOMKilled"):
        run(k8s, s, None, oom_until_failed)
    (job,) = jobs(k8s, "trainjob")
    assert PERMANENT_FAILURE not in (job["metadata"].get("annotations") or {})
    lines: list[str] = []
    result = run(k8s, s, lines, once_recreated(job, succeed(workers=1, lines=1)))
    assert result.phase == "Succeeded" and not result.reattached
    assert any("an earlier attempt's job failed" in x and "creating it again" in x for x in lines)
    assert creates(k8s, "trainjob") == [201, 409, 201]
    # The old JobSet's Job was gone before the new TrainJob was created: its JobSet would
    # otherwise find the failed Job of the same name and fail at once.
    events = k8s.cluster.plane.audit_events(namespace=k8s.name)
    recreated = max(i for i, e in enumerate(events) if _is(e, "create", "trainjobs"))
    old_job_gone = [i for i, e in enumerate(events) if _is(e, "delete", "jobs", "job-node-0")]
    assert old_job_gone and old_job_gone[0] < recreated


def _is(event: dict, verb: str, resource: str, name: str | None = None) -> bool:
    ref = event["objectRef"]
    return (
        event["verb"] == verb
        and ref.get("resource") == resource
        and (name is None or ref.get("name") == name)
        and event["responseStatus"]["code"] < 300
    )


def test_the_exit_handler_keeps_a_job_that_failed_for_good(k8s):
    from components.launcher.step import cleanup_step
    from tests.launcher.k8s_helpers import options

    with pytest.raises(JobFailed):
        run(k8s, spec(k8s, "trainjob"), None, bad_config)
    assert (
        cleanup_step(run_id="run-1", namespace=k8s.name, backend="kubernetes", options=options(k8s))
        == 0
    )
    assert len(jobs(k8s, "trainjob")) == 1


# -- the local backend, likewise -----------------------------------------------------------------


def local_spec(tmp_path: Path, code: int, **kw) -> TrainSpec:
    script = tmp_path / "exit.py"
    script.write_text(
        f"import pathlib, sys\npathlib.Path('{tmp_path}/ran').touch()\nsys.exit({code})\n"
    )
    base = {"api": "trainjob", "name": "job", "workers": 1, "run_id": "run-1"}
    return TrainSpec.flat(**(base | {"command": ["python", str(script)]} | kw))


def test_locally_a_permanent_failure_is_recorded_and_the_retry_starts_nothing(tmp_path: Path):
    options = LocalOptions(workdir=tmp_path, log=lambda _: None, handle_sigterm=False)
    with pytest.raises(JobFailed, match="exited with code 3"):
        run_job(local_spec(tmp_path, 3), backend="local", options=options)
    (tmp_path / "ran").unlink()
    started = time.monotonic()
    with pytest.raises(JobFailed, match="an earlier attempt of this step failed for good"):
        run_job(local_spec(tmp_path, 3), backend="local", options=options)
    assert time.monotonic() - started < 2 and not (tmp_path / "ran").exists()
    # Another run (another run id) is not affected; nor is a run without one.
    with pytest.raises(JobFailed, match="exited with code 3"):
        run_job(local_spec(tmp_path, 3, run_id="run-2"), backend="local", options=options)
    with pytest.raises(JobFailed, match="exited with code 3"):
        run_job(local_spec(tmp_path, 3, run_id=""), backend="local", options=options)


def test_locally_a_retryable_failure_leaves_no_record(tmp_path: Path):
    options = LocalOptions(workdir=tmp_path, log=lambda _: None, handle_sigterm=False)
    spec_ = local_spec(tmp_path, 143, restart_policy=None)
    with pytest.raises(JobFailed, match="backoff limit"):
        run_job(spec_, backend="local", options=options)
    assert not list((tmp_path / "nodes").glob("failed/*"))
