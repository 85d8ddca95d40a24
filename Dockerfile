# The one image every pipeline step and every training node (TrainJob node, PyTorchJob replica) runs.
#
# One Dockerfile, two variants (`make image`, `make image-local`; image/build.sh runs the build):
#   VARIANT=cuda (default): an official PyTorch CUDA *runtime* image; its torch/torchvision are
#     built for its CUDA and kept (never reinstalled from PyPI).
#   VARIANT=cpu: any Debian-like base with python3 and python3-venv (e.g. debian:bookworm-slim, or
#     the registry-free base `make image-local` makes with mmdebstrap); torch and torchvision are
#     installed into /opt/venv: from PyTorch's CPU index, or from a wheelhouse mounted at /wheels.
# Either with EXTRAS=ray (`make image-ray`, `make image-local-ray`; tagged -ray): pyproject.toml's
# `ray` extra too, what a RayJob's pods run (api=rayjob).
# Everything else is installed with the exact pins of constraints.txt, so the image runs the
# versions the tests ran; the torch version of BASE_IMAGE must be constraints.txt's `torch==` pin
# (tests/trainer/test_dockerfile.py checks).
#
# Layers: the dependencies (pyproject.toml's list + constraints.txt) first, in layers of their
# own; then those of the extras (EXTRAS, none by default: an empty step), so an image with an
# extra (EXTRAS=ray: `make image-ray`, tagged -ray) reuses the plain image's dependency layer from
# the build cache and adds one layer; the package's sources last (`pip install --no-deps .`), so
# a source change rebuilds in seconds. A folder of wheels mounted at /wheels at build time
# (`podman build -v WHEELS:/wheels:ro`) makes the build install from it alone, without any index.
#
# The default matches Kubeflow Trainer v2.3's torch-distributed runtime. Each CUDA base needs a
# minimum NVIDIA driver on the nodes (NVIDIA's CUDA minor-version compatibility table):
#   pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime  CUDA 13.x: driver >= 580 (R580)
#   pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime  CUDA 12.x: driver >= 525 (12.8's own: 570)
# For nodes with an R525-R575 driver build the cu12.x variant (check that the tag exists):
#   docker build --build-arg BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime .
# A driver older than the image's CUDA makes the trainer exit 2 naming both versions (it never
# falls back to training on the CPU).
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime
ARG VARIANT=cuda

# What the dependency layers install, worked out from pyproject.toml and constraints.txt in a
# stage of its own: a layer below is rebuilt only when its list changes (not for a new version or
# a new test tool in pyproject.toml). EXTRAS is an ARG of this stage only: the dependency layer's
# cache key is the same with or without extras.
FROM ${BASE_IMAGE} AS requirements
ARG VARIANT
# Extras of pyproject.toml to install too, comma-separated: `ray` for a RayJob's image (api=rayjob).
ARG EXTRAS=""
COPY pyproject.toml constraints.txt image/dependencies.py /src/
RUN python3 /src/dependencies.py /src/pyproject.toml > /src/requirements.txt \
 && python3 /src/dependencies.py /src/pyproject.toml --only-extras "${EXTRAS}" > /src/requirements-extras.txt \
 && python3 /src/dependencies.py /src/constraints.txt --variant "${VARIANT}" > /src/constraints-image.txt

FROM ${BASE_IMAGE}
ARG VARIANT
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

# /opt/venv exists in the CPU variant only; on the CUDA base, PATH finds the base's own Python.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:${PATH}

