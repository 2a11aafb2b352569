"""What a training job asks of the cluster. Pure.

Its replicas, where their pods may run, what they request, and the objects they name (Volcano
Queues, PriorityClasses, PersistentVolumeClaims).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kubedl_prefect.kube.resources import KubeObject
from kubedl_prefect.spec.quantity import parse_quantity


@dataclass(frozen=True)
class Placement:
    """Where the pods of one role may run, and what each of them requests.

    Args:
        role: The role, lower-case (``worker``).
        count: Its replicas.
        node_selector: ``nodeSelector`` labels.
        node_terms: The required node affinity's ``nodeSelectorTerms`` (any one must match).
        tolerations: The pods' tolerations.
        requests: Requests of one pod (limits where no request is given), in base units.
        limits: Limits of one pod, in base units.
    """

    role: str
    count: int
    node_selector: Mapping[str, str]
    node_terms: tuple[KubeObject, ...]
    tolerations: tuple[KubeObject, ...]
    requests: Mapping[str, Decimal]
    limits: Mapping[str, Decimal]

    def describe(self) -> str:
        """The placement constraints in words (``nodeSelector disktype=ssd``)."""
        parts = []
        if self.node_selector:
            labels = ", ".join(f"{k}={v}" for k, v in sorted(self.node_selector.items()))
            parts.append(f"nodeSelector {labels}")
        if self.node_terms:
            parts.append(f"node affinity {' or '.join(_describe_term(t) for t in self.node_terms)}")
        return "; ".join(parts) or "no node constraints"


def _describe_term(term: KubeObject) -> str:
    words = []
    for expression in (term.get("matchExpressions") or []) + (term.get("matchFields") or []):
        values = ",".join(str(v) for v in expression.get("values") or [])
        words.append(f"{expression.get('key')} {expression.get('operator')} ({values})".strip())
    return "[" + ", ".join(words) + "]"


_TRAINER_MPI_RUNTIMES = frozenset({"deepspeed-distributed", "mlx-distributed"})
"""Trainer v2.3.0's MPI runtimes: a launcher that is also a node, and ``numNodes - 1`` nodes."""
_VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
_RUNTIME_JOBS_ANNOTATION = "kubedl-prefect.io/runtime-jobs"
"""``spec.renderers.trainer.RUNTIME_JOBS_ANNOTATION``: the runtime's own Jobs and their pods."""


def _runtime_layout(job: KubeObject) -> list[tuple[str, int, bool]] | None:
    """``(replicated Job, pods, takes resourcesPerNode)`` recorded at submission, if any."""
    raw = ((job.get("metadata") or {}).get("annotations") or {}).get(_RUNTIME_JOBS_ANNOTATION)
    if not raw:
        return None
    try:
        layout = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(layout, dict):
        return None
    found = []
    for name, entry in layout.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("pods"), int):
            return None
        found.append((str(name), max(entry["pods"], 0), bool(entry.get("trainer"))))
    return found or None


