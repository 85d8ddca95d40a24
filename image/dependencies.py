"""What the image's dependency layer installs (stdlib only: it runs in the bare base image).

    python dependencies.py pyproject.toml                  # the project's dependencies, a line each
    python dependencies.py pyproject.toml --extras ray     # ... plus those of the extra `ray`
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


def project_dependencies(pyproject: Path, extras: list[str] | None = None) -> list[str]:
    """The dependencies, plus those of each of ``extras`` (pyproject's optional-dependencies)."""
    with pyproject.open("rb") as handle:
        project = tomllib.load(handle)["project"]
    found = list(project["dependencies"])
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
    parser.add_argument("--extras", default="", help="extras to add, comma-separated (ray)")
    args = parser.parse_args(argv)
    if args.file.suffix == ".toml":
        lines = project_dependencies(args.file, [e for e in args.extras.split(",") if e.strip()])
    else:
        lines = image_constraints(args.file, args.variant)
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
