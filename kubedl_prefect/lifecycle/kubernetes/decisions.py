"""Per-object decisions, each a blocker, permanent or not. Pure.

Refused pods (ResourceQuotas, LimitRanges, webhooks, ServiceAccounts), Volcano Queues,
PriorityClasses and PersistentVolumeClaims.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal

from kubedl_prefect.kube.resources import KubeObject
from kubedl_prefect.lifecycle.admission import AdmissionBlocker, Blocker
from kubedl_prefect.lifecycle.kubernetes.cluster import ClusterFacts
from kubedl_prefect.lifecycle.kubernetes.demand import (
    job_queues,
    job_total,
    needed_claims,
    quantities,
    waiting_podgroups,
)
from kubedl_prefect.spec.quantity import parse_quantity

_PRIORITY_REFUSED = re.compile(r"no PriorityClass with name (\S+) was found")
_QUOTA_REFUSED = re.compile(
    r"exceeded quota: (?P<name>[^,]+)(?:, requested: (?P<requested>.*?))?"
    r"(?:, used: (?P<used>.*?))?(?:, limited: (?P<limited>.*))?$"
)
_QUOTA_UNSPECIFIED = re.compile(r"failed quota: (?P<name>[^:]+): must specify (?P<what>.*)$")
LIMIT_RANGE = re.compile(
    r"(maximum|minimum) \S+ usage per (Container|Pod) is|limit to request ratio per", re.I
)
_SERVICE_ACCOUNT = re.compile(r'serviceaccount "([^"]+)" not found', re.I)
_WEBHOOK = re.compile(r'admission webhook "([^"]+)" denied the request')
_POD_NAME = re.compile(r'^[Pp]ods? "([^"]+)"')


def _pairs(text: str | None) -> dict[str, Decimal]:
    values: dict[str, Decimal] = {}
    for item in (text or "").split(","):
        key, _, value = item.strip().partition("=")
        if key and value:
            try:
                values[key] = parse_quantity(value.strip())
            except ValueError:
                continue
    return values


def _number(value: Decimal) -> str:
    return format(value.normalize(), "f") if value == value.to_integral() else str(value)


def _quota_blocker(
    job: KubeObject, namespace: str, message: str, facts: ClusterFacts | None
) -> Blocker | None:
    unspecified = _QUOTA_UNSPECIFIED.search(message)
    if unspecified:
        name = unspecified.group("name").strip()
        return Blocker(
            AdmissionBlocker.QUOTA,
            f"ResourceQuota {namespace}/{name} requires every pod to set "
            f"{unspecified.group('what').strip()}, and the job's pods do not",
            f"set the replicas' resources (cpu, memory and their limits) in the spec, or change "
            f"ResourceQuota {name}",
            subject=f"ResourceQuota {namespace}/{name}",
            permanent=True,
        )
    refused = _QUOTA_REFUSED.search(message)
    if not refused:
        return None
    name = refused.group("name").strip()
    subject = f"ResourceQuota {namespace}/{name}"
    requested, used = _pairs(refused.group("requested")), _pairs(refused.group("used"))
    limited = _pairs(refused.group("limited"))
    # One pod larger than the quota, or the whole job larger than the quota's hard limits:
    # freeing the namespace up can never make it fit.
    for key, value in requested.items():
        if key in limited and value > limited[key]:
            return Blocker(
                AdmissionBlocker.QUOTA,
                f"{subject} allows {key}={_number(limited[key])} in all, and one pod of the job "
                f"asks for {_number(value)}",
                f"raise {subject} or ask for less per replica",
                subject=subject,
                permanent=True,
            )
    quotas = (facts.quotas or []) if facts is not None else []
    quota = next((q for q in quotas if q["metadata"]["name"] == name), None)
    if quota is not None:
        hard = quantities((quota.get("spec") or {}).get("hard"))
        for key, limit in sorted(hard.items()):
            need = job_total(job, key)
            if need is not None and need > limit:
                return Blocker(
                    AdmissionBlocker.QUOTA,
                    f"{subject} allows {key}={_number(limit)} in all, and the job needs "
                    f"{key}={_number(need)}",
                    f"raise {subject} to at least {key}={_number(need)}, or ask for less "
                    "(fewer replicas, smaller resources)",
                    subject=subject,
                    permanent=True,
                )
    detail = ", ".join(
        f"{key} {_number(used.get(key, Decimal(0)))} of {_number(limited[key])} used, a pod "
        f"needs {_number(requested[key])} more"
        for key in sorted(requested)
        if key in limited
    )
    return Blocker(
        AdmissionBlocker.QUOTA,
        f"{subject} is used up" + (f": {detail}" if detail else f" ({message})"),
        f"wait for other pods in {namespace} to finish, or raise {subject}",
        subject=subject,
    )


def refusal_blocker(
    job: KubeObject, namespace: str, message: str, facts: ClusterFacts | None
) -> Blocker:
    """The blocker of one refusal of the operator's pod creation."""
    pod = _POD_NAME.search(message)
    pod_name = pod.group(1) if pod else ""
    pod_text = f"pod {pod_name}" if pod_name else "a pod"
    pod_subject = f"Pod {namespace}/{pod_name}" if pod_name else ""
    priority = _PRIORITY_REFUSED.search(message)
    if priority:
        name = priority.group(1)
        return missing_priority_class(name, "priorityClassName of the pods")
    quota = _quota_blocker(job, namespace, message, facts) if "quota" in message else None
    if quota is not None:
        return quota
    if LIMIT_RANGE.search(message):
        ranges = (facts.limit_ranges or []) if facts is not None else []
        names = sorted(str(lr["metadata"]["name"]) for lr in ranges)
        subject = (
            f"LimitRange {namespace}/{names[0]}"
            if len(names) == 1
            else f"LimitRange in {namespace}" + (f" ({', '.join(names)})" if names else "")
        )
        detail = message.split(" is forbidden: ", 1)[-1].strip("[]")
        return Blocker(
            AdmissionBlocker.LIMIT_RANGE,
            f"{subject} refuses {pod_text}: {detail}",
            f"fit the replicas' resources within {subject} (kubectl describe limitrange -n "
            f"{namespace}), or change it",
            subject=subject,
            permanent=True,
        )
    account = _SERVICE_ACCOUNT.search(message)
    if account:
        subject = f"ServiceAccount {namespace}/{account.group(1)}"
        return Blocker(
            AdmissionBlocker.POD_REFUSED,
            f"the API server refuses {pod_text}: {subject} does not exist",
            f"create {subject} or fix serviceAccountName in the spec",
            subject=subject,
            permanent=True,
        )
    webhook = _WEBHOOK.search(message)
    if webhook:
        subject = f"admission webhook {webhook.group(1)}"
        why = message.split("denied the request", 1)[-1].lstrip(": ")
        return Blocker(
            AdmissionBlocker.POD_REFUSED,
            f"{subject} refuses {pod_text}: {why}",
            f"change the spec to satisfy {subject}, or ask its owner",
            subject=subject,
            permanent=True,
        )
    if " is invalid: " in message or " is forbidden: " in message:
        detail = (
            message.split(" is invalid: ", 1)[-1]
            if " is invalid: " in message
            else (message.split(" is forbidden: ", 1)[-1])
        )
        return Blocker(
            AdmissionBlocker.POD_REFUSED,
            f"the API server refuses {pod_text}: {detail}",
            "fix the pod template in the spec (podTemplate, volumes, resources, env): the API "
            "server refuses the pods as rendered",
            subject=pod_subject,
            permanent=True,
        )
    return Blocker(
        AdmissionBlocker.NOT_CREATED,
        f"the operator could not create {pod_text}: {message}",
        "it retries; if this persists, read the operator's log",
        subject=pod_subject,
    )


