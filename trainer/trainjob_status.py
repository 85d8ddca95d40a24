"""Progress reports to Kubeflow Trainer: rank 0 fills ``status.trainerStatus`` of its TrainJob.

Kubeflow Trainer v2.2+ with its alpha ``TrainJobStatus`` feature gate on runs a status server and
gives every trainer container three variables (v2.3.0: ``pkg/runtime/framework/plugins/
trainjobstatus``, ``pkg/statusserver``):

- ``KUBEFLOW_TRAINER_SERVER_URL``: ``https://SERVICE.NAMESPACE.svc:PORT/apis/trainer.kubeflow.org/
  v1alpha1/namespaces/NS/trainjobs/NAME/status``;
- ``KUBEFLOW_TRAINER_SERVER_CA_CERT``: the *path* of the CA certificate of that server;
- ``KUBEFLOW_TRAINER_SERVER_TOKEN``: the *path* of a projected ServiceAccount token (audience
  ``trainer.kubeflow.org/v1alpha1/namespaces/NS/trainjobs/NAME/status``, valid one hour and
  rotated by the kubelet: it is read again for every report).

A report is ``POST URL`` with ``Authorization: Bearer TOKEN``, ``Content-Type: application/json``
and ``{"trainerStatus": {"progressPercentage", "estimatedRemainingSeconds", "metrics": [{"name",
"value"}], "lastUpdatedTime"}}``: int32s (0-100, >= 0), metric values *strings* of 1-64
characters, ``lastUpdatedTime`` in RFC 3339 (required by the CRD's CEL rule). The server
server-side-applies it to the TrainJob's status and answers 200 (echoing it) or a
``metav1.Status``: 403 (token refused), 404, 413 (over 64 KiB), 422 (refused by the schema), 500.
Kubeflow's own clients send at most one report every 5 s.

The figures and their form are :mod:`trainer.progress`'s. :meth:`StatusReporter.offer` runs on
the training thread: it leaves the loop's latest snapshot in a one-item slot (a newer snapshot
replaces one not sent yet). A thread of its own sends at most one report per
``--progress-report-interval-s``, each bounded by ``--progress-report-timeout-s``. A failed
report is logged (the first of a streak) and never reaches training. The final one (100 %, ETA
0) goes out at once, after a report in flight if there is one (reports never overtake each other,
so the status never goes back), and the end of the run waits for it at most one timeout more: a
hung server delays nothing else.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trainer.progress import Progress
from trainer.run_log import RunLog

URL_VARIABLE = "KUBEFLOW_TRAINER_SERVER_URL"
CA_CERT_VARIABLE = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
TOKEN_VARIABLE = "KUBEFLOW_TRAINER_SERVER_TOKEN"
ANSWER_BYTES = 4096
"""Of an answer's body, only this much is read (for the message of a refusal)."""


@dataclass(frozen=True, kw_only=True)
class StatusEndpoint:
    """Where and how to report: the three variables of the controller."""

    url: str
    token_file: Path
    ca_file: Path | None
    """None: the system's trust store."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> StatusEndpoint:
        """The endpoint the variables describe; ValueError naming what is wrong with them."""
        url = environ.get(URL_VARIABLE, "").strip()
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError(
                f"{URL_VARIABLE}={url!r} is not an https:// URL (the token is only sent over TLS)"
            )
        token = environ.get(TOKEN_VARIABLE, "").strip()
        if not token:
            raise ValueError(
                f"{URL_VARIABLE} is set but {TOKEN_VARIABLE} (the token's path) is not"
            )
        ca_file = environ.get(CA_CERT_VARIABLE, "").strip()
        return cls(url=url, token_file=Path(token), ca_file=Path(ca_file) if ca_file else None)


@dataclass(frozen=True)
class Answer:
    """The status server's answer to one report."""

    code: int
    message: str
    """The ``metav1.Status`` message of a refusal (or the start of the body)."""


def post_status(endpoint: StatusEndpoint, status: dict[str, Any], timeout_s: float) -> Answer:
    """Send one report; every socket operation is bounded by ``timeout_s``.

    The token and the CA file are read each time: the kubelet rotates both.
    """
    import http.client
    import ssl

    token = endpoint.token_file.read_text().strip()
    ca_file = str(endpoint.ca_file) if endpoint.ca_file else None
    context = ssl.create_default_context(cafile=ca_file)
    parts = urlsplit(endpoint.url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    connection = http.client.HTTPSConnection(
        parts.hostname or "", parts.port, timeout=timeout_s, context=context
    )
    body = json.dumps({"trainerStatus": status}).encode()
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": "application/json",
    }
    try:
        connection.request("POST", path or "/", body=body, headers=headers)
        response = connection.getresponse()
        return Answer(response.status, _message(response.read(ANSWER_BYTES), response.reason))
    finally:
        connection.close()


def _message(body: bytes, reason: str) -> str:
    try:
        status = json.loads(body)
    except ValueError:
        status = None
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        return status["message"]
    return body[:200].decode(errors="replace").strip() or reason


