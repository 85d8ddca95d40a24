# The one image every pipeline step and every training node (TrainJob node, PyTorchJob replica) runs (`make image`).
#
# Base: an official PyTorch CUDA *runtime* image; its torch/torchvision are built for its CUDA and
# are kept (never reinstalled from PyPI). Everything else is installed with the exact pins of
# constraints.txt, so the image runs the same versions the tests ran; the torch version of
# BASE_IMAGE must be constraints.txt's `torch==` pin (tests/trainer/test_dockerfile.py checks).
#
# The default matches Kubeflow Trainer v2.3's torch-distributed runtime. Each base needs a
# minimum NVIDIA driver on the nodes (NVIDIA's CUDA minor-version compatibility table):
#   pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime  CUDA 13.x: driver >= 580 (R580)
#   pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime  CUDA 12.x: driver >= 525 (12.8's own: 570)
# For nodes with an R525-R575 driver build the cu12.x variant (check that the tag exists):
#   docker build --build-arg BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime .
# A driver older than the image's CUDA makes the trainer exit 2 naming both versions (it never
# falls back to training on the CPU).
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A C compiler for Triton: `--compile` builds a small launcher module on its first step, and the
# runtime images have no compiler (Python's headers come with the image's Python).
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* \
 && python -c "import os, sysconfig; assert os.path.isfile(os.path.join(sysconfig.get_paths()['include'], 'Python.h')), 'no Python.h: Triton cannot build its launcher'"

WORKDIR /opt/kfp-ddp

COPY pyproject.toml constraints.txt README.md ./
COPY kfp_ddp ./kfp_ddp
COPY trainer ./trainer
COPY components ./components
COPY pipelines ./pipelines

# Drop the pins the base image owns (torch, torchvision and their CUDA wheels) from the constraints,
# install the package (not editable) and check that everything a step imports is importable.
RUN grep -vE '^(torch|torchvision|torchaudio|triton|nvidia-[a-z0-9-]+)==' constraints.txt \
        > /tmp/constraints-image.txt \
 && python -m pip install -c /tmp/constraints-image.txt . \
 && rm /tmp/constraints-image.txt \
 && python -c "import torch, torchvision, kfp, kfp.kubernetes, boto3, kubeflow.training, kubeflow_trainer_api, kfp_ddp, trainer, components, pipelines" \
 && kfp-ddp --help > /dev/null

# A non-root user of its own, the one the launcher runs the training pods as (TrainSpec.run_as_user
# / run_as_group 1000: restricted Pod Security). Base images that already have UID/GID 1000 (the
# "ubuntu" user of Ubuntu 24.04 images) give it up first. Its HOME holds every cache a step or the
# trainer writes (pip, Triton, TorchInductor, torch hub, matplotlib, the S3 sync's hash cache).
# KFP's launcher writes artifacts under /gcs, /minio and /s3 (a contract of its Python components,
# kubeflow/pipelines#5673): made here, owned by the user, so the steps run as non-root too.
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
    chown -R "${APP_UID}:${APP_GID}" /home/kfp-ddp /gcs /minio /s3; \
    chmod 0775 /gcs /minio /s3
ENV HOME=/home/kfp-ddp \
    XDG_CACHE_HOME=/home/kfp-ddp/.cache \
    TRITON_CACHE_DIR=/home/kfp-ddp/.cache/triton \
    TORCHINDUCTOR_CACHE_DIR=/home/kfp-ddp/.cache/torchinductor \
    TORCH_HOME=/home/kfp-ddp/.cache/torch \
    MPLCONFIGDIR=/home/kfp-ddp/.cache/matplotlib
# Numeric, so that the kubelet can check runAsNonRoot without reading /etc/passwd.
USER 1000:1000

# KFP sets the command of every step and the launcher the training nodes'; this is for `docker run`.
CMD ["kfp-ddp", "--help"]
