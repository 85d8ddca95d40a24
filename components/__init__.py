"""Reusable KFP v2 components: S3 sync, the training-job launcher (Kubeflow Trainer v2 TrainJob,
Training Operator v1 PyTorchJob/TFJob, or local processes), evaluation.

The libraries are plain Python (unit-tested without KFP): ``s3_sync``, ``launcher``,
``evaluate``. Their KFP components are all in ``kfp``: thin wrappers built by factories that take
the container image as a compile-time setting (ARCHITECTURE.md: the layers).
"""

DEFAULT_IMAGE = "ghcr.io/kfp-ddp/kfp-ddp:0.1.0"
"""The one image every component step and every PyTorchJob replica runs (see Dockerfile)."""
