"""Plays the KubeDL operator and the scheduler against the fake API server, over real HTTP.

The backend under test sees only what it would see on a cluster: job status conditions, pods with
labels, scheduling conditions and container states, written here through the API like an
operator writes them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import PODS
from kubedl_prefect.lifecycle.backend import JobRef
from kubedl_prefect.lifecycle.kubernetes.dialects import job_kind


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeOperator:
    """Writes what an operator, the scheduler and kubelets would write for a job."""

    def __init__(self, client: KubeClient):
        self.client = client

    async def job(self, ref: JobRef) -> dict[str, Any]:
        return await self.client.get(job_kind(ref.api_version, ref.kind), ref.namespace, ref.name)

    async def condition(self, ref: JobRef, type_: str, reason: str = "", message: str = "") -> None:
        """Append a True condition (the operators append; earlier ones stay)."""
        job = await self.job(ref)
        status = job.get("status") or {}
        conditions = [c for c in status.get("conditions") or [] if c["type"] != type_]
        conditions.append(
            {
                "type": type_,
                "status": "True",
                "reason": reason or f"Job{type_}",
                "message": message or f"job is {type_.lower()}",
                "lastTransitionTime": now(),
            }
        )
        patch: dict[str, Any] = {"status": {"conditions": conditions}}
        if type_ == "Running" and not status.get("startTime"):
            patch["status"]["startTime"] = now()
        await self.client.patch(
            job_kind(ref.api_version, ref.kind),
            ref.namespace,
            ref.name,
            patch,
            subresource="status",
        )

    async def pods(self, ref: JobRef, roles: dict[str, int], *, scheduled: bool = True) -> None:
        """Create the job's pods (KubeDL's labels), bound to a node when ``scheduled``."""
        for role, count in roles.items():
            for index in range(count):
                await self.client.create(
                    PODS, ref.namespace, self._pod(ref, role, index, scheduled)
                )

    def _pod(self, ref: JobRef, role: str, index: int, scheduled: bool) -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": [{"name": "pytorch", "image": "i"}]}
        status: dict[str, Any] = {"phase": "Pending"}
        if scheduled:
            spec["nodeName"] = "gpu-node-0"
            status = {
                "phase": "Running",
                "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [
                    {"name": "pytorch", "state": {"running": {"startedAt": now()}}}
                ],
            }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{ref.name}-{role}-{index}",
                "namespace": ref.namespace,
                "labels": {
                    "group-name": "training.kubedl.io",
                    "job-name": ref.name,
                    "replica-type": role,
                    "replica-index": str(index),
                },
                "ownerReferences": [
                    {
                        "apiVersion": ref.api_version,
                        "kind": ref.kind,
                        "name": ref.name,
                        "uid": ref.uid,
                        "controller": True,
                    }
                ],
            },
            "spec": spec,
            "status": status,
        }

    async def pod_status(self, ref: JobRef, replica: str, status: dict[str, Any]) -> None:
        await self.client.patch(
            PODS, ref.namespace, f"{ref.name}-{replica}", {"status": status}, subresource="status"
        )

    async def unschedulable(self, ref: JobRef, replica: str, message: str) -> None:
        await self.pod_status(
            ref,
            replica,
            {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": message,
                    }
                ]
            },
        )

    async def evict(self, ref: JobRef, replica: str) -> None:
        await self.pod_status(
            ref,
            replica,
            {"phase": "Failed", "reason": "Evicted", "message": "The node was low on memory."},
        )

    async def exit(self, ref: JobRef, replica: str, code: int) -> None:
        await self.pod_status(
            ref,
            replica,
            {
                "phase": "Failed" if code else "Succeeded",
                "containerStatuses": [
                    {
                        "name": "pytorch",
                        "state": {"terminated": {"exitCode": code, "reason": "Error"}},
                    }
                ],
            },
        )

    async def image_pull_error(self, ref: JobRef, replica: str) -> None:
        await self.pod_status(
            ref,
            replica,
            {
                "phase": "Pending",
                "containerStatuses": [
                    {
                        "name": "pytorch",
                        "state": {
                            "waiting": {
                                "reason": "ErrImagePull",
                                "message": "pull access denied for nosuch/image",
                            }
                        },
                    }
                ],
            },
        )

    async def run_to(
        self, ref: JobRef, end: str = "Succeeded", roles: dict[str, int] | None = None
    ) -> None:
        """Schedule the pods, run the job, end it."""
        await self.pods(ref, roles or {"master": 1, "worker": 2})
        await self.condition(ref, "Running")
        await self.condition(ref, end)
