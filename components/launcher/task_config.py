"""What the KFP task forwards to the training job (``dsl.TaskConfig``), merged into the spec.

The training component declares ``task_config_passthroughs`` (``passthroughs()``): whoever
composes it sets the job's GPUs, CPU, memory, env, tolerations, node selector, affinity and
volumes on the training task with KFP's own calls (``.set_accelerator_type()``,
``.set_accelerator_limit()``, ``.set_cpu_request()``, ``kubernetes.add_toleration()``,
``kubernetes.mount_pvc()``...), and KFP's backend (2.15.0 or newer) hands them to the component
as its ``task_config`` input instead of putting them on the step's own pod — except env and
volumes, which the step's pod keeps too (``apply_to_task``: the launcher reads S3 with the same
credentials and the trainer's outputs on the same claim).

The backend fills it from Go's ``TaskConfig`` (backend/src/v2/driver/driver.go, set in
``initPodSpecPatch`` and ``extendPodSpecPatch``): Kubernetes JSON under ``resources``
(``limits``/``requests``: cpu, memory, the accelerator type → its count), ``env`` (EnvVar: a
``value``, or a ``valueFrom`` reference for use_secret_as_env, use_config_map_as_env,
use_field_path_as_env), ``tolerations``, ``nodeSelector``, ``affinity`` (``nodeAffinity``),
``volumes`` (a PVC, Secret or ConfigMap volume, named after it) and ``volumeMounts``.
``dsl.TaskConfig`` keeps these as attributes (``node_selector``, ``volume_mounts``); both
shapes are read here.

How the task's settings meet the component's parameters, ``overrides_json`` and
``cluster_settings_json`` (``merge_task_config``):

- a single value (GPUs per node and their resource name, CPU and memory request and limit,
  the affinity): the task's fills a field left unset (0, empty, None); the same value on both
  sides is fine; two different values are refused, naming both — never one silently winning;
- lists and maps (tolerations, node selector, env, volumes): the union; an entry both sides
  give identically counts once; the same key, variable or mount path with different contents is
  refused, naming both;
- the spec's own rules apply to the result as to any spec: the defaults that size a pod from its
  GPUs (4 CPUs and 16Gi per GPU when the task gives GPUs but no CPU or memory), the Pod Security
  level (a hostPath volume needs pod_security=privileged), the names the controllers own.

Env values never appear in an error (a task's env may hold what someone set by hand); a Secret
stays a ``secretKeyRef``. ``kfp.local`` hands the component ``task_config=None`` (it ignores
kfp-kubernetes settings and warns that resources have no effect): nothing to merge, the
parameters alone decide.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from components.launcher.pod_extras import PodExtras, volume_kind
from components.launcher.pod_parts import S3_SECRET_KEYS
from components.launcher.spec import PvcMount, SpecError, parse_toleration

CORE_RESOURCES = {"cpu": ("cpu_request", "cpu_limit"), "memory": ("memory_request", "memory_limit")}
"""Resource name → the spec's (request, limit) fields."""
UNSET: tuple[Any, ...] = (None, "", 0, [], {})


def passthroughs() -> list:
    """The component's ``task_config_passthroughs``: what the task forwards to the job.

    Resources, tolerations, node selector and affinity go to the job only (the step's pod is a
    small CPU pod that follows the job); env and volumes go to both.
    """
    from kfp import dsl

    field_ = dsl.TaskConfigField
    return [
        dsl.TaskConfigPassthrough(field=field_.RESOURCES),
        dsl.TaskConfigPassthrough(field=field_.ENV, apply_to_task=True),
        dsl.TaskConfigPassthrough(field=field_.KUBERNETES_TOLERATIONS),
        dsl.TaskConfigPassthrough(field=field_.KUBERNETES_NODE_SELECTOR),
        dsl.TaskConfigPassthrough(field=field_.KUBERNETES_AFFINITY),
        dsl.TaskConfigPassthrough(field=field_.KUBERNETES_VOLUMES, apply_to_task=True),
    ]


