"""Fill a freshly started test bed: CRDs, simulated nodes; wait until they are usable.

Talks to the API server through the kube layer (:class:`~kubedl_prefect.kube.client.KubeClient`)
as the administrator; errors of the API server become :class:`TestbedError` with what was being
done. Running any of it again on a live cluster converges instead of failing on conflicts:
objects are created, or, when they exist, updated with what we write (:func:`create_or_update`).

The test bed itself is synchronous: :func:`call` runs one of these coroutines with an
administrator client and returns its result, also from inside a running event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import quote

from kubedl_prefect.errors import ConflictError, KubeAPIError, NotFoundError, TestbedError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import (
    CUSTOM_RESOURCE_DEFINITIONS,
    LEASES,
    NAMESPACES,
    NODES,
    PODS,
    ROLE_BINDINGS,
    ROLES,
    SERVICE_ACCOUNTS,
    KubeObject,
    ResourceKind,
)
from kubedl_prefect.testbed import content, podlogs
from kubedl_prefect.testbed.components import Layout

_T = TypeVar("_T")
_P = ParamSpec("_P")

_LOGS_GROUP, _LOGS_VERSION, _LOGS_PLURAL = podlogs.LOGS_RESOURCE
#: kwok's per-pod ``Logs`` objects (see :mod:`.podlogs`).
KWOK_LOGS = ResourceKind(_LOGS_GROUP, _LOGS_VERSION, "Logs", _LOGS_PLURAL)


@asynccontextmanager
async def admin_client(layout: Layout) -> AsyncIterator[KubeClient]:
    """A client authenticated as the test bed's administrator (its kubeconfig's certificate).

    Raises:
        TestbedError: The administrator kubeconfig cannot be read (the test bed was never
            started).
    """
    try:
        kube = await KubeClient.from_kubeconfig(str(layout.admin_kubeconfig))
    except KubeAPIError as exc:
        raise TestbedError(
            f"cannot use the administrator kubeconfig of test bed {layout.name}: {exc.message}",
            hint="start the test bed first (Testbed.up or `kubedl-prefect testbed up`)",
        ) from exc
    async with kube:
        yield kube


def call(
    layout: Layout,
    operation: Callable[Concatenate[KubeClient, _P], Awaitable[_T]],
    *args: _P.args,
    **kwargs: _P.kwargs,
) -> _T:
    """Run ``operation(client, *args, **kwargs)`` with an administrator client; return its result.

    Blocks until it is done; works from inside a running event loop too
    (see :func:`run_blocking_anywhere`).
    """

    async def with_admin() -> _T:
        async with admin_client(layout) as kube:
            return await operation(kube, *args, **kwargs)

    return run_blocking_anywhere(with_admin())


def run_blocking_anywhere(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coroutine`` to completion, also when called from inside a running event loop.

    Inside a loop (an async test calling the synchronous test bed) it runs on a loop of its own
    in another thread, which this one waits for.
    """
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is None:
        return asyncio.run(coroutine)
    result: list[_T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coroutine))
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=target, name="kubedl-prefect-testbed")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


async def create_or_update(
    kube: KubeClient, kind: ResourceKind, manifest: KubeObject, *, status: bool = False
) -> KubeObject:
    """Create ``manifest``, or merge it into the object of that name when it exists.

    A JSON merge patch: the fields we write win, lists (a Role's rules) are replaced whole,
    fields we do not write are kept. With ``status``, ``manifest["status"]`` is then written
    through the status subresource (where the server ignores it on create and update).

    Raises:
        KubeAPIError: The API server refused it.
    """
    metadata = manifest["metadata"]
    namespace, name = metadata.get("namespace"), metadata["name"]
    body = {k: v for k, v in manifest.items() if k != "status"} if status else manifest
    try:
        written = await kube.create(kind, namespace, body)
    except ConflictError:
        written = await kube.patch(kind, namespace, name, body)
    if status:
        written = await kube.patch(
            kind, namespace, name, {"status": manifest["status"]}, subresource="status"
        )
    return written


