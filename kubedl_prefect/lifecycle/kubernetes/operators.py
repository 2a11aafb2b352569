"""Operator presence: a job no operator acts on, or whose kind no operator serves. Pure.

No operator has acted on the job within a grace (:data:`OPERATOR_GRACE_S`), or the job's CRD is
not installed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from kubedl_prefect.kube.resources import KubeObject, ResourceKind
from kubedl_prefect.lifecycle.admission import AdmissionBlocker, Blocker

OPERATOR_GRACE_S = 30.0
"""How long after its creation a job may show no sign of an operator (no status, pods, PodGroups
or events) before the wait says that no operator acts on it. Both operators write one of these
within a second or two of a job's creation."""


def _created_at(job: KubeObject) -> float | None:
    stamp = (job.get("metadata") or {}).get("creationTimestamp")
    if not stamp:
        return None
    try:
        return dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _operator(job: KubeObject) -> tuple[str, str]:
    """The operator a job waits for, and how to check it."""
    group = str(job.get("apiVersion") or "").partition("/")[0]
    kind = str(job.get("kind") or "the job's kind")
    if group == "trainer.kubeflow.org":
        managed_by = (job.get("spec") or {}).get("managedBy")
        if managed_by and managed_by != "trainer.kubeflow.org/trainjob-controller":
            return (
                f"{managed_by} (its spec.managedBy)",
                f"check that {managed_by} runs; Trainer leaves TrainJobs managed by another "
                "controller alone",
            )
        return (
            "Kubeflow Trainer (with the JobSet controller)",
            "check that both run: kubectl get pods -A | grep -e trainer-controller -e jobset, "
            "then read their logs; the TrainJob's runtimeRef must name an installed runtime",
        )
    if group == "kubeflow.org":
        managed_by = ((job.get("spec") or {}).get("runPolicy") or {}).get("managedBy")
        if managed_by and managed_by != "kubeflow.org/training-operator":
            return (
                f"{managed_by} (its runPolicy.managedBy)",
                f"check that the controller {managed_by} runs; the Kubeflow training operator "
                "leaves jobs managed by another controller alone",
            )
        return (
            "the Kubeflow training operator",
            f"check that it runs with {kind.lower()} enabled (--enable-scheme): kubectl get pods "
            "-A | grep training-operator, then read its log",
        )
    return (
        "the KubeDL operator",
        f"check that it runs with {kind} in its --workloads: kubectl get pods -A | grep kubedl, "
        "then read its log",
    )


def operator_blocker(
    job: KubeObject,
    pods: Sequence[KubeObject],
    podgroups: Sequence[KubeObject],
    events: Sequence[KubeObject],
    now: float | None,
    grace_s: float,
) -> Blocker | None:
    """The blocker of a job no operator has acted on, once the grace has run out."""
    if now is None or job.get("status") or pods or podgroups or events:
        return None  # something acted on it
    created = _created_at(job)
    if created is None:
        return None
    age = now - created
    if age < grace_s:
        return Blocker(
            AdmissionBlocker.NOT_CREATED,
            "the operator has not acted on the job yet",
            "wait a moment",
            recheck_in_s=max(grace_s - age, 0.05),
        )
    operator, how = _operator(job)
    metadata = job.get("metadata") or {}
    name = f"{job.get('kind')} {metadata.get('namespace')}/{metadata.get('name')}"
    return Blocker(
        AdmissionBlocker.OPERATOR_NOT_RUNNING,
        f"no operator has acted on {name} for {age:.0f}s (no status, pods or PodGroups): is "
        f"{operator} running?",
        how,
        subject=operator,
    )


_OPERATORS = {
    "kubedl": "the KubeDL operator",
    "kubeflow": "the Kubeflow training operator",
    "trainer": "Kubeflow Trainer v2",
}
"""The operator of each dialect, in words."""


def operator_not_installed(
    kind: ResourceKind, dialect: str, server: str, served_elsewhere: Sequence[tuple[str, str]]
) -> Blocker:
    """The permanent blocker of a job whose kind the cluster does not serve (its CRD is missing).

    Args:
        kind: The job's :class:`~kubedl_prefect.kube.resources.ResourceKind`.
        dialect: The dialect it was rendered for.
        server: The API server's URL.
        served_elsewhere: ``(dialect, apiVersion)`` of other dialects whose kind is served.

    Example:
        >>> from kubedl_prefect.kube.resources import ResourceKind
        >>> kind = ResourceKind("training.kubedl.io", "v1alpha1", "PyTorchJob", "pytorchjobs")
        >>> operator_not_installed(kind, "kubedl", "https://k", [("kubeflow", "kubeflow.org/v1")]
        ...                        ).hint
        'install the KubeDL operator, or submit with dialect="kubeflow": the cluster serves \
PyTorchJob of kubeflow.org/v1'
    """
    operator = _OPERATORS.get(dialect, f"the operator of {kind.group}")
    crd = f"{kind.plural}.{kind.group}"
    if served_elsewhere:
        other, api_version = served_elsewhere[0]
        # Trainer's one kind (TrainJob) is not the v1 kinds: then the API alone is named.
        what = api_version if "trainer" in (dialect, other) else f"{kind.kind} of {api_version}"
        hint = f'install {operator}, or submit with dialect="{other}": the cluster serves {what}'

    else:
        hint = (
            f"install {operator} (docs/operators.md), or the operator of "
            "another dialect, in this cluster"
        )
    return Blocker(
        AdmissionBlocker.OPERATOR_NOT_INSTALLED,
        f"{kind.kind} ({kind.api_version}) is not served by {server}: the CRD {crd} of "
        f"{operator} is not installed",
        hint,
        subject=f"CustomResourceDefinition {crd}",
        permanent=True,
    )
