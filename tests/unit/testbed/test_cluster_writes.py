"""What the test bed writes into its cluster, against a recording stand-in for KubeClient.

The real API server answers these in the integration tests; here: which requests are made, in
which order, and how conflicts and errors are handled.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, cast

import pytest

from kubedl_prefect.errors import ConflictError, NotFoundError, ServerError, TestbedError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import (
    CUSTOM_RESOURCE_DEFINITIONS,
    ROLES,
    SERVICE_ACCOUNTS,
    VOLCANO_QUEUES,
    KubeObject,
    ResourceKind,
)
from kubedl_prefect.testbed import cluster, operators, podlogs


class RecordingKube:
    """Keeps objects by (path); answers create with 409 when one exists, like the API server."""

    def __init__(self) -> None:
        self.objects: dict[str, KubeObject] = {}
        self.calls: list[tuple[str, str]] = []
        self.version = 0
        self.conflicts_left = 0

    def _stamp(self, obj: KubeObject) -> KubeObject:
        self.version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        return copy.deepcopy(obj)

    async def create(self, kind: ResourceKind, namespace: str | None, body: KubeObject) -> Any:
        name = body.get("metadata", {}).get("name", "")
        path = kind.path(namespace, name) if name else kind.path(namespace)
        self.calls.append(("create", path))
        if kind.kind == "TokenRequest":
            return {"status": {"token": "a-token"}}
        if path in self.objects:
            raise ConflictError(f"create {kind}/{name} failed: exists", status=409)
        stored = {k: v for k, v in copy.deepcopy(body).items() if k != "status"}
        self.objects[path] = stored
        return self._stamp(stored)

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Any:
        path = kind.path(namespace, name)
        self.calls.append(("get", path))
        if path not in self.objects:
            raise NotFoundError(f"get {kind}/{name} failed", status=404)
        return copy.deepcopy(self.objects[path])

    async def patch(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        subresource: str | None = None,
        **_: Any,
    ) -> Any:
        path = kind.path(namespace, name, subresource)
        self.calls.append(("patch", path))
        current = self.objects[kind.path(namespace, name)]
        wanted = patch.get("metadata", {}).get("resourceVersion")
        if self.conflicts_left:
            self.conflicts_left -= 1
            self._stamp(current)  # someone else wrote it meanwhile
            raise ConflictError("patch failed: the object has been modified", status=409)
        if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
            raise ConflictError("patch failed: the object has been modified", status=409)
        for key, value in patch.items():  # a merge patch, one level deep is enough here
            if isinstance(value, dict) and isinstance(current.get(key), dict):
                current[key].update(value)
            else:
                current[key] = copy.deepcopy(value)
        return self._stamp(current)


def _kube(fake: RecordingKube) -> KubeClient:
    return cast(KubeClient, fake)


async def test_create_or_update_creates_then_merges_over_what_exists() -> None:
    fake = RecordingKube()
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "r", "namespace": "ns"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
    }
    await cluster.create_or_update(_kube(fake), ROLES, role)
    changed = {**role, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]}
    await cluster.create_or_update(_kube(fake), ROLES, changed)
    path = ROLES.path("ns", "r")
    assert fake.calls == [("create", path), ("create", path), ("patch", path)]
    assert fake.objects[path]["rules"] == changed["rules"]  # lists are replaced whole


async def test_queues_are_opened_through_their_status_subresource() -> None:
    fake = RecordingKube()
    await operators.install_prerequisites(_kube(fake))
    root = VOLCANO_QUEUES.path(None, "root")
    assert ("patch", f"{root}/status") in fake.calls
    assert fake.objects[root]["status"] == {"state": "Open"}
    assert fake.objects[root]["spec"] == {"weight": 1, "reclaimable": False}
    kinds = [m["kind"] for m in operators.operator_manifests()]
    assert len([c for c in fake.calls if c[0] == "create"]) == len(kinds)
    await operators.install_prerequisites(_kube(fake))  # again: converges, no error


async def test_install_prerequisites_says_what_was_refused() -> None:
    class Refusing(RecordingKube):
        async def create(self, kind: ResourceKind, namespace: str | None, body: KubeObject) -> Any:
            raise ServerError("create failed: etcd is unhappy", status=500)

    with pytest.raises(TestbedError, match="refused Queue root for the training operators"):
        await operators.install_prerequisites(_kube(Refusing()))


async def test_service_account_token_comes_from_the_token_subresource() -> None:
    fake = RecordingKube()
    token = await cluster.service_account_token(_kube(fake), "ns", "reader", [])
    assert token == "a-token"
    assert fake.calls[-1] == ("create", "/api/v1/namespaces/ns/serviceaccounts/reader/token")
    assert SERVICE_ACCOUNTS.path("ns", "reader") in fake.objects


async def test_pod_log_entries_are_added_and_conflicts_retried(tmp_path: Path) -> None:
    fake = RecordingKube()
    default = tmp_path / "empty.log"
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    await cluster.ensure_pod_log(_kube(fake), "ns", "pod", "main", first, default)
    fake.conflicts_left = 1
    await cluster.ensure_pod_log(_kube(fake), "ns", "pod", "sidecar", second, default)
    stored = fake.objects[cluster.KWOK_LOGS.path("ns", "pod")]
    assert podlogs.listed_containers(stored) == {"main": first, "sidecar": second}
    patches = [c for c in fake.calls if c[0] == "patch"]
    assert len(patches) == 2  # the first met a conflict, the second (after a new read) did not
    calls = len(fake.calls)
    await cluster.ensure_pod_log(_kube(fake), "ns", "pod", "main", first, default)
    assert fake.calls[calls:] == [("get", cluster.KWOK_LOGS.path("ns", "pod"))]  # nothing to do


async def test_the_crd_wait_reads_only_those_not_yet_established_and_names_the_last() -> None:
    fake = RecordingKube()
    crds = CUSTOM_RESOURCE_DEFINITIONS
    for name in ("a.example.io", "b.example.io"):
        await fake.create(crds, None, {"metadata": {"name": name}})
    fake.objects[crds.path(None, "a.example.io")]["status"] = {
        "conditions": [{"type": "Established", "status": "True"}]
    }
    fake.calls.clear()
    with pytest.raises(TestbedError, match=r"not yet Established: b\.example\.io, c\.example\.io"):
        await cluster.wait_crds_established(
            _kube(fake), ["a.example.io", "b.example.io", "c.example.io"], timeout_s=0.6
        )
    reads = [path.rsplit("/", 1)[-1] for _, path in fake.calls]
    assert reads.count("a.example.io") == 1  # read once: Established, never again
    assert reads.count("b.example.io") == reads.count("c.example.io") > 1
