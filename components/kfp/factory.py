"""Turn a plain, self-contained function into a KFP lightweight component on our image."""

from __future__ import annotations

from collections.abc import Callable

from kfp import dsl
from kfp.dsl.python_component import PythonComponent

from components import DEFAULT_IMAGE
from kfp_ddp.image_reference import image_problem


def make_component(
    func: Callable, *, image: str = DEFAULT_IMAGE, task_config_passthroughs: list | None = None
) -> PythonComponent:
    """Build the component of ``func`` to run on ``image``.

    The image already has kfp and this package installed, so nothing is pip-installed at run time
    (``install_kfp_package=False``); that also keeps ``kfp.local`` runs from touching the venv.
    ``task_config_passthroughs``: the task settings KFP forwards to ``func``'s ``dsl.TaskConfig``
    input instead of (or besides) applying them to the step's pod.
    """
    problem = image_problem(image)
    if problem:
        raise ValueError(f"image={image!r} is not a container image reference: {problem}")
    return dsl.component(
        func,
        base_image=image,
        install_kfp_package=False,
        task_config_passthroughs=task_config_passthroughs,
    )
