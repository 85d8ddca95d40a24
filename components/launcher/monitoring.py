"""Monitoring of a job with ``metrics_port``: ports, scrape annotations, PodMonitor, alerts (pure).

With ``TrainSpec.metrics_port = PORT`` every trainer process serves Prometheus metrics (local rank
k on ``PORT + k``, see ``trainer/metrics.py``), and the launcher:

- passes ``--metrics-port PORT --metrics-job <job name>`` to our trainer (a command of your own
  is expected to serve on the port itself);
- declares the container ports ``metrics-0`` … on every replica of a PyTorchJob or TFJob (a
  TrainJob cannot: its runtime patches may not add ports; Prometheus reaches them anyway, the
  port is open in the pod's network);
- annotates every pod ``prometheus.io/scrape: "true"``, ``prometheus.io/port: PORT`` (local rank
  0; for scrapers driven by annotations);
- renders, for the Prometheus Operator (``monitoring.coreos.com/v1``), a ``PodMonitor`` selecting
  the job's pods (``metrics_monitor="servicemonitor"``: a headless ``Service`` + a
  ``ServiceMonitor`` instead), with ``honorLabels`` so that the metrics' own ``job`` label (the
  training job's name) is kept, and a ``PrometheusRule`` with two alerts:
  ``KfpDdpTrainingHung`` (no rank completed a step for ``hang_alert_s``: a NCCL hang, a dead or
  stopped rank) and ``KfpDdpThroughputLow`` (images/s below ``THROUGHPUT_FRACTION`` of its median
  over ``MEDIAN_WINDOW``).

The monitoring objects carry the job's labels (``TrainSpec.labels``: add the label your
Prometheus selects on, e.g. ``release=kube-prometheus-stack``); the kubernetes backend creates
them after the job, owned by it (``ownerReferences``), so they go when the job goes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from components.launcher.spec import TrainSpec

MONITORS = ("podmonitor", "servicemonitor")
"""How Prometheus finds the pods: a PodMonitor, or a Service + ServiceMonitor."""
GROUP = "monitoring.coreos.com"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
PLURALS = {
    "PodMonitor": "podmonitors",
    "ServiceMonitor": "servicemonitors",
    "PrometheusRule": "prometheusrules",
}
METRIC_PREFIX = "kfp_ddp_train_"
"""The trainer's series (``trainer.metrics.PREFIX``)."""
HANG_METRIC = METRIC_PREFIX + "seconds_since_last_step"
THROUGHPUT_METRIC = METRIC_PREFIX + "images_per_second"
THROUGHPUT_FRACTION = 0.5
MEDIAN_WINDOW = "1h"
THROUGHPUT_FOR = "15m"
SCRAPE_INTERVAL = "30s"
PORT_NAME = "metrics-{}"
"""Container/Service port name of local rank k (at most 15 characters)."""
RENDEZVOUS_PORTS = (23456, 29400, 29500)
"""Master ports of the Training Operator (23456), Kubeflow Trainer (29400) and torchrun (29500)."""
SCRAPE_ANNOTATION = "prometheus.io/scrape"
PORT_ANNOTATION = "prometheus.io/port"
METRICS_SUFFIX = "-metrics"
ALERTS_SUFFIX = "-alerts"


# ------------------------------------------------------------------------------- the spec's part
def spec_problems(spec: TrainSpec) -> list[tuple[str, str]]:
    """(field, why) for each monitoring setting of ``spec`` that cannot work."""
    port, nproc = spec.metrics_port, spec.nproc_per_node
    if isinstance(port, bool) or not isinstance(port, int):
        return [("metrics_port", "must be an integer: 0 (off) or a TCP port")]
    if isinstance(spec.hang_alert_s, bool) or not isinstance(spec.hang_alert_s, int):
        return [("hang_alert_s", "must be a whole number of seconds")]
    if spec.hang_alert_s < 1:
        return [("hang_alert_s", "must be at least 1 second (900: 15 minutes)")]
    if not port:
        return []
    last = port + nproc - 1
    if port < 1024 or last > 65535:
        return [
            (
                "metrics_port",
                f"local ranks 0..{nproc - 1} listen on {port}..{last}: use a port from 1024 to "
                f"{65536 - nproc} (e.g. 9400), or 0 for no metrics",
            )
        ]
    taken = [p for p in RENDEZVOUS_PORTS if port <= p <= last]
    if taken:
        return [
            (
                "metrics_port",
                f"the range {port}..{last} holds the rendezvous port {taken[0]} of torchrun / the "
                "training controllers: use another port, e.g. 9400",
            )
        ]
    if spec.command is None and spec.trainer_flag("--metrics-port") is not None:
        return [("args", "set metrics_port, not --metrics-port in args: the launcher passes it")]
    return []  # (the Service <name>-metrics fits in 63 characters: pod hostnames bound the name)


def trainer_flags(spec: TrainSpec) -> list[str]:
    """``--metrics-port PORT --metrics-job NAME`` for our trainer (none for your command)."""
    if not spec.metrics_port or spec.command is not None:
        return []
    return ["--metrics-port", str(spec.metrics_port), "--metrics-job", spec.name]


def scrape_annotations(spec: TrainSpec) -> dict[str, str]:
    """The pods' ``prometheus.io/scrape|port`` annotations (local rank 0's port)."""
    if not spec.metrics_port:
        return {}
    return {SCRAPE_ANNOTATION: "true", PORT_ANNOTATION: str(spec.metrics_port)}


def pod_annotations(spec: TrainSpec) -> dict[str, str] | None:
    """The pods' annotations: the spec's, plus the scrape annotations (None when none)."""
    return (dict(spec.annotations) | scrape_annotations(spec)) or None


def ports(spec: TrainSpec) -> list[tuple[str, int]]:
    """(port name, number) of every local rank's metrics port (empty when off)."""
    if not spec.metrics_port:
        return []
    return [(PORT_NAME.format(k), spec.metrics_port + k) for k in range(spec.nproc_per_node)]


def container_ports(spec: TrainSpec) -> list[Any] | None:
    """The training container's ``V1ContainerPort`` list (None when off)."""
    from kubernetes import client as k8s

    found = [
        k8s.V1ContainerPort(name=name, container_port=number, protocol="TCP")
        for name, number in ports(spec)
    ]
    return found or None


# ------------------------------------------------------------------------------ the documents
def render_yaml(manifest: dict[str, Any], spec: TrainSpec) -> str:
    """The job's manifest, then its monitoring documents, as multi-document YAML."""
    import yaml

    return yaml.safe_dump_all([manifest, *monitoring_documents(spec)], sort_keys=False)


def monitoring_documents(spec: TrainSpec) -> list[dict[str, Any]]:
    """The Prometheus Operator objects of ``spec``'s job (empty without ``metrics_port``).

    ``api="auto"`` renders them for a TrainJob, as ``build_manifest`` does.
    """
    if not spec.metrics_port:
        return []
    from components.launcher.apis import TRAINJOB, job_api

    api = job_api(spec.api) if spec.api != "auto" else TRAINJOB
    selector = {api.pod_job_label: spec.name}
    if api is TRAINJOB:  # only the trainer's pods, not a data or model initializer's
        selector["jobset.sigs.k8s.io/replicatedjob-name"] = api.container
    if spec.metrics_monitor == "servicemonitor":
        scrapers = [service(spec, selector), service_monitor(spec)]
    else:
        endpoints = (
            _trainjob_endpoints(spec, api.container)
            if api is TRAINJOB
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
    """A TrainJob's container declares no metrics ports: each local rank's target is the pod's
    IP with its port, on the trainer's container only."""
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
