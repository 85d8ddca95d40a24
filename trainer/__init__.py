"""The DDP image-classification trainer (``python -m trainer.train``).

Needs torch, torchvision (through :mod:`trainer.tv_compat`), PIL, numpy, PyYAML and the standard
library; the optional parts import more, only when their flag is set: ``--checkpoint-uri`` /
``--output-uri`` this package's S3 sync (boto3, s3transfer, awscrt), ``--metrics-port``
prometheus-client. Without those flags it runs on a bare GPU machine with torch alone.
"""
