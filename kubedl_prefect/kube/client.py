"""An async Kubernetes client for plain-dictionary objects, with our errors.

It stands on ``kubernetes_asyncio`` for what that does well (kubeconfig and in-cluster
configuration, credentials, TLS, the aiohttp session) and makes every request itself, through one
method, so that errors are translated in one place, requests can be counted, and watch and log
streams are read line by line without the generated client's watch helper.

Example:
    >>> async def show(path: str) -> None:  # doctest: +SKIP
    ...     async with await KubeClient.from_kubeconfig(path) as kube:
    ...         pods = await kube.list(PODS, "default")
    ...         print([p["metadata"]["name"] for p in pods.items])
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.config.config_exception import ConfigException

from kubedl_prefect.errors import (
    ConflictError,
    ForbiddenError,
    InvalidObjectError,
    KubeAPIError,
    KubeConnectionError,
    NotFoundError,
    ServerError,
)
from kubedl_prefect.kube.resources import PODS, KubeObject, ResourceKind

PatchType = Literal["merge", "strategic", "json"]
PropagationPolicy = Literal["Foreground", "Background", "Orphan"]

_PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}


@dataclass(frozen=True)
class ObjectList:
    """The items of a list call and the collection's ``resourceVersion`` (where a watch resumes)."""

    items: list[KubeObject]
    resource_version: str


def api_error(status: int, body: str, action: str) -> KubeAPIError:
    """Translate an error answer of the API server into our exception tree.

    Args:
        status: HTTP status code.
        body: The response body (a Kubernetes ``Status`` object when the server wrote it).
        action: What we were doing, for the message (``create pytorchjobs.training.kubedl.io/x``).
    """
    try:
        payload = json.loads(body)
    except ValueError:
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    reason = str(payload.get("reason") or "")
    message = str(payload.get("message") or body.strip() or f"HTTP {status}")
    text = f"{action} failed: {message}"
    if status == 404:
        return NotFoundError(
            text,
            status=status,
            reason=reason or "NotFound",
            hint="check the name and namespace; for a custom resource, that its CRD is installed",
        )
    if status == 409:
        return ConflictError(text, status=status, reason=reason or "Conflict")
    if status in (401, 403):
        return ForbiddenError(
            text,
            status=status,
            reason=reason or "Forbidden",
            hint="grant the missing verb to this identity (see deploy/rbac.yaml for the Role "
            "kubedl-prefect needs)",
        )
    if status in (400, 422):
        return InvalidObjectError(text, status=status, reason=reason or "Invalid")
    if status == 429 or status >= 500:
        return ServerError(text, status=status, reason=reason or "ServerError")
    return KubeAPIError(text, status=status, reason=reason or None)


