"""The Prometheus Operator objects of a job with ``metrics_port`` (pure): a ``PodMonitor`` (or a
headless ``Service`` + ``ServiceMonitor``) selecting the job's pods and a ``PrometheusRule`` with
the hang and throughput alerts. What they watch and why: ``monitoring.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from components.launcher.apis import TRAINJOB, job_api
from components.launcher.monitoring import (
    ALERTS_SUFFIX,
    API_VERSION,
    HANG_METRIC,
    MEDIAN_WINDOW,
    METRIC_PREFIX,
    METRICS_SUFFIX,
    SCRAPE_INTERVAL,
    THROUGHPUT_FOR,
    THROUGHPUT_FRACTION,
    THROUGHPUT_METRIC,
    ports,
)

if TYPE_CHECKING:
    from components.launcher.spec import TrainSpec


def render_yaml(manifest: dict[str, Any], spec: TrainSpec) -> str:
    """The job's manifest, then its monitoring documents, as multi-document YAML."""
    return yaml.safe_dump_all([manifest, *monitoring_documents(spec)], sort_keys=False)


def monitoring_documents(spec: TrainSpec) -> list[dict[str, Any]]:
    """The Prometheus Operator objects of ``spec``'s job (empty without ``metrics_port``).

    ``api="auto"`` renders them for a TrainJob, as ``build_manifest`` does.
    """
    if not spec.metrics_port:
        return []
    api = job_api(spec.api) if spec.api != "auto" else TRAINJOB
    selector = {api.pod_job_label: spec.name}
    if api is TRAINJOB:  # only the trainer's pods, not a data or model initializer's
        selector["jobset.sigs.k8s.io/replicatedjob-name"] = api.container
    if api.name == "rayjob":  # the Ray workers (the head and the submitter train nothing)
        selector["ray.io/node-type"] = "worker"
    if spec.metrics_monitor == "servicemonitor":
        scrapers = [service(spec, selector), service_monitor(spec)]
    else:
        # A TrainJob's runtime patches cannot declare ports; a RayJob's Ray container's ports
        # are KubeRay's (a "metrics" port of its own is Ray's, not ours).
        endpoints = (
            _trainjob_endpoints(spec, api.container)
            if api is TRAINJOB or api.name == "rayjob"
            else [_endpoint(port=name) for name, _ in ports(spec)]
        )
        scrapers = [pod_monitor(spec, selector, endpoints)]
    return [*scrapers, prometheus_rule(spec)]


def _metadata(spec: TrainSpec, suffix: str) -> dict[str, Any]:
    return {"name": spec.name + suffix, "namespace": spec.namespace, "labels": spec.job_labels()}


def _endpoint(**fields: Any) -> dict[str, Any]:
    """One scrape endpoint; honorLabels keeps the trainer's ``job`` label (the job's name)."""
    return {"path": "/metrics", "interval": SCRAPE_INTERVAL, "honorLabels": True, **fields}


def _trainjob_endpoints(spec: TrainSpec, container: str) -> list[dict[str, Any]]:
    """A container that declares no metrics ports (a TrainJob's, a RayJob's): each local rank's
    target is the pod's IP with its port, on the trainer's container only."""
    keep_trainer = [
        {
            "sourceLabels": ["__meta_kubernetes_pod_container_name"],
            "regex": container,
            "action": "keep",
        },
        {
            "sourceLabels": ["__meta_kubernetes_pod_container_init"],
            "regex": "false",
            "action": "keep",
        },
    ]
    return [
        _endpoint(
            relabelings=[
                *keep_trainer,
                {
                    "sourceLabels": ["__meta_kubernetes_pod_ip"],
                    "regex": "(.+)",
                    "targetLabel": "__address__",
                    "replacement": f"$1:{number}",
                    "action": "replace",
                },
                {"targetLabel": "local_rank", "replacement": str(k), "action": "replace"},
            ]
        )
        for k, (_, number) in enumerate(ports(spec))
    ]


