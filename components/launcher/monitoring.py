"""Monitoring of a job with ``metrics_port``: ports, scrape annotations, PodMonitor, alerts (pure).
This module is the spec's part; the Prometheus Operator objects are ``monitoring_documents.py``.

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
    port, nproc = spec.metrics_port, spec.nproc_per_node or 1  # nproc: resolved by the spec
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
    return [(PORT_NAME.format(k), spec.metrics_port + k) for k in range(spec.nproc_per_node or 1)]


def container_ports(spec: TrainSpec) -> list[Any] | None:
    """The training container's ``V1ContainerPort`` list (None when off)."""
    from kubernetes import client as k8s

    found = [
        k8s.V1ContainerPort(name=name, container_port=number, protocol="TCP")
        for name, number in ports(spec)
    ]
    return found or None
