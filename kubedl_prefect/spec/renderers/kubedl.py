"""Rendering to KubeDL ``training.kubedl.io/v1alpha1`` (PyTorchJob, TFJob, MPIJob, XGBoostJob).

Where KubeDL v0.5.0 expects things (read in its CRDs and Go types):

- PyTorchJob, TFJob and XGBoostJob inline the run policy in ``spec`` (``cleanPodPolicy``,
  ``backoffLimit``, ``schedulingPolicy``...).
- MPIJob carries it TWICE, nested in ``spec.runPolicy`` and inline in ``spec``, and both are read:
  the reconciler passes ``spec.runPolicy`` to the job controller (back-off, deadline, TTL, gang),
  while the pod/service event handlers read the scheduling policy through the inline legacy
  pointer (``MPIJobLegacySpec.RunPolicy``, ``apis/training/v1alpha1/common.go``). That pointer is
  only allocated when an inline run-policy field is present; with the nested form alone v0.5.0
  dereferences nil and the whole manager crashes at the job's first pod. The inline
  ``cleanPodPolicy`` is also the one the controller copies over the nested one
  (``controllers/mpi/legacy.go``). Both copies are rendered identical.
- XGBoostJob's Go type declares its run policy as a NAMED field with ``json:",inline"``, which Go's
  JSON decoding does not inline: v0.5.0 reads it from a ``RunPolicy`` key that its own CRD schema
  prunes, so the inline fields rendered here (the only ones the schema keeps) are stored but the
  controller runs XGBoostJobs with an empty run policy (no back-off limit, deadline or TTL).
- The scheduling policy names the priority class ``priorityClassName``.
- The XGBoost container must be named ``xgboostjob``.
- Host networking is the job annotation ``kubedl.io/network-mode: host``: KubeDL then picks free
  host ports and wires the services; the pod template carries ``hostNetwork`` as well.
"""

from __future__ import annotations

import copy

from kubedl_prefect.spec.model import TrainingJobSpec
from kubedl_prefect.spec.renderers.common import (
    Manifest,
    RenderOptions,
    job_metadata,
    mpi_main_container,
    replica_specs,
    resolve_job_name,
    run_policy,
)
from kubedl_prefect.spec.types import FRAMEWORKS, Dialect, Framework, job_resource

NETWORK_MODE_ANNOTATION = "kubedl.io/network-mode"
"""KubeDL's job annotation that switches its replicas to host networking."""


def render_kubedl(spec: TrainingJobSpec, options: RenderOptions) -> Manifest:
    """The KubeDL custom resource for ``spec`` (validated by the caller)."""
    resource = job_resource(Dialect.KUBEDL, spec.framework)
    info = FRAMEWORKS[spec.framework]
    annotations = {}
    if spec.network is not None and spec.network.host_network:
        annotations[NETWORK_MODE_ANNOTATION] = "host"
    body: Manifest = {}
    policy = run_policy(spec, priority_field="priorityClassName")
    if spec.framework is Framework.MPI:
        body["runPolicy"] = policy
        body.update(copy.deepcopy(policy))
        if spec.slots_per_worker is not None:
            body["slotsPerWorker"] = spec.slots_per_worker
        body["mainContainer"] = mpi_main_container(spec, Dialect.KUBEDL)
    else:
        body.update(policy)
    if spec.framework is Framework.TENSORFLOW and spec.success_policy is not None:
        body["successPolicy"] = spec.success_policy
    body[info.replica_specs_field] = replica_specs(spec, Dialect.KUBEDL, options)
    return {
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": job_metadata(resolve_job_name(spec, options), spec, options, annotations),
        "spec": body,
    }
