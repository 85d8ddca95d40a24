"""What the launcher's Kubernetes tests share: specs, a run as the launcher's ServiceAccount on
the real control plane (tests/cluster), and kubelet scenarios for the pods the real controllers
create."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from components.launcher import KubernetesOptions, TrainSpec, job_api, run_job
from tests.cluster.play import JobPods
from tests.cluster.plugin import Namespace

APIS = ("trainjob", "pytorchjob")
ALL_APIS = (*APIS, "tfjob", "xgboostjob")
TF_PROGRAM = {"image": "registry.example.com/tf-mnist:1", "command": ["python", "/app/train.py"]}
"""A TFJob runs the user's TensorFlow image and command."""
XGB_PROGRAM = {
    "image": "registry.example.com/xgb-example:1",
    "command": ["python", "/app/train.py"],
}
"""An XGBoostJob runs the user's XGBoost image and command."""
RAY_IMAGE = {"image": "registry.example.com/ray:1"}
"""An image with Ray (our default image has none, and is refused for a RayJob)."""
PROGRAMS = {"tfjob": TF_PROGRAM, "xgboostjob": XGB_PROGRAM, "rayjob": RAY_IMAGE}
CPU_REQUEST_ENV = {
    "name": "KFP_DDP_CPU_REQUEST",
    "valueFrom": {"resourceFieldRef": {"divisor": "1", "resource": "requests.cpu"}},
}
"""The training container's CPU request in whole CPUs (the Downward API), for the trainer."""


def env_values(env: list[dict]) -> dict[str, str]:
    """A container's env as name → value; a reference (``valueFrom``) as its JSON."""
    return {e["name"]: e["value"] if "value" in e else str(e["valueFrom"]) for e in env}


def replica(api: str, node: int) -> str:
    """How the launcher names node ``node``'s log lines (a PyTorchJob: Workers only)."""
    if api == "trainjob":
        return f"node-{node}"
    if api == "pytorchjob":
        return f"worker-{node}"
    first = "master-0" if api == "xgboostjob" else "chief-0"
    return first if node == 0 else f"worker-{node - 1}"


def spec(ns: Namespace | str, api: str, **kw: Any) -> TrainSpec:
    namespace = ns if isinstance(ns, str) else ns.name
    base = {"api": api, "name": "job", "namespace": namespace, "workers": 2, "run_id": "run-1"}
    return TrainSpec.flat(**(base | PROGRAMS.get(api, {}) | kw))


