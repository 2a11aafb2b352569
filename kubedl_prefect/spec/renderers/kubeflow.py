"""Rendering to the Kubeflow training operator ``kubeflow.org/v1`` (same four kinds).

Where the Kubeflow training operator v1.9.4 expects things (read in its CRDs and Go types):

- Every kind nests the run policy in ``spec.runPolicy``; its scheduling policy names the
  priority class ``priorityClass``.
- PyTorchJob has ``elasticPolicy`` (min/max replicas, rendezvous, autoscaling metrics) and
  ``nprocPerNode``.
- The XGBoost container must be named ``xgboost``.
- MPIJob takes ``slotsPerWorker`` and ``mainContainer`` beside ``runPolicy``.
- A job in a Kueue LocalQueue is labelled for Kueue and created with ``runPolicy.suspend: true``
  (:mod:`kubedl_prefect.spec.kueue`).
"""

from __future__ import annotations

from kubedl_prefect.spec.kueue import queued_manifest
from kubedl_prefect.spec.model import TrainingJobSpec
from kubedl_prefect.spec.renderers.common import (
    Manifest,
    RenderOptions,
    dump_model,
    job_metadata,
    mpi_main_container,
    replica_specs,
    resolve_job_name,
    run_policy,
)
from kubedl_prefect.spec.types import FRAMEWORKS, Dialect, Framework, job_resource


def render_kubeflow(spec: TrainingJobSpec, options: RenderOptions) -> Manifest:
    """The Kubeflow custom resource for ``spec`` (validated by the caller)."""
    resource = job_resource(Dialect.KUBEFLOW, spec.framework)
    info = FRAMEWORKS[spec.framework]
    body: Manifest = {"runPolicy": run_policy(spec, priority_field="priorityClass")}
    if spec.framework is Framework.PYTORCH:
        if spec.elastic is not None:
            elastic: Manifest = {
                "minReplicas": spec.elastic.min_replicas,
                "maxReplicas": spec.elastic.max_replicas,
                "rdzvBackend": spec.elastic.rdzv_backend,
            }
            if spec.elastic.max_restarts is not None:
                elastic["maxRestarts"] = spec.elastic.max_restarts
            if spec.elastic.metrics is not None:
                elastic["metrics"] = [dump_model(metric) for metric in spec.elastic.metrics]
            body["elasticPolicy"] = elastic
        if spec.nproc_per_node is not None:
            body["nprocPerNode"] = spec.nproc_per_node
    elif spec.framework is Framework.MPI:
        if spec.slots_per_worker is not None:
            body["slotsPerWorker"] = spec.slots_per_worker
        body["mainContainer"] = mpi_main_container(spec, Dialect.KUBEFLOW)
    elif spec.framework is Framework.TENSORFLOW and spec.success_policy is not None:
        body["successPolicy"] = spec.success_policy
    body[info.replica_specs_field] = replica_specs(spec, Dialect.KUBEFLOW, options)
    manifest: Manifest = {
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": job_metadata(resolve_job_name(spec, options), spec, options),
        "spec": body,
    }
    return queued_manifest(manifest, spec)  # Kueue's labels, runPolicy.suspend
