"""Pre-flight: fail early, with the fix, when the cluster cannot run the job.

The runtime a TrainJob references exists; this service account may do everything the run will
do (a SelfSubjectAccessReview per permission); the namespace exists. (Which API is served is
decided before, in ``discovery``.)
"""

from __future__ import annotations

from collections.abc import Callable

from components.launcher.apis import JobApi
from components.launcher.backends.kubernetes.clients import Clients
from components.launcher.backends.kubernetes.permissions import Permission, required_permissions
from components.launcher.result import PreflightError
from components.launcher.spec import TrainSpec
from components.launcher.spec_rules import ML_POLICIES
from components.launcher.trainjob import DEFAULT_RUNTIME, DEFAULT_RUNTIME_KIND

RBAC_HINT = "components/launcher/rbac.yaml (python -m components.launcher rbac)"


def preflight(clients: Clients, spec: TrainSpec, api: JobApi, note: Callable[[str], None]) -> None:
    """Raise PreflightError naming what is missing and how to fix it."""
    namespaced_runtime = api.name == "trainjob" and spec.runtime.runtime_kind == "TrainingRuntime"
    readable = check_namespace(clients, spec.namespace)
    if api.name == "trainjob":
        check_runtime(clients, spec, note)
    check_permissions(
        clients,
        spec.namespace,
        required_permissions(api, namespaced_runtime=namespaced_runtime),
        namespace_readable=readable,
    )


def check_runtime(clients: Clients, spec: TrainSpec, note: Callable[[str], None]) -> None:
    """The TrainJob's runtime exists (a forbidden read of a cluster runtime is only noted)."""
    from kubernetes.client.rest import ApiException

    kind = spec.runtime.runtime_kind or DEFAULT_RUNTIME_KIND
    name = spec.runtime.runtime_name or DEFAULT_RUNTIME
    try:
        if kind == "ClusterTrainingRuntime":
            runtime = clients.custom.get_cluster_custom_object(
                "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", name
            )
        else:
            runtime = clients.custom.get_namespaced_custom_object(
                "trainer.kubeflow.org", "v1alpha1", spec.namespace, "trainingruntimes", name
            )
    except ApiException as exc:
        if exc.status == 404:
            where = "" if kind == "ClusterTrainingRuntime" else f" in namespace {spec.namespace!r}"
            raise PreflightError(
                f"the {kind} {name!r} does not exist{where}: list the runtimes with `kubectl get "
                f"{kind.lower()}s -A`, install Kubeflow Trainer's runtimes (manifests/overlays/"
                "runtimes), or set runtime_name/runtime_kind to one that exists"
            ) from exc
        if exc.status == 403:
            note(f"may not read {kind} {name!r} (HTTP 403); not checked before submitting")
            return
        raise PreflightError(f"reading {kind} {name!r} failed: {exc}") from exc
    check_policy(spec, kind, name, runtime)
    for line in mpi_notes(spec, name, runtime):
        note(line)


def mpi_notes(spec: TrainSpec, name: str, runtime: dict) -> list[str]:
    """What an MPI runtime does with the job, read from its ``mlPolicy.mpi``: where mpirun
    starts the ranks (``numProcPerNode``: this job's ``nproc_per_node`` wins; the launcher pod a
    node too with ``runLauncherAsNode``) and in which image (a TrainJob sets the launcher pod's
    image alone)."""
    mpi = ((runtime.get("spec") or {}).get("mlPolicy") or {}).get("mpi")
    if not isinstance(mpi, dict):
        return []
    as_node = bool(mpi.get("runLauncherAsNode"))
    where = "the launcher pod and the node pods" if as_node else "the node pods (not the launcher)"
    notes = [
        f"runtime {name!r} (mlPolicy mpi, runLauncherAsNode {str(as_node).lower()}): mpirun in "
        f"the launcher pod starts {spec.nproc_per_node} rank(s) per node on {where}"
    ]
    node_image = runtime_node_image(runtime)
    if spec.command is not None and node_image and node_image != spec.image:
        notes.append(
            f"runtime {name!r}: its node pods run the image {node_image!r}; only the launcher pod "
            f"runs this job's {spec.image!r}, so your program must be in the node image too"
        )
    return notes


def runtime_policy(runtime: dict) -> str:
    """A runtime's mlPolicy: the one framework key it sets (torch, mpi, xgboost...), else none."""
    policy = (runtime.get("spec") or {}).get("mlPolicy") or {}
    return next((key for key in ML_POLICIES if key in policy), "none")


