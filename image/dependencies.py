"""What the image's dependency layers install (stdlib only: it runs in the bare base image).

    python dependencies.py pyproject.toml                    # the project's dependencies
    python dependencies.py pyproject.toml --extras ray       # ... plus those of the extra `ray`
    python dependencies.py pyproject.toml --only-extras ray  # those of the extra `ray` alone
    python dependencies.py constraints.txt --variant cuda    # the pins, less those the base owns

The Dockerfile installs the project's dependencies and its extras' (``--only-extras``, none by
default) in layers of their own: an image with an extra reuses the plain image's dependency layer.

The CUDA base image owns torch, torchvision and the CUDA libraries they were built with: their
pins are dropped so pip never replaces them. The CPU variant keeps every pin.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

OWNED_BY_CUDA_BASE = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-[a-z0-9-]+)==")


def project_dependencies(
    pyproject: Path, extras: list[str] | None = None, *, only_extras: bool = False
) -> list[str]:
    """The dependencies, plus those of each of ``extras`` (pyproject's optional-dependencies);
    with ``only_extras``, those of ``extras`` alone."""
    with pyproject.open("rb") as handle:
        project = tomllib.load(handle)["project"]
    found = [] if only_extras else list(project["dependencies"])
    optional = project.get("optional-dependencies", {})
    for extra in extras or []:
        if extra not in optional:
            raise SystemExit(f"EXTRAS={extra!r}: pyproject.toml has the extras {sorted(optional)}")
        found += optional[extra]
    return found


def image_constraints(constraints: Path, variant: str) -> list[str]:
    lines = [x.strip() for x in constraints.read_text().splitlines()]
    pins = [x for x in lines if x and not x.startswith("#")]
    if variant == "cuda":
        pins = [x for x in pins if not OWNED_BY_CUDA_BASE.match(x)]
    return pins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path, help="pyproject.toml or a constraints file")
    parser.add_argument("--variant", choices=("cuda", "cpu"), default="cpu")
    listed = parser.add_mutually_exclusive_group()
    listed.add_argument("--extras", default="", help="extras to add, comma-separated (ray)")
    listed.add_argument(
        "--only-extras", default=None, help="extras to list alone, comma-separated (none: nothing)"
    )
    args = parser.parse_args(argv)
    if args.file.suffix == ".toml":
        only_extras = args.only_extras is not None
        names = args.only_extras if only_extras else args.extras
        extras = [e.strip() for e in names.split(",") if e.strip()]
        lines = project_dependencies(args.file, extras, only_extras=only_extras)
    else:
        lines = image_constraints(args.file, args.variant)
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
