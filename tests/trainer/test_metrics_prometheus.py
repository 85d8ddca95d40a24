"""A real Prometheus scrapes a 2-process CPU (gloo) training; a stopped rank fires the hang alert.

Prometheus is Debian's ``prometheus`` package, fetched with ``apt-get download`` and unpacked with
``dpkg -x`` into ``~/.cache/kfp-ddp/prometheus`` (no system install; skipped, saying why, where
that cannot be done). It scrapes both ranks every second, as the launcher's PodMonitor would
(``honor_labels``, a ``namespace`` target label); the hang alert's expression is taken from the
rendered PrometheusRule and evaluated through Prometheus's query API.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from components.launcher import TrainSpec
from components.launcher.monitoring_documents import monitoring_documents
from tests.trainer.trainer_forkserver import ForkedTrainer
from tests.trainer.trainer_launch import REPO, base_env, free_port

CACHE = Path.home() / ".cache" / "kfp-ddp" / "prometheus"
JOB = "cats"
HANG_ALERT_S = 3
TRAINER = [
    "--synthetic", "--synthetic-size", "256", "--num-classes", "3",
    "--model", "mobilenet_v3_small", "--image-size", "16", "--batch-size", "4",
    "--epochs", "1000", "--max-steps", "1000000", "--log-interval", "5",
    "--checkpoint-every-steps", "0", "--tensorboard-dir", "none",
    "--init-timeout-s", "60", "--collective-timeout-s", "60", "--metrics-job", JOB,
]  # fmt: skip


def prometheus_binary() -> Path:
    """Debian's Prometheus, unpacked into the cache (downloaded once); skips saying why not.

    Two processes may ask at once on a cold cache (two sessions, or both xdist workers when
    the file's tests are split between them): a lock lets the first fetch it, the next find it.
    """
    binary = CACHE / "root" / "usr" / "bin" / "prometheus"
    if binary.is_file():
        return binary
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not available: cannot fetch Debian's prometheus package")
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not binary.is_file():
            _fetch_into(CACHE / "root")
    return binary


def _fetch_into(root: Path) -> None:
    """``apt-get download prometheus`` and ``dpkg -x`` it; ``root`` appears whole or not at all."""
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        download, unpacked = Path(work) / "download", Path(work) / "unpacked"
        download.mkdir()
        try:
            fetched = subprocess.run(
                ["apt-get", "download", "prometheus"],
                cwd=download,
                capture_output=True,
                text=True,
                timeout=300,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            pytest.skip(f"apt-get download prometheus failed: {err}")
        packages = sorted(download.glob("prometheus_*.deb"))
        if fetched.returncode != 0 or not packages:
            pytest.skip(f"apt-get download prometheus failed: {fetched.stderr.strip()[-500:]}")
        subprocess.run(["dpkg", "-x", str(packages[-1]), str(unpacked)], check=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)  # a partial tree of an older layout
        unpacked.rename(root)


def start_group(command: list[str], log: Path, env: dict[str, str] | None = None):
    """A process in a session (and process group) of its own, its output in ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_group(process: subprocess.Popen | ForkedTrainer) -> None:
    """Kill the process's whole group (a stopped one is continued first), and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGCONT)
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)


@dataclass
class ScrapedRun:
    """Two trainer ranks ("pods" on loopback) and the Prometheus that scrapes them."""

    trainers: list[ForkedTrainer]
    prometheus_url: str
    hang_expression: str
    logs: Path

    def query(self, expression: str) -> list[dict]:
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.loads(response.read())
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def wait_for(self, what: str, found: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not found():
            if any(t.poll() is not None for t in self.trainers):
                pytest.fail(f"a trainer exited while waiting for {what}\n{self.log_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} after {timeout} s\n{self.log_text()}")
            time.sleep(0.5)

    def log_text(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in self.logs.glob("*.log"))


def start_trainers(ports: list[int], logs: Path) -> list[ForkedTrainer]:
    """One ``python -m trainer.train`` per "pod" (forked: :mod:`tests.trainer.trainer_forkserver`),
    the Training Operator's env contract, each in a session of its own."""
    master = free_port()
    trainers = []
    for rank, port in enumerate(ports):
        env = base_env() | {
            "RANK": str(rank),
            "WORLD_SIZE": str(len(ports)),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master),
        }
        args = [*TRAINER, "--output-dir", str(logs / f"out{rank}"), "--metrics-port", str(port)]
        log = logs / f"rank{rank}.log"
        trainers.append(ForkedTrainer(args, env=env, cwd=REPO, log_path=log, new_session=True))
    return trainers


