"""What the launcher's Kubernetes tests share: specs, a run as the launcher's ServiceAccount on
the real control plane (tests/cluster), and kubelet scenarios for the pods the real controllers
create."""

from __future__ import annotations

from typing import Any

from components.launcher import KubernetesOptions, TrainSpec, job_api, run_job
from tests.cluster.play import JobPods
from tests.cluster.plugin import Namespace

APIS = ("trainjob", "pytorchjob")
ALL_APIS = (*APIS, "tfjob")
TF_PROGRAM = {"image": "registry.example.com/tf-mnist:1", "command": ["python", "/app/train.py"]}
"""A TFJob runs the user's TensorFlow image and command."""


def replica(api: str, node: int) -> str:
    """How the launcher names node ``node``'s log lines."""
    if api == "trainjob":
        return f"node-{node}"
    first = "chief-0" if api == "tfjob" else "master-0"
    return first if node == 0 else f"worker-{node - 1}"


def spec(ns: Namespace | str, api: str, **kw: Any) -> TrainSpec:
    namespace = ns if isinstance(ns, str) else ns.name
    base = {"api": api, "name": "job", "namespace": namespace, "workers": 2, "run_id": "run-1"}
    return TrainSpec(**(base | (TF_PROGRAM if api == "tfjob" else {}) | kw))


def options(ns: Namespace, lines: list[str] | None = None, **kw: Any) -> KubernetesOptions:
    """The backend's options, as the launcher's ServiceAccount (the rendered Role)."""
    configuration = kw.pop("configuration", None) or ns.launcher_configuration()
    return KubernetesOptions(
        client_configuration=configuration,
        log=(lines if lines is not None else []).append,
        poll_interval_s=1.0,
        handle_sigterm=False,
        **kw,
    )


def run(
    ns: Namespace,
    s: TrainSpec,
    lines: list[str] | None = None,
    scenario: Any = None,
    *,
    scenario_api: str | None = None,
    **kw: Any,
):
    """Run ``s`` on the cluster; ``scenario`` plays the kubelet for its pods meanwhile (for
    ``api="auto"``, ``scenario_api`` says which API's pods to expect)."""
    if scenario is not None:
        ns.scenario(scenario_api or s.api, s.name, scenario)
    return run_job(s, backend="kubernetes", options=options(ns, lines, **kw))


def create_directly(ns: Namespace, s: TrainSpec) -> dict[str, Any]:
    """Create ``s``'s job as a first attempt of the step would have (as admin)."""
    from kubernetes import client

    api = job_api(s.api)
    return client.CustomObjectsApi(ns.admin()).create_namespaced_custom_object(
        api.group, api.version, s.namespace, api.plural, api.build(s)
    )


def jobs(ns: Namespace, api: str) -> list[dict[str, Any]]:
    """The jobs of ``api`` in the namespace now."""
    from kubernetes import client

    kind = job_api(api)
    listed = client.CustomObjectsApi(ns.admin()).list_namespaced_custom_object(
        kind.group, kind.version, ns.name, kind.plural
    )
    return listed["items"]


def succeed(workers: int = 2, *, lines: int = 3, restarts: int = 0, delay: float = 0.2):
    """Scenario: every pod runs, logs ``lines`` lines, exits 0."""

    def scenario(job: JobPods) -> None:
        pods = job.pods(workers)
        for pod in pods:
            job.run(pod, restarts=restarts)
        for step in range(lines):
            for i, pod in enumerate(pods):
                job.log(pod, f"step {step} from node {i}")
            job.sleep(delay)
        # Node 0 (Master, Chief) last: once it succeeds the Training Operator marks the job
        # Succeeded and deletes the pods still running (cleanPodPolicy: Running).
        for pod in reversed(pods):
            job.exit(pod, 0, restarts=restarts)

    return scenario
