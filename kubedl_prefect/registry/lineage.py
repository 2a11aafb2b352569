"""Lineage: the tags that tie a model version to the training job and flow run that made it. Pure.

Every tag key starts with :data:`TAG_PREFIX`, so that they sort together in the MLflow UI and a
search can find them (``tags.`kubedl-prefect.io/job-uid` = '...'``). The run's metrics are copied
as ``kubedl-prefect.io/metric.<name>``: a version keeps them even if the run is deleted.

Example:
    >>> tags = lineage_tags(Lineage(namespace="ml", job_name="mnist-x7k2-a2", job_uid="0f1e",
    ...                             attempt=2, image="ghcr.io/x/mnist:1", spec_hash="ab12",
    ...                             key="nightly", flow_run_id="f-1"),
    ...                     metrics={"accuracy": 0.93})
    >>> tags["kubedl-prefect.io/job-uid"], tags["kubedl-prefect.io/metric.accuracy"]
    ('0f1e', '0.93')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from kubedl_prefect.lifecycle.backend import JobRef
from kubedl_prefect.spec import TrainingJobSpec

TAG_PREFIX: Final = "kubedl-prefect.io/"
"""The prefix of every tag kubedl-prefect writes on runs and model versions."""

TAG_NAMESPACE: Final = f"{TAG_PREFIX}job-namespace"
TAG_JOB_NAME: Final = f"{TAG_PREFIX}job-name"
TAG_JOB_UID: Final = f"{TAG_PREFIX}job-uid"
TAG_ATTEMPT: Final = f"{TAG_PREFIX}attempt"
TAG_IMAGE: Final = f"{TAG_PREFIX}image"
TAG_SPEC_HASH: Final = f"{TAG_PREFIX}spec-hash"
TAG_SPEC_NAME: Final = f"{TAG_PREFIX}spec-name"
TAG_KEY: Final = f"{TAG_PREFIX}key"
TAG_CLUSTER: Final = f"{TAG_PREFIX}cluster"
TAG_FLOW_RUN: Final = f"{TAG_PREFIX}flow-run"
TAG_METRIC_PREFIX: Final = f"{TAG_PREFIX}metric."
TAG_MODEL_ID: Final = f"{TAG_PREFIX}model-id"
"""On a version: the MLflow logged model it was registered from (``m-<id>``)."""
TAG_OUTPUT_OF: Final = f"{TAG_PREFIX}output-of"
"""On a logged model made from an output directory: the run whose job wrote it."""

_MAX_TAG_VALUE: Final = 5000
"""MLflow's limit on a model-version tag value, in characters."""


@dataclass(frozen=True)
class Lineage:
    """Where a model came from: the training job (one attempt of it) and the flow run.

    Args:
        namespace: The job's namespace.
        job_name: The cluster job's name (of the attempt that produced the model).
        job_uid: Its uid.
        attempt: The attempt number.
        image: The training image.
        spec_hash: Hash of the spec the job was made from.
        key: The logical job's key.
        cluster: The API server the job ran on.
        flow_run_id: The Prefect flow run that ran it, if any.
        spec_name: The spec's name.
    """

    namespace: str
    job_name: str
    job_uid: str
    attempt: int
    image: str
    spec_hash: str
    key: str = ""
    cluster: str = ""
    flow_run_id: str | None = None
    spec_name: str = ""

    @classmethod
    def of(cls, ref: JobRef, spec: TrainingJobSpec, *, flow_run_id: str | None = None) -> Lineage:
        """The lineage of the attempt ``ref`` of a job made from ``spec``."""
        images = sorted({role.image for role in spec.resolved_roles() if role.image})
        return cls(
            namespace=ref.namespace,
            job_name=ref.name,
            job_uid=ref.uid,
            attempt=ref.attempt,
            image=",".join(images) or (spec.image or ""),
            spec_hash=ref.spec_hash,
            key=ref.key,
            cluster=ref.cluster,
            flow_run_id=flow_run_id,
            spec_name=spec.name,
        )


def lineage_tags(lineage: Lineage, metrics: Mapping[str, float] | None = None) -> dict[str, str]:
    """The tags recording ``lineage`` and the run's ``metrics`` (latest values)."""
    tags = {
        TAG_NAMESPACE: lineage.namespace,
        TAG_JOB_NAME: lineage.job_name,
        TAG_JOB_UID: lineage.job_uid,
        TAG_ATTEMPT: str(lineage.attempt),
        TAG_IMAGE: lineage.image,
        TAG_SPEC_HASH: lineage.spec_hash,
    }
    optional = {
        TAG_KEY: lineage.key,
        TAG_CLUSTER: lineage.cluster,
        TAG_FLOW_RUN: lineage.flow_run_id or "",
        TAG_SPEC_NAME: lineage.spec_name,
    }
    tags.update({name: value for name, value in optional.items() if value})
    for name, value in sorted((metrics or {}).items()):
        tags[f"{TAG_METRIC_PREFIX}{name}"] = format_metric(value)
    return {name: value[:_MAX_TAG_VALUE] for name, value in tags.items()}


def format_metric(value: float) -> str:
    """A metric as a tag value: ``repr`` of the float, which reads back exactly.

    Example:
        >>> format_metric(0.1), float(format_metric(1 / 3)) == 1 / 3
        ('0.1', True)
    """
    return repr(float(value))


def recorded_metrics(tags: Mapping[str, str]) -> dict[str, float]:
    """The metrics copied into a version's tags by :func:`lineage_tags`.

    Example:
        >>> recorded_metrics({"kubedl-prefect.io/metric.loss": "0.25", "other": "x"})
        {'loss': 0.25}
    """
    found: dict[str, float] = {}
    for name, value in tags.items():
        if name.startswith(TAG_METRIC_PREFIX):
            try:
                found[name.removeprefix(TAG_METRIC_PREFIX)] = float(value)
            except ValueError:
                continue
    return found
