"""A test's scenario for one job: it plays the kubelet for the job's pods, in a thread beside the
launcher (which runs in the test's thread, as in the training step's pod).

``JobPods`` finds the pods the real controllers created for the job (waiting for them), in
replica order — TrainJob nodes by completion index; PyTorchJob Master then Workers; TFJob Chief,
Workers, then parameter servers — and hands them to the kubelet.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.cluster.kubelet import FakeKubelet

REPLICA_ORDER = {"master": 0, "chief": 0, "worker": 1, "ps": 2, "evaluator": 3}
JOB_LABEL = {
    "trainjob": "jobset.sigs.k8s.io/jobset-name",
    "pytorchjob": "training.kubeflow.org/job-name",
    "tfjob": "training.kubeflow.org/job-name",
    "xgboostjob": "training.kubeflow.org/job-name",
}


def replica_key(pod: Any) -> tuple[int, int, str]:
    """Where ``pod`` stands among its job's replicas."""
    labels = pod.metadata.labels or {}
    if "batch.kubernetes.io/job-completion-index" in labels:
        return (0, int(labels["batch.kubernetes.io/job-completion-index"]), pod.metadata.name)
    rtype = labels.get("training.kubeflow.org/replica-type", "")
    index = int(labels.get("training.kubeflow.org/replica-index", 0))
    return (REPLICA_ORDER.get(rtype, 9), index, pod.metadata.name)


class Stopped(Exception):
    """The test ended: the scenario stops where it is."""


@dataclass
class JobPods:
    """The pods of one job, as its scenario sees them."""

    kubelet: FakeKubelet
    namespace: str
    api: str
    job: str
    stopped: threading.Event = field(default_factory=threading.Event)

    @property
    def selector(self) -> str:
        return f"{JOB_LABEL[self.api]}={self.job}"

    def pods(self, count: int, timeout: float = 30.0) -> list[Any]:
        """The job's first ``count`` live pods in replica order (waits for the controller)."""
        pods = self.kubelet.wait_for_pods(self.namespace, self.selector, count, timeout)
        return sorted(pods, key=replica_key)[:count]

    def fresh(self, pod: Any) -> Any:
        return self.kubelet.core.read_namespaced_pod(pod.metadata.name, self.namespace)

    def replacement(self, old: Any, timeout: float = 60.0) -> Any:
        """The pod the controller created in place of ``old`` (same replica, another uid)."""
        deadline = time.monotonic() + timeout
        while True:
            for pod in self.kubelet.pods(self.namespace, self.selector):
                same = replica_key(pod)[:2] == replica_key(old)[:2]
                if (
                    same
                    and pod.metadata.uid != old.metadata.uid
                    and not pod.metadata.deletion_timestamp
                ):
                    return pod
            if time.monotonic() > deadline:
                raise TimeoutError(f"no pod replaced {old.metadata.name} within {timeout:g} s")
            self.sleep(0.1)

    # The kubelet's part, for this job's pods.
    def run(self, pod: Any, **kw: Any) -> Any:
        return self.kubelet.run(pod, **kw)

    def log(self, pod: Any, line: str) -> None:
        self.kubelet.log(pod, line)

    def exit(self, pod: Any, code: int = 0, **kw: Any) -> Any:
        return self.kubelet.exit(pod, code, **kw)

    def crash(self, pod: Any, code: int, **kw: Any) -> Any:
        return self.kubelet.crash(pod, code, **kw)

    def waiting(self, pod: Any, reason: str, message: str) -> Any:
        return self.kubelet.waiting(pod, reason, message)

    def event(self, pod: Any, reason: str, message: str, **kw: Any) -> None:
        self.kubelet.event(pod, reason, message, **kw)

    def delete(self, pod: Any) -> None:
        self.kubelet.delete(pod)

    def job_object(self) -> dict[str, Any] | None:
        """The job as the API has it now (None once deleted)."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        from components.launcher.apis import job_api

        api = job_api(self.api)
        custom = client.CustomObjectsApi(self.kubelet.api)
        try:
            return custom.get_namespaced_custom_object(
                api.group, api.version, self.namespace, api.plural, self.job
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("condition not reached")
            self.sleep(0.1)

    def sleep(self, seconds: float) -> None:
        """Wait; a scenario still sleeping when its test ends stops here."""
        if self.stopped.wait(seconds):
            raise Stopped


@dataclass
class Play:
    """Runs scenarios in threads; ``check()`` re-raises what went wrong in them."""

    errors: list[BaseException] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    scenarios: list[JobPods] = field(default_factory=list)

    def start(self, scenario: Callable[[JobPods], None], pods: JobPods) -> None:
        def target() -> None:
            try:
                scenario(pods)
            except Stopped:
                pass
            except BaseException as exc:  # noqa: BLE001 - reported by check()
                if pods.stopped.is_set() or _job_gone(pods):
                    return  # the launcher deleted the job (timeout, cancel): the play is over
                self.errors.append(exc)

        thread = threading.Thread(target=target, name=f"scenario-{pods.job}", daemon=True)
        self.scenarios.append(pods)
        thread.start()
        self.threads.append(thread)

    def check(self, join_timeout: float = 5.0) -> None:
        for pods in self.scenarios:
            pods.stopped.set()
        for thread in self.threads:
            thread.join(join_timeout)
        if self.errors:
            raise AssertionError(f"the scenario failed: {self.errors[0]!r}") from self.errors[0]


def _job_gone(pods: JobPods) -> bool:
    try:
        return pods.job_object() is None
    except Exception:  # noqa: BLE001
        return False


def created_pods(cluster: Any, namespace: str, selector: str, count: int, timeout: float = 30):
    """The first ``count`` pods the controllers created matching ``selector``, by name (an
    AssertionError with the namespace's latest events when they do not come)."""
    from kubernetes import client

    core = client.CoreV1Api(cluster.clients())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
        if len(pods) >= count:
            return sorted(pods, key=lambda p: p.metadata.name)
        time.sleep(0.3)
    events = core.list_namespaced_event(namespace).items
    raise AssertionError(
        f"{len(pods)} of {count} pods ({selector}) after {timeout} s; events: "
        + "; ".join(f"{e.reason}: {e.message}" for e in events[-8:])
    )
