"""A pipeline of your own, built from kfp-ddp's component files: two models, the better published.

Stage the data once, train two models on it (different architectures), evaluate both, and
publish the more accurate of those that pass the gate. It needs only the KFP SDK (kfp, and
kfp-kubernetes for the cluster settings): the components come from their YAML files — a local
folder, or a release tag's URL — and run kfp-ddp's image, which carries the code.

    python pipeline.py --components ../../components/compiled --output two_models.yaml
    python pipeline.py \\
        --components https://raw.githubusercontent.com/<org>/kfp-ddp/v0.1.0/components/compiled \\
        --output two_models.yaml

Upload two_models.yaml in the Kubeflow UI (or with kfp.Client). On a cluster every step mounts
the workspace claim at /workspace and the S3 steps get their keys from a Secret, as in kfp-ddp's
own pipeline; the service account needs the launcher's RBAC (see the README).
"""

# No `from __future__ import annotations`: KFP reads the real annotations of pick_better.
import argparse
from pathlib import Path
from types import SimpleNamespace

from kfp import compiler, components, dsl, kubernetes
from kfp.dsl import Input, Metrics

COMPONENT_FILES = {
    "stage_dataset": "stage_dataset.yaml",
    "train": "training_job.yaml",
    "evaluate": "evaluate.yaml",
    "publish": "publish_model.yaml",
    "cleanup": "cleanup_jobs.yaml",
}
"""The kfp-ddp component files this pipeline uses, by the name it calls them."""
S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
RUN_ID = dsl.PIPELINE_JOB_ID_PLACEHOLDER


def load_components(source: str) -> SimpleNamespace:
    """The component files from a folder, or from a URL prefix (pin it to a release tag)."""
    loaded = {}
    for name, file_name in COMPONENT_FILES.items():
        if source.startswith(("https://", "http://")):
            loaded[name] = components.load_component_from_url(f"{source.rstrip('/')}/{file_name}")
        else:
            loaded[name] = components.load_component_from_file(str(Path(source) / file_name))
    return SimpleNamespace(**loaded)


def pick_better(
    a_passed: bool, a_metrics: Input[Metrics], b_passed: bool, b_metrics: Input[Metrics]
) -> str:
    """Which model to publish: "a" or "b", the more accurate that passed its gate, or "none".

    Args:
        a_passed: whether model a passed the evaluation gate.
        a_metrics: model a's evaluation metrics (accuracy, top5, loss...).
        b_passed: whether model b passed the evaluation gate.
        b_metrics: model b's evaluation metrics.

    Returns:
        Output: "a", "b" or "none" (neither passed).
    """
    candidates = [
        (float(metrics.metadata["accuracy"]), name)
        for name, passed, metrics in (("a", a_passed, a_metrics), ("b", b_passed, b_metrics))
        if passed
    ]
    if not candidates:
        print("neither model passed the gate: nothing is published")
        return "none"
    accuracy, best = max(candidates, key=lambda c: (c[0], c[1] == "a"))  # a tie keeps a
    print(f"publishing model {best} (accuracy {accuracy:.4f})")
    return best