async def write_in_order(
    kube: KubeClient,
    kinds: Sequence[ResourceKind],
    manifests: Sequence[KubeObject],
    what: str,
) -> None:
    """Create or update each of ``manifests`` in order; each one's kind is among ``kinds``.

    Raises:
        TestbedError: The API server (or a webhook) refused one: its kind, name and ``what``
            it was written for.
    """
    by_kind = {kind.kind: kind for kind in kinds}
    for manifest in manifests:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        try:
            await create_or_update(kube, by_kind[kind], manifest)
        except KubeAPIError as exc:
            raise TestbedError(
                f"the API server refused {kind} {name} for {what}: {exc.message}"
            ) from exc


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


def _conditions(obj: KubeObject) -> dict[str, str]:
    """``{type: status}`` of an object's ``status.conditions``."""
    found = (obj.get("status") or {}).get("conditions") or []
    return {str(c.get("type")): str(c.get("status")) for c in found}


async def apply_crds(
    kube: KubeClient, manifests: Sequence[KubeObject], *, timeout_s: float = 120.0
) -> list[str]:
    """Create CustomResourceDefinitions and wait until each is Established; return their names.

    A CRD that exists already gets our ``spec`` instead of its own.

    Raises:
        TestbedError: The API server refused one, or they were not Established in time.
    """
    semaphore = asyncio.Semaphore(4)

    async def apply(manifest: KubeObject) -> str:
        # Create, or replace the spec of what is there: server-side apply is several times
        # slower on CRDs of megabytes (the KServe one is 2 MB), and the test bed is their only
        # writer.
        name = str(manifest["metadata"]["name"])
        async with semaphore:
            try:
                try:
                    await kube.create(CUSTOM_RESOURCE_DEFINITIONS, None, manifest)
                except ConflictError:
                    replace = [{"op": "replace", "path": "/spec", "value": manifest["spec"]}]
                    await kube.patch(
                        CUSTOM_RESOURCE_DEFINITIONS, None, name, replace, patch_type="json"
                    )
            except KubeAPIError as exc:
                raise TestbedError(f"the API server refused CRD {name}: {exc.message}") from exc
        return name

    names = await asyncio.gather(*(apply(m) for m in manifests))
    return await wait_crds_established(kube, names, timeout_s=timeout_s)


async def wait_crds_established(
    kube: KubeClient, names: Sequence[str], *, timeout_s: float = 120.0
) -> list[str]:
    """Wait until every CRD of ``names`` is Established; return the names.

    Each round reads only the CRDs not yet Established, one by one: a list of every CRD is tens
    of megabytes (KServe's alone is 2 MB), and on a loaded 2-core machine reading it four times a
    second took longer than the whole wait allowed. On timeout the error names those still
    pending.
    """
    pending = set(names)

    async def established() -> bool:
        for name in sorted(pending):
            try:
                crd = await kube.get(CUSTOM_RESOURCE_DEFINITIONS, None, name)
            except NotFoundError:
                continue
            if _conditions(crd).get("Established") == "True":
                pending.discard(name)
        return not pending

    try:
        await _until("the CRDs to be established", established, timeout_s=timeout_s)
    except TestbedError as exc:
        raise TestbedError(f"{exc}; not yet Established: {', '.join(sorted(pending))}") from exc
    return list(names)


async def ensure_nodes(
    kube: KubeClient, *, count: int, gpus_per_node: int, timeout_s: float = 60.0
) -> list[str]:
    """Make exactly ``count`` simulated nodes exist, each with ``gpus_per_node`` GPUs, all Ready.

    Nodes beyond ``count`` left from an earlier configuration are deleted.

    Raises:
        TestbedError: A node could not be created, or they were not Ready in time.
    """
    selector = f"{content.NODE_LABEL}=true"
    wanted = [content.node_name(i) for i in range(count)]
    existing = await kube.list(NODES, None, label_selector=selector)
    present = set()
    for node in existing.items:
        name = node["metadata"]["name"]
        gpus = ((node.get("status") or {}).get("capacity") or {}).get(content.GPU_RESOURCE, "0")
        if name in wanted and gpus == str(gpus_per_node):
            present.add(name)
        else:  # not wanted, or another capacity: made again (its pods are collected)
            await kube.delete(NODES, None, name, propagation="Background")
    for index, name in enumerate(wanted):
        if name in present:
            continue
        # Created with its capacity in one request: kwok makes a node Ready from what it sees
        # first, and would otherwise write it Ready without capacity.
        try:
            await kube.create(NODES, None, content.node_manifest(index, gpus=gpus_per_node))
        except KubeAPIError as exc:
            raise TestbedError(f"could not create node {name}: {exc.message}") from exc

    async def ready() -> bool:
        listed = await kube.list(NODES, None, label_selector=selector)
        ready_names = set()
        for node in listed.items:
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            gpus_ok = allocatable.get(content.GPU_RESOURCE, "0") == str(gpus_per_node)
            if gpus_ok and _conditions(node).get("Ready") == "True":
                ready_names.add(node["metadata"]["name"])
        return ready_names.issuperset(wanted)

    await _until(f"{count} kwok nodes to be Ready", ready, timeout_s=timeout_s)
    return wanted


