# The one image every pipeline step and every PyTorchJob replica runs (`make image`).
#
# Base: an official PyTorch CUDA *runtime* image; its torch/torchvision are built for its CUDA and
# are kept (never reinstalled from PyPI). Everything else is installed with the exact pins of
# constraints.txt, so the image runs the same versions the tests ran. Bump BASE_IMAGE to move to a
# newer torch/CUDA (the package needs torch>=2.6, torchvision>=0.21, Python>=3.11), e.g.
#   docker build --build-arg BASE_IMAGE=pytorch/pytorch:<torch>-cuda<x.y>-cudnn9-runtime .
ARG BASE_IMAGE=pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/kfp-ddp

COPY pyproject.toml constraints.txt README.md ./
COPY trainer ./trainer
COPY components ./components
COPY pipelines ./pipelines

# Drop the pins the base image owns (torch, torchvision and their CUDA wheels) from the constraints,
# install the package (not editable) and check that everything a step imports is importable.
RUN grep -vE '^(torch|torchvision|torchaudio|triton|nvidia-[a-z0-9-]+)==' constraints.txt \
        > /tmp/constraints-image.txt \
 && python -m pip install -c /tmp/constraints-image.txt . \
 && rm /tmp/constraints-image.txt \
 && python -c "import torch, torchvision, kfp, kfp.kubernetes, boto3, kubeflow.training, trainer, components, pipelines" \
 && kfp-ddp --help > /dev/null

# KFP sets the command of every step and the PyTorchJob sets the trainer's; this is for `docker run`.
CMD ["kfp-ddp", "--help"]
