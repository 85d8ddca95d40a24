"""Progress reports to Kubeflow Trainer (``status.trainerStatus``), judged by the real API server.

A stand-in for the controller's status server (its TrainJobStatus gate stays off in the test
plane: its server would listen on every interface) authenticates the trainer's bearer token with
a TokenReview and server-side-applies what it sent to a real TrainJob, so the CRD's schema and CEL
rules decide. Runs are tiny CPU trainings; the ones that need no API server run without one.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.cluster.certs import CertificateAuthority
from tests.trainer.trainer_forkserver import ForkedTrainer
from tests.trainer.trainer_launch import REPO, base_env, free_port, logs, wait_all
from tests.trainer.trainjob_status_server import (
    HangingServer,
    StatusServer,
    answering,
    apply_trainer_status,
    audience_token,
    token_audience,
    trainer_status_server,
)
from trainer.config import TrainConfig
from trainer.errors import ConfigError
from trainer.progress import INT32_MAX, SUMMARY_KEY, Progress, ProgressTracker, metric_text
from trainer.train import main
from trainer.trainjob_status import (
    CA_CERT_VARIABLE,
    TOKEN_VARIABLE,
    URL_VARIABLE,
    StatusEndpoint,
    StatusReporter,
    post_status,
)

TINY = ["--model", "mobilenet_v3_small", "--image-size", "16", "--batch-size", "4"]
QUIET = ["--tensorboard-dir", "none", "--log-interval", "1"]
SYNTHETIC = ["--synthetic", "--synthetic-size", "64", "--num-classes", "3", "--epochs", "3"]
METRICS = {
    "loss",
    "val_loss",
    "val_accuracy",
    "images_per_second",
    "learning_rate",
    "epoch",
    "step",
    "total_steps",
}
STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def report_env(monkeypatch, url: str, ca_file: Path, token_file: Path) -> None:
    """The three variables Kubeflow Trainer sets in a trainer container (paths, not contents)."""
    monkeypatch.setenv(URL_VARIABLE, url)
    monkeypatch.setenv(CA_CERT_VARIABLE, str(ca_file))
    monkeypatch.setenv(TOKEN_VARIABLE, str(token_file))


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def create_trainjob(k8s, name: str) -> None:
    from kubernetes import client

    from components.launcher import TrainSpec, build_trainjob

    spec = TrainSpec(api="trainjob", name=name, namespace=k8s.name, run_id="r")
    client.CustomObjectsApi(k8s.admin()).create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", k8s.name, "trainjobs", build_trainjob(spec)
    )


def read_trainjob(k8s, name: str) -> dict:
    from kubernetes import client

    return client.CustomObjectsApi(k8s.admin()).get_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", k8s.name, "trainjobs", name
    )


# ------------------------------------------------------------------ against the real API server
def test_progress_and_metrics_reach_the_trainjobs_status(
    k8s, tmp_path, image_folder, monkeypatch, capsys
):
    plane, name = k8s.cluster.plane, "progress"
    create_trainjob(k8s, name)
    token = tmp_path / "token"
    token.write_text(audience_token(plane, k8s.name, "trainer", token_audience(k8s.name, name)))
    out, interval = tmp_path / "out", 1.0
    with StatusServer(tmp_path / "server", plane.ca, trainer_status_server(plane)) as server:
        report_env(monkeypatch, server.url(k8s.name, name), plane.ca_file, token)
        args = ["--data-dir", str(image_folder), *TINY, *QUIET, "--epochs", "4"]
        started = time.monotonic()
        assert main([*args, "--output-dir", str(out), "--progress-report-interval-s", "1"]) == 0
        took = time.monotonic() - started
    steps = summary(out)["steps"]  # 36 images / batch 4: 9 steps an epoch

    # Every report was accepted: the token by the TokenReview, the payload by the CRD's schema.
    assert server.codes and set(server.codes) == {200}, capsys.readouterr().out
    reports = [r.trainer_status for r in server.requests]
    assert reports[0]["progressPercentage"] == 0 and reports[-1]["progressPercentage"] == 100
    progress = [r["progressPercentage"] for r in reports]
    assert progress == sorted(progress)
    # At most one report per interval (the final one goes out at once), the latest figures only.
    assert len(reports) <= took / interval + 2
    periodic = [r.received_at for r in server.requests[:-1]]
    assert all(b - a >= 0.8 * interval for a, b in zip(periodic, periodic[1:], strict=False))
    assert all(r.headers["Content-Type"] == "application/json" for r in server.requests)

    status = read_trainjob(k8s, name)["status"]["trainerStatus"]
    assert status["progressPercentage"] == 100
    assert status["estimatedRemainingSeconds"] == 0
    metrics = {m["name"]: m["value"] for m in status["metrics"]}
    assert set(metrics) == METRICS
    assert all(isinstance(value, str) for value in metrics.values())
    assert metrics["step"] == metrics["total_steps"] == str(steps) == "36"
    assert 0.0 <= float(metrics["val_accuracy"]) <= 1.0
    assert float(metrics["loss"]) > 0 and float(metrics["images_per_second"]) > 0
    assert metrics == {m["name"]: m["value"] for m in reports[-1]["metrics"]}
    # summary.json holds the same final figures, for the launcher on every API and backend.
    assert summary(out)[SUMMARY_KEY] == reports[-1]
    updated = datetime.strptime(status["lastUpdatedTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert abs((datetime.now(UTC) - updated).total_seconds()) < 120


def test_kubectl_reads_the_progress_with_jsonpath(k8s, tmp_path):
    """What the README tells users to type (the v2.3.0 CRD prints only State and Age)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl on PATH to read the TrainJob with")
    plane, name = k8s.cluster.plane, "shown"
    create_trainjob(k8s, name)
    progress = Progress(step=45, total_steps=100, eta_s=754.4, metrics={"loss": 0.25, "epoch": 2})
    apply_trainer_status(plane, k8s.name, name, progress.trainer_status())

    def get(*output: str) -> str:
        command = [kubectl, "--kubeconfig", str(plane.kubeconfig()), "-n", k8s.name]
        command += ["get", "trainjob", *output]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout

    percent = "jsonpath={.status.trainerStatus.progressPercentage}"
    assert get(name, "-o", percent) == "45"
    assert get(name, "-o", percent + '{"\\n"}') == "45\n"
    eta = "jsonpath={.status.trainerStatus.estimatedRemainingSeconds}"
    assert get(name, "-o", eta) == "754"
    loss = 'jsonpath={.status.trainerStatus.metrics[?(@.name=="loss")].value}'
    assert get(name, "-o", loss) == "0.25"
    columns = (
        "custom-columns=NAME:.metadata.name,STATE:.status.conditions[-1:].type,"
        "PROGRESS:.status.trainerStatus.progressPercentage,"
        "ETA-S:.status.trainerStatus.estimatedRemainingSeconds"
    )
    table = get("-o", columns).split()
    assert table[:5] == ["NAME", "STATE", "PROGRESS", "ETA-S", name], table
    assert table[6:] == ["45", "754"], table  # table[5]: the state, or <none> before one


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"lastUpdatedTime": None}, "status.trainerStatus.lastUpdatedTime"),  # sent as null
        ({"progressPercentage": 101}, "progressPercentage"),
        ({"progressPercentage": 45.0}, "Invalid payload"),  # Go's decoder wants an int32
        ({"metrics": [{"name": "loss", "value": 0.25}]}, "Invalid payload"),  # and strings
        ({"metrics": [{"name": "loss", "value": ""}]}, "value"),
        ({"metrics": [{"name": "x" * 65, "value": "1"}]}, "name"),
    ],
)
def test_the_crd_refuses_what_the_status_server_refuses(k8s, tmp_path, change, words):
    """The stand-in's 200s mean something: a malformed report gets the real server's 422."""
    plane, name = k8s.cluster.plane, "judged"
    create_trainjob(k8s, name)
    token = tmp_path / "token"
    token.write_text(audience_token(plane, k8s.name, "trainer", token_audience(k8s.name, name)))
    with StatusServer(tmp_path / "server", plane.ca, trainer_status_server(plane)) as server:
        endpoint = StatusEndpoint(
            url=server.url(k8s.name, name), token_file=token, ca_file=plane.ca_file
        )
        status = Progress(step=1, total_steps=4, eta_s=3.0, metrics={"loss": 1.0}).trainer_status()
        assert post_status(endpoint, status, timeout_s=10).code == 200
        malformed = {k: v for k, v in (status | change).items() if v is not None}
        answer = post_status(endpoint, malformed, timeout_s=10)
    assert answer.code == 422 and words in answer.message, answer