def options(ns: Namespace, lines: list[str] | None = None, **kw: Any) -> KubernetesOptions:
    """The backend's options, as the launcher's ServiceAccount (the rendered Role)."""
    configuration = kw.pop("configuration", None) or ns.launcher_configuration()
    return KubernetesOptions(
        client_configuration=configuration,
        log=(lines if lines is not None else []).append,
        poll_interval_s=0.25,
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


SERVICE_ACCOUNT = "pipeline-runner"


def install_namespaced_runtime(
    ns: Namespace, name: str, source: str = "torch_distributed_runtime.yaml"
) -> None:
    """A TrainingRuntime ``name`` in the namespace: the spec of an official one (``source``,
    under the Trainer's reference folder; default torch-distributed)."""
    from tests.cluster.control_plane import TRAINER

    runtime = yaml.safe_load((TRAINER / source).read_text())
    runtime |= {"kind": "TrainingRuntime", "metadata": {"name": name, "namespace": ns.name}}
    ns.cluster.plane.apply([runtime])


def servicemonitor_account(ns: Namespace) -> Any:
    """A second account, bound to the Role rendered with ``--servicemonitor``."""
    from components.launcher.rbac import rbac_documents

    documents = rbac_documents(
        namespace=ns.name, service_account=MONITOR_ACCOUNT, servicemonitor=True
    )
    return ns.launcher_configuration(
        service_account=MONITOR_ACCOUNT, documents=renamed(documents, MONITOR_ACCOUNT)
    )


def renamed(documents: list[dict[str, Any]], suffix: str) -> list[dict[str, Any]]:
    """The Role and RoleBinding under names of their own (beside the default ones)."""
    documents = copy.deepcopy(documents)
    for document in documents:
        if document["kind"] in ("Role", "RoleBinding"):
            document["metadata"]["name"] += f"-{suffix}"
        if document["kind"] == "RoleBinding":
            document["roleRef"]["name"] += f"-{suffix}"
    return documents


MONITOR_ACCOUNT = "monitor-runner"
OPTIONAL_READS = {  # requests the launcher may make beyond the Role
    ("", "namespaces", "get"),  # a 403 falls back to the permission check
    ("trainer.kubeflow.org", "clustertrainingruntimes", "get"),  # a 403 is only noted
    ("authorization.k8s.io", "selfsubjectaccessreviews", "create"),  # every user may
}


def role_without(namespace: str, *denied: tuple[str, str]) -> list[dict[str, Any]]:
    """The rendered Role and RoleBinding, minus (verb, resource) pairs."""
    from components.launcher.rbac import rbac_documents

    role, binding = rbac_documents(namespace=namespace, service_account=SERVICE_ACCOUNT)
    for rule in role["rules"]:
        for resource in rule["resources"]:
            rule["verbs"] = [v for v in rule["verbs"] if (v, resource) not in denied]
    role["rules"] = [r for r in role["rules"] if r["verbs"]]
    return [role, binding]


def launcher_requests(
    ns: Namespace, account: str = SERVICE_ACCOUNT, stage: str = "ResponseComplete"
) -> list[dict[str, Any]]:
    """What the launcher's ServiceAccount asked the API server, from its audit log (``stage``:
    ResponseStarted for the watches open now)."""
    user = f"system:serviceaccount:{ns.name}:{account}"
    return ns.cluster.plane.audit_events(user=user, stage=stage)


def _request(event: dict[str, Any]) -> tuple[str, str, str] | None:
    """(API group, resource[/subresource], verb) of an audit event; None for discovery."""
    ref = event.get("objectRef") or {}
    if not ref.get("resource"):
        return None  # discovery (/apis/...): open to every authenticated user
    resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    return (ref.get("apiGroup", ""), resource, event["verb"])


def calls(
    ns: Namespace, account: str = SERVICE_ACCOUNT, stage: str = "ResponseComplete"
) -> set[tuple[str, str, str]]:
    """(API group, resource[/subresource], verb) of every request the launcher made."""
    return {r for r in map(_request, launcher_requests(ns, account, stage)) if r is not None}


def refused(ns: Namespace, account: str = SERVICE_ACCOUNT) -> set[tuple[str, str, str]]:
    """The launcher's requests the API server refused (403), as :func:`calls` names them."""
    return {
        r
        for e in launcher_requests(ns, account)
        if e.get("responseStatus", {}).get("code") == 403 and (r := _request(e)) is not None
    }


def created(ns: Namespace, account: str = SERVICE_ACCOUNT) -> list[dict[str, Any]]:
    """The objects the launcher created, in order, as the API server decoded them (schema
    defaults applied), from its audit log."""
    events = [
        e for e in launcher_requests(ns, account) if e["verb"] == "create" and "requestObject" in e
    ]
    ok = [e for e in events if 200 <= e.get("responseStatus", {}).get("code", 0) < 300]
    return [e["requestObject"] for e in sorted(ok, key=lambda e: e["requestReceivedTimestamp"])]


@contextlib.contextmanager
def bodies_sent() -> Iterator[list[dict[str, Any]]]:
    """The bodies of the POSTs this process's ``kubernetes`` client sends, as sent (a recorder
    at the client's REST layer; the API server still answers every request)."""
    from kubernetes.client import rest

    sent: list[dict[str, Any]] = []
    original = rest.RESTClientObject.request

    def request(self, method, url, *args, **kwargs):
        if method == "POST" and isinstance(kwargs.get("body"), dict):
            sent.append(copy.deepcopy(kwargs["body"]))
        return original(self, method, url, *args, **kwargs)

    rest.RESTClientObject.request = request
    try:
        yield sent
    finally:
        rest.RESTClientObject.request = original


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


def seen_running(
    job: JobPods, pod: Any, line: str, lines: list[str], timeout: float = 30.0
) -> None:
    """``pod`` logs ``line``; the scenario goes on once the launcher printed it, having seen
    the pod run. A real container runs for seconds before it is killed or preempted; a played
    one can be gone before a launcher on a busy machine starts its pod watch (CI counted no
    restart once: the watch never saw the killed pod)."""
    job.log(pod, line)
    job.wait_until(lambda: any(x.endswith(f"] {line}") for x in lines), timeout)


def once_recreated(old: dict[str, Any], scenario):
    """Scenario: ``scenario``, played on the pods of the job that replaced ``old`` (the job as
    the API had it), never on a pod of the old one still being deleted."""

    def play(job: JobPods) -> None:
        def replaced() -> bool:
            uid = ((job.job_object() or {}).get("metadata") or {}).get("uid")
            return uid not in (None, old["metadata"]["uid"])

        job.wait_until(replaced, 120)
        scenario(job)

    return play


def kubeconfig_of(configuration, path: Path) -> Path:
    """A kubeconfig file for a client Configuration (server, CA, bearer token)."""
    token = configuration.api_key["authorization"].removeprefix("Bearer ")
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": configuration.host,
                            "certificate-authority": configuration.ssl_ca_cert,
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


def play_rayjob_status(
    ns: Namespace, name: str, status: dict[str, Any], *, after_watch: bool = False
) -> Any:
    """Play KubeRay's verdict on RayJob ``name`` once it exists (in the background): what the
    operator writes when the Ray job ends, which it learns from the head's dashboard — a
    dashboard no test Ray cluster serves where the kubelet is played. Returns the thread.

    ``after_watch``: only once the launcher watches the namespace's RayJobs, as a Ray job that
    runs for a while would see it. Written at once, the verdict can be in the RayJob the
    launcher first reads, and the launcher then never watches (seen under load: the RBAC test
    missed the watch it checks the Role for)."""
    import threading
    import time

    from kubernetes import client
    from kubernetes.client.rest import ApiException

    def play() -> None:
        api = client.CustomObjectsApi(ns.admin())
        # Without a watch in a minute, the verdict all the same: the test then says what the
        # launcher did not do, instead of waiting for its run's timeout.
        deadline = time.monotonic() + 60
        while after_watch and time.monotonic() < deadline:
            if ("ray.io", "rayjobs", "watch") in calls(ns, stage="ResponseStarted"):
                break
            time.sleep(0.2)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                api.patch_namespaced_custom_object_status(
                    "ray.io", "v1", ns.name, "rayjobs", name, {"status": status}
                )
                return
            except ApiException as exc:
                if exc.status != 404:
                    raise
            time.sleep(0.2)

    thread = threading.Thread(target=play, name=f"kuberay-{name}", daemon=True)
    thread.start()
    return thread


def play_mpijob(ns: Namespace, spec: TrainSpec, exit_code: int) -> Any:
    """Play the MPI Operator and the kubelet for the MPIJob of ``spec`` (the default planes serve
    its CRD, and the real operator runs only on the real node's plane), in the background: once
    the job exists, its launcher pod (the manifest's template, the operator's job-name label)
    runs, logs a line and exits ``exit_code``; then the job's condition says how it ended, as the
    operator writes it. Returns the thread."""
    import threading
    import time

    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from components.launcher.apis import MPIJOB

    def play() -> None:
        custom, core = client.CustomObjectsApi(ns.admin()), client.CoreV1Api(ns.admin())
        deadline = time.monotonic() + 60
        while True:
            try:
                custom.get_namespaced_custom_object(
                    MPIJOB.group, MPIJOB.version, ns.name, MPIJOB.plural, spec.name
                )
                break
            except ApiException as exc:
                if exc.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)
        template = MPIJOB.build(spec)["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]
        role, _ = MPIJOB.replica_labels
        template["metadata"]["labels"] |= {MPIJOB.pod_job_label: spec.name, role: "launcher"}
        pod = core.create_namespaced_pod(
            ns.name,
            {"metadata": {"name": f"{spec.name}-launcher-x1x2x", **template["metadata"]}}
            | {"spec": template["spec"]},
        )
        ns.kubelet.run(pod)
        ns.kubelet.log(pod, "[mpirun] played launcher")
        ns.kubelet.exit(pod, exit_code)
        ended = "Succeeded" if exit_code == 0 else "Failed"
        condition = {
            "type": ended,
            "status": "True",
            "reason": f"MPIJob{ended}",
            "message": f"MPIJob {ns.name}/{spec.name} {ended.lower()}.",
        }
        custom.patch_namespaced_custom_object_status(
            MPIJOB.group,
            MPIJOB.version,
            ns.name,
            MPIJOB.plural,
            spec.name,
            {"status": {"conditions": [condition]}},
        )

    thread = threading.Thread(target=play, name=f"mpi-operator-{spec.name}", daemon=True)
    thread.start()
    return thread
