"""Local backend, TFJob contract: the Training Operator's TF_CONFIG per replica, the Chief's
success ending the job (parameter servers stopped), restarts — and the example TensorFlow program
(``examples/tensorflow/train.py``, real TensorFlow on CPU) as Chief + Worker: both in the
all-reduce, and a SIGKILLed worker restarted, resuming from the checkpoint.

The contract tests use a small script instead of TensorFlow (seconds, not a minute); the real
TensorFlow tests are few and marked slow (each TensorFlow process takes 5-15 s to import).
"""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from components.launcher import JobFailed, LocalOptions, TrainSpec, run_job
from components.launcher.backends.tf_config import TfTask, tf_config_env, tf_tasks
from tests.launcher.test_local_backend import kill_once, record_first_attempt

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tensorflow" / "train.py"
PROGRAM = {"image": "registry.example.com/tf-example:1"}

# Stands in for a TensorFlow program: records its env; the chief waits for every replica, a
# parameter server serves until it is stopped (SIGTERM), a worker may fail on purpose.
REPLICA = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path

    out, mode = Path(sys.argv[1]), sys.argv[2]
    config = json.loads(os.environ.get("TF_CONFIG") or '{"task": {"type": "chief", "index": 0}}')
    task = config["task"]
    name = f"{task['type']}-{task['index']}"
    if task["type"] == "ps":
        signal.signal(signal.SIGTERM, lambda *_: (out / "ps-stopped").touch() or sys.exit(143))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"env-{name}.json").write_text(json.dumps(dict(os.environ)))
    print(f"{name} up", flush=True)
    if task["type"] == "ps":
        time.sleep(60)
    if task["type"] == "worker" and mode == "worker-fails":
        print("bad input", flush=True)
        sys.exit(3)
    if task["type"] == "chief":
        replicas = sum(len(a) for a in config.get("cluster", {"chief": [0]}).values())
        while len(list(out.glob("env-*.json"))) < replicas:
            time.sleep(0.05)
        time.sleep(0.3 if mode == "ok" else 30)
    """
)


@pytest.fixture
def replica_script(tmp_path: Path) -> Path:
    path = tmp_path / "replica.py"
    path.write_text(REPLICA)
    return path


def tf_spec(**kw) -> TrainSpec:
    return TrainSpec.flat(**({"api": "tfjob", "name": "tf-local"} | PROGRAM | kw))


def test_tf_tasks_and_config_are_the_operators():
    tasks = tf_tasks(tf_spec(command=["python", "t.py"], workers=3, ps_replicas=2))
    assert [t.name for t in tasks] == ["chief-0", "worker-0", "worker-1", "ps-0", "ps-1"]
    env = tf_config_env(tasks, [11, 12, 13, 14, 15], TfTask("worker", 1))
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {
            "chief": ["127.0.0.1:11"],
            "worker": ["127.0.0.1:12", "127.0.0.1:13"],
            "ps": ["127.0.0.1:14", "127.0.0.1:15"],
        },
        "task": {"type": "worker", "index": 1},
        "environment": "cloud",
    }
    # One replica in all: the operator sets no TF_CONFIG (TensorFlow runs alone).
    lone = tf_tasks(tf_spec(command=["python", "t.py"]))
    assert lone == [TfTask("chief", 0)] and tf_config_env(lone, [11], lone[0]) == {}


def test_each_replica_gets_tf_config_and_the_chief_ends_the_job(
    replica_script: Path, tmp_path: Path, monkeypatch
):
    monkeypatch.setenv("TF_CONFIG", '{"task": {"type": "leaked"}}')  # a pod starts clean
    monkeypatch.setenv("RANK", "5")
    out = tmp_path / "out"
    lines: list[str] = []
    spec = tf_spec(
        workers=3, ps_replicas=1, command=["python", str(replica_script)], args=[str(out), "ok"]
    )
    result = run_job(spec, backend="local", options=LocalOptions(log=lines.append))
    assert result.phase == "Succeeded" and result.api == "tfjob" and result.restarts == 0
    names = ["chief-0", "worker-0", "worker-1", "ps-0"]
    envs = {name: json.loads((out / f"env-{name}.json").read_text()) for name in names}
    configs = {name: json.loads(env["TF_CONFIG"]) for name, env in envs.items()}
    cluster = configs["chief-0"]["cluster"]
    assert {kind: len(addresses) for kind, addresses in cluster.items()} == {
        "chief": 1,
        "worker": 2,
        "ps": 1,
    }
    addresses = [a for kind in ("chief", "worker", "ps") for a in cluster[kind]]
    assert all(re.fullmatch(r"127\.0\.0\.1:\d+", a) for a in addresses)
    assert len(set(addresses)) == 4  # a port of its own for every replica
    for name, config in configs.items():
        kind, index = name.split("-")
        assert config["task"] == {"type": kind, "index": int(index)}
        assert config["cluster"] == cluster
        for absent in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PET_NNODES"):
            assert absent not in envs[name], absent  # the torch contracts are not a TFJob's
        assert f"[{name}] {name} up" in lines
    # The Chief succeeded → the job did; the parameter server, serving forever, was stopped.
    assert (out / "ps-stopped").is_file()
    assert any("chief-0 succeeded, so the job did; stopping ps-0" in x for x in lines)


def test_a_lone_chief_gets_no_tf_config(replica_script: Path, tmp_path: Path):
    out = tmp_path / "out"
    spec = tf_spec(command=["python", str(replica_script)], args=[str(out), "ok"])
    assert run_job(spec, backend="local", options=LocalOptions(log=print)).phase == "Succeeded"
    assert "TF_CONFIG" not in json.loads((out / "env-chief-0.json").read_text())


def test_a_failed_worker_fails_the_job_under_the_exit_code_policy(
    replica_script: Path, tmp_path: Path
):
    spec = tf_spec(
        workers=2,
        restart_policy="ExitCode",
        command=["python", str(replica_script)],
        args=[str(tmp_path / "out"), "worker-fails"],
    )
    with pytest.raises(JobFailed) as err:
        run_job(spec, backend="local", options=LocalOptions(log=print, grace_period_s=2))
    message = str(err.value)
    assert "replica worker-0 exited with code 3" in message and "permanent" in message
    assert "[worker-0] bad input" in message


# -- the example TensorFlow program, with real TensorFlow on CPU --------------------------------


def example_spec(output: Path, *args: str, **kw) -> TrainSpec:
    return tf_spec(
        workers=2,
        command=["python", str(EXAMPLE)],
        args=["--synthetic", "--output-dir", str(output), *args],
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        **kw,
    )


def example_lines(lines: list[str], replica: str, pattern: str) -> list[re.Match]:
    found = (re.search(pattern, x) for x in lines if x.startswith(f"[{replica}] [tf-example]"))
    return [m for m in found if m]


def newest_checkpoint(checkpoints: Path) -> int:
    """The step of the chief's newest checkpoint (0: none yet), from CheckpointManager's index."""
    try:
        text = (checkpoints / "checkpoint").read_text()
    except OSError:
        return 0
    found = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', text, re.MULTILINE)
    return int(found.group(1)) if found else 0


@pytest.mark.slow
def test_tf_example_killed_worker_restarts_and_resumes_from_the_checkpoint(tmp_path: Path):
    pytest.importorskip("tensorflow")
    output = tmp_path / "out"
    pids: dict[str, int] = {}
    killer = kill_once(pids, lambda: newest_checkpoint(output / "checkpoints") >= 40)
    lines: list[str] = []
    spec = example_spec(
        output, "--epochs", "1", "--steps-per-epoch", "300", "--checkpoint-every-steps", "20"
    )
    options = LocalOptions(
        log=lines.append,
        on_event=record_first_attempt(pids),
        output_dir=output,
        grace_period_s=5,
        timeout_s=400,
    )
    result = run_job(spec, backend="local", options=options)
    killer.join()
    assert result.phase == "Succeeded" and result.restarts == 1
    restarts = [x for x in lines if "restarting the group" in x]
    # Another exit (a run failed 1 before the kill) is the program's: show what it said.
    assert any("worker-0 exited with code 137" in x for x in restarts), "\n".join(lines[-80:])
    summary = result.summary
    assert summary["steps"] == 300 and summary["world_size"] == 2
    assert summary["resumed_from_step"] is not None and summary["resumed_from_step"] >= 40
    # Both replicas of the second attempt restored the chief's checkpoint.
    for replica in ("chief-0", "worker-0"):
        assert example_lines(lines, replica, r"resuming from .*ckpt-\d+ \(step (\d+)\)"), replica
    # Both took part in the all-reduce of each attempt, and ended with the same weights.
    for replica in ("chief-0", "worker-0"):
        checks = example_lines(lines, replica, r"replicas_in_sync=(\d+) collective_sum=(\S+)")
        assert [(m[1], m[2]) for m in checks] == [("2", "3")] * 2, replica
    chief_sum = example_lines(lines, "chief-0", r"weights_checksum=(\S+)")
    worker_sum = example_lines(lines, "worker-0", r"weights_checksum=(\S+)")
    assert len(chief_sum) == 1 and [m[1] for m in worker_sum] == [chief_sum[0][1]]
    assert (output / "model" / "model.keras").is_file()
    # Nothing of the killed attempt is left running.
    leftovers = subprocess.run(
        ["pgrep", "-f", str(output)], capture_output=True, text=True
    ).stdout.split()
    assert not leftovers, leftovers
