"""Which pod exits stop a job for good: a program's exit 1-127 where the pods run the program,
never a RayJob pod's (``ray start`` on the head and workers, ``ray job logs`` in the submitter:
KubeRay restarts or retries them, and the Ray job's status carries the program's code)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from components.launcher.apis import JOB_APIS
from components.launcher.backends.kubernetes.diagnosis import Diagnosis
from components.launcher.backends.kubernetes.pods import PodFollower, PodState


def exited_pod(container: str, code: int) -> client.V1Pod:
    terminated = client.V1ContainerStateTerminated(exit_code=code, reason="Error")
    status = client.V1ContainerStatus(
        name=container,
        image="img",
        image_id="",
        ready=False,
        restart_count=0,
        state=client.V1ContainerState(terminated=terminated),
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name="p", uid="u", labels={}),
        status=client.V1PodStatus(phase="Failed", container_statuses=[status]),
    )


def permanent(api_name: str, code: int) -> bool:
    api = JOB_APIS[api_name]
    unused: Any = None  # no cluster: the follower's pods are given, not watched
    follower = PodFollower(unused, api, "ns", "job", logs=unused, poll_interval_s=1.0)
    follower.pods["u"] = PodState(exited_pod(api.container, code), first_seen=0.0)
    return Diagnosis(unused, api, "ns", tail_lines=5).permanent_exit(follower) is not None


@pytest.mark.parametrize("api", sorted(set(JOB_APIS) - {"rayjob"}))
def test_a_program_exit_1_to_127_is_permanent_a_signal_is_not(api):
    assert permanent(api, 2) and permanent(api, 1)
    assert not permanent(api, 137) and not permanent(api, 143)


def test_a_rayjob_pods_exit_is_rays_not_the_programs():
    """The submitter's ``ray job logs`` losing the dashboard exits 1: KubeRay retries it."""
    assert not permanent("rayjob", 1) and not permanent("rayjob", 2)
