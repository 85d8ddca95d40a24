"""A Kubeflow pipeline that trains the example XGBoost program on a cluster (the recipe, runnable).

One step — the launcher component (``components.launcher``, on the kfp-ddp image) — that submits
*your* XGBoost image and command as one of:

- ``--api xgboostjob`` (default): a Training Operator v1.9 XGBoostJob, a Master (XGBoost's
  tracker) and ``workers - 1`` Workers, with the operator's MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE;
- ``--api trainjob``: a Kubeflow Trainer v2 TrainJob on the ``xgboost-distributed`` runtime, with
  the controller's DMLC_* env (node 0 runs the tracker).

It follows the job's logs to the end and exports what the program wrote under
``<output_dir>/model/`` (+ ``summary.json``, ``metrics.jsonl``) as the step's Model artifact. An
exit handler deletes the run's jobs if the run is cancelled or fails.

    python examples/xgboost/pipeline.py --output xgboost_pipeline.yaml [--api trainjob] \\
        [--launcher-image registry.example.com/kfp-ddp:0.1.0]

then upload the YAML (Kubeflow UI, or ``kfp-ddp upload --package``) and run it with
``xgb_image`` set to an image holding xgboost, scikit-learn and ``train.py`` at ``/app/train.py``.
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
OUTPUT_TEMPLATE = "{workspace}/xgb-example/{dataset}-r{rounds}-w{workers}-{retrain_token}"
"""One folder per configuration: a retried step resumes from its own checkpoints, another
configuration (or a new retrain_token) starts afresh."""
APIS = {
    "xgboostjob": {},
    "trainjob": {"runtime_name": "xgboost-distributed"},
}
"""The APIs the example runs on, and what each needs besides ``api``."""


def training_arguments(
    *,
    api: str,
    xgb_image: Any,
    workers: Any,
    rounds: Any,
    dataset: Any,
    retrain_token: Any,
    workspace_pvc: Any,
    namespace: Any,
) -> dict[str, Any]:
    """The training step's inputs: from KFP channels in the pipeline, plain values in tests."""
    overrides = APIS[api] | {"command": COMMAND, "env": {"OMP_NUM_THREADS": "1"}}
    return {
        "api": api,
        "image": xgb_image,
        "workers": workers,
        "epochs": rounds,  # the program's --epochs: boosting rounds
        # <data_dir>/train.npz when there; else the program trains on --dataset.
        "data_dir": f"{WORKSPACE}/xgb-example/data",
        "output_dir": OUTPUT_TEMPLATE.format(
            workspace=WORKSPACE,
            dataset=dataset,
            rounds=rounds,
            workers=workers,
            retrain_token=retrain_token,
        ),
        "trainer_args": ["--dataset", dataset],
        "pvc_name": workspace_pvc,
        "pvc_mount_path": WORKSPACE,
        "namespace": namespace,
        "task_name": "train-xgboost",
        # What the step's parameters do not name: the program's command, its env, the runtime.
        "overrides_json": json.dumps(overrides),
    }


def build_xgboost_pipeline(launcher_image: str = DEFAULT_IMAGE, api: str = "xgboostjob"):
    """The pipeline, its launcher steps on ``launcher_image``; the job (an ``api`` job) runs
    ``xgb_image``."""
    from kfp import kubernetes

    from components.kfp.launcher import make_cleanup_op, make_training_job_op

    if api not in APIS:
        raise ValueError(f"api={api!r}: the example runs on {', '.join(APIS)}")
    train_op = make_training_job_op(launcher_image)
    cleanup_op = make_cleanup_op(launcher_image)

    @dsl.pipeline(
        name=f"kfp-ddp-xgboost-example-{api}",
        description=f"Train an XGBoost classifier with XGBoost's collective as a {api}.",
    )
    def xgboost_example(
        xgb_image: str = "registry.example.com/kfp-ddp-xgb-example:1",
        workers: int = 2,
        rounds: int = 50,
        dataset: str = "breast_cancer",
        retrain_token: str = "1",
        workspace_pvc: str = "kfp-ddp-workspace",
        namespace: str = "",
    ) -> None:
        """Args:
        xgb_image: image with xgboost, scikit-learn and the program at /app/train.py.
        workers: XGBoost workers (pods): rank 0 runs the tracker.
        rounds: boosting rounds (the program's --epochs).
        dataset: scikit-learn's breast_cancer, wine or digits, when the workspace's
            xgb-example/data has no train.npz.
        retrain_token: a new value trains from scratch in a fresh folder.
        workspace_pvc: ReadWriteMany claim shared by the step and rank 0 (outputs, checkpoints).
        namespace: namespace of the job ('' = the pipeline's own).
        """
        cleanup = cleanup_op(
            run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, namespace=namespace, backend="kubernetes"
        ).set_display_name("delete leftover training jobs")
        cleanup.set_caching_options(False)
        with dsl.ExitHandler(cleanup, name="train"):
            train = train_op(
                **training_arguments(
                    api=api,
                    xgb_image=xgb_image,
                    workers=workers,
                    rounds=rounds,
                    dataset=dataset,
                    retrain_token=retrain_token,
                    workspace_pvc=workspace_pvc,
                    namespace=namespace,
                )
            ).set_display_name(f"train ({api})")
            kubernetes.mount_pvc(train, pvc_name=workspace_pvc, mount_path=WORKSPACE)

    return xgboost_example


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Compile the XGBoost example pipeline.")
    parser.add_argument("--output", default="xgboost_pipeline.yaml")
    parser.add_argument("--api", choices=sorted(APIS), default="xgboostjob")
    parser.add_argument("--launcher-image", default=DEFAULT_IMAGE)
    args = parser.parse_args(argv)
    pipeline = build_xgboost_pipeline(args.launcher_image, args.api)
    compiler.Compiler().compile(pipeline, args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
