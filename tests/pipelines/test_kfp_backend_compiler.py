"""What we ship goes through the Kubeflow Pipelines backend's own compiler.

Every compiled pipeline (``pipelines/compiled/``), every component file (``components/compiled/``)
and the compose example become Argo Workflows with ``kfp-argo-compile`` — what the KFP API server
does at upload / run time — and a real kube-apiserver admits each Workflow against the official
Argo Workflow CRD with strict field validation (a dry-run create: nothing is stored). Each
Workflow is also read: every step of the PipelineSpec has its driver and executor tasks, runs
our image with the spec's command, keeps its kfp-kubernetes settings (the Secret the S3 keys come
from, the workspace claim) and its retry policy, and holds no credential.

Needs ``../shared``: the compiler and the API server from ``envtest/``, the CRD from
``reference/``; without them the tests skip, saying what is missing.
"""

# No `from __future__ import annotations`: KFP reads the control pipeline's real annotations.

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kfp import compiler, dsl

from components import DEFAULT_IMAGE
from pipelines.component_files import COMPILED_DIR
from tests import yaml_fast
from tests.cluster.assets import COMPILER, HOW_TO_GET, find_binaries
from tests.cluster.control_plane import ARGO_WORKFLOWS
from tests.cluster.plugin import Cluster, Clusters
from tests.examples.test_compose_example import load_example
from tests.pipelines.test_training_pipeline_yaml import CREDENTIAL_PATTERNS

REPO = Path(__file__).resolve().parents[2]
COMPOSE_EXAMPLE = "examples/compose/pipeline.py"
SHIPPED = [
    *sorted((REPO / "pipelines" / "compiled").glob("*.yaml")),
    *sorted(COMPILED_DIR.glob("*.yaml")),
]
CASES = [str(path.relative_to(REPO)) for path in SHIPPED] + [COMPOSE_EXAMPLE]
"""One per file we ship (the test ids name it)."""

ARGO_GROUP, ARGO_VERSION, ARGO_PLURAL = "argoproj.io", "v1alpha1", "workflows"
CREDENTIAL_ENV = re.compile(r"^AWS_(SECRET_ACCESS_KEY|ACCESS_KEY_ID|SESSION_TOKEN)$")
CREDENTIAL_PARAMETER = re.compile(r"secret_access|access_key|password|token_value", re.IGNORECASE)
PLANTED_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
"""AWS's documentation example key: a control pipeline carries it to prove the scan finds it."""


def test_every_file_we_ship_is_a_case() -> None:
    assert {Path(case).parent.as_posix() for case in CASES} == {
        "pipelines/compiled",
        "components/compiled",
        "examples/compose",
    }
    assert len(SHIPPED) >= 9  # 2 pipelines, 7 component files at the time of writing


# -- compiling ---------------------------------------------------------------------------------


@dataclass
class Compiled:
    """A PipelineSpec file and the Argo Workflow the backend compiler made of it."""

    spec_file: Path
    pipeline: dict[str, Any]
    platform: dict[str, Any]
    workflow: dict[str, Any]