def _trainjob_templates(job: KubeObject) -> Iterator[tuple[str, int, KubeObject]]:
    """A TrainJob's replicated Jobs as roles: what its ``trainer`` and runtime patches say.

    The runtime's own template is not read (it is another object): the pods' requests are
    ``resourcesPerNode`` and their placement the runtime patches' pod spec. A runtime that
    names its Jobs otherwise than Trainer's release has them recorded on the TrainJob at
    submission (``kubedl-prefect.io/runtime-jobs``: each Job's pods, and which take
    ``resourcesPerNode``). Otherwise an MPI runtime (Trainer's own, or one whose patches name
    a ``launcher``) has a launcher and ``numNodes - 1`` nodes; any other, ``numNodes`` nodes.
    """
    spec = job.get("spec") or {}
    trainer = spec.get("trainer") or {}
    nodes = trainer.get("numNodes", 1)
    nodes = nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes > 0 else 1
    pods: dict[str, KubeObject] = {}
    for patch in spec.get("runtimePatches") or []:
        template = ((patch or {}).get("trainingRuntimeSpec") or {}).get("template") or {}
        for replicated in (template.get("spec") or {}).get("replicatedJobs") or []:
            pod = ((replicated.get("template") or {}).get("spec") or {}).get("template") or {}
            name = str(replicated.get("name") or "")
            pods[name] = {**pods.get(name, {}), **(pod.get("spec") or {})}
    runtime = str((spec.get("runtimeRef") or {}).get("name") or "")
    container: KubeObject = {"name": "node"}
    if trainer.get("resourcesPerNode"):
        container["resources"] = trainer["resourcesPerNode"]
    layout = _runtime_layout(job)
    if layout is None:
        mpi = runtime in _TRAINER_MPI_RUNTIMES or "launcher" in pods
        roles = [("launcher", 1), ("node", max(nodes - 1, 1))] if mpi else [("node", nodes)]
        layout = [(role, count, True) for role, count in roles]
    for role, count, resourced in layout:
        pod_spec = {k: v for k, v in pods.get(role, {}).items() if k != "containers"}
        containers = [container] if resourced else [{"name": role}]
        yield role, count, {"spec": {**pod_spec, "containers": containers}}


def trainjob_queue(job: KubeObject) -> str | None:
    """The Volcano queue a TrainJob's runtime patches name (the JobSet template's annotation)."""
    for patch in (job.get("spec") or {}).get("runtimePatches") or []:
        template = ((patch or {}).get("trainingRuntimeSpec") or {}).get("template") or {}
        queue = ((template.get("metadata") or {}).get("annotations") or {}).get(
            _VOLCANO_QUEUE_ANNOTATION
        )
        if queue:
            return str(queue)
    return None


def replica_templates(job: KubeObject) -> Iterator[tuple[str, int, KubeObject]]:
    """``(role, replicas, pod template)`` of every role of a KubeDL or Kubeflow job.

    A Kubeflow Trainer ``TrainJob``'s roles are its replicated Jobs (``node``, MPI's
    ``launcher``), as far as the TrainJob says (:func:`_trainjob_templates`).
    """
    if job.get("kind") == "TrainJob":
        yield from _trainjob_templates(job)
        return
    spec = job.get("spec") or {}
    for key, roles in spec.items():
        if not (key.endswith("ReplicaSpecs") and isinstance(roles, dict)):
            continue
        for role, replica_spec in roles.items():
            replica_spec = replica_spec or {}
            count = replica_spec.get("replicas", 1)
            yield str(role).lower(), int(count or 0), replica_spec.get("template") or {}


def _scheduling_policy(job: KubeObject) -> KubeObject:
    spec = job.get("spec") or {}
    policy = spec.get("schedulingPolicy") or (spec.get("runPolicy") or {}).get("schedulingPolicy")
    return policy or {}


def quantities(values: Mapping[str, Any] | None) -> dict[str, Decimal]:
    """Parsed quantities of a resource map, in base units (unparseable ones left out)."""
    parsed: dict[str, Decimal] = {}
    for key, value in (values or {}).items():
        try:
            parsed[str(key)] = parse_quantity(str(value))
        except ValueError:
            continue
    return parsed


def _pod_resources(pod_spec: KubeObject) -> tuple[dict[str, Decimal], dict[str, Decimal]]:
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    for container in pod_spec.get("containers") or []:
        resources = container.get("resources") or {}
        own_limits = quantities(resources.get("limits"))
        own_requests = {**own_limits, **quantities(resources.get("requests"))}
        for key, value in own_requests.items():
            requests[key] = requests.get(key, Decimal(0)) + value
        for key, value in own_limits.items():
            limits[key] = limits.get(key, Decimal(0)) + value
    return requests, limits


def _pod_role(pod: KubeObject) -> str:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    role = (
        labels.get("replica-type")
        or labels.get("training.kubeflow.org/replica-type")
        or labels.get("jobset.sigs.k8s.io/replicatedjob-name")
        or ""
    )
    return str(role).lower()