@dataclass(frozen=True, kw_only=True)
class TaskSettings:
    """The task's forwarded settings, as Kubernetes JSON (the backend's TaskConfig)."""

    resources: dict[str, Any] = field(default_factory=dict)
    """``limits`` and ``requests``: resource name → quantity."""
    env: list[dict[str, Any]] = field(default_factory=list)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    node_selector: dict[str, str] = field(default_factory=dict)
    affinity: dict[str, Any] | None = None
    volumes: list[dict[str, Any]] = field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def parse(cls, value: Any) -> TaskSettings:
        """From ``dsl.TaskConfig``, the backend's JSON dict (camelCase keys), or None."""
        if value is None:
            return cls()
        if isinstance(value, dict):
            data = {
                "resources": value.get("resources"),
                "env": value.get("env"),
                "tolerations": value.get("tolerations"),
                "node_selector": value.get("nodeSelector", value.get("node_selector")),
                "affinity": value.get("affinity"),
                "volumes": value.get("volumes"),
                "volume_mounts": value.get("volumeMounts", value.get("volume_mounts")),
            }
        else:  # dsl.TaskConfig (or anything with its attributes)
            data = {name: getattr(value, name, None) for name in cls.__dataclass_fields__}
        data = _whole_numbers(data)
        return cls(
            resources=data["resources"] or {},
            env=list(data["env"] or []),
            tolerations=list(data["tolerations"] or []),
            node_selector=dict(data["node_selector"] or {}),
            affinity=data["affinity"] or None,
            volumes=list(data["volumes"] or []),
            volume_mounts=list(data["volume_mounts"] or []),
        )

    def __bool__(self) -> bool:
        return any(
            (
                (self.resources or {}).get("limits"),
                (self.resources or {}).get("requests"),
                self.env,
                self.tolerations,
                self.node_selector,
                self.affinity,
                self.volumes,
                self.volume_mounts,
            )
        )


def task_gpus(task_config: Any) -> int:
    """The GPUs per node the task asks for (its accelerator limit), 0 when none."""
    resources = TaskSettings.parse(task_config).resources
    limits = resources.get("limits") or {}
    counts = [_whole(v) for k, v in limits.items() if k not in CORE_RESOURCES]
    return next((c for c in counts if c), 0)


def merge_task_config(
    task_config: Any,
    *,
    parameters: dict[str, Any],
    overrides: dict[str, Any],
    cluster: dict[str, Any],
) -> dict[str, Any]:
    """The spec fields to apply over ``parameters``: ``cluster`` and ``overrides`` (as given),
    plus what the task forwarded (see the module's rules); refuses a conflict, naming both."""
    _refuse_node_paths(overrides)
    settings = TaskSettings.parse(task_config)
    merge = _Merge(parameters=parameters, overrides=overrides, cluster=cluster)
    if settings:
        merge.resources(settings.resources)
        merge.tolerations(settings.tolerations)
        merge.node_selector(settings.node_selector)
        merge.affinity(settings.affinity)
        merge.env(settings.env)
        merge.volumes(settings.volumes, settings.volume_mounts)
    return merge.result()


def _refuse_node_paths(overrides: dict[str, Any]) -> None:
    """A node path never comes from overrides_json (a run's parameter), like
    stage_cache_host_path: only from the task's own settings or cluster_settings_json."""
    try:
        extras = PodExtras.coerce(overrides.get("pod_extras"))
    except ValueError as exc:
        raise SpecError(f"overrides_json: {exc}") from exc
    if any(volume_kind(v) == "hostPath" for v in extras.volumes if isinstance(v, dict)):
        raise SpecError(
            "overrides_json sets pod_extras with a hostPath volume: a node's file system is "
            "opened only by whoever compiles the pipeline (cluster_settings_json)"
        )


