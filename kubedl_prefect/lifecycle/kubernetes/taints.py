"""Placement: where a role's pods may run, and the blocker when no node ever takes them. Pure.

Whether a node matches a role's selector and affinity, and which of its taints the pods do not
tolerate.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from kubedl_prefect.kube.resources import KubeObject
from kubedl_prefect.lifecycle.admission import AdmissionBlocker, Blocker
from kubedl_prefect.lifecycle.kubernetes.cluster import ClusterFacts
from kubedl_prefect.lifecycle.kubernetes.demand import Placement, placements

_LIFECYCLE_TAINT = re.compile(
    r"^(node\.kubernetes\.io/|node\.cloudprovider\.kubernetes\.io/|ToBeDeletedByClusterAutoscaler"
    r"|DeletionCandidateOfClusterAutoscaler)"
)


def _matches_expression(value: str | None, present: bool, expression: KubeObject) -> bool:
    operator = expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and values:
        try:
            number, bound = int(str(value)), int(values[0])
        except ValueError:
            return False
        return number > bound if operator == "Gt" else number < bound
    return False


def node_matches(node: KubeObject, placement: Placement) -> bool:
    """Whether ``node`` has the labels (and fields) ``placement`` requires."""
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if any(labels.get(k) != v for k, v in placement.node_selector.items()):
        return False
    if not placement.node_terms:
        return True
    fields = {"metadata.name": metadata.get("name")}
    for term in placement.node_terms:
        expressions = term.get("matchExpressions") or []
        matched = all(
            _matches_expression(labels.get(e.get("key")), e.get("key") in labels, e)
            for e in expressions
        ) and all(
            _matches_expression(fields.get(e.get("key")), e.get("key") in fields, e)
            for e in term.get("matchFields") or []
        )
        if matched and (expressions or term.get("matchFields")):
            return True
    return False


def tolerates(tolerations: Iterable[KubeObject], taint: KubeObject) -> bool:
    """Whether one of ``tolerations`` tolerates ``taint`` (Kubernetes' matching rules)."""
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key")
        operator = toleration.get("operator") or "Equal"
        if not key:
            if operator == "Exists":
                return True
            continue
        if key != taint.get("key"):
            continue
        if operator == "Exists" or str(toleration.get("value") or "") == str(
            taint.get("value") or ""
        ):
            return True
    return False


def blocking_taints(node: KubeObject, tolerations: Sequence[KubeObject]) -> list[KubeObject]:
    """The taints of ``node`` that keep pods with ``tolerations`` off it (a cordon counts)."""
    taints = list((node.get("spec") or {}).get("taints") or [])
    if (node.get("spec") or {}).get("unschedulable"):
        taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    return [
        t
        for t in taints
        if t.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, t)
    ]


def _taint_text(taint: KubeObject) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


def placement_blocker(
    job: KubeObject, pods: Sequence[KubeObject], facts: ClusterFacts, scaling_up: bool
) -> Blocker | None:
    """The blocker of nodes that can never take the pods (selector, affinity, taints)."""
    nodes = facts.nodes
    if not nodes:
        return None  # not read, or a cluster without nodes (yet): nothing to decide on
    for placement in placements(job, pods):
        candidates = [n for n in nodes if node_matches(n, placement)]
        if not candidates:
            return Blocker(
                AdmissionBlocker.NO_MATCHING_NODE,
                f"no node matches the {placement.describe()} of the {placement.role} pods "
                f"(0 of {len(nodes)} nodes)",
                "fix nodeSelector/affinity in the spec (kubectl get nodes --show-labels), or add "
                "nodes with those labels",
                subject=f"{placement.describe()} ({placement.role})",
                permanent=not scaling_up,
            )
        blocked = [(n, blocking_taints(n, placement.tolerations)) for n in candidates]
        if any(not taints for _, taints in blocked):
            continue
        deliberate = [
            (n, [t for t in taints if not _LIFECYCLE_TAINT.match(str(t.get("key") or ""))])
            for n, taints in blocked
        ]
        permanent = all(taints for _, taints in deliberate) and not scaling_up
        node, taints = next(((n, t) for n, t in deliberate if t), blocked[0])
        shown = ", ".join(sorted({_taint_text(t) for t in taints}))
        names = ", ".join(sorted(str(n["metadata"]["name"]) for n, _ in blocked)[:5])
        return Blocker(
            AdmissionBlocker.UNTOLERATED_TAINT,
            f"every node the {placement.role} pods may use has a taint they do not tolerate: "
            f"{shown} ({names})",
            f"add a toleration for {shown} to the spec (tolerations), or target other nodes"
            if permanent
            else "the nodes are cordoned, not ready or under pressure; wait, or add a toleration",
            subject=f"taint {shown} on node {node['metadata']['name']}",
            permanent=permanent,
        )
    return None
