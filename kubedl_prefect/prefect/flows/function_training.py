"""A ready-made flow whose training step is a Python function: the example model, on 2 replicas.

``train-function`` trains the shipped example model (``kubedl_prefect_examples.ddp_train``: a
PyTorch DDP network on three spirals, on the CPU) with
:func:`~kubedl_prefect.prefect.functions.distributed_task`: the function :func:`train_spirals` runs
on every replica of a training job on this machine (a ``LocalCluster``), the process group already
joined (gloo), and the flow returns rank 0's final metrics. No image, spec file or command line:
the function and its arguments travel to the replicas serialized. Retries, checkpoints (a retried
attempt resumes at the next epoch), events, artifacts, replica logs and cancellation are those of
``run-training-job``.

It needs torch (``uv sync --extra torch``). Run it::

    python -m kubedl_prefect.prefect.flows.function_training --epochs 4
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from prefect import flow

from kubedl_prefect.prefect import CLEANUP_HOOKS, LocalCluster, current_replica, distributed_task


def train_spirals(epochs: int) -> dict[str, float]:
    """Train the example model as this replica; its final metrics, and the job's world size."""
    from kubedl_prefect_examples.ddp_train import Settings, train

    replica = current_replica()
    metrics = train(Settings(epochs=epochs))
    return {**metrics, "rank": float(replica.rank), "world_size": float(replica.world_size)}


@flow(name="train-function", **CLEANUP_HOOKS)
def train_function(
    epochs: int = 4, replicas: int = 2, workspace: str | None = None
) -> dict[str, float]:
    """Train the example model on ``replicas`` local processes; rank 0's final metrics.

    Args:
        epochs: Epochs to train (a retried attempt resumes from its checkpoint).
        replicas: Replicas of the job (one master, the rest workers).
        workspace: The ``LocalCluster``'s workspace (default: ``~/.cache/kubedl-prefect/local``).
    """
    step = distributed_task(
        replicas=replicas,
        cluster=LocalCluster(workspace=workspace, max_processes=replicas),
        resources={"cpu": 1, "memory": "1Gi"},
        name="train-spirals",
    )(train_spirals)
    return step(epochs)


def main(argv: list[str] | None = None) -> Any:
    """Run ``train-function`` once and print rank 0's metrics."""
    parser = argparse.ArgumentParser(
        prog="python -m kubedl_prefect.prefect.flows.function_training"
    )
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--workspace", default=None)
    args = parser.parse_args(argv)
    metrics = train_function(epochs=args.epochs, replicas=args.replicas, workspace=args.workspace)
    print(json.dumps(metrics, sort_keys=True))
    return metrics


if __name__ == "__main__":
    main()
