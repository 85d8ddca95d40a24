"""The pipeline's parameters, declared once: name, type, default, doc, rule, and the training
step's input each one sets.

Everything else is derived from ``PARAMETERS``: the pipeline function's signature and docstring
(``pipelines.training``), the check step's inputs (``pipelines.steps``), the training step's
inputs (``training_step_inputs``), what ``render`` and the check pass to the step, and the
listing ``kfp-ddp parameters``. Adding a parameter is one ``Parameter`` here, plus — if it
reaches the trainer — its trainer flag and the training step's input that carries it.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from components.kfp.function import REQUIRED, FunctionInput
from components.launcher.step import TRAINER_SETTING, TrainingStepInputs, trainer_flag_inputs
from pipelines import parameter_rules as rules
from trainer import config as trainer_config

IMAGE = object()
"""The default of ``image``: the image the pipeline is compiled for."""
COMPILE_TIME = (
    FunctionInput(name="backend", annotation="str"),
    FunctionInput(name="workspace_path", annotation="str"),
    FunctionInput(name="storage", annotation="str"),
    FunctionInput(name="cluster_settings", annotation="str"),
)
"""What the check step gets beside the parameters: the choices made at compile time."""
SET_BY_PIPELINE = {
    "--data-dir": "is set by the pipeline (the pipeline syncs data_uri there); leave it out",
    "--output-dir": "is set by the pipeline (it names it after the settings and the data); "
    "leave it out",
    "--checkpoint-dir": "is set by the pipeline (checkpoints live in the run's output folder); "
    "leave it out",
    "--checkpoint-uri": "is set by the pipeline (set the pipeline parameter checkpoint_uri "
    "instead); leave it out",
    "--output-uri": "is set by the pipeline (it uploads the model under checkpoint_uri); "
    "leave it out",
    "--device": "is set by the pipeline (gpus_per_worker decides it: cuda with GPUs, else "
    "cpu); leave it out",
    "--metrics-job": "is set by the pipeline (the launcher sets it to the job's name, with "
    "metrics_port); leave it out",
}
"""Trainer flags the pipeline sets that are no parameter's (refused in trainer_args)."""

RENAMED_PARAMETERS = {
    "job_api": "api",
    "credentials_secret": "s3_credentials_secret",
    "cpu_per_worker": "cpu_request",
    "memory_per_worker": "memory_request",
    "checkpoint_interval": "checkpoint_every_steps",
    "train_overrides": "overrides_json",
}
"""Parameters renamed in 0.2.0 to the name of the setting in every layer (CHANGELOG.md): the CLI
takes the old name, with a warning, until 0.3.0."""


@dataclass(frozen=True, kw_only=True)
class Parameter:
    """One pipeline parameter."""

    name: str
    type: type
    """str, int, float or list (what KFP offers in its UI)."""
    default: Any = REQUIRED
    doc: str
    """What it is, for the UI and ``kfp-ddp parameters`` (line breaks kept)."""
    rule: Callable[[Any], str | None] | None = None
    """The value alone: what is wrong and the fix, or None. The training job's own checks
    (the launcher's TrainSpec, the trainer's flags) run on top, naming this parameter."""
    step_input: str | None = None
    """The training step's input (``TrainingStepInputs`` field) it sets as it is."""
    storage: str | None = None
    """The only storage mode that declares it (None: every one)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "doc", inspect.cleandoc(self.doc))

    def default_for(self, image: str) -> Any:
        return image if self.default is IMAGE else self.default


def trainer_parameters(inputs_class: type = TrainingStepInputs) -> list[Parameter]:
    """A parameter for each trainer setting of the training step (``trainer_setting`` in
    ``TrainingStepInputs``), of the same name: the trainer's type, description and default (or
    the pipeline's own default, whose reason the declaration states)."""
    defaults, docs = trainer_config.field_defaults(), trainer_config.field_docs()
    hints = typing.get_type_hints(trainer_config.TrainConfig)
    found = []
    for f in dataclasses.fields(inputs_class):
        name = f.metadata.get(TRAINER_SETTING)
        if name is None:
            continue
        kind = next((a for a in typing.get_args(hints[name]) if a is not type(None)), hints[name])
        default = f.metadata.get("pipeline_default", defaults[name])
        doc = docs.get(name, "")
        if "why" in f.metadata:
            doc += f" The pipeline's default is {default!r}: {f.metadata['why']}."
        found.append(Parameter(name=name, type=kind, default=default, doc=doc, step_input=f.name))
    return found