async def release_node_leases(kube: KubeClient) -> list[str]:
    """Delete the Leases of the simulated nodes (``kube-node-lease``); return the node names.

    kwok takes a new holder identity each time it starts and waits for the Leases of the one
    before to expire (40 s) before it runs their nodes' pods again; a restarted kubelet keeps
    its identity. Deleting them lets a restarted kwok take its nodes over at once.

    Raises:
        TestbedError: The nodes could not be listed or a Lease not deleted (the API server is
            down, for one).
    """
    try:
        nodes = await kube.list(NODES, None, label_selector=f"{content.NODE_LABEL}=true")
        names = [node["metadata"]["name"] for node in nodes.items]
        for name in names:
            await kube.delete(LEASES, "kube-node-lease", name, propagation="Background")
    except KubeAPIError as exc:
        raise TestbedError(f"could not release the nodes' Leases: {exc.message}") from exc
    return names


RESYNC_ANNOTATION = "testbed.kubedl-prefect.io/kwok-resync"
"""The annotation :func:`resync_kwok_pods` writes on the pods of the simulated nodes."""


async def resync_kwok_pods(
    kube: KubeClient, nodes: Sequence[str], *, timeout_s: float = 30.0
) -> int:
    """After kwok restarted: wait until it holds its nodes' Leases, then touch their pods.

    kwok (v0.8) plays a node's pods once it takes the node's Lease, but judges whether it holds
    the Lease from its informer's cache, which may not have the Lease it has just created yet:
    those pods are then skipped as another kwok's, and stay as they are (a Running pod never
    ends) until they change. An annotation written on each of them once the Leases are held
    makes kwok see them again; returns how many pods were touched.

    Raises:
        TestbedError: kwok did not hold every Lease within ``timeout_s``, or a pod could not
            be listed or written.
    """

    async def held() -> bool:
        for name in nodes:
            try:
                lease = await kube.get(LEASES, "kube-node-lease", name)
            except NotFoundError:
                return False
            if not (lease.get("spec") or {}).get("holderIdentity"):
                return False
        return True

    await _until(f"kwok to hold the Leases of {', '.join(nodes)}", held, timeout_s=timeout_s)
    await asyncio.sleep(1.0)  # and its informer to have seen them
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    touched = 0
    try:
        for name in nodes:
            listed = await kube.list(PODS, None, field_selector=f"spec.nodeName={name}")
            for pod in listed.items:
                metadata = pod["metadata"]
                if metadata.get("deletionTimestamp"):
                    continue
                try:
                    await kube.patch(
                        PODS,
                        metadata["namespace"],
                        metadata["name"],
                        {"metadata": {"annotations": {RESYNC_ANNOTATION: stamp}}},
                    )
                    touched += 1
                except NotFoundError:
                    continue  # deleted meanwhile
    except KubeAPIError as exc:
        raise TestbedError(
            f"could not touch the pods of the restarted kwok: {exc.message}"
        ) from exc
    return touched


async def wait_default_service_account(
    kube: KubeClient, namespace: str = "default", *, timeout_s: float = 60.0
) -> None:
    """Wait until the controller manager created ``namespace``'s ``default`` ServiceAccount.

    Pods are refused without it, so nothing is usable before.
    """

    async def exists() -> bool:
        try:
            await kube.get(SERVICE_ACCOUNTS, namespace, "default")
        except NotFoundError:
            return False
        return True

    await _until(f"the default ServiceAccount in {namespace}", exists, timeout_s=timeout_s)


