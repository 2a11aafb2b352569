"""Fill a freshly started test bed: CRDs, simulated nodes; wait until they are usable.

Talks to the API server with ``kubernetes_asyncio`` as the administrator. Running any of it again
on a live cluster converges instead of failing on conflicts (create-or-replace for CRDs, server-side
apply with field manager ``kubedl-prefect-testbed`` for nodes).
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed import content, podlogs
from kubedl_prefect.testbed.components import Layout

FIELD_MANAGER = "kubedl-prefect-testbed"
# Server-side apply. The generated client knows no apply content type, hence a plain dict of
# keyword arguments (and plain dict bodies, which it sends as they are).
_APPLY: dict[str, Any] = {
    "field_manager": FIELD_MANAGER,
    "force": True,
    "_content_type": "application/apply-patch+yaml",
}


@asynccontextmanager
async def admin_client(layout: Layout) -> AsyncIterator[client.ApiClient]:
    """An API client authenticated as the test bed's administrator (client certificate)."""
    configuration = client.Configuration()
    configuration.host = layout.apiserver_url
    configuration.ssl_ca_cert = str(layout.ca_file)
    configuration.cert_file = str(layout.admin_cert_file)
    configuration.key_file = str(layout.admin_key_file)
    async with client.ApiClient(configuration=configuration) as api:
        yield api


def _body(exc: ApiException) -> str:
    body = exc.body
    if isinstance(body, bytes):
        return body.decode(errors="replace")
    return str(body or "")


async def _until(
    what: str,
    check: Callable[[], Awaitable[bool]],
    *,
    timeout_s: float,
    interval: float = 0.25,
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if await check():
            return
        if time.monotonic() >= deadline:
            raise TestbedError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


async def apply_crds(
    api: client.ApiClient, manifests: Sequence[dict[str, Any]], *, timeout_s: float = 60.0
) -> list[str]:
    """Apply CustomResourceDefinitions and wait until each is Established; return their names."""
    extensions = client.ApiextensionsV1Api(api)
    semaphore = asyncio.Semaphore(4)

    async def apply(manifest: dict[str, Any]) -> str:
        # Create, or replace what is there: server-side apply is several times slower on CRDs of
        # megabytes (the KServe one is 2 MB), and the test bed is their only writer.
        name = str(manifest["metadata"]["name"])
        async with semaphore:
            try:
                body: Any = manifest
                try:
                    await extensions.create_custom_resource_definition(body)
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                    current = await extensions.read_custom_resource_definition(name)
                    replacement: Any = copy.deepcopy(manifest)
                    replacement["metadata"]["resourceVersion"] = current.metadata.resource_version
                    await extensions.replace_custom_resource_definition(name, replacement)
            except ApiException as exc:
                raise TestbedError(
                    f"the API server refused CRD {name}: {exc.status} {exc.reason}: "
                    f"{_body(exc)[:500]}"
                ) from exc
        return name

    names = await asyncio.gather(*(apply(m) for m in manifests))
    return await wait_crds_established(api, names, timeout_s=timeout_s)


async def wait_crds_established(
    api: client.ApiClient, names: Sequence[str], *, timeout_s: float = 60.0
) -> list[str]:
    """Wait until every CRD of ``names`` is Established; return the names."""
    extensions = client.ApiextensionsV1Api(api)

    async def established() -> bool:
        listed = await extensions.list_custom_resource_definition()
        ready = {
            crd.metadata.name
            for crd in listed.items
            if any(
                c.type == "Established" and c.status == "True"
                for c in (crd.status.conditions or [])
            )
        }
        return ready.issuperset(names)

    await _until("the CRDs to be established", established, timeout_s=timeout_s)
    return list(names)


async def ensure_nodes(
    api: client.ApiClient, *, count: int, gpus_per_node: int, timeout_s: float = 60.0
) -> list[str]:
    """Make exactly ``count`` simulated nodes exist, each with ``gpus_per_node`` GPUs, all Ready.

    Nodes beyond ``count`` left from an earlier configuration are deleted.
    """
    core = client.CoreV1Api(api)
    wanted = [content.node_name(i) for i in range(count)]
    existing = await core.list_node(label_selector=f"{content.NODE_LABEL}=true")
    present = set()
    for node in existing.items:
        gpus = (node.status.capacity or {}).get(content.GPU_RESOURCE, "0")
        if node.metadata.name in wanted and gpus == str(gpus_per_node):
            present.add(node.metadata.name)
        else:  # not wanted, or another capacity: made again (its pods are collected)
            await core.delete_node(node.metadata.name)
    for index, name in enumerate(wanted):
        if name in present:
            continue
        # Created with its capacity in one request: kwok makes a node Ready from what it sees
        # first, and would otherwise write it Ready without capacity.
        manifest: Any = content.node_manifest(index, gpus=gpus_per_node)
        try:
            await core.create_node(manifest)
        except ApiException as exc:
            raise TestbedError(f"could not create node {name}: {exc.status} {exc.reason}") from exc

    async def ready() -> bool:
        listed = await core.list_node(label_selector=f"{content.NODE_LABEL}=true")
        ready_names = set()
        for node in listed.items:
            conditions = node.status.conditions or []
            capacity = node.status.allocatable or {}
            gpus_ok = capacity.get(content.GPU_RESOURCE, "0") == str(gpus_per_node)
            if gpus_ok and any(c.type == "Ready" and c.status == "True" for c in conditions):
                ready_names.add(node.metadata.name)
        return ready_names.issuperset(wanted)

    await _until(f"{count} kwok nodes to be Ready", ready, timeout_s=timeout_s)
    return wanted


async def release_node_leases(api: client.ApiClient) -> list[str]:
    """Delete the Leases of the simulated nodes (``kube-node-lease``); return the node names.

    kwok takes a new holder identity each time it starts and waits for the Leases of the one
    before to expire (40 s) before it runs their nodes' pods again; a restarted kubelet keeps
    its identity. Deleting them lets a restarted kwok take its nodes over at once.
    """
    core = client.CoreV1Api(api)
    coordination = client.CoordinationV1Api(api)
    try:
        nodes = await core.list_node(label_selector=f"{content.NODE_LABEL}=true")
    except ApiException as exc:
        raise TestbedError(f"could not list the nodes: {exc.status} {exc.reason}") from exc
    names = [node.metadata.name for node in nodes.items]
    for name in names:
        try:
            await coordination.delete_namespaced_lease(name, "kube-node-lease")
        except ApiException as exc:
            if exc.status != 404:
                raise TestbedError(
                    f"could not delete the Lease of node {name}: {exc.status} {exc.reason}"
                ) from exc
    return names


async def wait_default_service_account(
    api: client.ApiClient, namespace: str = "default", *, timeout_s: float = 60.0
) -> None:
    """Wait until the controller manager created ``namespace``'s ``default`` ServiceAccount.

    Pods are refused without it, so nothing is usable before.
    """
    core = client.CoreV1Api(api)

    async def exists() -> bool:
        try:
            await core.read_namespaced_service_account("default", namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    await _until(f"the default ServiceAccount in {namespace}", exists, timeout_s=timeout_s)


async def create_namespace(
    api: client.ApiClient, name: str, *, labels: dict[str, str] | None = None
) -> None:
    """Create namespace ``name`` and wait until pods can be created in it (its ServiceAccount)."""
    core = client.CoreV1Api(api)
    body: Any = {"metadata": {"name": name, "labels": labels or {}}}
    try:
        await core.create_namespace(body)
    except ApiException as exc:
        raise TestbedError(f"could not create namespace {name}: {exc.status} {exc.reason}") from exc
    await wait_default_service_account(api, name)


async def delete_namespace(api: client.ApiClient, name: str) -> None:
    """Delete namespace ``name`` (in the background; no error when it is already gone)."""
    core = client.CoreV1Api(api)
    try:
        await core.delete_namespace(name, propagation_policy="Background")
    except ApiException as exc:
        if exc.status != 404:
            raise TestbedError(
                f"could not delete namespace {name}: {exc.status} {exc.reason}"
            ) from exc


async def service_account_token(
    api: client.ApiClient,
    namespace: str,
    name: str,
    rules: Sequence[dict[str, Any]],
    *,
    expiration_seconds: int = 3600,
) -> str:
    """Make ServiceAccount ``name`` with a Role of ``rules`` in ``namespace``; return a token.

    The Role and its RoleBinding are named like the account. The token comes from the
    TokenRequest API (bound to the account, valid ``expiration_seconds``).
    """
    core = client.CoreV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    meta = {"name": name, "namespace": namespace}
    objects: list[tuple[Callable[..., Awaitable[Any]], dict[str, Any]]] = [
        (core.patch_namespaced_service_account, {"apiVersion": "v1", "kind": "ServiceAccount"}),
        (
            rbac.patch_namespaced_role,
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "rules": list(rules)},
        ),
        (
            rbac.patch_namespaced_role_binding,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            },
        ),
    ]
    try:
        for patch, body in objects:
            await patch(name, namespace, {**body, "metadata": meta}, **_APPLY)
        request: Any = {"spec": {"expirationSeconds": expiration_seconds}}
        answer = await core.create_namespaced_service_account_token(name, namespace, request)
    except ApiException as exc:
        raise TestbedError(
            f"could not set up ServiceAccount {namespace}/{name}: {exc.status} {exc.reason}"
        ) from exc
    return str(answer.status.token)


