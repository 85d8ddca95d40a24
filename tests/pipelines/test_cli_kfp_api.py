"""`kfp-ddp upload/run/schedule` through the real kfp.Client against the stand-in API server."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from kfp_ddp.free_ports import free_port
from pipelines.cli import main
from pipelines.package import compile_pipeline
from tests import yaml_fast
from tests.pipelines.kfp_api_server import FakeKfpServer

IMAGE = "registry.example/kfp-ddp:1.0"
REQUIRED = ["-p", "data_uri=s3://bucket/digits", "-p", "publish_uri=s3://bucket/models"]


@pytest.fixture(autouse=True)
def _images_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the KFP API: IMAGE's registry is taken to have it (the check that
    asks registries is tested in test_cli_image_check.py, against a real one)."""
    monkeypatch.setattr("pipelines.cli.check_images", lambda images, *, what: None)


@functools.cache
def compiled_package() -> Path:
    """The pipeline compiled for another image than the committed one's release image."""
    folder = Path(tempfile.mkdtemp(prefix="kfp-ddp-test-package-"))
    atexit.register(shutil.rmtree, folder, True)  # cached for the session, removed after it
    return compile_pipeline(folder / "pipeline.yaml", image=IMAGE)


PACKAGE = str(compiled_package())


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=True)


def committed_docs() -> list[dict]:
    return [d for d in yaml_fast.safe_load_all(compiled_package().read_text()) if d]


def assert_one_clear_error(result, *needles: str) -> None:
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    for needle in needles:
        assert needle in errors[0], result.output


def test_upload_sends_the_compiled_yaml_then_a_version(kfp_server: FakeKfpServer) -> None:
    first = invoke("upload", "--host", kfp_server.url, "--package", PACKAGE, "--name", "ddp")
    assert first.exit_code == 0, first.output
    (upload,) = kfp_server.requests_to("POST", "/pipelines/upload")
    assert upload.query["name"] == ["ddp"]
    assert upload.files["uploadfile"] == compiled_package().read_bytes()

    second = invoke(
        "upload", "--host", kfp_server.url, "--package", PACKAGE, "--name", "ddp", "--version", "v2"
    )
    assert second.exit_code == 0, second.output
    (version,) = kfp_server.requests_to("POST", "/pipelines/upload_version")
    (pipeline_id,) = kfp_server.pipelines
    assert version.query["pipelineid"] == [pipeline_id]
    assert version.query["name"] == ["v2"]
    assert version.files["uploadfile"] == compiled_package().read_bytes()
    assert "version 'v2'" in second.output


def test_run_sends_spec_typed_parameters_and_experiment(kfp_server: FakeKfpServer) -> None:
    result = invoke(
        "run",
        "--host",
        kfp_server.url,
        "--package",
        PACKAGE,
        "--experiment",
        "nightly",
        "--name",
        "r1",
        "-p",
        "epochs=3",
        "-p",
        "lr=0.05",
        "-p",
        "data_uri=s3://bucket/digits",
        "-p",
        "publish_uri=s3://bucket/models",
        "-p",
        "accuracy_threshold=0.9",
    )
    assert result.exit_code == 0, result.output
    (experiment,) = kfp_server.requests_to("POST", "/experiments")
    assert experiment.json["display_name"] == "nightly"
    (run,) = kfp_server.runs
    assert run["display_name"] == "r1"
    assert run["experiment_id"] == kfp_server.requests_to("POST", "/runs")[0].json["experiment_id"]
    assert run["runtime_config"]["parameters"] == {
        "epochs": 3,
        "lr": 0.05,
        "data_uri": "s3://bucket/digits",
        "publish_uri": "s3://bucket/models",
        "accuracy_threshold": 0.9,
    }
    pipeline_doc, platform_doc = committed_docs()
    assert run["pipeline_spec"]["pipeline_spec"]["root"] == pipeline_doc["root"]
    assert run["pipeline_spec"]["pipeline_spec"]["deploymentSpec"] == pipeline_doc["deploymentSpec"]
    assert run["pipeline_spec"]["platform_spec"] == platform_doc


