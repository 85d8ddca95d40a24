"""Why a job failed or waits: the failing pod's reason, its events and its last log lines.

Reads container statuses (OOMKilled, Error with its exit code, ImagePullBackOff,
CrashLoopBackOff...), pod conditions (Unschedulable), pod status reasons (Evicted) and warning
events (FailedScheduling, quota, Kueue admission, image pulls).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from components.launcher import sizing
from components.launcher.apis import JobApi
from components.launcher.backends.kubernetes.clients import Clients
from components.launcher.backends.kubernetes.pods import PodFollower, container_status, started
from components.launcher.torchrun_report import LINES_READ, failure_lines

WAITING_ERRORS = {
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
}


SIGTERM_EXIT = 143
OWN_DISK_EVICTION = re.compile(
    r"Usage of EmptyDir volume .* exceeds the limit|ephemeral local storage usage exceeds|"
    r"exceeded its local ephemeral storage limit"
)
"""The kubelet's words when it evicts a pod for what the pod itself wrote to the node's disk (not
for a node short of disk: "The node was low on resource", which another node may not be)."""
MEMORY_HINT = (
    "the kernel killed the trainer for memory: more than its container's limit (a LimitRange's "
    "default where memory_request sets none) or than the node had free; lower batch_size or "
    "image_size (each process holds a batch's activations, each DataLoader worker its batches), "
    "or raise memory_request"
)
"""Said with an OOMKilled container: what uses a node's memory and which settings change it."""
DISK_HINT = (
    "the node's disk: the pod wrote more than its volume's sizeLimit or its ephemeral-storage "
    f"limit allows; the staging volume is the data set + checkpoint_space, /tmp "
    f"{sizing.TMP_GI}Gi and HOME {sizing.HOME_GI}Gi: write checkpoints and outputs under the "
    "staging volume, raise checkpoint_space or ephemeral_storage, or use a PVC"
)


@dataclass(frozen=True)
class PodProblem:
    """What is wrong with one pod; ``severity`` 0 means nothing found."""

    severity: int
    text: str = ""
    exit_code: int | None = None
    """The trainer container's non-zero exit code, when it terminated with one."""
    permanent: bool = False
    """It would happen again on every restart: a program exit 1-127, or an eviction for what
    the pod itself wrote to the node's disk (over a sizeLimit or its ephemeral-storage)."""


def pod_problem(pod: Any, container: str) -> PodProblem:
    """The worst thing wrong with ``pod`` (an eviction for its own disk use first: its containers
    then show only the kill; then its trainer container; then the pod)."""
    pod_status = pod.status
    evicted = pod_status is not None and pod_status.reason == "Evicted"
    if evicted and OWN_DISK_EVICTION.search(pod_status.message or ""):
        text = f"Evicted: {pod_status.message or ''}".rstrip(": ")
        return PodProblem(3, f"{text} ({DISK_HINT})", permanent=True)
    status = container_status(pod, container)
    if status is not None:
        for state, when in ((status.state, ""), (status.last_state, " (previous run)")):
            terminated = state.terminated if state else None
            if terminated is not None and terminated.exit_code:
                reason = terminated.reason or "Error"
                text = f"{reason} (exit code {terminated.exit_code}){when}"
                if reason == "OOMKilled":
                    text += f": {MEMORY_HINT}"
                # SIGTERM (143): stopped by the cluster — often because another pod failed and
                # its Job's pods were deleted; a crash elsewhere is the likelier cause.
                severity = 2 if terminated.exit_code == SIGTERM_EXIT else 3
                code = terminated.exit_code
                return PodProblem(severity, text, code, permanent=0 < code < 128)
        waiting = status.state.waiting if status.state else None
        if waiting is not None and waiting.reason in WAITING_ERRORS:
            return PodProblem(3, f"{waiting.reason}: {waiting.message or ''}".rstrip(": "))
    if pod_status is None:
        return PodProblem(0)
    if pod_status.reason:
        return PodProblem(2, f"{pod_status.reason}: {pod_status.message or ''}".rstrip(": "))
    for cond in pod_status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            reason = cond.reason or "Unschedulable"
            return PodProblem(2, f"{reason}: {cond.message or ''}".rstrip(": "))
    if pod_status.phase == "Failed":
        return PodProblem(1, "pod Failed")
    return PodProblem(0)