def build_pipeline(
    component_source: str,
    *,
    workspace: str = "/workspace",
    backend: str = "kubernetes",
    helper_image: str = "",
):
    """The two-model pipeline from the component files at ``component_source``.

    Args:
        component_source: a folder or a URL prefix holding the component files.
        workspace: where every step (and every training node) sees the shared volume; on a
            cluster the workspace claim is mounted there.
        backend: kubernetes (TrainJob or PyTorchJob), or local (kfp.local, for development).
        helper_image: image of this pipeline's own small step (pick_better); empty uses the
            image the component files pin (it has kfp installed).
    """
    ops = load_components(component_source)
    picker_image = helper_image or ops.evaluate.component_spec.implementation.container.image
    picker = dsl.component(pick_better, base_image=picker_image, install_kfp_package=False)

    def on_cluster(task, pvc_name, secret_name=None):
        """Mount the workspace claim (and the S3 keys); kfp.local ignores both."""
        if pvc_name is not None:
            kubernetes.mount_pvc(task, pvc_name=pvc_name, mount_path=workspace)
        if secret_name is not None:
            kubernetes.use_secret_as_env(
                task, secret_name=secret_name, secret_key_to_env={k: k for k in S3_KEYS}
            )
        return task

    @dsl.pipeline(
        name="kfp-ddp-two-models",
        description="Stage the data once, train two models on it, evaluate both and publish "
        "the more accurate one that passes the gate.",
    )
    def two_models(
        data_uri: str,
        publish_uri: str,
        model_a: str = "resnet18",
        model_b: str = "mobilenet_v3_small",
        s3_endpoint: str = "",
        s3_credentials_secret: str = "s3-credentials",
        workspace_pvc: str = "kfp-ddp-workspace",
        workers: int = 2,
        gpus_per_worker: int = 1,
        epochs: int = 10,
        batch_size: int = 64,
        image_size: int = 32,
        accuracy_threshold: float = 0.9,
    ) -> None:
        """Two architectures on the same data; the better one is published.

        Args:
            data_uri: s3://bucket/prefix of an ImageFolder (train/ and val/ class folders).
            publish_uri: s3://bucket/prefix; the chosen model goes to publish_uri/<run id>/.
            model_a: the first torchvision model, e.g. resnet18.
            model_b: the second torchvision model, e.g. mobilenet_v3_small.
            s3_endpoint: URL of an S3-compatible endpoint; empty for AWS.
            s3_credentials_secret: Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
            workspace_pvc: ReadWriteMany claim shared by the steps and the training nodes.
            workers: training nodes per model.
            gpus_per_worker: GPUs per node (0 trains on CPUs).
            epochs: training epochs of each model.
            batch_size: batch size per process.
            image_size: input image size in pixels.
            accuracy_threshold: minimum validation accuracy to publish.
        """
        cleanup = ops.cleanup(run_id=RUN_ID, namespace="", backend=backend)
        cleanup.set_caching_options(False)
        with dsl.ExitHandler(cleanup, name="two-models"):
            data = ops.stage_dataset(
                data_uri=data_uri, endpoint_url=s3_endpoint, workspace_path=workspace
            ).set_display_name("stage data from S3")
            data.set_caching_options(False)  # must look at S3; its digest keys the trainings
            on_cluster(data, workspace_pvc, s3_credentials_secret)

            trained = {}
            for key, model_name in (("a", model_a), ("b", model_b)):
                train = ops.train(
                    data_dir=data.outputs["data_dir"],
                    output_dir=f"{workspace}/train",
                    data_digest=data.outputs["digest"],
                    model_name=model_name,
                    task_name=f"train-{key}",  # each training task its own job name
                    backend=backend,
                    workers=workers,
                    gpus_per_worker=gpus_per_worker,
                    epochs=epochs,
                    batch_size=batch_size,
                    image_size=image_size,
                    pvc_name=workspace_pvc,
                    pvc_mount_path=workspace,
                ).set_display_name(f"train model {key}")
                train.set_retry(num_retries=2)  # a retry re-attaches to its job
                on_cluster(train, workspace_pvc)
                evaluation = ops.evaluate(
                    model=train.outputs["model"],
                    data_dir=data.outputs["data_dir"],
                    threshold=accuracy_threshold,
                    baseline_uri="",
                    tolerance=0.0,
                ).set_display_name(f"evaluate model {key}")
                on_cluster(evaluation, workspace_pvc)
                trained[key] = (train, evaluation)

            (train_a, eval_a), (train_b, eval_b) = trained["a"], trained["b"]
            choice = picker(
                a_passed=eval_a.outputs["Output"],
                a_metrics=eval_a.outputs["metrics"],
                b_passed=eval_b.outputs["Output"],
                b_metrics=eval_b.outputs["metrics"],
            ).set_display_name("pick the better model")

            def publish(train, evaluation):
                upload = ops.publish(
                    model=train.outputs["model"],
                    report=evaluation.outputs["report"],
                    evaluation=evaluation.outputs["evaluation"],
                    publish_uri=publish_uri,
                    endpoint_url=s3_endpoint,
                    run_id=RUN_ID,
                ).set_display_name("publish to S3")
                upload.set_caching_options(False)  # every run publishes to its own prefix
                on_cluster(upload, None, s3_credentials_secret)

            with dsl.If(choice.output == "a", name="model-a"):
                publish(train_a, eval_a)
            with dsl.Elif(choice.output == "b", name="model-b"):
                publish(train_b, eval_b)

    return two_models


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--components",
        required=True,
        help="folder or URL prefix of kfp-ddp's component files (pin URLs to a release tag)",
    )
    parser.add_argument("--output", required=True, help="where to write the pipeline YAML")
    parser.add_argument(
        "--workspace", default="/workspace", help="the shared volume's path in every step"
    )
    args = parser.parse_args(argv)
    pipeline = build_pipeline(args.components, workspace=args.workspace)
    compiler.Compiler().compile(pipeline, args.output)
    print(f"compiled {args.output} from the component files in {args.components}")


if __name__ == "__main__":
    main()
