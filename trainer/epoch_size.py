"""How many steps an epoch has: the same figure for the trainer's loaders and the pipeline's data
step, which checks a run's size before any node starts.

Standard library only: the data step imports this module without torch.
"""

from __future__ import annotations

import math


def steps_per_epoch(num_items: int, batch_size: int, world_size: int) -> int:
    """Full per-rank batches in one epoch (identical on every rank)."""
    return math.ceil(num_items / world_size) // batch_size
