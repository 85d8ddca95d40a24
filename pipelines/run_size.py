"""What the data set's size says about a run, before any training node starts.

The data step lists every key, so it knows how many training images there are. With the run's
workers, processes, batch size and epochs it can tell:

- **a batch size that a rank's share cannot fill**: each of the ``world size`` ranks trains on
  ``ceil(images / world size)`` images in full batches (``trainer.data.steps_per_epoch``); fewer
  images than ``batch_size`` is zero steps. Refused, naming ``batch_size``, with the largest
  batch that fills a step (the trainer refuses the same before step 1, on every node, after the
  staging; the data step says it in seconds);
- **a run implausibly long**: epochs × steps per epoch beyond a year even at the fastest rate this
  project measured (``FASTEST_IMAGES_PER_SECOND``). A warning in the step's log, not a refusal:
  a typo (``epochs=1000000000``) is said before the GPUs start, a deliberate long run still runs.

The figures are a lower bound of the time on purpose (the fastest measured rate, scaled up for
smaller images): a warning that fires is never a close call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from components.launcher.sizing import processes_per_node
from pipelines.parameter_errors import ParameterError
from trainer.epoch_size import steps_per_epoch

FASTEST_IMAGES_PER_SECOND = {"gpu": 5772.0, "cpu": 217.0}
"""Images per second per process, the fastest measured (README, Performance): one H100 with
ResNet-50 at 224 px compiled (5,772), and a gloo process on this project's 2-core machine with
ResNet-18 at 32 px (433 images/s for two)."""
MEASURED_AT = {"gpu": 224, "cpu": 32}
"""The image size each rate was measured at; a smaller image is taken to go faster by its
pixel count (an optimistic bound: a step never costs less than its pixels)."""
IMPLAUSIBLE_SECONDS = 365 * 24 * 3600
"""A run that cannot end within a year, even at the fastest rate, is called implausible."""


@dataclass(frozen=True)
class RunSize:
    """A run's size: its training images spread over its ranks, in batches, for some epochs."""

    train_images: int
    world_size: int
    batch_size: int
    epochs: int
    image_size: int
    gpus: bool

    @classmethod
    def of(
        cls,
        train_images: int,
        *,
        workers: int,
        gpus_per_worker: int,
        nproc_per_node: int,
        batch_size: int,
        epochs: int,
        image_size: int,
    ) -> RunSize | None:
        """The run the data step's inputs describe; None when they do not say (a step used
        without them: ``workers`` or ``batch_size`` 0)."""
        if workers < 1 or batch_size < 1:
            return None
        processes = processes_per_node(nproc_per_node, gpus_per_worker)
        return cls(
            train_images=train_images,
            world_size=workers * processes,
            batch_size=batch_size,
            epochs=max(epochs, 0),
            image_size=max(image_size, 1),
            gpus=gpus_per_worker > 0,
        )

    @property
    def share(self) -> int:
        """Training images per rank."""
        return math.ceil(self.train_images / self.world_size)

    @property
    def steps_per_epoch(self) -> int:
        return steps_per_epoch(self.train_images, self.batch_size, self.world_size)

    def check(self) -> None:
        """Raise ParameterError (``batch_size``) when a rank's share fills no batch."""
        if self.steps_per_epoch >= 1:
            return
        raise ParameterError(
            "batch_size",
            self.batch_size,
            f"each of the {self.world_size} ranks trains on {self.share} of the "
            f"{self.train_images} training images, fewer than one batch: set batch_size to "
            f"{max(self.share, 1)} or less, use fewer workers or processes, or add images",
        )

    def fastest_seconds(self) -> float:
        """The run's time at the fastest measured rate (a lower bound)."""
        kind = "gpu" if self.gpus else "cpu"
        pixels = (MEASURED_AT[kind] / self.image_size) ** 2
        rate = FASTEST_IMAGES_PER_SECOND[kind] * max(pixels, 1.0) * self.world_size
        images = self.epochs * self.steps_per_epoch * self.batch_size * self.world_size
        return images / rate

    def warnings(self) -> list[str]:
        """What looks like a typo: a run that needs over a year even at the fastest rate."""
        seconds = self.fastest_seconds()
        if seconds <= IMPLAUSIBLE_SECONDS:
            return []
        years = seconds / IMPLAUSIBLE_SECONDS
        return [
            f"epochs={self.epochs} x {self.steps_per_epoch} steps per epoch would take at least "
            f"{years:,.0f} years on {self.world_size} {'GPU' if self.gpus else 'CPU'} process(es) "
            "even at the fastest rate measured: is epochs what you meant? (not refused)"
        ]