PARAMETERS = (
    Parameter(
        name="data_uri",
        type=str,
        doc="""s3://bucket/prefix of the ImageFolder (train/ and val/ class folders).""",
        rule=rules.s3_uri("s3://my-bucket/datasets/cats"),
    ),
    Parameter(
        name="publish_uri",
        type=str,
        doc="""s3://bucket/prefix; a model that passes the gate goes to
            publish_uri/<run id>/.""",
        rule=rules.s3_uri("s3://my-bucket/models/cats"),
    ),
    Parameter(
        name="s3_endpoint",
        type=str,
        default="",
        doc="""URL of an S3-compatible endpoint (MinIO, Ceph...); empty for AWS.""",
        rule=rules.endpoint_url,
        step_input="s3_endpoint",
    ),
    Parameter(
        name="s3_credentials_secret",
        type=str,
        default="s3-credentials",
        doc="""Kubernetes Secret with AWS_ACCESS_KEY_ID and
            AWS_SECRET_ACCESS_KEY.""",
        rule=rules.kubernetes_name,
        step_input="s3_credentials_secret",
    ),
    Parameter(
        name="workspace_pvc",
        type=str,
        default="kfp-ddp-workspace",
        doc="""the existing ReadWriteMany claim shared by the steps and the
            nodes (shared-volume storage only).""",
        rule=rules.kubernetes_name,
        storage="shared-volume",
    ),
    Parameter(
        name="image",
        type=str,
        doc="""image of the training nodes.""",
        default=IMAGE,
        step_input="image",
        rule=rules.image,
    ),
    Parameter(
        name="namespace",
        type=str,
        default="",
        doc="""namespace of the training job; empty for the pipeline's own.""",
        step_input="namespace",
    ),
    Parameter(
        name="api",
        type=str,
        default="auto",
        doc="""trainjob (Kubeflow Trainer v2), pytorchjob (Training Operator v1) or auto
            (whichever the cluster serves; TrainJob when both are).""",
        step_input="api",
    ),
    Parameter(
        name="workers",
        type=int,
        default=2,
        doc="""training nodes (pods).""",
        step_input="workers",
    ),
    Parameter(
        name="gpus_per_worker",
        type=int,
        default=1,
        doc="""GPUs per node (0 trains on CPUs with gloo).""",
        step_input="gpus_per_worker",
    ),
    Parameter(
        name="nproc_per_node",
        type=int,
        default=0,
        doc="""processes per node; 0 starts one per GPU.""",
        step_input="nproc_per_node",
    ),
    Parameter(
        name="cpu_request",
        type=str,
        default="",
        doc="""CPU request per node, e.g. 16; empty for none.""",
        step_input="cpu_request",
    ),
    Parameter(
        name="memory_request",
        type=str,
        default="",
        doc="""memory request per node, e.g. 128Gi; empty for none.""",
        step_input="memory_request",
    ),
    *trainer_parameters(),
    Parameter(
        name="checkpoint_uri",
        type=str,
        default="",
        doc="""s3://bucket/prefix where the trainer mirrors its checkpoints (a
            new pod, on any node, resumes from there) and, with object-store storage,
            uploads the model; empty: publish_uri/training with object-store storage, no
            mirror with shared-volume storage.""",
        rule=rules.s3_uri("s3://my-bucket/checkpoints/cats", optional=True),
    ),
    Parameter(
        name="metrics_port",
        type=int,
        default=0,
        doc="""Prometheus metrics port of every trainer process (local rank k
            on metrics_port + k) with a PodMonitor and hang/throughput alerts beside the
            job (see README, Monitoring); 0: off.""",
        step_input="metrics_port",
    ),
    Parameter(
        name="trainer_args",
        type=list,
        default=[],
        doc="""more trainer flags, e.g. ["--augment", "none"] (python -m
            trainer.train --help lists them; the flags of the parameters above are refused).""",
        rule=lambda value: trainer_args_problem(value),  # defined below: it reads PARAMETERS
        step_input="trainer_args",
    ),
    Parameter(
        name="overrides_json",
        type=str,
        default="{}",
        doc="""JSON object of more launcher settings (shm_size, nccl_preset,
            tolerations, runtime_name, ...; "backend_options" for the launcher itself).""",
        step_input="overrides_json",
    ),
    Parameter(
        name="retrain_token",
        type=str,
        default="",
        doc="""any new value (e.g. today's date) trains from scratch in a fresh
            folder and misses the cache.""",
        step_input="retrain_token",
    ),
    Parameter(
        name="accuracy_threshold",
        type=float,
        default=0.9,
        doc="""minimum validation accuracy to publish, between 0 and 1.""",
        rule=rules.fraction("a fraction such as 0.9 (90% accuracy)"),
    ),
    Parameter(
        name="baseline_uri",
        type=str,
        default="",
        doc="""an earlier model's eval.json (s3:// or a path) to compare against;
            latest: the model last published under publish_uri (its latest.json; none
            published yet: no baseline); empty for none.""",
        rule=rules.baseline_uri,
    ),
    Parameter(
        name="tolerance",
        type=float,
        default=0.01,
        doc="""allowed accuracy drop below the baseline, between 0 and 1.""",
        rule=rules.fraction("a fraction such as 0.01 (one point of accuracy)"),
    ),
)
"""The pipeline's parameters, in the order the UI shows them."""