def test_a_token_of_another_audience_is_refused_and_training_goes_on(
    k8s, tmp_path, monkeypatch, capsys
):
    from tests.cluster.accounts import service_account_token

    plane, name = k8s.cluster.plane, "refused"
    create_trainjob(k8s, name)
    token = tmp_path / "token"  # a real token, but for the API server's audience
    token.write_text(service_account_token(plane, k8s.name, "trainer"))
    out = tmp_path / "out"
    with StatusServer(tmp_path / "server", plane.ca, trainer_status_server(plane)) as server:
        report_env(monkeypatch, server.url(k8s.name, name), plane.ca_file, token)
        args = [*SYNTHETIC, *TINY, *QUIET, "--progress-report-interval-s", "1"]
        assert main([*args, "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert len(server.codes) >= 2 and set(server.codes) == {403}
    assert printed.count("HTTP 403: Forbidden") == 2, printed  # the first failure, the final one
    assert f"0 went through, {len(server.codes)} failed" in printed
    assert "trainerStatus" not in read_trainjob(k8s, name).get("status", {})
    assert summary(out)["steps"] == 48


# --------------------------------------------------------------------- servers that misbehave
@pytest.fixture
def ca(tmp_path) -> tuple[CertificateAuthority, Path]:
    authority = CertificateAuthority()
    authority.pem.write(tmp_path / "ca", "ca.crt", "ca.key")
    token = tmp_path / "token"
    token.write_text("a-projected-token\n")
    return authority, tmp_path / "ca" / "ca.crt"


def train_records(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == "train"]


def timed_run(args: list[str]) -> tuple[float, dict]:
    started = time.monotonic()
    assert main(args) == 0
    return time.monotonic() - started, summary(Path(args[args.index("--output-dir") + 1]))


@pytest.mark.parametrize("misbehaving", ["server error", "hangs"])
def test_a_failing_or_hung_server_neither_fails_nor_slows_training(
    tmp_path, ca, monkeypatch, capsys, misbehaving
):
    authority, ca_file = ca
    timeout = 5.0
    args = [*SYNTHETIC, *TINY, *QUIET, "--progress-report-interval-s", "1"]
    args += ["--progress-report-timeout-s", str(timeout)]
    base_wall, base = timed_run([*args, "--output-dir", str(tmp_path / "base")])
    assert "progress report" not in capsys.readouterr().out

    if misbehaving == "hangs":
        server = HangingServer()
    else:
        server = StatusServer(tmp_path / "server", authority, answering(500))
    with server:
        report_env(monkeypatch, server.url("ns", "job"), ca_file, tmp_path / "token")
        wall, reported = timed_run([*args, "--output-dir", str(tmp_path / "reported")])
        printed = capsys.readouterr().out
        connections = len(server.connections if misbehaving == "hangs" else server.requests)

    assert reported["steps"] == base["steps"] == 48
    # A report that blocked the loop would hold a step for a whole timeout.
    elapsed = [r["elapsed_s"] for r in train_records(tmp_path / "reported")]
    gaps = [b - a for a, b in zip(elapsed, elapsed[1:], strict=False)]
    assert len(elapsed) == 48 and max(gaps) < 0.6 * timeout, gaps
    assert reported["train_time_s"] < 2 * base["train_time_s"] + 2.0, (base, reported)
    # The end waits for a report in flight (one timeout at most), then the final one (another).
    tail, base_tail = wall - reported["wall_time_s"], base_wall - base["wall_time_s"]
    assert tail < base_tail + 2 * timeout + 2.0, (tail, base_tail)
    if misbehaving == "hangs":
        assert connections >= 1
        assert "TimeoutError" in printed or "timed out" in printed, printed
        assert f"final progress report to Kubeflow Trainer got no answer within {timeout:g} s" in (
            printed
        )
    else:
        assert connections >= 2  # reports go on after a failure: the first one and the final
        assert printed.count("HTTP 500: Internal error") == 2, printed
        assert f"0 went through, {connections} failed" in printed  # the final line's tally


def test_without_the_variables_nothing_is_imported_or_started(tmp_path):
    """Three runs in one fresh interpreter: no variables, then the reports switched off (0), then
    on (the control: the module does get imported, so the probe can see it)."""
    script = f"""
import json, os, sys
from trainer.train import main
args = {[*SYNTHETIC, *TINY, "--tensorboard-dir", "none", "--max-steps", "2"]!r}
seen = []
def run(name, *extra):
    assert main([*args, *extra, "--output-dir", os.path.join({str(tmp_path)!r}, name)]) == 0
    seen.append("trainer.trainjob_status" in sys.modules)
run("unset")
os.environ.update({{
    {URL_VARIABLE!r}: "https://127.0.0.1:{free_port()}/apis/x/status",
    {TOKEN_VARIABLE!r}: {str(tmp_path / "token")!r},
}})
run("off", "--progress-report-interval-s", "0")
run("on", "--progress-report-timeout-s", "1")
print(json.dumps(seen))
"""
    env = {k: v for k, v in base_env().items() if not k.startswith("KUBEFLOW_TRAINER_")}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [False, False, True]
    assert "progress reports to Kubeflow Trainer: https://127.0.0.1" in result.stdout


def test_only_rank_0_reports(tmp_path, ca):
    """Two processes as a TrainJob's two nodes: each has the variables and a token of its own."""
    authority, ca_file = ca
    port, world, procs = free_port(), 2, []
    with StatusServer(tmp_path / "server", authority, answering(200)) as server:
        for rank in range(world):
            token = tmp_path / f"token-{rank}"
            token.write_text(f"token-of-rank-{rank}")
            env = base_env() | {
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                URL_VARIABLE: server.url("ns", "job"),
                CA_CERT_VARIABLE: str(ca_file),
                TOKEN_VARIABLE: str(token),
            }
            args = [*SYNTHETIC, *TINY, *QUIET, "--output-dir", str(tmp_path / f"out-{rank}")]
            args += ["--progress-report-interval-s", "1", "--init-timeout-s", "90"]
            (tmp_path / "logs").mkdir(exist_ok=True)
            log = tmp_path / "logs" / f"rank{rank}.log"
            procs.append(ForkedTrainer(args, env=env, cwd=REPO, log_path=log))
        assert wait_all(procs, timeout=180) == [0, 0], logs(tmp_path / "logs")
    assert len(server.requests) >= 2
    assert {r.token for r in server.requests} == {"token-of-rank-0"}
    assert server.requests[-1].trainer_status["progressPercentage"] == 100


# ---------------------------------------------------------------------- the reporter on its own
def test_the_payload_has_the_types_and_ranges_the_crd_demands():
    progress = Progress(
        step=99,
        total_steps=100,
        eta_s=1e12,
        metrics={"epoch": 3, "val_accuracy": 0.987654321, "loss": float("nan"), "custom": 1.5},
        observed_at=0.0,
    )
    status = progress.trainer_status()
    assert status["progressPercentage"] == 99  # rounded down: 100 only once the run is complete
    assert status["estimatedRemainingSeconds"] == INT32_MAX
    assert status["lastUpdatedTime"] == "1970-01-01T00:00:00Z"
    assert status["metrics"] == [  # the known names first, in their order
        {"name": "loss", "value": "nan"},
        {"name": "val_accuracy", "value": "0.987654"},
        {"name": "epoch", "value": "3"},
        {"name": "custom", "value": "1.5"},
    ]
    unknown = Progress(step=0, total_steps=0, eta_s=float("inf")).trainer_status()
    assert "progressPercentage" not in unknown and "estimatedRemainingSeconds" not in unknown
    assert STAMP.fullmatch(unknown["lastUpdatedTime"])
    late = Progress(step=5, total_steps=10, eta_s=-3).trainer_status()
    assert late["estimatedRemainingSeconds"] == 0
    assert [metric_text(v) for v in (1200, 3.90625e-05, 1e20)] == ["1200", "3.90625e-05", "1e+20"]


def test_the_variables_must_name_an_https_url_and_a_token_file():
    token = {TOKEN_VARIABLE: "/var/run/secrets/kubeflow/trainer/token"}
    with pytest.raises(ValueError, match="not an https:// URL"):
        StatusEndpoint.from_environ({URL_VARIABLE: "http://trainer:10443/status"} | token)
    with pytest.raises(ValueError, match=f"{TOKEN_VARIABLE} .* is not"):
        StatusEndpoint.from_environ({URL_VARIABLE: "https://trainer:10443/status"})
    endpoint = StatusEndpoint.from_environ({URL_VARIABLE: "https://trainer:10443/s"} | token)
    assert endpoint.ca_file is None  # the system's trust store


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"progress_report_interval_s": 0.5}, "--progress-report-interval-s 0.5 is too short"),
        ({"progress_report_interval_s": -1}, "--progress-report-interval-s -1.0 is out of range"),
        ({"progress_report_timeout_s": 0}, "--progress-report-timeout-s 0.0 is out of range"),
    ],
)
def test_report_settings_are_checked(tmp_path, changes, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        TrainConfig(output_dir=tmp_path, synthetic=True, **changes)


def test_only_the_latest_figures_wait_and_the_final_report_goes_out_at_once(tmp_path, ca):
    from trainer.run_log import RunLog

    authority, ca_file = ca
    interval = 2.0

    def wait_for(server: StatusServer, count: int) -> None:
        deadline = time.monotonic() + 30
        while len(server.requests) < count and time.monotonic() < deadline:
            time.sleep(0.02)

    with StatusServer(tmp_path / "server", authority, answering(200)) as server:
        endpoint = StatusEndpoint(
            url=server.url("ns", "job"), token_file=tmp_path / "token", ca_file=ca_file
        )
        log = RunLog(tmp_path, is_main=True)
        # A timeout shorter than the interval: a final report that waited for the interval
        # would miss close()'s wait.
        reporter = StatusReporter(endpoint, interval_s=interval, timeout_s=1.0, log=log)
        figures = ProgressTracker()
        reporter.offer(figures.update(step=1, total_steps=2000, loss=1.0))
        wait_for(server, 1)
        for step in range(2, 1002):  # far more often than the interval allows
            latest = figures.update(step=step, total_steps=2000, eta_s=2000.0 - step, loss=1 / step)
            reporter.offer(latest)
        wait_for(server, 2)
        reporter.offer(figures.update(step=2000, total_steps=2000, final=True))
        reporter.close()
    steps = [
        int(next(m["value"] for m in r.trainer_status["metrics"] if m["name"] == "step"))
        for r in server.requests
    ]
    assert steps == [1, 1001, 2000]  # the figures in between were replaced, never queued
    assert server.requests[1].received_at - server.requests[0].received_at >= 0.8 * interval
    final = server.requests[-1].trainer_status
    assert final["progressPercentage"] == 100 and final["estimatedRemainingSeconds"] == 0
    assert reporter.sent == 3 and reporter.failed == 0


def test_a_report_hung_in_flight_does_not_cost_the_final_one(tmp_path, ca):
    """The first report's answer never comes in time; the final one still goes through."""
    from trainer.run_log import RunLog

    authority, ca_file = ca
    timeout = 1.5
    answer = answering(200)

    def slow_first(request):
        if len(requests) == 1:  # the first request: answered after the client gave up
            time.sleep(2 * timeout)
        return answer(request)

    with StatusServer(tmp_path / "server", authority, slow_first) as server:
        requests = server.requests
        endpoint = StatusEndpoint(
            url=server.url("ns", "job"), token_file=tmp_path / "token", ca_file=ca_file
        )
        reporter = StatusReporter(
            endpoint, interval_s=60.0, timeout_s=timeout, log=RunLog(tmp_path, is_main=True)
        )
        figures = ProgressTracker()
        reporter.offer(figures.update(step=1, total_steps=10, loss=1.0))
        deadline = time.monotonic() + 10
        while not requests and time.monotonic() < deadline:
            time.sleep(0.02)
        reporter.offer(figures.update(step=10, total_steps=10, final=True))
        reporter.close()
        assert (reporter.sent, reporter.failed) == (1, 1), reporter.last_problem
        assert "timed out" in str(reporter.last_problem)
    assert [r.trainer_status["progressPercentage"] for r in server.requests] == [10, 100]