def prometheus_config(ports: list[int]) -> dict:
    """What the PodMonitor amounts to: every rank every second, the trainer's job label kept."""
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "kfp-ddp-pods",
                "honor_labels": True,
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{port}" for port in ports],
                        "labels": {"namespace": "default"},
                    }
                ],
            }
        ],
    }


@pytest.fixture(scope="module")
def scraped_run(tmp_path_factory) -> Iterator[ScrapedRun]:
    binary = prometheus_binary()
    logs = tmp_path_factory.mktemp("scraped-run")
    ports = [free_port(), free_port()]  # two "pods" on one machine: a port each
    (logs / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config(ports)))
    web = free_port()
    spec = TrainSpec(
        api="pytorchjob",
        name=JOB,
        namespace="default",
        metrics_port=9400,
        hang_alert_s=HANG_ALERT_S,
    )
    (rule,) = [d for d in monitoring_documents(spec) if d["kind"] == "PrometheusRule"]
    (hang,) = [r for r in rule["spec"]["groups"][0]["rules"] if r["alert"] == "KfpDdpTrainingHung"]
    processes = []
    try:
        processes.append(
            start_group(
                [
                    str(binary),
                    f"--config.file={logs / 'prometheus.yml'}",
                    f"--storage.tsdb.path={logs / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{web}",
                ],
                logs / "prometheus.log",
            )
        )
        trainers = start_trainers(ports, logs)
        processes += trainers
        run = ScrapedRun(trainers, f"http://127.0.0.1:{web}", hang["expr"], logs)
        run.wait_for("ready Prometheus", lambda: _ready(run.prometheus_url), timeout=30)
        yield run
    finally:
        for process in reversed(processes):
            stop_group(process)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def by_rank(results: list[dict]) -> dict[str, float]:
    return {r["metric"]["rank"]: float(r["value"][1]) for r in results}


def test_prometheus_scrapes_step_and_throughput_of_both_ranks(scraped_run):
    run = scraped_run
    run.wait_for(
        "step series of both ranks past step 10",
        lambda: [v > 10 for v in by_rank(run.query("kfp_ddp_train_step")).values()] == [True] * 2,
    )
    run.wait_for(
        "images/s of both ranks",
        lambda: len(by_rank(run.query("kfp_ddp_train_images_per_second > 0"))) == 2,
    )
    (series, _) = run.query(f'kfp_ddp_train_step{{job="{JOB}"}}')
    assert {series["metric"]["job"], series["metric"]["namespace"]} == {JOB, "default"}
    assert sorted(by_rank(run.query("kfp_ddp_train_samples_total"))) == ["0", "1"]
    assert by_rank(run.query("kfp_ddp_train_seconds_since_last_step"))["1"] < HANG_ALERT_S
    assert run.query(run.hang_expression) == []  # training: no alert


def test_the_hang_metric_grows_on_a_stopped_rank_and_the_alert_fires(scraped_run):
    run = scraped_run
    run.wait_for("rank 0's series", lambda: "0" in by_rank(run.query("kfp_ddp_train_step")))
    stopped = run.trainers[1]
    os.killpg(stopped.pid, signal.SIGSTOP)
    try:
        # Rank 0 waits for rank 1 in its next all-reduce; its endpoint still answers.
        since = "kfp_ddp_train_seconds_since_last_step"
        run.wait_for(
            f"{since} of rank 0 above {HANG_ALERT_S} s",
            lambda: by_rank(run.query(since)).get("0", 0) > HANG_ALERT_S,
            timeout=30,
        )
        first = by_rank(run.query(since))["0"]
        run.wait_for(
            "a growing hang metric",
            lambda: by_rank(run.query(since))["0"] >= first + 1,
            timeout=10,
        )
        run.wait_for("the hang alert's expression", lambda: run.query(run.hang_expression) != [])
        (alert,) = run.query(run.hang_expression)
        assert alert["metric"] == {"namespace": "default", "job": JOB}
        assert float(alert["value"][1]) > HANG_ALERT_S
    finally:
        os.killpg(stopped.pid, signal.SIGCONT)