def missing_priority_class(name: str, where: str) -> Blocker:
    """The permanent blocker of a PriorityClass that does not exist."""
    return Blocker(
        AdmissionBlocker.PRIORITY_CLASS_NOT_FOUND,
        f'PriorityClass "{name}" does not exist ({where})',
        "create it (kubectl get priorityclasses lists those there are) or name an existing one "
        "in the spec",
        subject=f"PriorityClass {name}",
        permanent=True,
    )


def queue_blocker(
    job: KubeObject,
    podgroups: Sequence[KubeObject],
    facts: ClusterFacts,
    queue_short: bool,
) -> Blocker | None:
    """The blocker of the Volcano Queue the job's PodGroups wait in, if it holds them back."""
    waiting = waiting_podgroups(podgroups)
    if podgroups and not waiting:
        return None  # enqueued: the queue let them in
    groups = waiting or [{"metadata": {"name": ""}, "spec": {}}]
    for name in job_queues(job, podgroups):
        if name not in facts.queues:
            continue
        queue = facts.queues[name]
        subject = f"Queue {name}"
        if queue is None:
            return Blocker(
                AdmissionBlocker.QUEUE_NOT_FOUND,
                f'Volcano Queue "{name}" does not exist: nothing admits the job\'s PodGroup',
                "create the queue (kubectl get queues lists those there are) or set gang.queue "
                "to an existing one",
                subject=subject,
                permanent=True,
            )
        state = str((queue.get("status") or {}).get("state") or "Open")
        if state in ("Closed", "Closing"):
            return Blocker(
                AdmissionBlocker.QUEUE_CLOSED,
                f'Volcano Queue "{name}" is {state}: it admits no new jobs',
                "open the queue, or set gang.queue to an open one",
                subject=subject,
                permanent=True,
            )
        capability = quantities((queue.get("spec") or {}).get("capability"))
        if not capability:
            continue
        group = next((pg for pg in groups if (pg.get("spec") or {}).get("queue") == name), None)
        need = quantities(((group or {}).get("spec") or {}).get("minResources"))
        if not need:
            need = {
                key: total
                for key in capability
                if (total := job_total(job, f"requests.{key}")) is not None
            }
        for key, limit in sorted(capability.items()):
            if need.get(key, Decimal(0)) > limit:
                return Blocker(
                    AdmissionBlocker.QUEUE_CAPABILITY,
                    f'the job needs {key}={_number(need[key])} but Volcano Queue "{name}" is '
                    f"capped at {key}={_number(limit)} (spec.capability)",
                    f"raise the queue's capability to at least {key}={_number(need[key])}, or "
                    "ask for less (fewer replicas, smaller resources)",
                    subject=subject,
                    permanent=True,
                )
        if queue_short:
            allocated = quantities((queue.get("status") or {}).get("allocated"))
            for key, limit in sorted(capability.items()):
                taken = allocated.get(key, Decimal(0))
                if key in need and taken + need[key] > limit:
                    return Blocker(
                        AdmissionBlocker.QUEUE_CAPABILITY,
                        f'Volcano Queue "{name}" is at its capability: {key} '
                        f"{_number(taken)} of {_number(limit)} allocated, the job needs "
                        f"{_number(need[key])}",
                        "wait for the queue's other jobs to finish, or raise its capability",
                        subject=subject,
                    )
    return None


