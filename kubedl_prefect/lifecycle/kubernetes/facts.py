"""Reading the cluster objects a not-started diagnosis needs: once per wait, never in a loop.

(Also :func:`operator_missing`: whether the cluster serves a job's kind at all, at submission.)

:func:`~.blockers.fact_request` says what a job's diagnosis needs now; a :class:`FactReader`
(one per wait) reads it and hands :class:`~.blockers.ClusterFacts` to the pure decision. Named
objects (a Volcano Queue, a PriorityClass, a PersistentVolumeClaim) are read once per wait; the
lists (Nodes, ResourceQuotas, LimitRanges) when a message first asks for them and again only when
that message changes. Nothing is polled: the wait decides again when the job's own objects change
(a blocker that clears lets the scheduler bind the pods, which the wait sees).

A read that is refused (RBAC) or fails is not an error of the wait: it becomes a line of
``unchecked`` (``Nodes (forbidden)``) that the diagnosis reports instead. The reads and the
grants they need (deploy/rbac.yaml for namespaced objects, deploy/cluster-rbac.yaml for
cluster-scoped ones):

=========================  ==================================  =====================
object                     request                             grant
=========================  ==================================  =====================
Volcano ``Queue``          ``get`` (cluster-scoped)             ClusterRole
``PriorityClass``          ``get`` (cluster-scoped)             ClusterRole
``Node``                   ``list`` (cluster-scoped)            ClusterRole
``PersistentVolumeClaim``  ``get`` in the job's namespace       Role
``ResourceQuota``          ``list`` in the job's namespace      Role
``LimitRange``             ``list`` in the job's namespace      Role
Kueue ``LocalQueue``       ``get`` in the job's namespace       Role
Kueue ``Workload``         ``list``, ``watch`` (namespace)      Role
Kueue ``ClusterQueue``     ``get`` (cluster-scoped)             ClusterRole
=========================  ==================================  =====================

A job's Kueue Workloads (labelled with its uid) are watched by the backend's waits (the
namespace's shared informer): Kueue writes its decision on the Workload after the job last
changed. Without a watch they are read here again each time the job itself changes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from kubedl_prefect.errors import (
    ForbiddenError,
    KubeAPIError,
    NotFoundError,
    OperatorNotInstalledError,
)
from kubedl_prefect.kube.client import KubeClient, ObjectList
from kubedl_prefect.kube.resources import (
    KUEUE_CLUSTER_QUEUES,
    KUEUE_LOCAL_QUEUES,
    KUEUE_WORKLOADS,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    VOLCANO_QUEUES,
    KubeObject,
    ResourceKind,
)
from kubedl_prefect.lifecycle.kubernetes.cluster import ClusterFacts, FactRequest
from kubedl_prefect.lifecycle.kubernetes.operators import operator_not_installed
from kubedl_prefect.spec import Dialect, Framework, job_resource
from kubedl_prefect.spec.kueue import JOB_UID_LABEL

logger = logging.getLogger(__name__)

T = TypeVar("T")

PRIORITY_CLASSES = ResourceKind(
    "scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", namespaced=False
)
RESOURCE_QUOTAS = ResourceKind("", "v1", "ResourceQuota", "resourcequotas")
LIMIT_RANGES = ResourceKind("", "v1", "LimitRange", "limitranges")

_MISSING = object()


@dataclass
class _Listed:
    trigger: str
    items: list[KubeObject] | None


@dataclass
class FactReader:
    """Reads what one wait's diagnoses need, remembering what it read.

    Args:
        client: The backend's client (its identity's RBAC applies).
        namespace: The job's namespace.
    """

    client: KubeClient
    namespace: str
    reads: int = 0
    """How many requests it made (tests and benchmarks check it stays bounded)."""
    _named: dict[tuple[str, str], KubeObject | None] = field(default_factory=dict)
    _lists: dict[str, _Listed] = field(default_factory=dict)
    _unchecked: dict[str, str] = field(default_factory=dict)
    _unreadable: set[tuple[str, str]] = field(default_factory=set)

    async def read(self, request: FactRequest) -> ClusterFacts:
        """The objects ``request`` names, read if not read yet (or asked for anew)."""
        queues = await self._get_all(VOLCANO_QUEUES, None, request.queues)
        classes = await self._get_all(PRIORITY_CLASSES, None, request.priority_classes)
        claims = await self._get_all(PERSISTENT_VOLUME_CLAIMS, self.namespace, request.claims)
        local_queues = await self._get_all(KUEUE_LOCAL_QUEUES, self.namespace, request.local_queues)
        named = {
            str(((q or {}).get("spec") or {}).get("clusterQueue") or "")
            for q in local_queues.values()
        }
        cluster_queues = await self._get_all(
            KUEUE_CLUSTER_QUEUES, None, tuple(sorted(named - {""}))
        )
        workloads = None
        if request.workloads is not None:
            uid, version = request.workloads
            workloads = await self._list(
                KUEUE_WORKLOADS,
                self.namespace,
                f"{uid}@{version}",
                label_selector=f"{JOB_UID_LABEL}={uid}",
                missing=[],
            )
        return ClusterFacts(
            queues=queues,
            priority_classes=classes,
            claims=claims,
            nodes=await self._list(NODES, None, request.nodes),
            quotas=await self._list(RESOURCE_QUOTAS, self.namespace, request.quotas),
            limit_ranges=await self._list(LIMIT_RANGES, self.namespace, request.limit_ranges),
            local_queues=local_queues,
            cluster_queues=cluster_queues,
            workloads=workloads,
            unchecked=tuple(self._unchecked.values()),
        )

    async def current(
        self, kind: ResourceKind, namespace: str | None, name: str
    ) -> KubeObject | None:
        """One named object as it is now (read again, whatever was read before).

        For what changes while the job waits and matters once (a Kueue ClusterQueue's usage
        when the job is admitted). ``None`` when it does not exist or could not be read (then
        noted in ``unchecked``).
        """
        what = self._what(kind, namespace, name)
        try:
            found = await self._guarded(what, lambda: self.client.get(kind, namespace, name))
        except NotFoundError:
            return None
        return found if isinstance(found, dict) else None

    async def _get_all(
        self, kind: ResourceKind, namespace: str | None, names: tuple[str, ...]
    ) -> dict[str, KubeObject | None]:
        """Name to object (``None``: it does not exist) of the ``names`` that could be read."""
        found: dict[str, KubeObject | None] = {}
        for name in names:
            known, value = await self._get(kind, namespace, name)
            if known:
                found[name] = value
        return found

    def _what(self, kind: ResourceKind, namespace: str | None, name: str | None) -> str:
        where = f"{namespace}/" if namespace else ""
        return f"{kind.kind} {where}{name}" if name else f"{kind.kind}s"

    async def _guarded(self, what: str, call: Callable[[], Awaitable[T]]) -> T | object:
        """``call()``, or ``_MISSING`` with ``what`` noted as unchecked when it is refused."""
        self.reads += 1
        try:
            result = await call()
        except NotFoundError:
            raise
        except ForbiddenError:
            self._unchecked[what] = f"{what} (forbidden)"
            return _MISSING
        except KubeAPIError as exc:
            logger.info("could not read %s for a diagnosis: %s", what, exc.message)
            self._unchecked[what] = f"{what} ({exc.reason or 'error'})"
            return _MISSING
        self._unchecked.pop(what, None)
        return result

    async def _get(
        self, kind: ResourceKind, namespace: str | None, name: str
    ) -> tuple[bool, KubeObject | None]:
        """``(known, object)`` of one named object, read at most once per wait.

        ``(True, None)`` when it does not exist; ``(False, None)`` when it could not be read.
        """
        key = (str(kind), name)
        if key in self._named:
            return True, self._named[key]
        if key in self._unreadable:
            return False, None
        what = self._what(kind, namespace, name)
        try:
            found = await self._guarded(what, lambda: self.client.get(kind, namespace, name))
        except NotFoundError:
            self._named[key] = None
            return True, None
        if not isinstance(found, dict):
            self._unreadable.add(key)  # not asked again in this wait
            return False, None
        self._named[key] = found
        return True, found

    async def _list(
        self,
        kind: ResourceKind,
        namespace: str | None,
        trigger: str | None,
        *,
        label_selector: str | None = None,
        missing: list[KubeObject] | None = None,
    ) -> list[KubeObject] | None:
        """The objects of ``kind``, read again only when ``trigger`` changes.

        ``missing`` is what a 404 reads as (the kind is not served): ``None``, not read, unless
        said otherwise.
        """
        if trigger is None:
            return None
        key = str(kind)
        listed = self._lists.get(key)
        if listed is not None and listed.trigger == trigger:
            return listed.items
        what = self._what(kind, namespace, None)
        try:
            found = await self._guarded(
                what, lambda: self.client.list(kind, namespace, label_selector=label_selector)
            )
        except NotFoundError:
            found = missing if missing is not None else _MISSING
        items = found.items if isinstance(found, ObjectList) else None
        if isinstance(found, list):
            items = found
        self._lists[key] = _Listed(trigger, items)
        return items


async def served(client: KubeClient, kind: ResourceKind) -> bool | None:
    """Whether the API server serves ``kind`` (API discovery); ``None`` when it cannot be told.

    Discovery is open to every authenticated identity (the ``system:discovery`` role), so this
    needs no grant.
    """
    try:
        text = await client.get_text(f"/apis/{kind.group}/{kind.version}")
    except NotFoundError:
        return False
    except KubeAPIError:
        return None
    try:
        resources = json.loads(text).get("resources") or []
    except (ValueError, AttributeError):
        return None
    return any(r.get("name") == kind.plural for r in resources if isinstance(r, dict))


async def operator_missing(
    client: KubeClient, kind: ResourceKind, framework: Framework, dialect: Dialect
) -> OperatorNotInstalledError | None:
    """The error for a job whose kind the cluster does not serve, or ``None`` if it does.

    Called when creating the job answered 404, which may also mean that the namespace is missing.
    """
    if await served(client, kind) is not False:
        return None
    others = [d for d in Dialect if d is not dialect]
    served_elsewhere = []
    for other in others:
        resource = job_resource(other, framework)
        other_kind = ResourceKind(resource.group, resource.version, resource.kind, resource.plural)
        if await served(client, other_kind):
            served_elsewhere.append((other, other_kind))
    blocker = operator_not_installed(
        kind, dialect, client.server, [(d.value, k.api_version) for d, k in served_elsewhere]
    )
    return OperatorNotInstalledError(
        f"cannot submit: {blocker.message}", hint=blocker.hint, diagnosis=blocker.diagnosis()
    )