# cuda: a C compiler for Triton (`--compile`, the default with CUDA, builds a small launcher
# module on its first step; the runtime images have none, Python's headers come with them).
# cpu: a virtual environment of the base's python3 (Debian's own is externally managed).
RUN set -eu; \
    case "${VARIANT}" in \
      cuda) apt-get update \
            && apt-get install -y --no-install-recommends gcc libc6-dev \
            && rm -rf /var/lib/apt/lists/* \
            && python -c "import os, sysconfig; assert os.path.isfile(os.path.join(sysconfig.get_paths()['include'], 'Python.h')), 'no Python.h: Triton cannot build its launcher'" ;; \
      cpu) python3 -m venv /opt/venv ;; \
      *) echo "VARIANT=${VARIANT}: expected cuda or cpu" >&2; exit 2 ;; \
    esac

WORKDIR /opt/kfp-ddp
COPY --from=requirements /src/requirements.txt /src/constraints-image.txt /tmp/deps/

# The dependencies, from /wheels alone when a wheelhouse is mounted there. cuda: the base owns
# torch, torchvision and their CUDA wheels (their pins are dropped). cpu: torch and torchvision
# first (PyTorch's CPU index, unless /wheels has them), then the rest.
RUN set -eu; \
    if [ -n "$(ls /wheels 2>/dev/null)" ]; then set -- --no-index --find-links /wheels; else set --; fi; \
    if [ "${VARIANT}" = cpu ]; then \
      if [ "$#" -eq 0 ]; then torch_from="--index-url ${TORCH_INDEX_URL}"; else torch_from=""; fi; \
      python -m pip install "$@" ${torch_from} -c /tmp/deps/constraints-image.txt torch torchvision; \
    fi; \
    python -m pip install "$@" -c /tmp/deps/constraints-image.txt -r /tmp/deps/requirements.txt setuptools; \
    rm -r /tmp/deps

# The extras' dependencies (EXTRAS=ray: ray[default,train], then a check that what a RayJob's pods
# run imports), with the same pins and from the same wheelhouse; nothing without extras.
COPY --from=requirements /src/requirements-extras.txt /src/constraints-image.txt /tmp/deps/
RUN set -eu; \
    if [ -s /tmp/deps/requirements-extras.txt ]; then \
      if [ -n "$(ls /wheels 2>/dev/null)" ]; then set -- --no-index --find-links /wheels; else set --; fi; \
      python -m pip install "$@" -c /tmp/deps/constraints-image.txt -r /tmp/deps/requirements-extras.txt; \
      if grep -q '^ray\[' /tmp/deps/requirements-extras.txt; then python -c "import ray, ray.train.torch"; fi; \
    fi; \
    rm -r /tmp/deps

COPY pyproject.toml README.md ./
COPY kfp_ddp ./kfp_ddp
COPY trainer ./trainer
COPY components ./components
COPY pipelines ./pipelines

# The package itself (not editable, no dependency resolution: they are all in the layer above),
# then a check that everything a step imports is importable. torchvision through the trainer's
# import (trainer.tv_compat): on a CPU torch, PyPI's torchvision is a CUDA build whose C++ ops
# cannot load.
RUN python -m pip install --no-deps --no-build-isolation --no-index . \
 && rm -rf build ./*.egg-info \
 && python -c "import torch, kfp, kfp.kubernetes, boto3, kubeflow.training, kubeflow_trainer_api, kfp_ddp, trainer, components, pipelines; from trainer.tv_compat import import_torchvision; import_torchvision()" \
 && kfp-ddp --help > /dev/null

# A non-root user of its own, the one the launcher runs the training pods as (TrainSpec.run_as_user
# / run_as_group 1000: restricted Pod Security). Base images that already have UID/GID 1000 (the
# "ubuntu" user of Ubuntu 24.04 images) give it up first. Its HOME holds every cache a step or the
# trainer writes (pip, Triton, TorchInductor, torch hub, matplotlib, the S3 sync's hash cache).
# KFP's launcher writes artifacts under /gcs, /minio and /s3 (a contract of its Python components,
# kubeflow/pipelines#5673): made here, owned by the user, so the steps run as non-root too.
# Group 0 owns them too, group-writable: OpenShift's restricted-v2 runs the image as an arbitrary
# UID with GID 0 (and /etc/passwd has no entry for it; nothing here needs one).
ARG APP_UID=1000
ARG APP_GID=1000
RUN set -eu; \
    old_user="$(getent passwd "${APP_UID}" | cut -d: -f1 || true)"; \
    if [ -n "$old_user" ]; then userdel --remove "$old_user" 2>/dev/null || userdel "$old_user"; fi; \
    old_group="$(getent group "${APP_GID}" | cut -d: -f1 || true)"; \
    if [ -n "$old_group" ]; then groupdel "$old_group"; fi; \
    groupadd --gid "${APP_GID}" kfp-ddp; \
    useradd --uid "${APP_UID}" --gid "${APP_GID}" --create-home --home-dir /home/kfp-ddp \
        --shell /usr/sbin/nologin kfp-ddp; \
    mkdir -p /home/kfp-ddp/.cache /gcs /minio /s3; \
    chown -R "${APP_UID}:0" /home/kfp-ddp /gcs /minio /s3; \
    chmod -R g=u /home/kfp-ddp; \
    chmod 0775 /gcs /minio /s3
ENV HOME=/home/kfp-ddp \
    XDG_CACHE_HOME=/home/kfp-ddp/.cache \
    TRITON_CACHE_DIR=/home/kfp-ddp/.cache/triton \
    TORCHINDUCTOR_CACHE_DIR=/home/kfp-ddp/.cache/torchinductor \
    TORCH_HOME=/home/kfp-ddp/.cache/torch \
    MPLCONFIGDIR=/home/kfp-ddp/.cache/matplotlib
# Numeric, so that the kubelet can check runAsNonRoot without reading /etc/passwd.
USER 1000:1000

# Last, so that a new version or commit changes this layer only (an ARG takes part in the cache
# key of every later instruction).
ARG VERSION=0+unknown
ARG REVISION=unknown
ARG EXTRAS=""
LABEL org.opencontainers.image.title="kfp-ddp" \
      org.opencontainers.image.description="Distributed PyTorch training as Kubeflow Pipelines: every step and training node" \
      org.opencontainers.image.source="https://github.com/kfp-ddp/kfp-ddp" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      io.kfp-ddp.variant="${VARIANT}" \
      io.kfp-ddp.extras="${EXTRAS}"

# KFP sets the command of every step and the launcher the training nodes'; this is for `docker run`.
CMD ["kfp-ddp", "--help"]
