"""Create a job, re-attach to the one a previous attempt of this step created, delete it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from components.launcher.apis import JobApi
from components.launcher.backends.kubernetes.clients import Clients
from components.launcher.names import PERMANENT_FAILURE, RUN_ID_LABEL, TASK_LABEL
from components.launcher.result import JobExists, JobFailed, PreflightError
from components.launcher.spec import TrainSpec


class JobHandle:
    """One job of one API in one namespace: create it, read it, delete it."""

    def __init__(self, clients: Clients, api: JobApi, spec: TrainSpec, note: Callable[[str], None]):
        self.clients, self.api, self.spec, self.note = clients, api, spec, note
        self.created: dict[str, Any] | None = None
        """The job as the API returned it on create (or found it on re-attach): its uid owns
        the monitoring objects."""

    @property
    def title(self) -> str:
        return f"{self.api.kind} {self.spec.namespace}/{self.spec.name}"

    def create(self) -> bool:
        """Create the job; True when an existing job of the same run was re-attached instead."""
        from kubernetes.client.rest import ApiException

        api, spec = self.api, self.spec
        manifest = api.build(spec)
        try:
            self.created = self.clients.custom.create_namespaced_custom_object(
                api.group, api.version, spec.namespace, api.plural, manifest
            )
        except ApiException as exc:
            if exc.status == 409:
                return self._reattach()
            if exc.status == 404:
                raise PreflightError(
                    f"namespace {spec.namespace!r} does not exist (create returned 404): create "
                    "it or set TrainSpec.namespace"
                ) from exc
            refusal = admission_refusal(exc)
            if refusal:
                raise PreflightError(
                    f"the cluster refused {self.title}, nothing was submitted: {refusal}"
                ) from exc
            if exc.status == 403:
                raise PreflightError(
                    f"forbidden to create {api.plural} in {spec.namespace!r}: apply "
                    "components/launcher/rbac.yaml (python -m components.launcher rbac)"
                ) from exc
            raise JobFailed(f"creating {self.title} failed: {_reason(exc)}") from exc
        self.note(f"created {self.title}")
        return False

    def _reattach(self) -> bool:
        spec = self.spec
        existing = self.get() or {}
        self.created = existing or None
        theirs = (existing.get("metadata") or {}).get("labels") or {}
        ours = spec.job_labels()
        same = bool(spec.run_id) and all(
            theirs.get(k) == ours[k] for k in (RUN_ID_LABEL, TASK_LABEL)
        )
        if not same:
            raise JobExists(
                f"{self.title} already exists and was not created by this run (its labels "
                f"{RUN_ID_LABEL}={theirs.get(RUN_ID_LABEL)!r}, {TASK_LABEL}="
                f"{theirs.get(TASK_LABEL)!r}; ours {ours[RUN_ID_LABEL]!r}, {ours[TASK_LABEL]!r}): "
                f"delete it (kubectl delete {self.api.kind.lower()} -n {spec.namespace} "
                f"{spec.name}) or choose another name"
            )
        self.note(
            f"{self.title} already exists for this run ({RUN_ID_LABEL}={ours[RUN_ID_LABEL]}): "
            "re-attaching instead of creating a duplicate"
        )
        return True

    def get(self) -> dict[str, Any] | None:
        """The job as the API has it (None when it does not exist)."""
        from kubernetes.client.rest import ApiException

        api = self.api
        try:
            return self.clients.custom.get_namespaced_custom_object(
                api.group, api.version, self.spec.namespace, api.plural, self.spec.name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def kept_note(self) -> str:
        """Where the kept (failed) job is, how long it stays and how to delete it."""
        kind, spec = self.api.kind.lower(), self.spec
        ttl = {
            "trainjob": "",
            "rayjob": "; KubeRay deletes its Ray cluster after its ttlSecondsAfterFinished",
        }.get(self.api.name, "; the Training Operator deletes it after its ttlSecondsAfterFinished")
        kept = "The job is" if self.api.name == "rayjob" else "The job and its pods are"
        return (
            f"{kept} kept for inspection{ttl}: kubectl describe {kind} -n "
            f"{spec.namespace} {spec.name}; delete it with kubectl delete {kind} -n "
            f"{spec.namespace} {spec.name}"
        )

    def delete(self, why: str) -> None:
        """Delete the job and (in the background) its pods; a job already gone is fine."""
        delete_job(self.clients, self.api, self.spec.namespace, self.spec.name, why, self.note)

    def record_failure(self, reason: str, *, suspend: bool) -> None:
        """Annotate the job with why it failed for good (a retried step reads it and fails at
        once); ``suspend``: also suspend it, so its controller deletes its pods (the GPUs are
        free) but the job stays, as evidence and as the record."""
        api, spec = self.api, self.spec
        patch: dict[str, Any] = {"metadata": {"annotations": {PERMANENT_FAILURE: reason[:4000]}}}
        if suspend:
            patch = _merged(patch, api.suspend_patch)
        try:
            self.clients.custom.patch_namespaced_custom_object(
                api.group, api.version, spec.namespace, api.plural, spec.name, patch
            )
        except Exception as exc:  # noqa: BLE001 - the record is best effort: delete instead
            self.note(f"could not record the failure on {self.title} ({exc}); deleting it")
            if suspend:
                self.delete("failed for good; the record could not be written")
            return
        what = "suspended (its pods deleted) and kept" if suspend else "kept"
        self.note(f"{self.title} failed for good: {what}, with the reason recorded")

    def recreate(self, why: str, *, timeout_s: float | None = None) -> None:
        """Delete the job, wait until it and what its controller made for it are gone (pods,
        ``api.child_jobs``), create it again (a retryable failure)."""
        self.note(f"{self.title}: {why}; deleting it and creating it again")
        self.delete(why)
        if timeout_s is None:  # its pods' grace period, then a minute for the controllers
            timeout_s = (self.spec.termination_grace_period_seconds or 30) + 60.0
        deadline = time.monotonic() + timeout_s
        while left := self.leftovers():
            if time.monotonic() > deadline:
                raise JobFailed(
                    f"{self.title} was deleted to be created again, but after {timeout_s:g} s "
                    f"{', '.join(left)} still exist: delete them and retry the step"
                )
            time.sleep(0.5)
        if self.create():
            raise JobFailed(f"{self.title} appeared again while it was being recreated")

    def leftovers(self) -> list[str]:
        """What of the deleted job is still there: itself, its pods, its controller's Jobs."""
        api, spec = self.api, self.spec
        left = [self.title] if self.get() is not None else []
        pods = self.clients.core.list_namespaced_pod(
            spec.namespace, label_selector=f"{api.pod_job_label}={spec.name}"
        ).items
        left += [f"pod {pod.metadata.name}" for pod in pods]
        if api.child_jobs is not None:
            jobs = self.clients.batch.list_namespaced_job(
                spec.namespace, **api.child_jobs.query(spec.name)
            ).items
            left += [f"Job {job.metadata.name}" for job in jobs]
        return left


