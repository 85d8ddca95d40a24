"""What a run starts from, settled by the check step before anything is submitted.

- ``init_from``: ``latest`` becomes the model ``<publish_uri>/latest.json`` names (nothing
  published yet: random weights, said in the log). ``s3://`` weights are read and checked
  against ``model`` (the same tensors, but for the classifier head's classes), then pinned by
  their digest (``s3://…#sha256=…``): the trainer starts from exactly what was checked, and the
  training step's inputs (its cache key and the run's folder) name it. ``imagenet`` is checked
  to be there for ``model`` and reachable: in this step's torchvision cache, a ``TORCH_HOME``
  the nodes get, or torchvision's download server.
- ``baseline_uri``: ``latest`` becomes the pointed model's ``eval.json`` (none yet: no baseline).
- ``latest_run``: the run the pointer names now; the publish step moves the pointer only from it
  (``pipelines.latest_model``).

Each refusal names the parameter, its value and the fix (``ParameterError``).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.launcher.spec import SpecError
from components.launcher.step import StepOverrides
from pipelines.latest_model import ANY_RUN, LATEST, Pointer, PointerError, read_pointer
from pipelines.parameter_errors import ArgumentError, ParameterError

REACH_TIMEOUT_S = 10.0
"""How long the check waits for torchvision's download server."""


@dataclass(frozen=True)
class RunStart:
    """``init_from`` and ``baseline_uri`` as the training and the evaluation get them."""

    init_from: str
    baseline_uri: str
    latest_run: str
    """The run ``latest.json`` named at the check ('' when none was published); ``ANY_RUN``
    when the run is not compared with the latest model (neither setting is ``latest``): its
    model then becomes the latest whatever was published meanwhile."""
    notes: list[str] = field(default_factory=list)


def resolve_run_start(arguments: Mapping[str, Any]) -> RunStart:
    """The run's start for ``arguments`` (the pipeline's, all given); ArgumentError if the
    weights or the pointer cannot be used."""
    a = arguments
    endpoint = a.get("s3_endpoint") or None
    publish_uri = str(a["publish_uri"])
    pointer = None
    chained = LATEST in (a.get("init_from"), a.get("baseline_uri"))
    if chained:
        try:
            pointer = read_pointer(publish_uri, endpoint_url=endpoint)
        except PointerError as err:
            fix = f"{err}; init_from=latest and baseline_uri=latest read it"
            raise ArgumentError([ParameterError("publish_uri", publish_uri, fix)]) from None
    notes: list[str] = []
    init_from = _latest(str(a.get("init_from") or ""), "init_from", pointer, notes, publish_uri)
    baseline = str(a.get("baseline_uri") or "")
    if baseline == LATEST:
        baseline = pointer.eval_uri if pointer else ""
        notes.append(
            f"baseline_uri=latest: the gate compares with run {pointer.run_id}'s model"
            if pointer
            else "baseline_uri=latest: nothing published under publish_uri yet, so no baseline "
            "(the accuracy threshold alone decides)"
        )
    try:
        pinned = checked_weights(init_from, str(a["model"]), a)
    except ParameterError as err:
        if init_from != a.get("init_from"):  # resolved from latest: say both
            err = ParameterError("init_from", a.get("init_from"), f"{init_from}: {err.fix}")
        raise ArgumentError([err]) from None
    return RunStart(
        init_from=pinned,
        baseline_uri=baseline,
        latest_run=(pointer.run_id if pointer else "") if chained else ANY_RUN,
        notes=notes,
    )


def _latest(
    value: str, name: str, pointer: Pointer | None, notes: list[str], publish_uri: str
) -> str:
    if value != LATEST:
        return value
    if pointer is None:
        notes.append(
            f"{name}=latest: nothing published under {publish_uri} yet, so this run starts "
            "from random weights"
        )
        return ""
    notes.append(f"{name}=latest: run {pointer.run_id}'s model, {pointer.uri}")
    return pointer.uri


def init_from_place_problem(value: Any) -> str | None:
    """What is wrong with a path as ``init_from`` in the pipeline (None: not a path)."""
    if not isinstance(value, str) or value in ("", LATEST, "imagenet") or "://" in value:
        return None
    return (
        "the training nodes cannot read the files of the machine that starts the run: copy the "
        "model folder or state dict to S3 (aws s3 cp --recursive ...) and give its s3:// URI"
    )


def checked_weights(init_from: str, model: str, arguments: Mapping[str, Any]) -> str:
    """``init_from`` checked against ``model`` and pinned ('' and ``imagenet`` as they are)."""
    if not init_from:
        return ""
    # torch and torchvision (~3 s) for the runs that start from weights only
    from trainer.init_weights import IMAGENET, StartingWeightsError, fetch, match
    from trainer.models import build_model

    problem = init_from_place_problem(init_from)
    if problem:
        raise ParameterError("init_from", init_from, problem)
    try:
        if init_from == IMAGENET:
            _imagenet_reachable(model, arguments)
            return IMAGENET
        weights = fetch(init_from, model, endpoint_url=arguments.get("s3_endpoint") or None)
        assert weights is not None
        match(build_model(model, 2), weights, arch=model, num_classes=2)
    except StartingWeightsError as err:
        raise ParameterError("init_from", init_from, err.fix.replace("--model", "model")) from None
    return weights.pinned()


def _imagenet_reachable(model: str, arguments: Mapping[str, Any]) -> None:
    """StartingWeightsError unless torchvision's weights for ``model`` exist and the nodes can
    get them: cached here, a TORCH_HOME in the nodes' env, or the download server answers."""
    # torchvision (~2 s) for the runs that start from weights only
    from trainer.init_weights import torchvision_weights

    found = torchvision_weights(model)
    if found.cached.is_file():
        return
    if "TORCH_HOME" in _node_env(arguments):
        return  # the nodes read a cache of their own; the trainer names a missing file
    try:
        request = urllib.request.Request(found.weights.url, method="HEAD")
        with urllib.request.urlopen(request, timeout=REACH_TIMEOUT_S):
            return
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise found.unreachable(str(getattr(err, "reason", err))) from None


def _node_env(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The env ``overrides_json`` gives the training nodes."""
    try:
        fields = StepOverrides.parse(str(arguments.get("overrides_json") or "")).spec_fields
    except SpecError:
        return {}
    env = fields.get("env")
    return env if isinstance(env, dict) else {}