def check_policy(spec: TrainSpec, kind: str, name: str, runtime: dict) -> None:
    """The runtime's mlPolicy suits the job: the one the spec says (``ml_policy``, or known from
    a Trainer runtime's name); when the spec says none, an MPI runtime (whose launcher pod the
    job must patch) or our trainer on any policy but torch is refused."""
    actual = runtime_policy(runtime)
    expected = spec.runtime.policy
    where = f"the {kind} {name!r} has mlPolicy {actual}"
    if expected is not None and actual != expected:
        said = (
            f"ml_policy={expected}"
            if spec.runtime.ml_policy is not None
            else f"Kubeflow Trainer's own {name!r} has mlPolicy {expected}"
        )
        raise PreflightError(
            f"{where}, but {said}: set ml_policy={actual} (api_options), or choose a runtime "
            f"with mlPolicy {expected} (runtime_name)"
        )
    if expected is None and actual == "mpi":
        raise PreflightError(
            f"{where} (a launcher pod runs the command under mpirun, node pods run sshd): set "
            "ml_policy=mpi (api_options) so that the launcher pod is built for it, with your "
            "program's command"
        )
    if spec.command is None and actual == "mpi":
        node_image = runtime_node_image(runtime)
        if node_image != spec.image:
            raise PreflightError(
                f"{where}, and its node pods run the image {node_image!r}, not this job's "
                f"{spec.image!r}: under mpirun our trainer runs on every node pod, over SSH, in "
                "the node pods' image. Set image to the runtime's node image if it is our "
                "image's MPI variant, or use a runtime whose node pods run yours "
                "(manifests/kfp-ddp-mpi-runtime.yaml with your image: runtime_name=kfp-ddp-mpi)"
            )
    elif spec.command is None and actual != "torch":
        raise PreflightError(
            f"{where}, and our trainer runs under torchrun (mlPolicy torch) or mpirun (mlPolicy "
            "mpi): choose such a runtime (runtime_name unset: torch-distributed), or give your "
            "program's command"
        )


def runtime_node_image(runtime: dict) -> str | None:
    """The image of the ``node`` container in a runtime's ``node`` replicated job (None if it
    has none)."""
    jobs = (((runtime.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "replicatedJobs"
    ) or []
    for job in jobs:
        if job.get("name") != "node":
            continue
        pod = ((job.get("template") or {}).get("spec") or {}).get("template") or {}
        for container in (pod.get("spec") or {}).get("containers") or []:
            if container.get("name") == "node":
                return container.get("image")
    return None


def check_permissions(
    clients: Clients,
    namespace: str,
    needed: tuple[Permission, ...],
    *,
    namespace_readable: bool = True,
) -> None:
    """Every permission in ``needed`` is granted in ``namespace`` (a SelfSubjectAccessReview
    each). ``namespace_readable`` False: we could not tell whether the namespace exists."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    denied = []
    for group, resource, verb in needed:
        resource_name, _, subresource = resource.partition("/")
        review = client.V1SelfSubjectAccessReview(
            spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    namespace=namespace,
                    group=group,
                    resource=resource_name,
                    subresource=subresource or None,
                    verb=verb,
                )
            )
        )
        try:
            answer = clients.authz.create_self_subject_access_review(review)
        except ApiException as exc:
            raise PreflightError(
                f"cannot check permissions (SelfSubjectAccessReview: HTTP {exc.status}); every "
                "authenticated user may create one (system:basic-user): check the service "
                "account's token"
            ) from exc
        if not answer.status.allowed:
            denied.append(f"{verb} {resource}" + (f" ({group})" if group else ""))
    if not denied:
        return
    if len(denied) == len(needed) and not namespace_readable:
        raise PreflightError(
            f"nothing is allowed in namespace {namespace!r}: it does not exist, or this service "
            f"account has no Role there. Check the namespace (TrainSpec.namespace / the "
            f"pipeline's namespace parameter), or apply {RBAC_HINT} in it"
        )
    raise PreflightError(
        f"this service account may not: {', '.join(denied)} in namespace {namespace!r}. "
        f"Apply {RBAC_HINT} (a Role + RoleBinding for the pipeline's service account) in "
        f"{namespace!r}"
    )


def check_namespace(clients: Clients, namespace: str) -> bool:
    """The namespace exists (PreflightError if not); False when we may not read namespaces
    (a namespaced Role cannot grant it) and so cannot tell."""
    from kubernetes.client.rest import ApiException

    try:
        clients.core.read_namespace(namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise PreflightError(
                f"namespace {namespace!r} does not exist: create it or set TrainSpec.namespace"
            ) from exc
        if exc.status == 403:
            return False
        raise PreflightError(f"reading namespace {namespace!r} failed: {exc}") from exc
    return True
