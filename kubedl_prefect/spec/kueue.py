"""What Kueue reads on a job, and the job created suspended for it to admit. Pure.

Kueue (``kueue.x-k8s.io``) admits a job whose metadata names a LocalQueue
(:data:`QUEUE_LABEL`): it keeps the job suspended until the LocalQueue's ClusterQueue has quota
for the whole job, then resumes it; it may suspend it again later (preemption, pods not ready in
time) and admit the same job once more. A WorkloadPriorityClass (:data:`PRIORITY_CLASS_LABEL`)
orders jobs in their queue and decides who preempts whom. Kueue keeps its bookkeeping in a
``Workload`` it creates for the job, labelled :data:`JOB_UID_LABEL` with the job's uid.

The labels go on the job only, never on its pods: Kueue's pod integration would take labelled
pods for jobs of their own. The job is created suspended where its kind can be
(:func:`suspend_field`): Kueue's webhook suspends it too, but a cluster whose webhook is off or
late would otherwise start the pods before Kueue admits them. Names are those of Kueue v0.19.2
(``pkg/controller/constants/constants.go``); KubeDL's kinds are not among the kinds Kueue
manages (``pkg/controller/jobs/``), so :mod:`kubedl_prefect.spec.checks` refuses a KubeDL job
with a queue.
"""

from __future__ import annotations

from typing import Any, Final

from kubedl_prefect.spec.model import TrainingJobSpec

__all__ = [
    "JOB_UID_LABEL",
    "KUEUE_LABELS",
    "PRIORITY_CLASS_LABEL",
    "QUEUE_LABEL",
    "queued_manifest",
    "suspend_field",
]

QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
"""The label naming the LocalQueue (in the job's namespace) a job waits in."""

PRIORITY_CLASS_LABEL: Final = "kueue.x-k8s.io/priority-class"
"""The label naming the job's WorkloadPriorityClass (cluster-scoped)."""

JOB_UID_LABEL: Final = "kueue.x-k8s.io/job-uid"
"""The label Kueue puts on the Workload it makes for a job: the job's uid."""

KUEUE_LABELS: Final = frozenset({QUEUE_LABEL, PRIORITY_CLASS_LABEL})
"""The labels the spec's ``kueue`` field sets (``labels`` may not set them: they reach the pods)."""


def suspend_field(manifest: dict[str, Any]) -> tuple[str, ...] | None:
    """Where a job of this manifest's kind is suspended, as a path under the object; or ``None``.

    Kubeflow training operator v1 kinds (``kubeflow.org/v1``) suspend through
    ``spec.runPolicy.suspend``; Kubeflow Trainer's ``TrainJob`` (and JobSet) through
    ``spec.suspend``. KubeDL's kinds cannot be suspended.

    Example:
        >>> suspend_field({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"})
        ('spec', 'runPolicy', 'suspend')
        >>> suspend_field({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob"})
        ('spec', 'suspend')
    """
    group = str(manifest.get("apiVersion") or "").rpartition("/")[0]
    if group == "kubeflow.org":
        return ("spec", "runPolicy", "suspend")
    if group in ("trainer.kubeflow.org", "jobset.x-k8s.io"):
        return ("spec", "suspend")
    return None


def queued_manifest(manifest: dict[str, Any], spec: TrainingJobSpec) -> dict[str, Any]:
    """``manifest`` with what Kueue reads when ``spec`` names a queue: labels, and suspended.

    Applied last to a rendered job: by the Kubeflow renderer, and by
    :func:`~kubedl_prefect.spec.renderers.render_unchecked` to a TrainJob (:func:`suspend_field`
    knows ``spec.suspend``). Without ``spec.kueue`` the manifest is returned unchanged. Changes
    ``manifest`` in place and returns it.

    Example:
        >>> from kubedl_prefect.spec import parse_spec
        >>> spec = parse_spec({"name": "mnist", "image": "busybox", "replicas": {"master": 1},
        ...                    "kueue": {"queue": "team-a"}})
        >>> job = queued_manifest({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        ...                        "metadata": {"name": "mnist"}, "spec": {"runPolicy": {}}}, spec)
        >>> job["metadata"]["labels"], job["spec"]["runPolicy"]
        ({'kueue.x-k8s.io/queue-name': 'team-a'}, {'suspend': True})
    """
    kueue = spec.kueue
    if kueue is None:
        return manifest
    labels = manifest.setdefault("metadata", {}).setdefault("labels", {})
    labels[QUEUE_LABEL] = kueue.queue
    if kueue.priority_class is not None:
        labels[PRIORITY_CLASS_LABEL] = kueue.priority_class
    path = suspend_field(manifest)
    if path is not None:
        node = manifest
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = True
    return manifest
