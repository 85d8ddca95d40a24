"""Component files: one KFP component YAML per reusable step, for pipelines of your own.

``kfp-ddp compile-components --image IMG --output DIR`` writes them with KFP's own compiler; a
pipeline loads them with ``kfp.components.load_component_from_file`` (or ``_from_url``, pinned to
a release tag) and needs nothing of this package on its side: the component bodies run in the
image, which carries the code. The repository keeps them under ``components/compiled/``, compiled
for the release image ``components.DEFAULT_IMAGE`` (its tag is the package version), and a
golden test keeps them in sync with the code.

Each file pins its image, describes every input and output (from the functions' Google-style
docstrings; the Kubeflow UI shows them), and names the package version and the image in its
description (the file's ``# Description:`` header). KFP keeps neither a description nor
platform settings such as pod labels when a loaded component is used in a pipeline (measured,
kfp 2.17), so in a run the version shows as the image's tag.
"""

# No `from __future__ import annotations`: KFP reads the component functions' real annotations.
import functools
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kfp import compiler
from kfp.dsl.python_component import PythonComponent

from components import DEFAULT_IMAGE
from components.kfp.evaluate import make_evaluate_op
from components.kfp.factory import make_component
from components.kfp.launcher import make_cleanup_op, make_training_job_op
from components.kfp.s3_sync import make_s3_sync_op
from kfp_ddp import __version__
from kfp_ddp.atomic_files import write_atomic
from pipelines.steps import list_dataset_step, publish_model_step, stage_dataset_step

COMPILED_DIR = Path(__file__).resolve().parents[1] / "components" / "compiled"
"""The committed component files (compiled for ``DEFAULT_IMAGE``; a golden test diffs them)."""


@dataclass(frozen=True, kw_only=True)
class ComponentFile:
    """One component file: its name and the factory of its component."""

    file_name: str
    """The YAML file's name in the output folder."""
    factory: Callable[..., PythonComponent]
    """Builds the component; called as ``factory(image=IMAGE)``."""

    def component(self, image: str) -> PythonComponent:
        """The component on ``image``, its description ending in the version line."""
        op = self.factory(image=image)
        # The compiler writes the component's attribute; its spec keeps the same text.
        op.description = f"{op.description}\n{version_line(image)}"
        op.component_spec.description = op.description
        return op


COMPONENT_FILES = (
    ComponentFile(file_name="s3_sync.yaml", factory=make_s3_sync_op),
    # The pipeline's data step: a sync into a folder of its own source, checked for train/ and
    # val/ and frozen by digest. Reusable by any pipeline that trains on an ImageFolder from S3
    # (what the trainer and the evaluation read), and safer than a plain sync into a shared
    # folder: runs of other data never share or delete each other's files.
    ComponentFile(
        file_name="stage_dataset.yaml",
        factory=functools.partial(make_component, stage_dataset_step),
    ),
    # The object-store pipeline's data step: the same check and digest from a listing, nothing
    # downloaded (each training node stages the data itself: training_job's data_uri).
    ComponentFile(
        file_name="list_dataset.yaml",
        factory=functools.partial(make_component, list_dataset_step),
    ),
    ComponentFile(file_name="training_job.yaml", factory=make_training_job_op),
    ComponentFile(file_name="cleanup_jobs.yaml", factory=make_cleanup_op),
    ComponentFile(file_name="evaluate.yaml", factory=make_evaluate_op),
    ComponentFile(
        file_name="publish_model.yaml",
        factory=functools.partial(make_component, publish_model_step),
    ),
)
"""Every component file, in the order ``compile-components`` writes them."""


def version_line(image: str) -> str:
    """The line that ends every component file's description."""
    return f"kfp-ddp {__version__}, image {image}"


def compile_component(component: PythonComponent, path: Path) -> Path:
    """Compile ``component`` to the YAML file ``path`` (atomically)."""
    with tempfile.TemporaryDirectory(prefix="kfp-ddp-component-") as tmp:
        compiled = Path(tmp) / Path(path).name
        compiler.Compiler().compile(pipeline_func=component, package_path=str(compiled))
        data = compiled.read_bytes()
    write_atomic(Path(path), lambda handle: handle.write(data))
    return Path(path)


def compile_components(output_dir: Path, *, image: str = DEFAULT_IMAGE) -> list[Path]:
    """Write every component file for ``image`` into ``output_dir``; returns their paths.

    Every component is built before anything is written, so a bad ``image`` (ValueError naming
    it) leaves the folder untouched. Files of these names are replaced; other files are left
    alone.
    """
    built = [(entry.file_name, entry.component(image)) for entry in COMPONENT_FILES]
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    return [compile_component(component, output_dir / name) for name, component in built]
