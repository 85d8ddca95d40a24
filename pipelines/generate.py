"""``python -m pipelines.generate [--check]``: write the modules of the KFP functions whose
parameters are declared elsewhere (``make components`` runs it; a test runs ``--check``).

A lightweight KFP component embeds its function's source, so a function whose signature comes
from a declaration (the training step's inputs dataclass, the pipeline's parameters) is written
out as source here, once, and imported like any other module:

- ``components/kfp/generated_training_job.py``: the training component's function, from
  ``components.launcher.step.TrainingStepInputs`` (``components.kfp.launcher``);
- ``pipelines/generated_check_step.py``: the pipeline's first step, from
  ``pipelines.parameters.PARAMETERS`` (``pipelines.steps``);
- ``trainer/model_names.py``: the names ``--model`` takes, from torchvision's model registry
  (``trainer.models``), for the checks that run without torchvision.

``--check`` writes nothing and exits 1 naming each file that differs from its declaration.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from components.kfp.launcher import training_job_source
from kfp_ddp.atomic_files import write_text_atomic
from pipelines.steps import check_step_source
from trainer.models import model_names_source

REPO = Path(__file__).resolve().parents[1]
GENERATED: dict[str, Callable[[], str]] = {
    "components/kfp/generated_training_job.py": training_job_source,
    "pipelines/generated_check_step.py": check_step_source,
    "trainer/model_names.py": model_names_source,
}
"""Each generated module (from the repository's root) → what writes its text."""


def stale(root: Path = REPO) -> list[str]:
    """The generated modules whose text differs from what their declarations write now."""
    return [
        name
        for name, write in GENERATED.items()
        if not (root / name).is_file() or (root / name).read_text() != write()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.generate", description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    names = stale()
    if args.check:
        for name in names:
            print(f"{name} is stale: run `make components`", file=sys.stderr)
        return 1 if names else 0
    for name in names:
        write_text_atomic(REPO / name, GENERATED[name]())
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
