"""Images of the examples' programs, built on our CPU image for the real node's tests.

``mpi_image``: our image plus OpenMPI and sshd (``image/build.sh local-mpi``).

``ray_image``: our image's Ray variant (``image/build.sh local-ray``: the Dockerfile with
``EXTRAS=ray``, as users build it), plus the Ray example at ``/app/count_primes.py``.

``xgboost_example_image``: ``examples/xgboost/train.py`` at ``/app/train.py`` with xgboost (CPU)
and scikit-learn installed into the image's own environment from a wheelhouse made on this
machine (``pip wheel`` with the project's pins, cached beside the CPU image's wheels), built
without network like the CPU image, and labelled with the hash of its inputs: a warm suite finds
it up to date.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from tests.containers.podman import REPO, Podman

CACHE = Path(os.environ.get("KFP_DDP_IMAGE_CACHE", Path.home() / ".cache" / "kfp-ddp" / "image"))
XGBOOST_PACKAGES = ("xgboost-cpu", "scikit-learn")
INPUTS_LABEL = "io.kfp-ddp.example-inputs"
CONTAINERFILE = """\
FROM {base}
USER 0
{install}{copies}USER 1000:1000
"""
INSTALL = "RUN python -m pip install --no-cache-dir --no-index --find-links /wheels {packages}\n"


def _pins(packages: tuple[str, ...]) -> list[str]:
    """The project's pins of ``packages`` (constraints.txt)."""
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        name, _, version = line.partition("==")
        if version:
            pins[name.strip().lower()] = f"{name.strip()}=={version.strip()}"
    return [pins.get(p, p) for p in packages]


def wheelhouse(packages: tuple[str, ...]) -> Path:
    """A folder with the wheels of ``packages`` and their dependencies (made once)."""
    pins = _pins(packages)
    constraints = (REPO / "constraints.txt").read_text()
    key = hashlib.sha256(" ".join([*pins, constraints]).encode()).hexdigest()[:16]
    folder = CACHE / f"example-wheels-{key}"
    if not folder.is_dir():
        partial = folder.with_name(folder.name + ".tmp")
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(partial)),
                *("-c", str(REPO / "constraints.txt"), *pins),
            ],
            check=True,
            capture_output=True,
            timeout=900,
        )
        partial.rename(folder)
    return folder


def xgboost_example_image(podman: Podman, cpu_image: str, folder: Path) -> str:
    """The XGBoost example's image on ``cpu_image`` (built unless up to date)."""
    program = REPO / "examples" / "xgboost" / "train.py"
    return _layered_image(
        podman, cpu_image, folder, "kfp-ddp-xgb-example", XGBOOST_PACKAGES, {"train.py": program}
    )


def ray_image(podman: Podman, cpu_image: str, folder: Path) -> str:
    """Our image's Ray variant on ``cpu_image`` (``image/build.sh local-ray``: the ``ray`` extra,
    ``ray[default,train]``, what a RayJob's pods run, from the wheelhouse without network), plus
    the Ray example at ``/app/count_primes.py`` in a layer of its own (built unless up to date)."""
    variant = podman.build_script("local-ray", python=sys.executable, timeout=900)
    assert variant == f"{cpu_image}-ray", (variant, cpu_image)
    program = REPO / "examples" / "ray" / "count_primes.py"
    return _layered_image(podman, variant, folder, "kfp-ddp-ray", (), {"count_primes.py": program})


def _layered_image(
    podman: Podman,
    cpu_image: str,
    folder: Path,
    repository: str,
    packages: tuple[str, ...],
    files: dict[str, Path],
) -> str:
    """``cpu_image`` plus ``packages`` (from this machine's wheelhouse; none: no install step)
    and ``files`` at /app/."""
    install = INSTALL.format(packages=" ".join(_pins(packages))) if packages else ""
    containerfile = CONTAINERFILE.format(
        base=cpu_image,
        install=install,
        copies="".join(f"COPY {name} /app/{name}\n" for name in files),
    )
    base_id = podman.run("image", "inspect", "--format", "{{.Id}}", cpu_image).stdout.strip()
    digest = hashlib.sha256(
        "\0".join([containerfile, base_id, *(p.read_text() for p in files.values())]).encode()
    ).hexdigest()[:16]
    name = f"localhost/{repository}:test"
    found = podman.run(
        "image", "inspect", "--format", f'{{{{index .Labels "{INPUTS_LABEL}"}}}}', name, check=False
    )
    if found.returncode == 0 and found.stdout.strip() == digest:
        return name
    context = folder / repository
    context.mkdir(parents=True, exist_ok=True)
    (context / "Containerfile").write_text(containerfile)
    for file_name, path in files.items():
        (context / file_name).write_text(path.read_text())
    wheels = ("--volume", f"{wheelhouse(packages)}:/wheels:ro") if packages else ()
    podman.run(
        "build", "--pull=never", "--network=none", *wheels,
        "--label", f"{INPUTS_LABEL}={digest}", "-t", name, str(context),
        timeout=900,
    )  # fmt: skip
    return name


def mpi_image(podman: Podman, cpu_image: str) -> str:
    """Our image's MPI variant on ``cpu_image`` (``image/build.sh local-mpi``: OpenMPI and sshd
    from Debian packages this machine's apt downloads, no network in the build)."""
    name = podman.build_script("local-mpi", python=sys.executable, timeout=900)
    assert name == f"{cpu_image}-mpi", (name, cpu_image)
    return name