def pod_monitor(
    spec: TrainSpec, selector: dict[str, str], endpoints: list[dict[str, Any]]
) -> dict[str, Any]:
    """The PodMonitor selecting the job's pods in its namespace."""
    return {
        "apiVersion": API_VERSION,
        "kind": "PodMonitor",
        "metadata": _metadata(spec, METRICS_SUFFIX),
        "spec": {
            "selector": {"matchLabels": selector},
            "namespaceSelector": {"matchNames": [spec.namespace]},
            "podMetricsEndpoints": endpoints,
        },
    }


def service(spec: TrainSpec, selector: dict[str, str]) -> dict[str, Any]:
    """A headless Service in front of the job's pods (what a ServiceMonitor selects)."""
    metadata = _metadata(spec, METRICS_SUFFIX)
    metadata["labels"] = metadata["labels"] | {"kfp-ddp.io/metrics-of": spec.name}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            "ports": [
                {"name": name, "port": number, "targetPort": number, "protocol": "TCP"}
                for name, number in ports(spec)
            ],
        },
    }


def service_monitor(spec: TrainSpec) -> dict[str, Any]:
    """The ServiceMonitor of :func:`service`."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ServiceMonitor",
        "metadata": _metadata(spec, METRICS_SUFFIX),
        "spec": {
            "selector": {"matchLabels": {"kfp-ddp.io/metrics-of": spec.name}},
            "namespaceSelector": {"matchNames": [spec.namespace]},
            "endpoints": [_endpoint(port=name) for name, _ in ports(spec)],
        },
    }


def series_selector(spec: TrainSpec) -> str:
    """The PromQL label matchers of the job's series."""
    return f'{{namespace="{spec.namespace}", job="{spec.name}"}}'


def hang_expression(spec: TrainSpec) -> str:
    """True (a result) while some rank of the job completed no step for ``hang_alert_s``."""
    return f"max by (namespace, job) ({HANG_METRIC}{series_selector(spec)}) > {spec.hang_alert_s}"


def throughput_expression(spec: TrainSpec) -> str:
    """True while the job's images/s is below a fraction of its running median."""
    series = f"{THROUGHPUT_METRIC}{series_selector(spec)}"
    return (
        f"avg by (namespace, job) ({series}) < {THROUGHPUT_FRACTION} * avg by (namespace, job) "
        f"(quantile_over_time(0.5, {series}[{MEDIAN_WINDOW}]))"
    )


def prometheus_rule(spec: TrainSpec) -> dict[str, Any]:
    """The two alerts of the job: hung, and throughput far below its median."""
    where = f"{spec.namespace}/{spec.name}"
    hang = {
        "alert": "KfpDdpTrainingHung",
        "expr": hang_expression(spec),
        "for": "1m",
        "labels": {"severity": "critical"},
        "annotations": {
            "summary": f"training job {where} completed no step for {spec.hang_alert_s} s",
            "description": (
                "The ranks wait in a collective for a peer that is gone, stopped or stuck "
                "(NCCL, a dead node), or data loading stalls. A rank missing from the scrape "
                "(up == 0) is the likely culprit: read its pod's logs and events. The collective "
                "timeout (--collective-timeout-s) fails the job later, and a restart resumes "
                "from the last checkpoint."
            ),
        },
    }
    slow = {
        "alert": "KfpDdpThroughputLow",
        "expr": throughput_expression(spec),
        "for": THROUGHPUT_FOR,
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": (
                f"training job {where} trains below {THROUGHPUT_FRACTION:.0%} of its median "
                f"images/s ({MEDIAN_WINDOW})"
            ),
            "description": (
                f"Compare {METRIC_PREFIX}data_wait_seconds_total with compute_seconds_total (a "
                "slow input pipeline or storage), GPU utilisation, and the network (NCCL)."
            ),
        },
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "PrometheusRule",
        "metadata": _metadata(spec, ALERTS_SUFFIX),
        "spec": {"groups": [{"name": f"kfp-ddp-{spec.name}", "rules": [hang, slow]}]},
    }