class StatusReporter:
    """Rank 0's reports to ``endpoint``, sent by a thread of its own."""

    def __init__(
        self, endpoint: StatusEndpoint, *, interval_s: float, timeout_s: float, log: RunLog
    ):
        self.endpoint, self.log = endpoint, log
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.sent = 0
        self.failed = 0
        self.last_problem: str | None = None
        """What went wrong with the last report that failed."""
        self._failing = False
        self._slot = threading.Condition()
        self._pending: Progress | None = None
        self._closing = False
        self._final_asked = False
        self._final_started = threading.Event()
        self._final_done = threading.Event()
        self._final_problem: str | None = None
        self._timed_out = False
        """The last report failed for want of an answer within ``timeout_s``."""
        self._thread = threading.Thread(target=self._work, name="trainjob-status", daemon=True)
        self._thread.start()

    # -- the training thread -------------------------------------------------------------------
    def offer(self, progress: Progress) -> None:
        """Take the loop's latest snapshot (it replaces one not sent yet, unless that one is the
        final one); never waits for the network."""
        with self._slot:
            if self._pending is None or not self._pending.final:
                self._pending = progress
            self._final_asked |= progress.final
            self._slot.notify()

    def close(self) -> None:
        """Stop the thread; wait for the final report, if one was asked for: it follows a report
        in flight (which ends within its own timeout) and gets one timeout of its own.

        Logs one line at most: what became of the final report, or a tally of failures.
        """
        with self._slot:
            self._closing = True
            final_asked = self._final_asked
            self._slot.notify()
        answered = True
        if final_asked:
            started = self._final_started.wait(self.timeout_s + 1.0)
            answered = started and self._final_done.wait(self.timeout_s)
            # Its own socket timeout and this wait end together: one message for a silent server.
            answered = answered and not self._timed_out
        tally = f"{self.sent} went through, {self.failed} failed"
        kept = "the TrainJob's status.trainerStatus keeps an earlier one"
        if not answered:
            self.log.line(
                "WARNING: the final progress report to Kubeflow Trainer got no answer within "
                f"{self.timeout_s:g} s; {kept} ({tally})"
            )
        elif final_asked and self._final_problem is not None:
            self.log.line(
                f"WARNING: the final progress report to Kubeflow Trainer failed "
                f"({self._final_problem}); {kept} ({tally})"
            )
        elif self.failed:
            self.log.line(
                f"progress reports to Kubeflow Trainer: {tally} (last failure: {self.last_problem})"
            )

    # -- the reporter's thread -----------------------------------------------------------------
    def _work(self) -> None:
        next_at = 0.0
        while True:
            with self._slot:
                while not self._due(next_at):
                    if self._closing:
                        return
                    wait = None if self._pending is None else next_at - time.monotonic()
                    self._slot.wait(wait)
                progress, self._pending = self._pending, None
            assert progress is not None
            if progress.final:
                self._final_started.set()
            problem = self._send(progress)
            next_at = time.monotonic() + self.interval_s
            if progress.final:
                self._final_problem = problem
                self._final_done.set()

    def _due(self, next_at: float) -> bool:
        pending = self._pending
        return pending is not None and (pending.final or time.monotonic() >= next_at)

    def _send(self, progress: Progress) -> str | None:
        """One report; what went wrong (None: it went through). Never raises."""
        self._timed_out = False
        try:
            answer = post_status(self.endpoint, progress.trainer_status(), self.timeout_s)
            problem = None if answer.code == 200 else f"HTTP {answer.code}: {answer.message}"
        except Exception as err:  # noqa: BLE001 - a report must never end the run
            problem = f"{type(err).__name__}: {err}"
            self._timed_out = isinstance(err, TimeoutError)
        if problem is None:
            if self._failing:
                self.log.line(
                    f"progress reports to Kubeflow Trainer go through again ({self.failed} failed)"
                )
            self.sent += 1
            self._failing = False
            return None
        if not self._failing:  # the first of a streak
            self.log.line(
                f"WARNING: a progress report to Kubeflow Trainer ({self.endpoint.url}) failed: "
                f"{problem}; training goes on, reports are retried every "
                f"{self.interval_s:g} s (further failures are counted, not logged)"
            )
        self.failed += 1
        self.last_problem = problem
        self._failing = True
        return problem


def status_reporter(
    environ: Mapping[str, str], *, interval_s: float, timeout_s: float, log: RunLog
) -> StatusReporter | None:
    """The reporter the controller's variables ask for; None (with a warning) if they cannot
    work. Rank 0 only: other ranks report nothing."""
    try:
        endpoint = StatusEndpoint.from_environ(environ)
    except ValueError as err:
        log.line(f"WARNING: no progress reports to Kubeflow Trainer: {err}")
        return None
    log.line(
        f"progress reports to Kubeflow Trainer: {endpoint.url}, at most every {interval_s:g} s"
    )
    return StatusReporter(endpoint, interval_s=interval_s, timeout_s=timeout_s, log=log)