async def ensure_pod_log(
    api: client.ApiClient,
    namespace: str,
    pod: str,
    container: str,
    path: Path,
    default: Path,
) -> None:
    """Make the kwok ``Logs`` object of ``namespace/pod`` name ``path`` as ``container``'s log.

    Other containers the object lists are kept; the rest of the pod's containers read
    ``default``. Concurrent writers are retried on conflicts.
    """
    group, version, plural = podlogs.LOGS_RESOURCE
    custom = client.CustomObjectsApi(api)
    for _ in range(10):
        try:
            current = await custom.get_namespaced_custom_object(
                group, version, namespace, plural, pod
            )
        except ApiException as exc:
            if exc.status != 404:
                raise TestbedError(
                    f"could not read the Logs of {namespace}/{pod}: {exc.status} {exc.reason}"
                ) from exc
            current = None
        containers = podlogs.listed_containers(current) if current else {}
        if containers.get(container) == path:
            return
        containers[container] = path
        manifest = podlogs.logs_manifest(namespace, pod, containers, default)
        try:
            if current is None:
                await custom.create_namespaced_custom_object(
                    group, version, namespace, plural, manifest
                )
            else:
                manifest["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                await custom.replace_namespaced_custom_object(
                    group, version, namespace, plural, pod, manifest
                )
        except ApiException as exc:
            if exc.status == 409:  # created or changed meanwhile: read it again
                continue
            hint = None
            if exc.status == 404:  # no such namespace, or no Logs resource at all
                hint = (
                    f"check that namespace {namespace} exists; a test bed started by an older "
                    "kubedl-prefect has no pod logs: run `kubedl-prefect testbed down`, then `up`"
                )
            raise TestbedError(
                f"could not write the Logs of {namespace}/{pod}: {exc.status} {exc.reason}: "
                f"{_body(exc)[:300]}",
                hint=hint,
            ) from exc
        return
    raise TestbedError(f"the Logs of {namespace}/{pod} kept changing; gave up after 10 tries")
