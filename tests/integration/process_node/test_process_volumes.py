"""PersistentVolumeClaims on the process node: the test bed's local provisioner (issue 20).

A claim of the StorageClass ``testbed-local`` gets a ``hostPath`` volume whose folder lies under
the test bed's state folder, bound by kube-controller-manager's real PersistentVolume binder; a
pod mounts it at its ``mountPath`` in its own mount namespace, and what one pod writes there the
next one reads. Deleting the claim deletes the volume and its folder. About 10 s here.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kubedl_prefect.errors import NotFoundError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import PERSISTENT_VOLUME_CLAIMS, PODS
from kubedl_prefect.testbed.nodeagent.node import AgentPaths
from kubedl_prefect.testbed.nodeagent.provisioner import (
    PERSISTENT_VOLUMES,
    PROVISIONER,
)
from kubedl_prefect.testbed.testbed import Testbed
from tests.integration.process_node.conftest import NewClaim
from tests.integration.process_node.test_process_pods import log_of, phase_is, pod, wait_pod
from tests.support.polling import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

Obj = dict[str, Any]


async def test_a_claim_is_provisioned_bound_mounted_shared_and_reclaimed(
    kube: KubeClient, namespace: str, process_node: Testbed, new_claim: NewClaim
) -> None:
    await new_claim("data", storage="64Mi")

    async def bound() -> Obj | None:
        found = await kube.get(PERSISTENT_VOLUME_CLAIMS, namespace, "data")
        return found if (found.get("status") or {}).get("phase") == "Bound" else None

    bound_claim = await until("the claim's binding", bound, every_s=0.2)
    volume = await kube.get(PERSISTENT_VOLUMES, None, bound_claim["spec"]["volumeName"])
    folder = Path(volume["spec"]["hostPath"]["path"])
    assert volume["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == PROVISIONER
    assert volume["status"]["phase"] == "Bound"
    assert folder.parent == AgentPaths(process_node.layout).root / "volumes"
    assert await asyncio.to_thread(folder.is_dir)

    mount = [{"name": "data", "mountPath": "/var/lib/data"}]
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    write = "echo epoch-3 > /var/lib/data/checkpoint.txt; mkdir -p /var/lib/data/sub; echo ok"
    await kube.create(
        PODS,
        namespace,
        pod(
            "writer",
            [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sh", "-c", write],
                    "volumeMounts": mount,
                }
            ],
            volumes=volumes,
        ),
    )
    written = await wait_pod(kube, namespace, "writer", phase_is("Succeeded", "Failed"))
    assert written["status"]["phase"] == "Succeeded", await log_of(
        kube, namespace, "writer", "main"
    )
    assert await asyncio.to_thread((folder / "checkpoint.txt").read_text) == "epoch-3\n"

    # Another pod reads it, through a read-only claim and a subPath: writing there fails.
    read = "cat /in/checkpoint.txt; ls /sub-only; touch /in/x 2>/dev/null || echo read-only"
    await kube.create(
        PODS,
        namespace,
        pod(
            "reader",
            [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sh", "-c", read],
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/in"},
                        {"name": "data", "mountPath": "/sub-only", "subPath": "sub"},
                    ],
                }
            ],
            volumes=[
                {"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}}
            ],
        ),
    )
    done = await wait_pod(kube, namespace, "reader", phase_is("Succeeded", "Failed"))
    lines = await log_of(kube, namespace, "reader", "main")
    assert done["status"]["phase"] == "Succeeded", lines
    assert lines == ["epoch-3", "read-only"]
    assert not await asyncio.to_thread((folder / "x").exists)

    for name in ("writer", "reader"):
        await kube.delete(PODS, namespace, name)
    await kube.delete(PERSISTENT_VOLUME_CLAIMS, namespace, "data")

    async def reclaimed() -> bool:
        try:
            await kube.get(PERSISTENT_VOLUMES, None, volume["metadata"]["name"])
        except NotFoundError:
            return not await asyncio.to_thread(folder.exists)
        return False

    await until("the volume's deletion", reclaimed, within_s=60, every_s=0.2)


async def test_a_pod_whose_claim_is_missing_is_held_by_the_scheduler(
    kube: KubeClient, namespace: str
) -> None:
    """The scheduler holds a pod whose claim does not exist, as on a real cluster."""
    await kube.create(
        PODS,
        namespace,
        pod(
            "orphan",
            [{"name": "main", "image": "busybox", "command": ["true"]}],
            volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "nowhere"}}],
        ),
    )

    async def unschedulable() -> str:
        found = await kube.get(PODS, namespace, "orphan")
        for condition in (found.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                return str(condition.get("message", ""))
        return ""

    message = await until("the scheduler's verdict", unschedulable, every_s=0.2)
    assert 'persistentvolumeclaim "nowhere" not found' in message
