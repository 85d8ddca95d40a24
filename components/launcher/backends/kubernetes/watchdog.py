"""The watchdog of a running job: pods Pending (or not created) too long, replicas silent too long.

Each condition is reported once per run; the run decides whether a report fails the job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from components.launcher.backends.kubernetes.pods import PodFollower, started


@dataclass
class Watchdog:
    pending_timeout_s: float | None
    silence_timeout_s: float | None
    container: str
    describe_pending: Callable[[], str]
    """Explains what keeps the pods from starting (scheduler messages, events)."""
    reported: set[str] = field(default_factory=set)

    def check(self, follower: PodFollower, start: float) -> str | None:
        """A report if a limit was just passed, else None."""
        return self._pending(follower, start) or self._silence(follower)

    def _pending(self, follower: PodFollower, start: float) -> str | None:
        if self.pending_timeout_s is None or "pending" in self.reported:
            return None
        now = time.monotonic()
        states = follower.snapshot()
        waiting = [s for s in states if not started(s.pod, self.container)]
        # Per pod, so a pod recreated late in a long run gets its own full allowance.
        stuck = [s for s in waiting if now - s.first_seen > self.pending_timeout_s]
        none_yet = not states and now - start > self.pending_timeout_s
        if not (stuck or none_yet):
            return None
        self.reported.add("pending")
        return (
            f"pods still Pending after {self.pending_timeout_s:g} s (pending_timeout_s): "
            f"{self.describe_pending()}"
        )

    def _silence(self, follower: PodFollower) -> str | None:
        if self.silence_timeout_s is None or "silence" in self.reported:
            return None
        running_since = follower.first_running_at
        states = follower.snapshot()
        if running_since is None or any(not started(s.pod, self.container) for s in states):
            return None
        last = max(running_since, follower.logs.last_line_at or running_since)
        if time.monotonic() - last <= self.silence_timeout_s:
            return None
        self.reported.add("silence")
        return (
            f"no replica logged anything for {self.silence_timeout_s:g} s (silence_timeout_s): "
            "hanging at NCCL/gloo init or in a collective? Try nccl_preset='debug'"
        )
