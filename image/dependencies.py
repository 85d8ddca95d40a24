"""What the image's dependency layer installs (stdlib only: it runs in the bare base image).

    python dependencies.py pyproject.toml                  # the project's dependencies, a line each
    python dependencies.py constraints.txt --variant cuda  # the pins, less those the base owns

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


def project_dependencies(pyproject: Path) -> list[str]:
    with pyproject.open("rb") as handle:
        return list(tomllib.load(handle)["project"]["dependencies"])


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
    args = parser.parse_args(argv)
    if args.file.suffix == ".toml":
        lines = project_dependencies(args.file)
    else:
        lines = image_constraints(args.file, args.variant)
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