class Diagnosis:
    """Reads pods and events of one job to explain a failure or a wait."""

    def __init__(self, clients: Clients, api: JobApi, namespace: str, tail_lines: int):
        self.clients, self.api, self.namespace, self.tail_lines = (
            clients,
            api,
            namespace,
            tail_lines,
        )

    def events(self, pod_name: str) -> list[str]:
        """The pod's last three non-Normal events."""
        try:
            events = self.clients.core.list_namespaced_event(
                self.namespace, field_selector=f"involvedObject.name={pod_name}"
            ).items
        except Exception:  # noqa: BLE001 - diagnosis is best effort
            return []
        warnings = [f"{e.reason}: {e.message}" for e in events if (e.type or "Warning") != "Normal"]
        return warnings[-3:]

    def worst_pod(self, follower: PodFollower) -> tuple[Any, PodProblem] | None:
        """The pod with the most severe problem: the job's pods as the API lists them now, and
        the last state of those the follower saw that are gone since (the Job controller deletes
        the pods of a Job that failed)."""
        selector = f"{self.api.pod_job_label}={follower.job_name}"
        try:
            listed = self.clients.core.list_namespaced_pod(
                self.namespace, label_selector=selector
            ).items
        except Exception:  # noqa: BLE001 - diagnosis is best effort
            listed = []
        pods = {state.pod.metadata.uid: state.pod for state in follower.seen()}
        pods.update({pod.metadata.uid: pod for pod in listed})
        worst: tuple[Any, PodProblem] | None = None
        for pod in pods.values():
            problem = pod_problem(pod, self.api.container)
            if problem.severity and (worst is None or problem.severity > worst[1].severity):
                worst = (pod, problem)
        return worst

    def permanent_exit(self, follower: PodFollower) -> tuple[Any, PodProblem] | None:
        """A pod that failed for good (:attr:`PodProblem.permanent`: its trainer container
        exited 1-127, now or in its previous run, or it was evicted for its own disk use).

        Read from what the pod watch saw (no extra requests per loop). An exit code counts only
        where the pods run the program itself (``JobApi.pods_exit_as_the_program``).
        """
        for state in follower.snapshot():
            problem = pod_problem(state.pod, self.api.container)
            if problem.exit_code is not None and not self.api.pods_exit_as_the_program:
                continue
            if problem.permanent:
                return state.pod, problem
        return None

    def failure(self, follower: PodFollower) -> tuple[str, str]:
        """(reason, details) naming the failing pod, its reason, events and last log lines."""
        worst = self.worst_pod(follower)
        if worst is None:
            return "no failing pod found", ""
        pod, problem = worst
        replica = self.api.replica_of(pod)
        read = follower.logs.replica_tail(replica, LINES_READ) or self._log_tail(pod)
        said, lines = failure_lines(read, self.tail_lines)
        details = ""
        events = self.events(pod.metadata.name)
        if events:
            details += "\nEvents:\n" + "\n".join(f"  {e}" for e in events)
        if lines:
            details += f"\nLast log lines of {replica}:\n" + "\n".join(f"  {x}" for x in lines)
        said = f"; its torchrun says {said}" if said else ""
        return f"pod {pod.metadata.name} ({replica}): {problem.text}{said}", details

    def _log_tail(self, pod: Any) -> list[str]:
        try:
            text = self.clients.core.read_namespaced_pod_log(
                pod.metadata.name,
                self.namespace,
                container=self.api.container,
                tail_lines=LINES_READ,
            )
        except Exception:  # noqa: BLE001
            return []
        return text.splitlines()

    def pending(self, follower: PodFollower, suspended: bool) -> str:
        """What keeps the job's pods from starting."""
        waiting = [s.pod for s in follower.snapshot() if not started(s.pod, self.api.container)]
        if not waiting:
            if suspended:
                return "the job is suspended, waiting for Kueue to admit it (quota of its queue?)"
            return "no pods created yet (quota, Kueue admission or gang scheduling?)"
        parts = []
        for pod in waiting:
            problem = pod_problem(pod, self.api.container)
            events = self.events(pod.metadata.name)
            parts.append(
                f"{pod.metadata.name}: {problem.text or 'Pending'}"
                + (f" [{'; '.join(events)}]" if events else "")
            )
        return "; ".join(parts)
