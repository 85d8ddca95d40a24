"""The controller side of the stand-in API server: the job kinds it serves and ``Operator``.

A test's scenario plays Kubeflow Trainer (TrainJobs) or the Training Operator (PyTorchJobs,
TFJobs), and the kubelet, through ``Operator``: pods named and labelled as each controller names
them, container states, logs, events and the job's conditions.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.launcher.fake_apiserver import FakeKubeAPI


@dataclass(frozen=True)
class Kind:
    """How the stand-in serves one job kind, and how its controller names and labels pods."""

    api: str
    group: str
    version: str
    plural: str
    kind: str
    container: str
    succeeded: str

    @property
    def jobs_path(self) -> str:
        return f"/apis/{self.group}/{self.version}/namespaces/(?P<ns>[^/]+)/{self.plural}"


KINDS = {
    "pytorchjob": Kind(
        "pytorchjob", "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", "pytorch", "Succeeded"
    ),
    "trainjob": Kind(
        "trainjob",
        "trainer.kubeflow.org",
        "v1alpha1",
        "trainjobs",
        "TrainJob",
        "node",
        "Complete",
    ),
    "tfjob": Kind("tfjob", "kubeflow.org", "v1", "tfjobs", "TFJob", "tensorflow", "Succeeded"),
}


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Operator:
    """What a scenario uses to play the controller (and the kubelet) for one job.

    Node ``i`` is the PyTorchJob's Master (i = 0) or Worker i-1, the TFJob's Chief (i = 0) or
    Worker i-1, and the TrainJob's JobSet pod ``<job>-node-<i>-0-<suffix>``, labelled as each
    controller labels them; ``add_ps(i)`` adds a TFJob's parameter server ``<job>-ps-<i>``.
    """

    class Gone(Exception):
        """The job was deleted: the scenario stops."""

    def __init__(self, api: FakeKubeAPI, kind: Kind, ns: str, name: str):
        self.api, self.kind, self.ns, self.name = api, kind, ns, name

    def _job(self) -> dict[str, Any]:
        job = self.api.get(self.kind.plural, self.ns, self.name)
        if job is None:
            raise self.Gone
        return job

    def condition(self, ctype: str, reason: str = "", message: str = "") -> None:
        job = self._job()
        status = job.setdefault("status", {})
        conds = [c for c in status.get("conditions", []) if c["type"] != ctype]
        for c in conds:
            if ctype in ("Running", "Succeeded", "Complete", "Failed", "Restarting"):
                c["status"] = "False" if c["type"] in ("Running", "Restarting") else c["status"]
        conds.append(
            {
                "type": ctype,
                "status": "True",
                "reason": reason or f"{self.kind.kind}{ctype}",
                "message": message or f"{self.kind.kind} {self.name} is {ctype.lower()}.",
                "lastTransitionTime": now(),
                "lastUpdateTime": now(),
            }
        )
        status["conditions"] = conds
        self.api.put(self.kind.plural, job, "MODIFIED")

    def succeed(self) -> None:
        """The job's success condition (PyTorchJob Succeeded, TrainJob Complete)."""
        self.condition(self.kind.succeeded)

    def fail(self, message: str) -> None:
        reason = "JobSetFailed" if self.kind.api == "trainjob" else f"{self.kind.kind}Failed"
        self.condition("Failed", reason, message)

    def _v1_replica(self, index: int) -> tuple[str, int]:
        """A v1 job's (replica type, index) of node ``index``: its Master/Chief, then Workers."""
        first = "chief" if self.kind.api == "tfjob" else "master"
        return (first, 0) if index == 0 else ("worker", index - 1)

    def node_pod_name(self, index: int) -> str:
        if self.kind.api == "trainjob":
            return f"{self.name}-node-{index}-0-{uuid.uuid4().hex[:5]}"
        rtype, rindex = self._v1_replica(index)
        return f"{self.name}-{rtype}-{rindex}"

    def _labels(self, index: int, replica: tuple[str, int] | None = None) -> dict[str, str]:
        if self.kind.api == "trainjob":
            return {
                "jobset.sigs.k8s.io/jobset-name": self.name,
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "jobset.sigs.k8s.io/job-index": str(index),
                "batch.kubernetes.io/job-completion-index": "0",
            }
        rtype, rindex = replica or self._v1_replica(index)
        return {
            "training.kubeflow.org/job-name": self.name,
            "training.kubeflow.org/replica-type": rtype,
            "training.kubeflow.org/replica-index": str(rindex),
            "training.kubeflow.org/operator-name": f"{self.kind.api}-controller",
        }

    def add_node(self, index: int) -> str:
        """Create the pod of node ``index`` (Pending); returns its name."""
        return self._add_pod(self.node_pod_name(index), self._labels(index))

    def add_ps(self, index: int) -> str:
        """Create a TFJob's parameter-server pod ``<job>-ps-<index>`` (Pending)."""
        assert self.kind.api == "tfjob", "parameter servers belong to TFJobs"
        return self._add_pod(f"{self.name}-ps-{index}", self._labels(0, ("ps", index)))

    def _add_pod(self, name: str, labels: dict[str, str]) -> str:
        self._job()
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.ns,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": now(),
                "labels": labels,
                "annotations": {"stand-in/job": f"{self.kind.plural}/{self.name}"},
            },
            "spec": {"containers": [{"name": self.kind.container, "image": "img"}]},
            "status": {"phase": "Pending", "conditions": []},
        }
        with self.api.cond:  # a new pod (also a recreated one) starts with an empty log
            self.api.logs[(self.ns, name)] = []
            self.api.logs_closed.discard((self.ns, name))
        self.api.put("pods", pod, "ADDED")
        return name

    def delete_pod(self, name: str) -> None:
        """The controller deletes a failed pod to create it again."""
        self.api.put("pods", self._pod(name), "DELETED")
        self.api.close_log(self.ns, name)

    def _pod(self, name: str) -> dict[str, Any]:
        pod = self.api.get("pods", self.ns, name)
        if pod is None:
            raise self.Gone
        return pod

    def _container(self, ready: bool, state: dict, restarts: int = 0, last: dict | None = None):
        return {
            "name": self.kind.container,
            "image": "img",
            "imageID": "",
            "ready": ready,
            "restartCount": restarts,
            "state": state,
            "lastState": last or {},
        }

    def unschedulable(self, name: str, message: str) -> None:
        pod = self._pod(name)
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
            }
        ]
        self.api.put("pods", pod, "MODIFIED")
        self.event(name, "FailedScheduling", message)

    def waiting(self, name: str, reason: str, message: str = "") -> None:
        pod = self._pod(name)
        pod["status"]["containerStatuses"] = [
            self._container(False, {"waiting": {"reason": reason, "message": message}})
        ]
        self.api.put("pods", pod, "MODIFIED")

    def running(self, name: str, restarts: int = 0, last_exit: int | None = None) -> None:
        pod = self._pod(name)
        pod["status"]["phase"] = "Running"
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        last = None
        if last_exit is not None:
            last = {"terminated": {"exitCode": last_exit, "reason": "Error", "finishedAt": now()}}
        pod["status"]["containerStatuses"] = [
            self._container(True, {"running": {"startedAt": now()}}, restarts, last)
        ]
        self.api.put("pods", pod, "MODIFIED")

    def log(self, name: str, *lines: str) -> None:
        self._pod(name)
        with self.api.cond:
            self.api.logs[(self.ns, name)].extend(lines)
            self.api.cond.notify_all()

    def terminate(self, name: str, exit_code: int = 0, reason: str = "Completed") -> None:
        pod = self._pod(name)
        pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        term = {"exitCode": exit_code, "reason": reason, "finishedAt": now()}
        restarts = max(
            [c["restartCount"] for c in pod["status"].get("containerStatuses", [])] or [0]
        )
        pod["status"]["containerStatuses"] = [
            self._container(False, {"terminated": term}, restarts)
        ]
        self.api.put("pods", pod, "MODIFIED")
        self.api.close_log(self.ns, name)

    def event(self, pod: str, reason: str, message: str, etype: str = "Warning") -> None:
        self.api.events.append(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{pod}.{uuid.uuid4().hex[:8]}", "namespace": self.ns},
                "involvedObject": {"kind": "Pod", "name": pod, "namespace": self.ns},
                "reason": reason,
                "message": message,
                "type": etype,
            }
        )

    def sleep(self, seconds: float) -> None:
        """Sleep, but stop the scenario as soon as the job is deleted."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._job()
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
