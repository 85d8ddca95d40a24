"""Watches as Kubernetes clients do them, on a real API server: a watch continues from the last
resourceVersion it saw; when that version was compacted away (410 Gone) it lists again, and what
vanished in the gap is reported deleted. And a launcher restarted mid-job re-attaches.

The 410 tests use the bare plane (an API server alone, watching etcd directly, without the watch
cache) so that an etcd compaction makes an old resourceVersion answer 410 Gone, as a busy
cluster's does. No controller runs there: where a test needs a job to finish, it plays the
Training Operator by patching the job's status itself.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from kubernetes import client

from components.launcher.backends.kubernetes.watching import ResumableWatch
from tests.cluster.play import JobPods
from tests.launcher.k8s_helpers import kubeconfig_of, run, spec

REPO = Path(__file__).resolve().parents[2]


def pod(name: str, job: str = "job", rtype: str = "master") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                "training.kubeflow.org/job-name": job,
                "training.kubeflow.org/replica-type": rtype,
                "training.kubeflow.org/replica-index": "0",
            },
        },
        "spec": {"containers": [{"name": "pytorch", "image": "example.com/trainer:1"}]},
    }


def advance_and_compact(ns) -> None:
    """Some writes elsewhere (the revision moves on), then an etcd compaction."""
    core = client.CoreV1Api(ns.admin())
    for i in range(3):
        core.create_namespaced_config_map(ns.name, {"metadata": {"name": f"noise-{i}"}})
    ns.cluster.plane.compact_etcd()


def test_a_watch_lists_again_after_410_and_reports_what_vanished(bare_k8s):
    ns = bare_k8s
    core = client.CoreV1Api(ns.admin())
    core.create_namespaced_pod(ns.name, pod("a"))
    notes: list[str] = []
    watch = ResumableWatch(core.list_namespaced_pod, (ns.name,), {}, notes.append, "pod")
    first = [(kind, p.metadata.name) for kind, p in watch.events(1)]
    assert first == [("ADDED", "a")]  # the list
    assert [(kind, p.metadata.name) for kind, p in watch.events(1)] == []  # continued: no replay
    core.delete_namespaced_pod("a", ns.name, grace_period_seconds=0)
    core.create_namespaced_pod(ns.name, pod("b"))
    advance_and_compact(ns)  # the watch's version is gone now
    assert list(watch.events(1)) == []
    assert notes and "410 Gone" in notes[0] and "listing again" in notes[0]
    again = [(kind, p.metadata.name) for kind, p in watch.events(1)]
    assert again == [("DELETED", "a"), ("ADDED", "b")]


def test_the_launcher_follows_its_job_through_410_gone(bare_k8s):
    ns = bare_k8s
    ns.cluster.plane.serve_only(("pytorchjob",))
    admin = ns.cluster.plane.admin_configuration()
    custom = client.CustomObjectsApi(ns.admin())
    core = client.CoreV1Api(ns.admin())

    def operator_and_kubelet(job: JobPods) -> None:
        job.wait_until(lambda: job.job_object() is not None)
        core.create_namespaced_pod(ns.name, pod("job-master-0"))
        (master,) = job.pods(1)
        job.run(master)
        job.log(master, "before the compaction")
        job.sleep(2.5)  # both watches now continue from a version...
        advance_and_compact(ns)  # ...that is gone
        job.sleep(2.5)
        job.log(master, "after the compaction")
        job.sleep(1.0)
        job.exit(master)
        status = {"conditions": [{"type": "Succeeded", "status": "True", "reason": "Done"}]}
        custom.patch_namespaced_custom_object_status(
            "kubeflow.org", "v1", ns.name, "pytorchjobs", "job", {"status": status}
        )

    lines: list[str] = []
    s = spec(ns, "pytorchjob", workers=1)
    result = run(ns, s, lines, operator_and_kubelet, configuration=admin)
    assert result.phase == "Succeeded"
    assert any("job watch expired (410 Gone" in x for x in lines), lines
    assert any("pod watch expired (410 Gone" in x for x in lines), lines
    master = [x for x in lines if x.startswith("[master-0]")]
    assert master == ["[master-0] before the compaction", "[master-0] after the compaction"]


RESTARTED_SCRIPT = textwrap.dedent(
    """
    import sys
    from components.launcher import KubernetesOptions, TrainSpec, run_job

    namespace, kubeconfig = sys.argv[1:3]
    spec = TrainSpec(api="trainjob", name="job", namespace=namespace, workers=2, run_id="run-1")
    result = run_job(spec, backend="kubernetes", options=KubernetesOptions(
        config_file=kubeconfig, poll_interval_s=1.0))
    print("RESULT", result.phase, "reattached" if result.reattached else "created", flush=True)
    """
)


def test_a_launcher_killed_mid_job_is_restarted_and_reattaches(k8s, tmp_path: Path):
    """The step's pod is killed (node lost, OOM): its retry finds the job by its name and run
    labels and follows it to the end; no second job is created."""
    script = tmp_path / "launch.py"
    script.write_text(RESTARTED_SCRIPT)
    kubeconfig = kubeconfig_of(k8s.launcher_configuration(), tmp_path / "kubeconfig")
    argv = [sys.executable, str(script), k8s.name, str(kubeconfig)]
    release = threading.Event()

    def scenario(job: JobPods) -> None:
        pods = job.pods(2)
        for p in pods:
            job.run(p)
        job.log(pods[0], "first launcher")
        job.wait_until(release.is_set, timeout=60)
        job.log(pods[0], "second launcher")
        job.sleep(1.5)
        for p in reversed(pods):
            job.exit(p)

    k8s.scenario("trainjob", "job", scenario)
    first = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO
    )
    try:
        out = ""
        deadline = time.monotonic() + 60
        while "first launcher" not in out:
            assert time.monotonic() < deadline, out
            out += first.stdout.readline()
        first.send_signal(signal.SIGKILL)  # no cleanup: the job keeps running
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    release.set()
    second = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "re-attaching instead of creating a duplicate" in second.stdout
    assert "[node-0] second launcher" in second.stdout
    assert "RESULT Succeeded reattached" in second.stdout
    created = [
        e
        for e in k8s.cluster.plane.audit_events(namespace=k8s.name)
        if e["verb"] == "create" and e["objectRef"].get("resource") == "trainjobs"
    ]
    assert [e["responseStatus"]["code"] for e in created] == [201, 409]  # one job, then 409