def test_run_no_cache_turns_caching_off_in_every_dag(kfp_server: FakeKfpServer) -> None:
    result = invoke("run", "--host", kfp_server.url, "--package", PACKAGE, "--no-cache", *REQUIRED)
    assert result.exit_code == 0, result.output
    spec = kfp_server.runs[0]["pipeline_spec"]["pipeline_spec"]
    dags = [spec["root"]["dag"]] + [c["dag"] for c in spec["components"].values() if "dag" in c]
    tasks = [t for dag in dags for t in dag["tasks"].values()]
    assert len(tasks) > len(spec["root"]["dag"]["tasks"])  # nested DAGs exist and are covered
    # proto3 drops false booleans: no enableCache means caching off (like the sync step's).
    assert not any(t.get("cachingOptions", {}).get("enableCache") for t in tasks)
    committed = committed_docs()[0]["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    assert committed["training-job-component"]["cachingOptions"] == {"enableCache": True}
    # ... and the trainer starts in a fresh folder instead of resuming an identical run.
    assert kfp_server.runs[0]["runtime_config"]["parameters"]["retrain_token"]


def test_schedule_sends_cron_concurrency_catchup_and_parameters(kfp_server: FakeKfpServer) -> None:
    result = invoke(
        "schedule",
        "--host",
        kfp_server.url,
        "--package",
        PACKAGE,
        "--cron",
        "0 2 * * *",
        "--max-concurrency",
        "2",
        "--no-catchup",
        "-p",
        "workers=4",
        *REQUIRED,
    )
    assert result.exit_code == 0, result.output
    (recurring,) = kfp_server.recurring_runs
    # KFP's scheduler parses cron with a seconds field first: 02:00 daily is "0 0 2 * * *".
    assert recurring["trigger"] == {"cron_schedule": {"cron": "0 0 2 * * *"}}
    assert int(recurring["max_concurrency"]) == 2
    assert recurring["no_catchup"] is True
    assert recurring["mode"] == "ENABLE"
    assert recurring["runtime_config"]["parameters"] == {
        "workers": 4,
        "data_uri": "s3://bucket/digits",
        "publish_uri": "s3://bucket/models",
    }
    assert recurring["pipeline_spec"]["pipeline_spec"]["root"] == committed_docs()[0]["root"]

    again = invoke(
        "schedule",
        "--host",
        kfp_server.url,
        "--package",
        PACKAGE,
        "--cron",
        "0 0 3 * * 1",
        "--catchup",
        *REQUIRED,
    )
    assert again.exit_code == 0, again.output
    assert kfp_server.recurring_runs[1]["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * 1"
    assert kfp_server.recurring_runs[1]["no_catchup"] is False


def test_schedule_sends_its_window_in_utc_and_refuses_one_that_never_runs(
    kfp_server: FakeKfpServer,
) -> None:
    """A start or end the server cannot parse came back as an API error after the experiment
    was made; an end already past, or before the first run, made a schedule that never runs."""
    base = ["schedule", "--host", kfp_server.url, "--package", PACKAGE, "--cron", "0 2 * * *"]
    refused = {
        ("--start-time", "2026-13-01T00:00:00Z"): "is not an RFC 3339 date and time",
        ("--start-time", "2031-12-05"): "is a date without a time of day",
        ("--start-time", "2031-12-05T10:00:00"): "has no UTC offset (Z, +01:00)",
        ("--end-time", "2020-01-01T00:00:00Z"): "is past (",
        ("--end-time", "2031-12-05T01:00:00Z", "--start-time", "2031-12-05T00:00:00Z"): (
            "comes before the schedule's first run (2031-12-05T02:00:00Z, by --cron '0 0 2 * * *')"
        ),
        ("--end-time", "2031-12-04T00:00:00Z", "--start-time", "2031-12-05T00:00:00Z"): (
            "is not after --start-time '2031-12-05T00:00:00Z'"
        ),
    }
    for options, words in refused.items():
        result = invoke(*base, *options, *REQUIRED)
        assert result.exit_code == 2, result.output
        assert f"Invalid value for '{options[0]}': '{options[1]}' " in result.output
        assert words in result.output, result.output
    assert kfp_server.requests == []  # nothing was sent, no experiment made

    window = ["--start-time", "2031-12-05T03:00:00+01:00", "--end-time", "2032-01-01T00:00:00Z"]
    result = invoke(*base, *window, *REQUIRED)
    assert result.exit_code == 0, result.output
    (recurring,) = kfp_server.recurring_runs
    assert recurring["trigger"]["cron_schedule"] == {
        "cron": "0 0 2 * * *",
        "start_time": "2031-12-05T02:00:00Z",
        "end_time": "2032-01-01T00:00:00Z",
    }


def test_run_without_package_compiles_for_the_image(kfp_server: FakeKfpServer) -> None:
    result = invoke(
        "run", "--host", kfp_server.url, "--image", "registry.example/ddp:1.2", *REQUIRED
    )
    assert result.exit_code == 0, result.output
    executors = kfp_server.runs[0]["pipeline_spec"]["pipeline_spec"]["deploymentSpec"]["executors"]
    images = {e["container"]["image"] for e in executors.values()}
    assert "registry.example/ddp:1.2" in images
    assert "ghcr.io/kfp-ddp/kfp-ddp:0.1.0" not in images


def test_host_from_env_and_token_sent_but_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeKfpServer(token="tok-SECRET-123") as server:
        monkeypatch.setenv("KFP_HOST", server.url)
        refused = invoke("run", "--package", PACKAGE, *REQUIRED)
        assert_one_clear_error(refused, "refused the credentials", "401", "KFP_TOKEN")

        monkeypatch.setenv("KFP_TOKEN", "tok-SECRET-123")
        ok = invoke("run", "--package", PACKAGE, *REQUIRED)
        assert ok.exit_code == 0, ok.output
        assert server.requests_to("POST", "/runs")[0].headers["authorization"] == (
            "Bearer tok-SECRET-123"
        )
        for result in (refused, ok):
            assert "tok-SECRET-123" not in result.output


def test_service_account_token_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("sa-token-xyz\n")
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(token_file))
    with FakeKfpServer(token="sa-token-xyz") as server:
        result = invoke("upload", "--host", server.url, "--package", PACKAGE)
        assert result.exit_code == 0, result.output
        assert server.requests_to("POST", "/pipelines/upload")[0].headers["authorization"] == (
            "Bearer sa-token-xyz"
        )
        assert "sa-token-xyz" not in result.output


def test_forbidden_is_one_clear_error() -> None:
    with FakeKfpServer(forbidden=True) as server:
        result = invoke("upload", "--host", server.url, "--package", PACKAGE)
    assert_one_clear_error(result, "refused the credentials", "403")


def test_unreachable_server_is_one_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = invoke(
        "schedule", "--host", url, "--package", PACKAGE, "--cron", "0 2 * * *", *REQUIRED
    )
    assert_one_clear_error(result, "cannot reach", url)


def test_no_host_and_host_without_scheme() -> None:
    assert_one_clear_error(invoke("run", "--package", PACKAGE, *REQUIRED), "--host", "KFP_HOST")
    assert_one_clear_error(
        invoke("run", "--package", PACKAGE, "--host", "localhost:8888", *REQUIRED),
        "http://localhost:8888",
    )


def test_server_side_rejection_is_one_clear_error(kfp_server: FakeKfpServer) -> None:
    kfp_server.pipelines["x"] = {"display_name": "dup", "versions": []}
    kfp_server.pipelines["y"] = {"display_name": "dup", "versions": []}
    result = invoke("upload", "--host", kfp_server.url, "--package", PACKAGE, "--name", "dup")
    assert_one_clear_error(result, "Multiple pipelines")


@pytest.mark.parametrize(
    ("route", "status", "message", "needles"),
    [
        (
            "POST /runs",
            400,
            "Invalid input error: epochs must be > 0",
            ["HTTP 400", "epochs must be"],
        ),
        ("POST /runs", 403, "no access to namespace team-a", ["refused the credentials", "403"]),
        ("GET /experiments", 500, "database is down", ["HTTP 500", "database is down"]),
    ],
)
def test_api_errors_after_a_healthy_probe(
    route: str, status: int, message: str, needles: list[str]
) -> None:
    with FakeKfpServer(reject={route: (status, message)}) as server:
        result = invoke("run", "--host", server.url, "--package", PACKAGE, *REQUIRED)
    assert_one_clear_error(result, *needles)


@pytest.mark.parametrize(
    ("params", "needles"),
    [
        (["-p", "epochs=three"], ["'epochs'", "integer", "'three'"]),
        (["-p", "lr=fast"], ["'lr'", "number"]),
        (["-p", "bogus=1"], ["unknown pipeline parameter 'bogus'; valid", "epochs", "data_uri"]),
        (["-p", "epoch=3"], ["unknown pipeline parameter 'epoch' (did you mean 'epochs'?)"]),
        (["-p", "epochs"], ["key=value"]),
        (["-p", "epochs=1", "-p", "epochs=2"], ["given twice"]),
    ],
)
def test_bad_parameters_are_refused_before_any_request(
    kfp_server: FakeKfpServer, params: list[str], needles: list[str]
) -> None:
    result = invoke("run", "--host", kfp_server.url, "--package", PACKAGE, *REQUIRED, *params)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in result.output
    assert kfp_server.requests == []


def test_bad_cron_and_missing_package(kfp_server: FakeKfpServer, tmp_path: Path) -> None:
    bad_cron = invoke(
        "schedule", "--host", kfp_server.url, "--package", PACKAGE, "--cron", "2 * *", *REQUIRED
    )
    assert bad_cron.exit_code == 2
    assert "'0 2 * * *'" in bad_cron.output
    missing = invoke(
        "run", "--host", kfp_server.url, "--package", str(tmp_path / "nope.yaml"), *REQUIRED
    )
    assert_one_clear_error(missing, "nope.yaml", "kfp-ddp compile")
    broken = tmp_path / "broken.yaml"
    broken.write_text("root: {dag: [unclosed\n")
    not_yaml = invoke("run", "--host", kfp_server.url, "--package", str(broken), *REQUIRED)
    assert_one_clear_error(not_yaml, "broken.yaml", "not valid YAML")


def test_console_script_exits_non_zero_without_traceback() -> None:
    script = Path(sys.executable).with_name("kfp-ddp")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KFP_", "KF_PIPELINES"))}
    url = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.run(
        [str(script), "run", "--host", url, "--package", PACKAGE, "--skip-image-check", *REQUIRED],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        line for line in proc.stderr.strip().splitlines() if line.startswith("Error:")
    ]
    assert "cannot reach" in proc.stderr


def test_disable_caching_walks_nested_dags() -> None:
    from pipelines.package import disable_caching

    spec = json.loads(json.dumps(committed_docs()[0]))
    assert disable_caching(spec) >= 5


def test_bad_arguments_are_refused_one_line_each_before_any_request(
    kfp_server: FakeKfpServer,
) -> None:
    result = invoke(
        "run",
        "--host",
        kfp_server.url,
        "--package",
        PACKAGE,
        "-p",
        "data_uri=not-a-uri",
        "-p",
        "publish_uri=s3://bucket/models",
        "-p",
        "epochs=0",
        "-p",
        "accuracy_threshold=2",
    )
    assert result.exit_code == 2, result.output
    assert "-p data_uri='not-a-uri': must be an s3://bucket/prefix URI" in result.output
    assert "-p epochs=0: --epochs 0 is too small" in result.output
    assert "-p accuracy_threshold=2.0: must be between 0 and 1" in result.output
    assert "Traceback" not in result.output
    assert kfp_server.requests == []


def test_namespace_goes_to_the_experiment_and_comes_from_kfp_namespace(
    kfp_server: FakeKfpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = invoke(
        "run", "--host", kfp_server.url, "--package", PACKAGE, "--namespace", "team-a", *REQUIRED
    )
    assert result.exit_code == 0, result.output
    (experiment,) = kfp_server.requests_to("POST", "/experiments")
    assert experiment.json["namespace"] == "team-a"
    monkeypatch.setenv("KFP_NAMESPACE", "team-b")
    again = invoke(
        "run", "--host", kfp_server.url, "--package", PACKAGE, "--experiment", "e2", *REQUIRED
    )
    assert again.exit_code == 0, again.output
    assert kfp_server.requests_to("POST", "/experiments")[1].json["namespace"] == "team-b"


HEALTHZ_ONLY = [("GET", "/apis/v2beta1/healthz")]


def sent(server: FakeKfpServer) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in server.requests]


def submit_args(command: str, url: str, *extra: str) -> list[str]:
    """The command line of upload / run / schedule against ``url`` with our package."""
    args = [command, "--host", url, "--package", PACKAGE, *extra]
    if command == "schedule":
        args += ["--cron", "0 2 * * *"]
    return args + (REQUIRED if command != "upload" else [])


@pytest.mark.parametrize(
    ("tag_name", "expected"),
    [
        ("2.15.0", (2, 15, 0, 3, 0)),
        ("v2.16.1", (2, 16, 1, 3, 0)),
        (" 2.17.0\n", (2, 17, 0, 3, 0)),
        ("2.0.0-rc.2", (2, 0, 0, 2, 2)),
        ("2.0.0-alpha.7", (2, 0, 0, 0, 7)),
        ("master", None),
        ("unknown", None),
        ("1.0-dev", None),
        ("2.15", None),
        ("2.15.0-custom", None),
        ("", None),
    ],
)
def test_parse_kfp_release(tag_name: str, expected: tuple | None) -> None:
    from pipelines.kfp_api import parse_kfp_release

    assert parse_kfp_release(tag_name) == expected


def test_releases_order_by_number_and_stage() -> None:
    from pipelines.kfp_api import MIN_KFP_BACKEND, parse_kfp_release

    minimum = parse_kfp_release(MIN_KFP_BACKEND)
    assert minimum is not None
    # As strings "2.5.0" > "2.15.0": the comparison must be numeric.
    for older in ("2.5.0", "2.14.4", "1.8.22", "2.15.0-rc.1", "2.15.0-beta.3"):
        assert parse_kfp_release(older) < minimum, older
    for newer in ("2.15.0", "v2.15.1", "2.16.0", "2.17.0", "3.0.0-alpha.1", "10.0.0"):
        assert parse_kfp_release(newer) >= minimum, newer


@pytest.mark.parametrize("command", ["upload", "run", "schedule"])
def test_an_old_server_is_refused_before_anything_is_sent(command: str) -> None:
    with FakeKfpServer(tag_name="2.14.4") as server:
        result = invoke(*submit_args(command, server.url))
    assert result.exit_code == 2, result.output
    assert_one_clear_error(
        result,
        f"--host {server.url}",
        "release 2.14.4",
        "2.15.0 or newer",
        "secretAsEnv.optional",
        "secretNameParameter",
        "Upgrade Kubeflow Pipelines",
        "--skip-kfp-version-check",
    )
    assert sent(server) == HEALTHZ_ONLY
    assert not (server.pipelines or server.experiments or server.runs or server.recurring_runs)


@pytest.mark.parametrize("tag_name", ["2.5.0", "v2.14.0", "2.4.1", "2.15.0-rc.1"])
def test_every_release_before_the_minimum_is_refused(tag_name: str) -> None:
    with FakeKfpServer(tag_name=tag_name) as server:
        result = invoke(*submit_args("run", server.url))
    assert_one_clear_error(result, f"release {tag_name}", "2.15.0 or newer")
    assert result.exit_code == 2
    assert sent(server) == HEALTHZ_ONLY


@pytest.mark.parametrize("tag_name", ["2.15.0", "v2.16.1"])
def test_the_minimum_and_newer_pass_without_a_warning(tag_name: str) -> None:
    with FakeKfpServer(tag_name=tag_name) as server:
        result = invoke(*submit_args("run", server.url))
        assert result.exit_code == 0, result.output
        assert len(server.runs) == 1
    assert "WARNING" not in result.stderr


@pytest.mark.parametrize("command", ["upload", "run", "schedule"])
@pytest.mark.parametrize("tag_name", ["master", "unknown", "1.0-dev", "", None])
def test_an_unreadable_version_warns_and_proceeds(command: str, tag_name: str | None) -> None:
    with FakeKfpServer(tag_name=tag_name) as server:
        result = invoke(*submit_args(command, server.url))
        assert result.exit_code == 0, result.output
        created = server.pipelines or server.runs or server.recurring_runs
        assert len(created) == 1
    (warning,) = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert "cannot tell the release" in warning
    assert f"tag_name {tag_name or ''!r}" in warning
    assert "2.15.0 or newer" in warning


def test_skip_version_check_turns_the_refusal_into_a_warning() -> None:
    with FakeKfpServer(tag_name="2.14.4") as server:
        result = invoke(*submit_args("run", server.url, "--skip-kfp-version-check"))
        assert result.exit_code == 0, result.output
        assert len(server.runs) == 1
    (warning,) = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert "release 2.14.4" in warning and "--skip-kfp-version-check" in warning


def test_version_check_is_on_each_command_help() -> None:
    for command in ("upload", "run", "schedule"):
        help_text = invoke(command, "--help").output
        assert "--skip-kfp-version-check" in help_text and "2.15.0" in help_text, command


def test_a_healthz_answer_that_is_not_json_counts_as_an_unreadable_version() -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    from pipelines.kfp_api import probe_server

    class Html(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = b"<html>ok</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Html) as httpd:
        Thread(target=httpd.serve_forever, daemon=True).start()
        host, port = httpd.server_address[:2]
        try:
            assert probe_server(f"http://{host}:{port}", None, None) == {}
        finally:
            httpd.shutdown()
    with FakeKfpServer() as server:
        assert probe_server(server.url, None, None)["tag_name"] == "2.17.0"
