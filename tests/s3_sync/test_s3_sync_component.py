"""The KFP component: compiles with credentials only as Secret references; runs in kfp.local."""

# No `from __future__ import annotations`: the @dsl.pipeline below needs real types.
import yaml
from kfp import compiler, dsl

from components.kfp.s3_sync import make_s3_sync_op, use_s3_credentials
from tests.kfp_local import workspace_root


def _pipeline():
    op = make_s3_sync_op(image="example.com/kfp-ddp:test")

    @dsl.pipeline(name="s3-sync-check")
    def pipeline(source: str = "s3://bucket/data", destination: str = "/workspace/data"):
        task = op(
            source=source,
            destination=destination,
            endpoint_url="",
            include=["*.png"],
            exclude=[],
            delete=False,
        )
        use_s3_credentials(task, secret_name="s3-creds")

    return pipeline


def test_compiles_with_secret_references_only(tmp_path, s3_env):
    out = tmp_path / "p.yaml"
    compiler.Compiler().compile(_pipeline(), str(out))
    text = out.read_text()
    docs = list(yaml.safe_load_all(text))
    executors = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    (executor,) = executors.values()
    secret_env = executor["secretAsEnv"][0]
    assert secret_env["secretName"] == "s3-creds" or "s3-creds" in str(secret_env)
    assert {e["envVar"] for e in secret_env["keyToEnv"]} == {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    }
    assert "example.com/kfp-ddp:test" in text
    for secret in (s3_env.access_key, s3_env.secret_key):
        assert secret not in text
    inputs = docs[0]["components"]["comp-s3-sync-component"]["inputDefinitions"]["parameters"]
    assert set(inputs) == {
        "source",
        "destination",
        "endpoint_url",
        "include",
        "exclude",
        "delete",
        "max_delete",
        "dry_run",
    }
    # the new knobs are optional: a pipeline that does not pass them keeps working
    assert inputs["max_delete"]["isOptional"] and inputs["dry_run"]["isOptional"]


def test_runs_in_kfp_local_against_the_server(s3_env, bucket, tmp_path):
    from kfp import local

    client = s3_env.client()
    for i in range(3):
        client.put_object(Bucket=bucket, Key=f"data/c/{i}.png", Body=bytes([i]) * 10)
    client.put_object(Bucket=bucket, Key="data/c/skip.txt", Body=b"x")
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "root"),
        workspace_root=workspace_root(tmp_path),
    )
    dest = tmp_path / "ws" / "data"
    task = make_s3_sync_op()(
        source=f"s3://{bucket}/data",
        destination=str(dest),
        endpoint_url="",
        include=["*.png"],
        exclude=[],
        delete=False,
    )
    assert sorted(p.name for p in (dest / "c").iterdir()) == ["0.png", "1.png", "2.png"]
    digest = task.outputs["Output"]
    assert isinstance(digest, str) and len(digest) == 64
    meta = task.outputs["dataset"].metadata
    assert meta["digest"] == digest and int(meta["files"]) == 3 and int(meta["bytes"]) == 30
    assert meta["source"] == f"s3://{bucket}/data" and meta["destination"] == str(dest)
    assert int(meta["transferred"]) == 3