def backend_compile(binary: Path, spec_file: Path) -> dict[str, Any]:
    """``kfp-argo-compile --spec FILE``'s Workflow (its error output fails the test)."""
    result = subprocess.run(
        [str(binary), "--spec", str(spec_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(
            f"kfp-argo-compile refused {spec_file} (exit {result.returncode}):\n"
            f"{result.stderr[-3000:]}"
        )
    return yaml_fast.safe_load(result.stdout)


@dataclass
class Workflows:
    """Each case compiled once, on first use."""

    binary: Path
    folder: Path
    done: dict[str, Compiled] = field(default_factory=dict)

    def __getitem__(self, case: str) -> Compiled:
        if case not in self.done:
            spec_file = self._spec_file(case)
            documents = [d for d in yaml_fast.safe_load_all(spec_file.read_text()) if d]
            self.done[case] = Compiled(
                spec_file=spec_file,
                pipeline=documents[0],
                platform=documents[1] if len(documents) > 1 else {},
                workflow=backend_compile(self.binary, spec_file),
            )
        return self.done[case]

    def _spec_file(self, case: str) -> Path:
        if case != COMPOSE_EXAMPLE:
            return REPO / case
        # As its own test compiles it: the example's pipeline from the component files.
        output = self.folder / "compose_example.yaml"
        pipeline = load_example().build_pipeline(str(COMPILED_DIR))
        compiler.Compiler().compile(pipeline, str(output))
        return output


@pytest.fixture(scope="module")
def compiler_binary() -> Path:
    binaries = find_binaries((COMPILER,))
    if binaries.missing((COMPILER,)):
        pytest.skip(f"no {COMPILER} (the KFP backend's compiler): {HOW_TO_GET}")
    return binaries[COMPILER]


@pytest.fixture(scope="module")
def workflows(compiler_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Workflows:
    return Workflows(compiler_binary, tmp_path_factory.mktemp("kfp-backend"))


# -- the API server ----------------------------------------------------------------------------


@dataclass
class ArgoApi:
    """Dry-run creates of Workflows in a namespace of a bare plane that serves the Argo CRD."""

    cluster: Cluster
    namespace: str

    def create(self, workflow: dict[str, Any]) -> dict[str, Any]:
        from kubernetes import client

        return client.CustomObjectsApi(self.cluster.clients()).create_namespaced_custom_object(
            ARGO_GROUP,
            ARGO_VERSION,
            self.namespace,
            ARGO_PLURAL,
            workflow,
            dry_run="All",
            field_validation="Strict",
        )


@pytest.fixture(scope="module")
def argo(clusters: Clusters) -> Iterator[ArgoApi]:
    if not ARGO_WORKFLOWS.is_file():
        pytest.skip(
            f"the official Argo Workflow CRD is not there ({ARGO_WORKFLOWS}): put ../shared "
            "(reference/) beside the repository"
        )
    cluster = clusters.get(())  # etcd + kube-apiserver: admission needs no controller
    cluster.plane.install_crds(("argo",))
    namespace = cluster.create_namespace("kfp-backend-compiler")
    try:
        yield ArgoApi(cluster, namespace)
    finally:
        cluster.clear_namespace(namespace)


def admitted(argo: ArgoApi, workflow: dict[str, Any], what: str) -> dict[str, Any]:
    """The object the API server would store; a refusal fails with the server's message."""
    from kubernetes.client.rest import ApiException

    try:
        return argo.create(workflow)
    except ApiException as exc:
        pytest.fail(f"the API server refused the Workflow of {what} ({exc.status}):\n{exc.body}")


@pytest.mark.parametrize("case", CASES)
def test_the_api_server_admits_the_workflow(case: str, workflows: Workflows, argo: ArgoApi) -> None:
    workflow = workflows[case].workflow
    stored = admitted(argo, workflow, case)
    assert stored["kind"] == "Workflow"
    assert stored["metadata"]["name"].startswith(workflow["metadata"]["generateName"])
    assert stored["metadata"]["namespace"] == argo.namespace
    # Nothing was dropped on the way in (strict validation refuses rather than prunes).
    assert [t["name"] for t in stored["spec"]["templates"]] == [
        t["name"] for t in workflow["spec"]["templates"]
    ]
    assert stored["spec"]["arguments"] == workflow["spec"]["arguments"]


def test_strict_validation_refuses_what_the_crd_does_not_know(
    workflows: Workflows, argo: ArgoApi
) -> None:
    """The control: the same server refuses a Workflow with an unknown or mistyped field."""
    from kubernetes.client.rest import ApiException

    good = workflows[CASES[0]].workflow
    unknown = json.loads(json.dumps(good))
    unknown["spec"]["templates"][0]["container"]["imagePullPolcy"] = "Always"
    with pytest.raises(ApiException) as refused:
        argo.create(unknown)
    assert refused.value.status in (400, 422)
    assert "imagePullPolcy" in refused.value.body

    mistyped = json.loads(json.dumps(good))
    mistyped["spec"]["parallelism"] = "many"
    with pytest.raises(ApiException) as refused:
        argo.create(mistyped)
    assert refused.value.status in (400, 422)
    assert "parallelism" in refused.value.body


# -- what the Workflow holds -------------------------------------------------------------------


def _decoded(value: Any) -> Any:
    """``value`` with every JSON document inside a string decoded (the compiler embeds the
    PipelineSpec's parts as JSON strings)."""
    if isinstance(value, dict):
        return {key: _decoded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_decoded(item) for item in value]
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return _decoded(json.loads(value))
        except json.JSONDecodeError:
            return value
    return value


@dataclass(frozen=True)
class Step:
    """A task of the PipelineSpec that runs a container."""

    task: str
    executor: str
    retry: dict[str, Any] | None


def steps_of(pipeline: dict[str, Any]) -> list[Step]:
    """Every container task of the PipelineSpec, in the root DAG and in nested ones."""
    dags = [pipeline["root"], *pipeline.get("components", {}).values()]
    found = []
    for dag in dags:
        for name, task in dag.get("dag", {}).get("tasks", {}).items():
            component = pipeline["components"][task["componentRef"]["name"]]
            if "executorLabel" in component:
                found.append(Step(name, component["executorLabel"], task.get("retryPolicy")))
    return found


def dag_tasks(workflow: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The Workflow's DAG tasks by name, their arguments by name (workflow parameters
    resolved, JSON decoded)."""
    parameters = {p["name"]: p["value"] for p in workflow["spec"]["arguments"]["parameters"]}
    reference = re.compile(r"^\{\{workflow\.parameters\.([^}]+)\}\}$")

    def resolve(value: str) -> Any:
        match = reference.match(value)
        return _decoded(parameters[match.group(1)] if match else value)

    tasks = {}
    for template in workflow["spec"]["templates"]:
        for task in template.get("dag", {}).get("tasks", []):
            arguments = task.get("arguments", {}).get("parameters", [])
            tasks[task["name"]] = {
                "template": task["template"],
                "arguments": {a["name"]: resolve(str(a.get("value", ""))) for a in arguments},
            }
    return tasks


@pytest.mark.parametrize("case", CASES)
def test_every_step_runs_our_image_with_its_settings(case: str, workflows: Workflows) -> None:
    compiled = workflows[case]
    steps = steps_of(compiled.pipeline)
    assert steps, f"{case}: no container step in the PipelineSpec"
    executors = compiled.pipeline["deploymentSpec"]["executors"]
    platform = compiled.platform.get("platforms", {}).get("kubernetes", {})
    settings = platform.get("deploymentSpec", {}).get("executors", {})
    tasks = dag_tasks(compiled.workflow)
    for step in steps:
        driver, executor = tasks[f"{step.task}-driver"], tasks[step.task]
        assert driver["template"] == "system-container-driver", step
        container = driver["arguments"]["container"]
        assert container["image"] == DEFAULT_IMAGE, step
        assert container == executors[step.executor]["container"], step
        # kfp-kubernetes settings (Secret-backed env, claim mounts) reach the driver intact.
        if step.executor in settings:
            assert driver["arguments"]["kubernetes-config"] == settings[step.executor], step
        else:
            assert "kubernetes-config" not in driver["arguments"], step
        if step.retry:
            assert executor["template"] == "retry-system-container-executor", step
            retries = executor["arguments"]["retry-max-count"]
            assert retries == str(step.retry["maxRetryCount"]), step
        else:
            assert executor["template"] == "system-container-executor", step
    # Every executor the platform document configures belongs to a step.
    assert set(settings) <= {step.executor for step in steps}


def credentials_in(workflow: dict[str, Any]) -> list[str]:
    """What in ``workflow`` looks like a credential value (empty: nothing)."""
    findings = []
    text = json.dumps(_decoded(workflow))
    findings += [f"matches {p.pattern}" for p in CREDENTIAL_PATTERNS if p.search(text)]

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            name = value.get("name") or value.get("envVar") or ""
            if CREDENTIAL_ENV.match(str(name)) and value.get("value"):
                findings.append(f"{path}: {name} has a literal value")
            for key, item in value.items():
                if CREDENTIAL_PARAMETER.search(key) and item not in ("", None):
                    findings.append(f"{path}.{key}: a credential-named parameter with a value")
                walk(item, f"{path}.{key}")
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{path}[{index}]")

    walk(_decoded(workflow), "workflow")
    return findings


@pytest.mark.parametrize("case", CASES)
def test_the_workflow_holds_no_credentials(case: str, workflows: Workflows) -> None:
    workflow = workflows[case].workflow
    assert credentials_in(workflow) == []
    # The S3 keys come from a Secret, by key name: never a value.
    for task in dag_tasks(workflow).values():
        config = task["arguments"].get("kubernetes-config")
        for secret in (config or {}).get("secretAsEnv", []):
            assert {e["secretKey"] for e in secret["keyToEnv"]} <= {
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
            }
            assert "secretNameParameter" in secret or "secretName" in secret


def leaky_pipeline() -> Any:
    """A pipeline that puts a key in a step's env: what the scan must catch."""

    @dsl.component(base_image=DEFAULT_IMAGE)
    def leaky_step() -> str:
        return "x"

    @dsl.pipeline(name="leaky")
    def pipeline() -> None:
        leaky_step().set_env_variable("AWS_SECRET_ACCESS_KEY", PLANTED_SECRET)

    return pipeline


def test_the_credential_scan_finds_a_planted_key(compiler_binary: Path, tmp_path: Path) -> None:
    """The control: a pipeline that puts a key in a step's env is caught in its Workflow."""
    spec_file = tmp_path / "leaky.yaml"
    compiler.Compiler().compile(leaky_pipeline(), str(spec_file))
    findings = credentials_in(backend_compile(compiler_binary, spec_file))
    assert any("AWS_SECRET_ACCESS_KEY has a literal value" in f for f in findings), findings
    assert any("wJalrXUtnFEMI" in f for f in findings), findings
