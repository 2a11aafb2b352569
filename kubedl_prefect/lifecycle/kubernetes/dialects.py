"""What differs between the operators once a job exists: how its pods and PodGroups are found.

The renderers (:mod:`kubedl_prefect.spec.renderers`) say how each operator wants a job written;
this adapter says how each one labels what it makes from it. KubeDL labels pods
``group-name=training.kubedl.io`` + ``job-name`` (a bare ``job-name`` also matches batch Jobs'
pods) and makes one PodGroup per role, labelled ``kubedl.io/gang-job-name``; the Kubeflow operator
labels pods ``training.kubeflow.org/job-name`` and makes one PodGroup named like the job.

Kubeflow Trainer v2 (v2.3.0, on JobSet v0.12.0) makes a TrainJob ``x`` into a JobSet ``x`` (its
owner reference points at the TrainJob), whose controller makes a Job ``x-<replicatedJob>-<i>``
per replicated Job and a headless Service ``x``, and labels the Jobs and their pods
``jobset.sigs.k8s.io/jobset-name=x`` (and ``jobset.sigs.k8s.io/replicatedjob-name``); Trainer
adds no label of its own to them. A runtime with a Volcano (or coscheduling) ``podGroupPolicy``
gets a PodGroup named ``x``, owned by the TrainJob; Trainer leaves it behind when the job fails
(kubeflow/trainer#4033), so cancelling deletes it by name as well (:meth:`JobObjects.leftovers`).

The replicated Jobs are named by the runtime (Trainer's release: ``node``, MPI's ``launcher``; a
runtime of one's own may say ``worker``): pods, counts and logs are read by label and from
``status.jobsStatus``, never by a fixed name, and :func:`read_runtime` reads the runtime a
TrainJob names, so that its runtime patch reaches the runtime's own Jobs at submission
(:func:`~kubedl_prefect.spec.renderers.trainer.fit_runtime_patches`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from kubedl_prefect.errors import ForbiddenError, NotFoundError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import VOLCANO_PODGROUPS, KubeObject, ResourceKind
from kubedl_prefect.spec import Dialect

logger = logging.getLogger(__name__)

JOBSET_NAME_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
"""The label JobSet v0.12.0 puts on a JobSet's Jobs and pods (the JobSet's name)."""
REPLICATED_JOB_LABEL: Final = "jobset.sigs.k8s.io/replicatedjob-name"
"""The label naming a JobSet pod's replicated Job (``node``, ``launcher``)."""
JOBSETS: Final = ResourceKind("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")
"""The JobSet a TrainJob runs as (JobSet v0.12.0)."""
BATCH_JOBS: Final = ResourceKind("batch", "v1", "Job", "jobs")
"""Kubernetes Jobs (a JobSet's children)."""
CLUSTER_TRAINING_RUNTIMES: Final = ResourceKind(
    "trainer.kubeflow.org",
    "v1alpha1",
    "ClusterTrainingRuntime",
    "clustertrainingruntimes",
    namespaced=False,
)
"""Trainer's cluster-scoped runtimes (a ``runtimeRef``'s default kind)."""
TRAINING_RUNTIMES: Final = ResourceKind(
    "trainer.kubeflow.org", "v1alpha1", "TrainingRuntime", "trainingruntimes"
)
"""Trainer's namespaced runtimes (``runtimeRef.kind: TrainingRuntime``)."""
COSCHEDULING_PODGROUPS: Final = ResourceKind(
    "scheduling.x-k8s.io", "v1alpha1", "PodGroup", "podgroups"
)
"""scheduler-plugins' PodGroup, which Trainer makes (named like the TrainJob) for a runtime whose
``podGroupPolicy`` is ``coscheduling``; its pods are labelled ``scheduling.x-k8s.io/pod-group``."""


def runtime_kind(train_job: KubeObject) -> tuple[ResourceKind, str]:
    """The runtime kind and name a TrainJob's ``runtimeRef`` names.

    Example:
        >>> kind, name = runtime_kind({"spec": {"runtimeRef": {"name": "torch-distributed"}}})
        >>> kind.kind, name
        ('ClusterTrainingRuntime', 'torch-distributed')
    """
    ref = (train_job.get("spec") or {}).get("runtimeRef") or {}
    kind = TRAINING_RUNTIMES if ref.get("kind") == "TrainingRuntime" else CLUSTER_TRAINING_RUNTIMES
    return kind, str(ref.get("name") or "")


async def read_runtime(
    client: KubeClient, namespace: str, train_job: KubeObject
) -> KubeObject | None:
    """The runtime ``train_job`` names, or ``None`` when it cannot be read.

    A runtime that does not exist is Trainer's to refuse (its webhook names it); one we may
    not read (no ``get`` on the runtimes: deploy/rbac.yaml, deploy/cluster-rbac.yaml) is
    logged, and the TrainJob goes as rendered, which fits Trainer's own runtimes.
    """
    kind, name = runtime_kind(train_job)
    if not name:
        return None
    try:
        return await client.get(kind, namespace if kind.namespaced else None, name)
    except NotFoundError:
        return None
    except ForbiddenError as exc:
        logger.warning(
            "cannot read %s %s (%s): its replicated Jobs are taken to be Trainer's own "
            "(node, launcher); grant get on %s",
            kind.kind,
            name,
            exc.message,
            kind.plural,
        )
        return None


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
        if self.dialect == Dialect.TRAINER:
            return (JOBSET_NAME_LABEL, self.name)
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
        if self.dialect == Dialect.TRAINER:
            return bool(labels.get(JOBSET_NAME_LABEL) == self.name)
        return bool(labels.get("training.kubeflow.org/job-name") == self.name)

    def is_child_job(self, obj: KubeObject) -> bool:
        """Whether ``obj`` (a batch Job) is one of a TrainJob's JobSet's Jobs."""
        if self.dialect != Dialect.TRAINER:
            return False
        labels = obj["metadata"].get("labels") or {}
        return bool(labels.get(JOBSET_NAME_LABEL) == self.name)

    def leftovers(self) -> tuple[tuple[ResourceKind, str], ...]:
        """``(kind, name)`` of what the operator makes for the job and may leave when it goes.

        Deleting a TrainJob lets the garbage collector remove its JobSet (and so its Jobs,
        pods and Service) and its PodGroup, but a failed TrainJob's PodGroup is known to stay
        (kubeflow/trainer#4033): cancellation deletes these by name, each a no-op when gone
        (or when the cluster has no such kind). The PodGroup is Volcano's or, under a
        ``coscheduling`` runtime, scheduler-plugins'. The v1 operators delete what they made
        themselves: nothing.

        Example:
            >>> [(kind.group, name) for kind, name in JobObjects(Dialect.TRAINER, "x").leftovers()]
            [('jobset.x-k8s.io', 'x'), ('scheduling.volcano.sh', 'x'), ('scheduling.x-k8s.io', 'x')]
        """
        if self.dialect != Dialect.TRAINER:
            return ()
        return (
            (JOBSETS, self.name),
            (VOLCANO_PODGROUPS, self.name),
            (COSCHEDULING_PODGROUPS, self.name),
        )

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