def delete_job(
    clients: Clients, api: JobApi, namespace: str, name: str, why: str, note: Callable[[str], None]
) -> bool:
    """Delete one job; True if it was deleted, False if it was already gone."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        clients.custom.delete_namespaced_custom_object(
            api.group,
            api.version,
            namespace,
            api.plural,
            name,
            body=client.V1DeleteOptions(propagation_policy="Background"),
        )
    except ApiException as exc:
        if exc.status == 404:
            return False
        note(f"could not delete {api.kind} {namespace}/{name}: {_reason(exc)}")
        return False
    note(f"deleted {api.kind} {namespace}/{name} ({why})")
    return True


def status_message(exc: Any) -> str:
    """The message of the API server's ``Status`` answer (the raw body if it is not one)."""
    body = getattr(exc, "body", "") or ""
    try:
        return str(json.loads(body).get("message") or body)
    except (ValueError, AttributeError):
        return str(body)


def admission_refusal(exc: Any) -> str | None:
    """What refused the object, when it was not RBAC: an admission webhook (the Trainer's or the
    Training Operator's), the CRD's schema or CEL rules (422), a policy. RBAC's own 403 says
    ``cannot <verb> resource``."""
    message = status_message(exc)
    if exc.status == 422 or "admission webhook" in message or "denied the request" in message:
        return message
    return None


def _merged(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two merge patches as one."""
    out = dict(a)
    for key, value in b.items():
        out[key] = _merged(out[key], value) if isinstance(out.get(key), dict) else value
    return out


def _reason(exc: Any) -> str:
    return (
        f"HTTP {getattr(exc, 'status', '?')} {getattr(exc, 'reason', '')}: "
        + str(getattr(exc, "body", "") or "")[:500]
    )