class KubeClient:
    """An async client for one cluster (one identity), sharing one connection pool.

    Create it with :meth:`from_kubeconfig` or :meth:`from_incluster`; close it with
    :meth:`close` or ``async with``. Every method raises only :class:`KubeAPIError` subclasses.
    """

    def __init__(self, api_client: k8s_client.ApiClient, *, cluster_id: str):
        self._api = api_client
        self.cluster_id = cluster_id
        """Identifies the server and identity; shared watches are keyed by it."""
        self.request_count = 0
        """How many HTTP requests (including watch and log streams) this client has started."""

    @classmethod
    async def from_kubeconfig(
        cls, path: str | None = None, *, context: str | None = None
    ) -> KubeClient:
        """A client from a kubeconfig file (``$KUBECONFIG`` or ``~/.kube/config`` when ``None``)."""
        configuration = k8s_client.Configuration()
        try:
            await k8s_config.load_kube_config(
                config_file=path, context=context, client_configuration=configuration
            )
        except (ConfigException, OSError, ValueError) as exc:
            raise KubeConnectionError(
                f"could not load kubeconfig {path or '(default)'}: {exc}",
                hint="pass the path of a valid kubeconfig, or set KUBECONFIG",
                retryable=False,
            ) from exc
        return cls._from_configuration(configuration, context)

    @classmethod
    def from_incluster(cls) -> KubeClient:
        """A client for the cluster this process runs in (its ServiceAccount)."""
        configuration = k8s_client.Configuration()
        try:
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except ConfigException as exc:
            raise KubeConnectionError(
                f"not running inside a Kubernetes pod: {exc}",
                hint="use a kubeconfig outside a cluster",
                retryable=False,
            ) from exc
        return cls._from_configuration(configuration, "in-cluster")

    @classmethod
    def _from_configuration(
        cls, configuration: k8s_client.Configuration, identity: str | None
    ) -> KubeClient:
        # Watches and log follows each hold a connection for as long as they run.
        configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, 256)
        api = k8s_client.ApiClient(configuration)
        return cls(api, cluster_id=f"{configuration.host}#{identity or 'default'}")

    async def close(self) -> None:
        """Close the connection pool."""
        await self._api.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _open(
        self,
        method: str,
        path: str,
        action: str,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        read_timeout_s: float | None = None,
    ) -> aiohttp.ClientResponse:
        """Start a request; return the open response (status 2xx) or raise our error."""
        params = [(k, _query_value(v)) for k, v in (query or {}).items()]
        self.request_count += 1
        timeout = aiohttp.ClientTimeout(connect=30, sock_connect=30, sock_read=read_timeout_s)
        try:
            response: aiohttp.ClientResponse = await self._api.call_api(
                path,
                method,
                query_params=params,
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeConnectionError(
                f"{action} failed: cannot reach the API server {self._api.configuration.host}: "
                f"{exc or type(exc).__name__}",
                hint="check that the cluster is up and the kubeconfig points at it",
            ) from exc
        if response.status >= 400:
            try:
                text = await response.text()
            except (aiohttp.ClientError, TimeoutError) as exc:
                text = str(exc)
            finally:
                response.release()
            raise api_error(response.status, text, action)
        return response

    async def _json(self, method: str, path: str, action: str, **kwargs: Any) -> KubeObject:
        response = await self._open(method, path, action, **kwargs)
        try:
            data: KubeObject = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeConnectionError(f"{action} failed while reading the answer: {exc}") from exc
        finally:
            response.release()
        return data

    async def _text(self, path: str, action: str, **kwargs: Any) -> str:
        response = await self._open("GET", path, action, **kwargs)
        try:
            return await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeConnectionError(f"{action} failed while reading the answer: {exc}") from exc
        finally:
            response.release()

    async def get_text(self, path: str) -> str:
        """GET a non-resource path (``/metrics``, ``/readyz``) and return the body as text."""
        return await self._text(path, f"get {path}")

    async def read_log(
        self, namespace: str, pod: str, container: str, *, tail_lines: int = 50
    ) -> list[str]:
        """The last ``tail_lines`` lines of a container's log (current or last instance)."""
        query: dict[str, str | int | bool] = {"container": container, "tailLines": tail_lines}
        path = PODS.path(namespace, pod, "log")
        text = await self._text(path, f"read log of pod {namespace}/{pod}", query=query)
        return text.splitlines()

    async def create(
        self, kind: ResourceKind, namespace: str | None, body: KubeObject, *, dry_run: bool = False
    ) -> KubeObject:
        """Create an object; with ``dry_run`` the server validates it (schema, admission) only.

        Unknown or duplicate fields are refused (``fieldValidation=Strict``) rather than pruned
        silently, so a misplaced field in a raw pod template fails here, not later.
        """
        name = body.get("metadata", {}).get("name", "")
        query: dict[str, str | int | bool] = {"fieldValidation": "Strict"}
        if dry_run:
            query["dryRun"] = "All"
        return await self._json(
            "POST", kind.path(namespace), f"create {kind}/{name}", query=query, body=body
        )

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> KubeObject:
        """Read one object; :class:`NotFoundError` when it does not exist."""
        return await self._json("GET", kind.path(namespace, name), f"get {kind}/{name}")

    async def list(
        self,
        kind: ResourceKind,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        """List objects (all pages) and the collection's resourceVersion."""
        items: list[KubeObject] = []
        query: dict[str, str | int | bool] = {"limit": 500}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        while True:
            page = await self._json("GET", kind.path(namespace), f"list {kind}", query=query)
            items.extend(page.get("items") or [])
            metadata = page.get("metadata") or {}
            token = metadata.get("continue")
            if not token:
                return ObjectList(items=items, resource_version=metadata.get("resourceVersion", ""))
            query["continue"] = token

    async def patch(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
    ) -> KubeObject:
        """Patch an object (merge patch by default), or its ``status`` subresource."""
        return await self._json(
            "PATCH",
            kind.path(namespace, name, subresource),
            f"patch {kind}/{name}",
            body=patch,
            content_type=_PATCH_CONTENT_TYPES[patch_type],
        )

    async def delete(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        *,
        propagation: PropagationPolicy = "Foreground",
        missing_ok: bool = True,
    ) -> KubeObject | None:
        """Delete an object; returns what the server answered, or ``None`` if it was gone."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        try:
            return await self._json(
                "DELETE", kind.path(namespace, name), f"delete {kind}/{name}", body=body
            )
        except NotFoundError:
            if missing_ok:
                return None
            raise

    async def watch(
        self,
        kind: ResourceKind,
        namespace: str | None,
        *,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int | None = None,
        inactivity_timeout_s: float | None = None,
    ) -> AsyncIterator[KubeObject]:
        """Yield raw watch events (``{"type": ..., "object": ...}``) from ``resource_version``.

        Bookmarks are requested. ``ERROR`` events are yielded as they are (the caller decides what
        a 410 Gone means to it). The stream ends when the server closes it; a stream silent for
        ``inactivity_timeout_s`` raises :class:`KubeConnectionError`.
        """
        query: dict[str, str | int | bool] = {
            "watch": True,
            "allowWatchBookmarks": True,
            "resourceVersion": resource_version,
        }
        if label_selector:
            query["labelSelector"] = label_selector
        if timeout_seconds is not None:
            query["timeoutSeconds"] = timeout_seconds
        action = f"watch {kind}"
        response = await self._open(
            "GET", kind.path(namespace), action, query=query, read_timeout_s=inactivity_timeout_s
        )
        try:
            async for line in _lines(response, action):
                if line.strip():
                    yield json.loads(line)
        finally:
            response.close()

    async def follow_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        since_time: str | None = None,
        inactivity_timeout_s: float | None = None,
    ) -> AsyncIterator[str]:
        """Yield log lines of a container as they are written, each prefixed by its RFC 3339 time.

        ``since_time`` (RFC 3339) resumes a stream; the server's resolution is one second, so the
        caller removes lines it has seen already.
        """
        query: dict[str, str | int | bool] = {
            "container": container,
            "follow": True,
            "timestamps": True,
        }
        if since_time:
            query["sinceTime"] = since_time
        action = f"follow log of pod {namespace}/{pod} container {container}"
        path = PODS.path(namespace, pod, "log")
        response = await self._open(
            "GET", path, action, query=query, read_timeout_s=inactivity_timeout_s
        )
        try:
            async for line in _lines(response, action):
                yield line.rstrip("\n")
        finally:
            response.close()


async def _lines(response: aiohttp.ClientResponse, action: str) -> AsyncIterator[str]:
    """Lines of a streamed response body, with transport errors translated."""
    while True:
        try:
            raw = await response.content.readline()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeConnectionError(
                f"{action}: stream interrupted: {exc or type(exc).__name__}"
            ) from exc
        if not raw:
            return
        yield raw.decode("utf-8", errors="replace")


def _query_value(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