def claims_blocker(job: KubeObject, namespace: str, facts: ClusterFacts) -> Blocker | None:
    """The blocker of the job's PersistentVolumeClaims, if one is missing or unbound."""
    for name in needed_claims(job):
        if name in facts.claims and facts.claims[name] is None:
            return missing_claim(namespace, name)
    return None


def missing_claim(namespace: str, name: str) -> Blocker:
    """The permanent blocker of a PersistentVolumeClaim that does not exist."""
    return Blocker(
        AdmissionBlocker.PVC_NOT_FOUND,
        f'PersistentVolumeClaim "{name}" does not exist in namespace {namespace}',
        f"create the claim in {namespace}, or fix the volume's pvc in the spec",
        subject=f"PersistentVolumeClaim {namespace}/{name}",
        permanent=True,
    )


def unbound_claims(job: KubeObject, namespace: str, facts: ClusterFacts | None) -> Blocker:
    """The blocker of the job's claims that are not bound yet."""
    pending = [
        (name, claim)
        for name in needed_claims(job)
        if facts is not None
        and (claim := facts.claims.get(name)) is not None
        and (claim.get("status") or {}).get("phase") != "Bound"
    ]
    if not pending:
        return Blocker(
            AdmissionBlocker.UNBOUND_PVC,
            "a PersistentVolumeClaim of the pods is not bound",
            "check the claims' storage class and provisioner (kubectl describe pvc)",
        )
    name, claim = pending[0]
    phase = (claim.get("status") or {}).get("phase") or "Pending"
    storage_class = (claim.get("spec") or {}).get("storageClassName")
    where = f'storage class "{storage_class}"' if storage_class else "no storage class"
    return Blocker(
        AdmissionBlocker.UNBOUND_PVC,
        f'PersistentVolumeClaim "{name}" is {phase}, not bound ({where})',
        f"it binds once a volume is provisioned for it: check its storage class and provisioner "
        f"(kubectl describe pvc {name} -n {namespace})",
        subject=f"PersistentVolumeClaim {namespace}/{name}",
    )


# Taints the node lifecycle sets and clears by itself (not ready, unreachable, pressure,