class _Merge:
    """The fields as the parameters, cluster settings and overrides give them, and the task's
    settings added one by one (``added``)."""

    def __init__(self, *, parameters: dict, overrides: dict, cluster: dict) -> None:
        self.parameters = parameters
        self.overrides = overrides
        self.cluster = cluster
        self.given = parameters | cluster | overrides
        self.added: dict[str, Any] = {}

    def result(self) -> dict[str, Any]:
        return self.cluster | self.overrides | self.added

    def current(self, name: str) -> Any:
        return self.added.get(name, self.given.get(name))

    def origin(self, name: str) -> str:
        if name in self.overrides:
            return "overrides_json"
        if name in self.cluster:
            return "cluster_settings_json"
        if name in self.parameters:
            return "the component's parameter"
        return "the spec"

    def conflict(self, name: str, shown: Any, task_side: str) -> SpecError:
        return SpecError(
            f"{name}={shown} ({self.origin(name)}) and the training task's {task_side} "
            "disagree: set it in one place, or to the same value on both"
        )

    def scalar(
        self, name: str, value: Any, task_side: str, same: Callable[[Any, Any], bool] | None = None
    ) -> None:
        now = self.current(name)
        if now in UNSET:
            self.added[name] = value
        elif not (same(now, value) if same else now == value):
            raise self.conflict(name, repr(now), task_side)

    # -- resources -------------------------------------------------------------------------------

    def resources(self, resources: dict[str, Any]) -> None:
        limits = dict(resources.get("limits") or {})
        requests = dict(resources.get("requests") or {})
        extended = sorted({k for k in (*limits, *requests) if k not in CORE_RESOURCES})
        other = [k for k in extended if "/" not in k]
        if other:
            raise SpecError(
                f"the training task's resources name {other}: only cpu, memory and one "
                "accelerator (e.g. nvidia.com/gpu) are taken from a task; the launcher sizes the "
                "pods' disk itself (ephemeral_storage in overrides_json)"
            )
        if len(extended) > 1:
            raise SpecError(
                f"the training task's resources name several accelerators {extended}: a node's "
                "GPUs are one resource (set_accelerator_type)"
            )
        if extended:
            self.accelerator(extended[0], limits.get(extended[0], requests.get(extended[0])))
        for resource, (request_field, limit_field) in CORE_RESOURCES.items():
            for kind, name, values in (
                ("request", request_field, requests),
                ("limit", limit_field, limits),
            ):
                if resource in values:
                    side = f"{resource} {kind} {values[resource]!r} (set_{resource}_{kind})"
                    self.scalar(name, str(values[resource]), side, same=_same_quantity)

    def accelerator(self, resource: str, count: Any) -> None:
        gpus = _whole(count)
        if gpus is None or gpus < 0:
            raise SpecError(
                f"the training task's accelerator limit {resource}={count!r} "
                "(set_accelerator_limit) must be a whole number of devices"
            )
        given_type = self.current("gpu_resource")
        if given_type not in UNSET and given_type != resource:
            raise self.conflict(
                "gpu_resource",
                repr(given_type),
                f"accelerator type {resource!r} (set_accelerator_type)",
            )
        self.added["gpu_resource"] = resource
        side = f"accelerator limit {resource}={gpus} (set_accelerator_limit)"
        self.scalar("gpus_per_worker", gpus, side)

    # -- scheduling ------------------------------------------------------------------------------

    def tolerations(self, tolerations: list[dict[str, Any]]) -> None:
        if not tolerations:
            return
        now = [
            parse_toleration(t) if isinstance(t, str) else t
            for t in self.current("tolerations") or []
        ]
        merged = list(now)
        for toleration in tolerations:
            ours = _toleration(toleration)
            if not any(_toleration(t) == ours for t in merged):
                merged.append(ours)
        self.added["tolerations"] = merged

    def node_selector(self, selector: dict[str, str]) -> None:
        if not selector:
            return
        now = dict(self.current("node_selector") or {})
        for key, value in selector.items():
            if key in now and str(now[key]) != str(value):
                shown = f"{{{key!r}: {now[key]!r}}}"
                raise self.conflict("node_selector", shown, f"node selector {key}={value!r}")
            now[key] = value
        self.added["node_selector"] = now

    def affinity(self, affinity: dict[str, Any] | None) -> None:
        if not affinity:
            return
        extras = self.extras()
        if extras.affinity and extras.affinity != affinity:
            raise self.conflict(
                "pod_extras", "{'affinity': ...}", "node affinity (add_node_affinity)"
            )
        self.set_extras(affinity=affinity)

    # -- env -------------------------------------------------------------------------------------

    def env(self, variables: list[dict[str, Any]]) -> None:
        plain = dict(self.current("env") or {})
        refs = {e.get("name"): e for e in self.extras().env}
        for var in variables:
            name = var.get("name") or ""
            source = var.get("valueFrom")
            if self.s3_variable(name, var):
                continue
            if source is None:
                value = str(var.get("value", ""))
                if name in refs or (name in plain and plain[name] != value):
                    raise self.conflict(
                        "env", f"{{{name!r}: ...}}", f"env {name} (set_env_variable)"
                    )
                plain[name] = value
            else:
                if name in plain or (name in refs and refs[name] != var):
                    raise self.conflict(
                        "env", f"{{{name!r}: ...}}", f"env {name} from {_source_name(source)}"
                    )
                refs[name] = {"name": name, "valueFrom": source}
        if plain != dict(self.current("env") or {}):
            self.added["env"] = plain
        self.set_extras(env=list(refs.values()))

    def s3_variable(self, name: str, var: dict[str, Any]) -> bool:
        """Whether ``var`` is one the S3 settings give the nodes already (then it is left out);
        refuses one that names the same variable differently."""
        secret = self.current("s3_credentials_secret")
        endpoint = self.current("s3_endpoint")
        if secret and name in S3_SECRET_KEYS:
            ref = (var.get("valueFrom") or {}).get("secretKeyRef") or {}
            if ref.get("name") == secret and ref.get("key") == name:
                return True
            raise self.conflict(
                "s3_credentials_secret", repr(secret), f"env {name} (not the same Secret key)"
            )
        if endpoint and name == "AWS_ENDPOINT_URL_S3":
            if var.get("value") == endpoint and "valueFrom" not in var:
                return True
            raise self.conflict("s3_endpoint", repr(endpoint), "env AWS_ENDPOINT_URL_S3")
        return False

    # -- volumes ---------------------------------------------------------------------------------

    def volumes(self, volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> None:
        if not mounts:
            return

        by_name = {v.get("name"): v for v in volumes}
        pvcs = [PvcMount.coerce(p) for p in self.current("pvcs") or []]
        extras = self.extras()
        kept_volumes = {v.get("name"): v for v in extras.volumes}
        kept_mounts = {m.get("mountPath"): m for m in extras.volume_mounts}
        for mount in mounts:
            name, path = mount.get("name"), mount.get("mountPath")
            volume = by_name.get(name)
            if volume is None:
                raise SpecError(f"the training task's volume mount {mount!r} names no volume")
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            ours = next((p for p in pvcs if p.path == path), None)
            if ours is not None:
                if claim == ours.claim and not mount.get("subPath"):
                    continue  # the parameter's claim, mounted where the task mounts it
                raise self.conflict(
                    "pvcs", f"[{ours.claim}:{ours.path}]", f"volume {name} at {path} (mount_pvc)"
                )
            if path in kept_mounts and (
                kept_mounts[path] != mount or kept_volumes.get(name) != volume
            ):
                raise self.conflict(
                    "pod_extras", f"{{mount at {path}}}", f"volume {name} at {path}"
                )
            if name in kept_volumes and kept_volumes[name] != volume:
                raise self.conflict("pod_extras", f"{{volume {name}}}", f"volume {name}")
            kept_volumes[name] = volume
            kept_mounts[path] = mount
        self.set_extras(
            volumes=list(kept_volumes.values()), volume_mounts=list(kept_mounts.values())
        )

    # -- pod_extras ------------------------------------------------------------------------------

    def extras(self) -> PodExtras:
        return PodExtras.coerce(self.current("pod_extras"))

    def set_extras(self, **changes: Any) -> None:
        extras = self.extras()
        data = {
            "affinity": extras.affinity,
            "env": extras.env,
            "volumes": extras.volumes,
            "volume_mounts": extras.volume_mounts,
        } | changes
        updated = PodExtras(**data)
        if updated != extras:
            self.added["pod_extras"] = updated


def _toleration(toleration: dict[str, Any]) -> dict[str, Any]:
    """A toleration in the spec's form (``toleration_seconds``), without empty entries."""
    renamed = {
        ("toleration_seconds" if k == "tolerationSeconds" else k): v for k, v in toleration.items()
    }
    cleaned = {k: v for k, v in renamed.items() if v not in (None, "")}
    cleaned.setdefault("operator", "Equal")
    return cleaned


def _source_name(source: dict[str, Any]) -> str:
    kind = next(iter(source), "valueFrom")
    target = source.get(kind) or {}
    label = target.get("name") or target.get("fieldPath") or target.get("resource") or ""
    return f"{kind} {label}".strip()


def _same_quantity(a: Any, b: Any) -> bool:
    from kubernetes.utils import parse_quantity

    try:
        return parse_quantity(str(a)) == parse_quantity(str(b))
    except ValueError:
        return str(a) == str(b)


def _whole(value: Any) -> int | None:
    """A whole number from an int, an integral float or a quantity string ("2"), else None."""
    from kubernetes.utils import parse_quantity

    try:
        number = parse_quantity(str(value))
    except ValueError:
        return None
    return int(number) if number == int(number) else None


def _whole_numbers(value: Any) -> Any:
    """The task config with integral floats as ints: protobuf's Struct keeps every number as a
    double (a tolerationSeconds of 3600 may arrive as 3600.0)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value
