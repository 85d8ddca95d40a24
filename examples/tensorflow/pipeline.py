"""A Kubeflow pipeline that trains the example TensorFlow program as a TFJob (the recipe, runnable).

One step — the launcher component (``components.launcher``, on the kfp-ddp image) with
``api="tfjob"``: it submits a Training Operator v1 TFJob (Chief + Workers) that runs *your*
TensorFlow image and command, follows its logs to the end, and exports what the program wrote
under ``<output_dir>/model/`` (+ ``summary.json``, ``metrics.jsonl``) as the step's Model
artifact. An exit handler deletes the run's jobs if the run is cancelled or fails.

    python examples/tensorflow/pipeline.py --output tensorflow_pipeline.yaml \\
        [--launcher-image registry.example.com/kfp-ddp:0.1.0]

then upload the YAML (Kubeflow UI, or ``kfp-ddp upload --package``) and run it with
``tf_image`` set to an image holding TensorFlow and ``train.py`` at ``/app/train.py``.
"""

# No `from __future__ import annotations`: KFP reads the pipeline's real annotations.
import argparse
import json
from typing import Any

from kfp import compiler, dsl

from components import DEFAULT_IMAGE

WORKSPACE = "/workspace"
COMMAND = ["python", "/app/train.py"]
"""Where the example image keeps the program (``COPY train.py /app/train.py``)."""
OUTPUT_TEMPLATE = "{workspace}/tf-example/e{epochs}-w{workers}-{retrain_token}"
"""One folder per configuration: a retried step resumes from its own checkpoints, another
configuration (or a new retrain_token) starts afresh."""


def training_arguments(
    *,
    tf_image: Any,
    workers: Any,
    gpus_per_worker: Any,
    epochs: Any,
    retrain_token: Any,
    workspace_pvc: Any,
    namespace: Any,
) -> dict[str, Any]:
    """The training step's inputs: from KFP channels in the pipeline, plain values in tests."""
    return {
        "api": "tfjob",
        "image": tf_image,
        "workers": workers,
        "gpus_per_worker": gpus_per_worker,
        "epochs": epochs,
        "data_dir": f"{WORKSPACE}/tf-example/data",  # unused: the program is told --synthetic
        "output_dir": OUTPUT_TEMPLATE.format(
            workspace=WORKSPACE, epochs=epochs, workers=workers, retrain_token=retrain_token
        ),
        "trainer_args": ["--synthetic"],
        "pvc_name": workspace_pvc,
        "pvc_mount_path": WORKSPACE,
        "namespace": namespace,
        "task_name": "train-tensorflow",
        # What the step's parameters do not name: the program's command and env.
        "overrides_json": json.dumps({"command": COMMAND, "env": {"TF_CPP_MIN_LOG_LEVEL": "2"}}),
    }


def build_tensorflow_pipeline(launcher_image: str = DEFAULT_IMAGE):
    """The pipeline, its launcher steps on ``launcher_image`` (the TFJob runs ``tf_image``)."""
    from kfp import kubernetes

    from components.kfp.launcher import make_cleanup_op, make_training_job_op

    train_op = make_training_job_op(launcher_image)
    cleanup_op = make_cleanup_op(launcher_image)

    @dsl.pipeline(
        name="kfp-ddp-tensorflow-example",
        description="Train a Keras model with MultiWorkerMirroredStrategy as a TFJob.",
    )
    def tensorflow_example(
        tf_image: str = "registry.example.com/kfp-ddp-tf-example:1",
        workers: int = 2,
        gpus_per_worker: int = 0,
        epochs: int = 3,
        retrain_token: str = "1",
        workspace_pvc: str = "kfp-ddp-workspace",
        namespace: str = "",
    ) -> None:
        """Args:
        tf_image: image with TensorFlow and the program at /app/train.py.
        workers: TFJob replicas: one Chief and workers - 1 Workers.
        gpus_per_worker: GPUs per replica (0: CPU).
        epochs: the program's --epochs.
        retrain_token: a new value trains from scratch in a fresh folder.
        workspace_pvc: ReadWriteMany claim shared by the step and the replicas (checkpoints).
        namespace: namespace of the TFJob ('' = the pipeline's own).
        """
        cleanup = cleanup_op(
            run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, namespace=namespace, backend="kubernetes"
        ).set_display_name("delete leftover training jobs")
        cleanup.set_caching_options(False)
        with dsl.ExitHandler(cleanup, name="train"):
            train = train_op(
                **training_arguments(
                    tf_image=tf_image,
                    workers=workers,
                    gpus_per_worker=gpus_per_worker,
                    epochs=epochs,
                    retrain_token=retrain_token,
                    workspace_pvc=workspace_pvc,
                    namespace=namespace,
                )
            ).set_display_name("train (TFJob)")
            kubernetes.mount_pvc(train, pvc_name=workspace_pvc, mount_path=WORKSPACE)

    return tensorflow_example


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Compile the TensorFlow example pipeline.")
    parser.add_argument("--output", default="tensorflow_pipeline.yaml")
    parser.add_argument("--launcher-image", default=DEFAULT_IMAGE)
    args = parser.parse_args(argv)
    compiler.Compiler().compile(build_tensorflow_pipeline(args.launcher_image), args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
