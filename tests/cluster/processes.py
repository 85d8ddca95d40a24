"""Start one control-plane binary, wait until it answers, stop it; its log for the error.

A component that exits or does not get ready in time raises ``StartupError`` with the tail of its
log, so a failed start says why (a port taken, a bad flag, a missing CRD).
"""

from __future__ import annotations

import functools
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kfp_ddp.parent_death import die_with_this_process


class StartupError(RuntimeError):
    """A component did not start: the message carries its log tail."""


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@functools.cache
def _insecure_context() -> ssl.SSLContext:
    """One TLS context for every readiness probe, with no CA loaded: it verifies nothing.
    ``ssl.create_default_context()`` loads the system's CA bundle (~24 ms of CPU), and a plane's
    start probes its components every 0.1 s."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def answers(url: str, token: str | None = None) -> bool:
    """Whether ``url`` answers 200 (TLS without verification; a bearer token if given)."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=2, context=_insecure_context()) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class Component:
    """One running binary of the control plane."""

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None

    def start(self) -> Component:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                # A Ctrl-C of the test run reaches us, not them; a test run killed outright
                # (a CI timeout, kill -9) takes them with it instead of leaving them running:
                # SIGKILL, since a kube-apiserver whose etcd went first ignores SIGTERM.
                preexec_fn=die_with_this_process(new_session=True, death_signal=signal.SIGKILL),
            )
        return self

    def wait_ready(self, url: str, *, token: str | None = None, timeout: float = 60.0) -> None:
        """Block until ``url`` answers 200; StartupError (with the log tail) otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise StartupError(
                    f"{self.name} exited with code {self.process.returncode} while starting; "
                    f"its log ({self.log}):\n{log_tail(self.log)}"
                )
            if answers(url, token):
                return
            time.sleep(0.1)
        raise StartupError(
            f"{self.name} did not answer {url} within {timeout:g} s; its log ({self.log}):\n"
            f"{log_tail(self.log)}"
        )

    def stop(self, grace: float = 5.0) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def stop_side_by_side(stops: list[Callable[[], None]]) -> None:
    """Run each stop at once (an API server, a weed server take seconds to shut down); the first
    error is raised once all have ended."""
    if not stops:
        return
    with ThreadPoolExecutor(len(stops)) as pool:
        done = [pool.submit(stop) for stop in stops]
    for future in done:
        future.result()
