"""What :mod:`tests.trainer.trainer_forkserver`'s server imports once, before it forks any rank.

The imports every ``python -m trainer.train`` makes before its first step, save ``trainer.train``
itself (each rank runs it as ``__main__``, as ``-m`` does). None of them starts a Python thread
(the server forks, and a fork copies only the thread that calls it); the one other thread is
OpenBLAS's pool, started by numpy's import, which re-creates itself after a fork.
"""

import torch  # noqa: F401
import torch._dynamo  # noqa: F401  # the optimizer's constructor imports it
import torch.distributed  # noqa: F401

import trainer.loop  # noqa: F401
from trainer.tensorboard_log import summary_writer_class
from trainer.tv_compat import import_torchvision

import_torchvision()
import torchvision.models  # noqa: E402, F401

summary_writer_class()  # TensorBoard's writer, without TensorFlow, as the trainer imports it