def declared(storage: str) -> tuple[Parameter, ...]:
    """The parameters of the pipeline compiled for ``storage``."""
    return tuple(p for p in PARAMETERS if p.storage in (None, storage))


def parameter(name: str) -> Parameter:
    return next(p for p in PARAMETERS if p.name == name)


def function_inputs(parameters: Sequence[Parameter], *, image: str) -> list[FunctionInput]:
    """``parameters`` as the inputs of a generated KFP function."""
    return [
        FunctionInput(
            name=p.name, annotation=p.type.__name__, default=p.default_for(image), doc=p.doc
        )
        for p in parameters
    ]


def signature(parameters: Sequence[Parameter], *, image: str) -> inspect.Signature:
    """The pipeline function's signature (KFP reads the parameters from it)."""
    return inspect.Signature(
        [
            inspect.Parameter(
                p.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=p.type,
                default=inspect.Parameter.empty if p.default is REQUIRED else p.default_for(image),
            )
            for p in parameters
        ]
    )


def step_parameters() -> dict[str, str]:
    """{training step input: the parameter that sets it as it is}."""
    return {p.step_input: p.name for p in PARAMETERS if p.step_input}


def pipeline_flags() -> dict[str, str]:
    """{trainer flag the pipeline sets: why trainer_args may not}: the flags of parameters (the
    step's inputs that carry a trainer flag) and ``SET_BY_PIPELINE``."""
    by_input = step_parameters()
    owned = {
        flag: f"is the pipeline parameter {by_input[name]}; set -p {by_input[name]}=... instead"
        for name, flag in trainer_flag_inputs().items()
        if name in by_input
    }
    return owned | SET_BY_PIPELINE


def listing(storage: str, *, image: str) -> str:
    """Every parameter of the pipeline compiled for ``storage``: name, type, default, doc."""
    lines = []
    for p in declared(storage):
        default = "required" if p.default is REQUIRED else f"default {p.default_for(image)!r}"
        lines.append(f"{p.name} ({p.type.__name__}, {default})")
        lines += [f"    {line}" for line in p.doc.splitlines()]
    return "\n".join(lines)


def trainer_args_problem(value: Any) -> str | None:
    """A list of strings, none of them a flag the pipeline sets (``pipeline_flags``)."""
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        return 'must be a list of strings, e.g. ["--augment", "none"]'
    owned = pipeline_flags()
    for arg in value:
        why = owned.get(arg.split("=", 1)[0])
        if why:
            return f"{arg.split('=', 1)[0]} {why}"
    return None