async def create_namespace(
    kube: KubeClient, name: str, *, labels: dict[str, str] | None = None
) -> None:
    """Create namespace ``name`` and wait until pods can be created in it (its ServiceAccount)."""
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}
    try:
        await kube.create(NAMESPACES, None, body)
    except KubeAPIError as exc:
        raise TestbedError(f"could not create namespace {name}: {exc.message}") from exc
    await wait_default_service_account(kube, name)


async def delete_namespace(kube: KubeClient, name: str) -> None:
    """Delete namespace ``name`` (in the background; no error when it is already gone)."""
    try:
        await kube.delete(NAMESPACES, None, name, propagation="Background")
    except KubeAPIError as exc:
        raise TestbedError(f"could not delete namespace {name}: {exc.message}") from exc


def _token_requests(account: str) -> ResourceKind:
    """Where TokenRequests for ``account`` are created: its ServiceAccount's ``token`` subresource.

    Posed as a collection (``.../serviceaccounts/<account>/token``), which is what
    :meth:`KubeClient.create` posts to.
    """
    plural = f"{SERVICE_ACCOUNTS.plural}/{quote(account, safe='')}/token"
    return ResourceKind("", "v1", "TokenRequest", plural)


async def service_account_token(
    kube: KubeClient,
    namespace: str,
    name: str,
    rules: Sequence[dict[str, Any]],
    *,
    expiration_seconds: int = 3600,
) -> str:
    """Make ServiceAccount ``name`` with a Role of ``rules`` in ``namespace``; return a token.

    The Role and its RoleBinding are named like the account. The token comes from the
    TokenRequest API (bound to the account, valid ``expiration_seconds``).

    Raises:
        TestbedError: The API server refused one of them.
    """
    meta = {"name": name, "namespace": namespace}
    objects: list[tuple[ResourceKind, KubeObject]] = [
        (SERVICE_ACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}),
        (
            ROLES,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": meta,
                "rules": list(rules),
            },
        ),
        (
            ROLE_BINDINGS,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": meta,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            },
        ),
    ]
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": expiration_seconds},
    }
    try:
        for kind, manifest in objects:
            await create_or_update(kube, kind, manifest)
        answer = await kube.create(_token_requests(name), namespace, request)
    except KubeAPIError as exc:
        raise TestbedError(
            f"could not set up ServiceAccount {namespace}/{name}: {exc.message}"
        ) from exc
    return str(answer["status"]["token"])


async def ensure_pod_log(
    kube: KubeClient,
    namespace: str,
    pod: str,
    container: str,
    path: Path,
    default: Path,
) -> None:
    """Make the kwok ``Logs`` object of ``namespace/pod`` name ``path`` as ``container``'s log.

    Other containers the object lists are kept; the rest of the pod's containers read
    ``default``. Concurrent writers are retried on conflicts.

    Raises:
        TestbedError: The object could not be read or written.
    """
    for _ in range(10):
        try:
            current: KubeObject | None = await kube.get(KWOK_LOGS, namespace, pod)
        except NotFoundError:
            current = None
        except KubeAPIError as exc:
            raise TestbedError(f"could not read the Logs of {namespace}/{pod}: {exc}") from exc
        containers = podlogs.listed_containers(current) if current else {}
        if containers.get(container) == path:
            return
        containers[container] = path
        manifest = podlogs.logs_manifest(namespace, pod, containers, default)
        try:
            if current is None:
                await kube.create(KWOK_LOGS, namespace, manifest)
            else:
                # The resourceVersion makes the patch conditional: 409 if it changed meanwhile.
                # A merge patch replaces the list of entries whole.
                manifest["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                await kube.patch(KWOK_LOGS, namespace, pod, manifest)
        except ConflictError:  # created or changed meanwhile: read it again
            continue
        except KubeAPIError as exc:
            hint = None
            if isinstance(exc, NotFoundError):  # no such namespace, or no Logs resource at all
                hint = (
                    f"check that namespace {namespace} exists; a test bed started by an older "
                    "kubedl-prefect has no pod logs: run `kubedl-prefect testbed down`, then `up`"
                )
            raise TestbedError(
                f"could not write the Logs of {namespace}/{pod}: {exc.message}", hint=hint
            ) from exc
        return
    raise TestbedError(f"the Logs of {namespace}/{pod} kept changing; gave up after 10 tries")
