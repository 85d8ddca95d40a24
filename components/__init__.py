"""Reusable KFP v2 components: S3 sync, the training-job launcher (Kubeflow Trainer v2 TrainJob,
Training Operator v1 PyTorchJob/TFJob, or local processes), evaluation.

Each subpackage holds plain Python functions (unit-tested without KFP) and a ``component.py``
with thin KFP wrappers built by factories that take the container image as a compile-time setting.
"""

DEFAULT_IMAGE = "ghcr.io/kfp-ddp/kfp-ddp:0.1.0"
"""The one image every component step and every PyTorchJob replica runs (see Dockerfile)."""
