# Two commands do all the set-up: `make demo` and `make test` (both run `setup` first).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The image and the component files carry the package version (a test holds them equal).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
RELEASE_IMAGE := ghcr.io/kfp-ddp/kfp-ddp:$(VERSION)
IMAGE  ?= $(RELEASE_IMAGE)

.PHONY: setup test test-profile lint format demo bench generate compile components image image-local image-mpi image-local-mpi image-ray image-local-ray constraints clean

setup: $(STAMP)

# torch goes in first and alone: anything that depends on an unpinned torch would otherwise pull
# a multi-GB CUDA build. Everything else is pinned by constraints.txt.
$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required (set PYTHON=...)"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt torch
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

test: setup
	$(PY) -m pytest

# One test at a time, so that each test's machine-wide CPU is its own: the summary ranks the files
# by it (tests/cpu_time.py). Slower than `make test`; for finding what the suite spends.
test-profile: setup
	$(PY) -m pytest -n 0

# Style, the layers and no import circles (.importlinter), and the types of every package.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

demo: setup
	$(PY) -m pipelines.demo

# Each prints its figures and ratios against a baseline measured in the same run.
BENCHMARKS := $(sort $(wildcard benchmarks/*.py))
bench: setup
	@for script in $(BENCHMARKS); do echo "== $$script"; $(PY) $$script || exit 1; done

# The KFP functions written from their declarations (pipelines/generate.py): the compiled
# pipelines and component files embed them (a test holds them current).
generate: setup
	$(PY) -m pipelines.generate

compile: generate
	$(VENV)/bin/kfp-ddp compile --storage object-store
	$(VENV)/bin/kfp-ddp compile --storage shared-volume

# The component files for pipelines of your own (a golden test diffs them).
components: generate
	$(VENV)/bin/kfp-ddp compile-components --image $(RELEASE_IMAGE) --output components/compiled

# The image, with docker, podman or buildah (whichever this machine has; CONTAINER_TOOL= chooses).
image:
	IMAGE=$(IMAGE) image/build.sh release

# The CPU image localhost/kfp-ddp:$(VERSION)-cpu with no registry at all (a Debian base made by
# mmdebstrap, the wheels from this machine's pip): for machines without GPUs, and for the tests.
image-local: setup
	PYTHON=$(PY) image/build.sh local

# The MPI variants ($(IMAGE)-mpi, localhost/kfp-ddp:$(VERSION)-cpu-mpi): the image plus OpenMPI and
# sshd, for the MPI runtime manifests/kfp-ddp-mpi-runtime.yaml (image/mpi/).
image-mpi:
	IMAGE=$(IMAGE) image/build.sh release-mpi

image-local-mpi: setup
	PYTHON=$(PY) image/build.sh local-mpi

# The Ray variants ($(IMAGE)-ray, localhost/kfp-ddp:$(VERSION)-cpu-ray): the image with the `ray`
# extra (ray[default,train]; --build-arg EXTRAS=ray), for a RayJob's pods (api=rayjob).
image-ray:
	IMAGE=$(IMAGE) image/build.sh release-ray

image-local-ray: setup
	PYTHON=$(PY) image/build.sh local-ray

constraints: setup
	{ head -n 2 constraints.txt; $(PY) -m pip freeze --exclude-editable | sed -E 's/\+(cpu|cu[0-9]+)$$//'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) demo-output .pytest_cache .ruff_cache
