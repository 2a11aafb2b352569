"""Ready-made training flows: spec in, outcome out.

``train`` runs one training job from a spec (a spec file, or the spec's fields) on a saved
cluster block and returns its :class:`~kubedl_prefect.prefect.TrainingResult`. ``retrain`` is the
same for a deployment's schedule: its key is the schedule slot, so a slot's duplicate or retried
run adopts the slot's job instead of training twice. Both delete the jobs they created when the
flow run is cancelled or crashes.

The registry and serving steps (register the trained model, gate it, deploy it with KServe) slot
in after the training task: :mod:`kubedl_prefect.prefect.flows.train_and_serve` (flow
``train-and-serve``) is that chain.

The default spec, ``flows/specs/testbed-mnist.yaml``, is a path of this project's checkout (the
test bed's job); pass your own anywhere else. ``flows/training.py`` in the checkout re-exports
this module (the entrypoint of ``flows/prefect.yaml``). Run it once::

    python -m kubedl_prefect.prefect.flows.training flows/specs/testbed-mnist.yaml --cluster testbed

Serve the nightly retraining deployment (02:00 UTC every day) from this process, as
``retrain/nightly-served`` (``--name`` to change it): a name of its own, so that it never replaces
the schedule of ``flows/prefect.yaml``'s ``retrain/nightly``, which a worker runs::

    python -m kubedl_prefect.prefect.flows.training --serve
"""

from __future__ import annotations

import argparse
from typing import Any

from prefect import flow

from kubedl_prefect.prefect import (
    CLEANUP_HOOKS,
    RetrySettings,
    TrainingJob,
    TrainingResult,
    run_training_job,
    schedule_slot_key,
)
from kubedl_prefect.prefect.blocks import load_cluster
from kubedl_prefect.spec import load_spec, spec_to_data

_SUMMARY = "Ready-made training flows: spec in, outcome out."

SERVED_NAME = "nightly-served"
"""The name of the deployment ``--serve`` serves (``flows/prefect.yaml``'s is ``nightly``)."""


def training_job(
    spec: str | dict[str, Any],
    cluster: str,
    dialect: str = "kubedl",
    namespace: str | None = None,
    max_attempts: int = 3,
) -> TrainingJob:
    """The training-job block of a spec file or spec fields, on a saved cluster block.

    ``cluster`` names a ``kubedl-kubernetes-cluster`` or a ``kubedl-local-cluster`` block (or is
    ``<block type slug>/<name>``): the same flow runs on a cluster or on this machine.
    """
    fields = spec_to_data(load_spec(spec)) if isinstance(spec, str) else spec
    return TrainingJob(
        spec=fields,
        cluster=load_cluster(cluster),
        dialect=dialect,
        namespace=namespace,
        retry=RetrySettings(max_attempts=max_attempts),
    )


@flow(name="train", log_prints=True, **CLEANUP_HOOKS)
def train(
    spec: str | dict[str, Any] = "flows/specs/testbed-mnist.yaml",
    cluster: str = "testbed",
    dialect: str = "kubedl",
    namespace: str | None = None,
    key: str | None = None,
    max_attempts: int = 3,
) -> TrainingResult:
    """Train once: the spec on the cluster block ``cluster``; return how it ended.

    Args:
        spec: A spec file (on the machine of the flow run) or the spec's fields.
        cluster: The name of a saved cluster block: ``kubedl-kubernetes-cluster`` or
            ``kubedl-local-cluster`` (this machine).
        dialect: ``kubedl``, ``kubeflow`` or ``trainer`` (Kubeflow Trainer v2: the choice for a
            new cluster).
        namespace: Where the job runs (default: the cluster block's namespace).
        key: The idempotency key (default: this flow run's id and the task's name).
        max_attempts: Attempts in all for retryable failures (eviction, preemption...).
    """
    job = training_job(spec, cluster, dialect, namespace, max_attempts)
    result = run_training_job(job, key=key)
    # The registry and serving steps follow here in train_and_serve.py (train-and-serve).
    print(f"{result.spec_name}: {result.phase} after {len(result.attempts)} attempt(s)")
    return result


@flow(name="retrain", log_prints=True, **CLEANUP_HOOKS)
def retrain(
    spec: str | dict[str, Any] = "flows/specs/testbed-mnist.yaml",
    cluster: str = "testbed",
    dialect: str = "kubedl",
    namespace: str | None = None,
    max_attempts: int = 3,
) -> TrainingResult:
    """Scheduled retraining: :func:`train` with the schedule slot as the key."""
    job = training_job(spec, cluster, dialect, namespace, max_attempts)
    result = run_training_job(job, key=schedule_slot_key(default="") or None)
    print(f"{result.spec_name}: {result.phase} (key {result.key})")
    return result


def main() -> None:
    """Run :func:`train` once, or serve the nightly :func:`retrain` deployment."""
    parser = argparse.ArgumentParser(description=_SUMMARY)
    parser.add_argument("spec", nargs="?", default="flows/specs/testbed-mnist.yaml")
    parser.add_argument("--cluster", default="testbed")
    parser.add_argument("--dialect", default="kubedl", choices=["kubedl", "kubeflow", "trainer"])
    parser.add_argument("--key")
    parser.add_argument("--serve", action="store_true", help="serve the nightly deployment")
    parser.add_argument("--cron", default="0 2 * * *")
    parser.add_argument(
        "--name",
        default=SERVED_NAME,
        help="the served deployment's name (not prefect.yaml's: each has its own schedule)",
    )
    args = parser.parse_args()
    if args.serve:
        retrain.serve(
            name=args.name,
            cron=args.cron,
            parameters={"spec": args.spec, "cluster": args.cluster, "dialect": args.dialect},
        )
        return
    result = train(spec=args.spec, cluster=args.cluster, dialect=args.dialect, key=args.key)
    print(result.model_dump_json(indent=2))


if __name__ == "__main__":
    main()
