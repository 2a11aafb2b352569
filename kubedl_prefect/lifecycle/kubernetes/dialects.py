"""What differs between the operators once a job exists: how its pods and PodGroups are found.

The renderers (:mod:`kubedl_prefect.spec.renderers`) say how each operator wants a job written;
this adapter says how each one labels what it makes from it. KubeDL labels pods
``group-name=training.kubedl.io`` + ``job-name`` (a bare ``job-name`` also matches batch Jobs'
pods) and makes one PodGroup per role, labelled ``kubedl.io/gang-job-name``; the Kubeflow operator
labels pods ``training.kubeflow.org/job-name`` and makes one PodGroup named like the job.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubedl_prefect.kube.resources import KubeObject, ResourceKind
from kubedl_prefect.spec import Dialect


@dataclass(frozen=True)
class JobObjects:
    """Selectors for the objects that belong to one job of one operator.

    Args:
        dialect: The operator that runs the job.
        name: The job's name.
    """

    dialect: Dialect
    name: str

    @property
    def pod_label(self) -> tuple[str, str]:
        """The label (key, value) every pod of the job carries (indexed by the informer)."""
        if self.dialect == Dialect.KUBEDL:
            return ("job-name", self.name)
        return ("training.kubeflow.org/job-name", self.name)

    def is_job(self, obj: KubeObject) -> bool:
        """Whether ``obj`` is the job itself."""
        return bool(obj["metadata"]["name"] == self.name)

    def is_pod(self, obj: KubeObject) -> bool:
        """Whether ``obj`` is one of the job's pods."""
        labels = obj["metadata"].get("labels") or {}
        if self.dialect == Dialect.KUBEDL:
            return bool(
                labels.get("group-name") == "training.kubedl.io"
                and labels.get("job-name") == self.name
            )
        return bool(labels.get("training.kubeflow.org/job-name") == self.name)

    def is_podgroup(self, obj: KubeObject) -> bool:
        """Whether ``obj`` is one of the job's Volcano PodGroups."""
        if self.dialect == Dialect.KUBEDL:
            labels = obj["metadata"].get("labels") or {}
            return bool(labels.get("kubedl.io/gang-job-name") == self.name)
        return bool(obj["metadata"]["name"] == self.name)

    def is_event(self, event: KubeObject) -> bool:
        """Whether a Kubernetes Event is about the job or one of its objects (by name)."""
        involved = str((event.get("involvedObject") or {}).get("name") or "")
        return involved == self.name or involved.startswith(f"{self.name}-")


def job_kind(api_version: str, kind: str) -> ResourceKind:
    """The resource kind of a training job's ``apiVersion`` and ``kind``."""
    return ResourceKind.of({"apiVersion": api_version, "kind": kind})
