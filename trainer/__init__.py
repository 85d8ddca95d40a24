"""The DDP image-classification trainer (``python -m trainer.train``).

Imports only torch, torchvision (through :mod:`trainer.tv_compat`), PIL, numpy, PyYAML and the
standard library, so it runs unchanged in a training image and on a bare GPU machine.
"""