def placements(job: KubeObject, pods: Sequence[KubeObject] = ()) -> list[Placement]:
    """One :class:`Placement` per role: from a pod of the role when one exists, else its template.

    A pod is preferred because admission webhooks may have changed it (added tolerations).
    """
    found = []
    pods_by_role = {_pod_role(pod): pod for pod in pods}
    for role, count, template in replica_templates(job):
        source = pods_by_role.get(role) or template
        pod_spec = source.get("spec") or {}
        affinity = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        requests, limits = _pod_resources(pod_spec)
        found.append(
            Placement(
                role=role,
                count=count,
                node_selector={
                    str(k): str(v) for k, v in (pod_spec.get("nodeSelector") or {}).items()
                },
                node_terms=tuple(affinity.get("nodeSelectorTerms") or []),
                tolerations=tuple(pod_spec.get("tolerations") or []),
                requests=requests,
                limits=limits,
            )
        )
    return found


def job_total(job: KubeObject, key: str) -> Decimal | None:
    """What the whole job asks of a ResourceQuota key (``requests.cpu``, ``pods``...), if known."""
    roles = placements(job)
    if key in ("pods", "count/pods"):
        return Decimal(sum(p.count for p in roles))
    if key.startswith("limits."):
        resource, source = key.removeprefix("limits."), "limits"
    else:
        resource, source = key.removeprefix("requests."), "requests"
    if "/" in resource and not resource.count("."):
        return None  # count/<resource> quotas are not about pods
    total = Decimal(0)
    for placement in roles:
        values = placement.limits if source == "limits" else placement.requests
        total += values.get(resource, Decimal(0)) * placement.count
    return total


def template_specs(job: KubeObject) -> Iterator[KubeObject]:
    """The pod spec of each role's template."""
    for _, _, template in replica_templates(job):
        yield template.get("spec") or {}


def needed_priority_classes(
    job: KubeObject, podgroups: Sequence[KubeObject] = ()
) -> list[tuple[str, str]]:
    """``(name, where it is named)`` of every PriorityClass the job names."""
    found: dict[str, str] = {}
    policy = _scheduling_policy(job)
    for key in ("priorityClassName", "priorityClass"):
        if policy.get(key):
            found.setdefault(str(policy[key]), "gang.priorityClass")
    for podgroup in podgroups:
        name = (podgroup.get("spec") or {}).get("priorityClassName")
        if name:
            found.setdefault(str(name), "gang.priorityClass")
    for pod_spec in template_specs(job):
        if pod_spec.get("priorityClassName"):
            found.setdefault(str(pod_spec["priorityClassName"]), "priorityClassName of the pods")
    return sorted(found.items())


def needed_claims(job: KubeObject) -> list[str]:
    """The PersistentVolumeClaims the job's pods mount."""
    claims = {
        str(claim)
        for pod_spec in template_specs(job)
        for volume in pod_spec.get("volumes") or []
        if (claim := (volume.get("persistentVolumeClaim") or {}).get("claimName"))
    }
    return sorted(claims)


def job_queues(job: KubeObject, podgroups: Sequence[KubeObject]) -> list[str]:
    """The Volcano Queues the job is in: its PodGroups', else the one its spec names."""
    queues = {str(q) for pg in podgroups if (q := (pg.get("spec") or {}).get("queue"))}
    if not queues and not podgroups and _scheduling_policy(job).get("queue"):
        queues.add(str(_scheduling_policy(job)["queue"]))
    if not queues and not podgroups and job.get("kind") == "TrainJob":
        queue = trainjob_queue(job)
        if queue is not None:
            queues.add(queue)
    return sorted(queues)


def waiting_podgroups(podgroups: Sequence[KubeObject]) -> list[KubeObject]:
    """PodGroups Volcano has not enqueued yet (their queue may be what holds them)."""
    return [
        pg for pg in podgroups if (pg.get("status") or {}).get("phase") in (None, "", "Pending")
    ]
