"""An async Kubernetes client for plain-dictionary objects, with our errors.

It stands on ``kubernetes_asyncio`` for what that does well (kubeconfig and in-cluster
configuration, credentials, TLS, the aiohttp session) and makes every request itself, through one
method, so that errors are translated in one place, requests can be counted, and watch and log
streams are read line by line without the generated client's watch helper.

Stream bodies are read in chunks and split into lines here, with bounded memory: a watch event up
to :data:`MAX_WATCH_EVENT_BYTES` arrives whole (an object in etcd is at most about 1.5 MiB), and a
log line up to :data:`MAX_LOG_LINE_BYTES` (longer ones are cut, with a marker).

Clients are made from credentials by :func:`kubedl_prefect.kube.credentials.connect`.

Example:
    >>> async def show(path: str) -> None:  # doctest: +SKIP
    ...     async with await connect(KubeconfigFile(path)) as kube:
    ...         pods = await kube.list(PODS, "default")
    ...         print([p["metadata"]["name"] for p in pods.items])
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, NamedTuple

import aiohttp
from kubernetes_asyncio import client as k8s_client

from kubedl_prefect.errors import (
    ConflictError,
    ForbiddenError,
    InvalidObjectError,
    KubeAPIError,
    KubeConnectionError,
    KubeDLPrefectError,
    NotFoundError,
    ServerError,
    UnauthenticatedError,
    WatchError,
    strip_user_info,
)
from kubedl_prefect.kube.resources import PODS, KubeObject, ResourceKind

PatchType = Literal["merge", "strategic", "json"]
PropagationPolicy = Literal["Foreground", "Background", "Orphan"]

MAX_WATCH_EVENT_BYTES = 16 * 1024 * 1024
"""The largest watch event accepted (one JSON line).

Objects are limited to about 1.5 MiB in etcd; their JSON, with escaping, stays well below this. A
larger event ends the watch with :class:`~kubedl_prefect.errors.WatchError`.
"""

MAX_LOG_LINE_BYTES = 4 * 1024 * 1024
"""The longest log line delivered whole; the rest of a longer line is dropped.

A truncated line ends with :data:`LOG_TRUNCATION_MARKER` (formatted with the number of bytes
dropped), so that no stream buffers more than this, however long a container's line.
"""

LOG_TRUNCATION_MARKER = " [kubedl-prefect: line truncated, {dropped} more bytes dropped]"
"""Appended to a log line longer than :data:`MAX_LOG_LINE_BYTES`."""

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
    if status == 401:
        return UnauthenticatedError(
            text,
            status=status,
            reason=reason or "Unauthorized",
            hint="the API server did not accept the credentials: the token or client "
            "certificate is invalid or expired (a short-lived token, a deleted ServiceAccount, "
            "a rotated certificate); renew them in the kubeconfig or the cluster block",
        )
    if status == 403:
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

    Create it with :func:`kubedl_prefect.kube.credentials.connect` (any kind of credentials), or
    :meth:`from_kubeconfig` / :meth:`from_incluster`; close it with :meth:`close` or
    ``async with``. Every method raises only :class:`KubeAPIError` subclasses, except that a watch
    stream that cannot be read raises :class:`WatchError`.

    Args:
        api_client: The configured ``kubernetes_asyncio`` client (its session and credentials).
        cluster_id: Identifies the server and identity (the credentials' session key).
        server: The API server's URL; by default the configuration's host, without user info.
    """

    def __init__(
        self, api_client: k8s_client.ApiClient, *, cluster_id: str, server: str | None = None
    ):
        self._api = api_client
        self.cluster_id = cluster_id
        """Identifies the server and identity; shared watches are keyed by it."""
        self.server = public_url(server or str(api_client.configuration.host))
        """The API server's URL (``https://host:port``), never with credentials in it."""
        self.request_count = 0
        """How many HTTP requests (including watch and log streams) this client has started."""

    @classmethod
    async def from_kubeconfig(
        cls, path: str | None = None, *, context: str | None = None
    ) -> KubeClient:
        """A client from a kubeconfig file (``$KUBECONFIG`` or ``~/.kube/config`` when ``None``).

        Same as ``connect(KubeconfigFile(path, context))``.
        """
        from kubedl_prefect.kube.credentials import KubeconfigFile, connect

        return await connect(KubeconfigFile(path, context))

    @classmethod
    def from_incluster(cls) -> KubeClient:
        """A client for the cluster this process runs in (its ServiceAccount).

        Same as ``connect(InCluster())``, usable without awaiting.
        """
        from kubedl_prefect.kube.credentials import connect_incluster

        return connect_incluster()

    @classmethod
    def _from_configuration(
        cls, configuration: k8s_client.Configuration, *, cluster_id: str
    ) -> KubeClient:
        # Watches and log follows each hold a connection for as long as they run.
        configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, 256)
        api = k8s_client.ApiClient(configuration)
        return cls(api, cluster_id=cluster_id)

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
        """Start a request; return the open response (status 2xx) or raise our error.

        The request goes through the ``kubernetes_asyncio`` client's session (its TLS context,
        proxy and connection pool) with its credentials (refreshed by its hooks), but is built
        here: the body is serialised once and streamed from memory, so that objects of any size
        the API server accepts are sent without blocking the loop.
        """
        params = [(k, _query_value(v)) for k, v in (query or {}).items()]
        self.request_count += 1
        timeout = aiohttp.ClientTimeout(connect=30, sock_connect=30, sock_read=read_timeout_s)
        rest = self._api.rest_client
        headers: dict[str, str] = {
            **self._api.default_headers,
            "Content-Type": content_type,
            "Accept": "application/json",
        }
        data = io.BytesIO(json.dumps(body).encode()) if body is not None else None
        try:
            await self._api.update_params_for_auth(headers, params, ["BearerToken"])
            response: aiohttp.ClientResponse = await rest.pool_manager.request(
                method,
                f"{self._api.configuration.host}{path}",
                params=params,
                headers=headers,
                data=data,
                timeout=timeout,
                proxy=rest.proxy,
                proxy_headers=rest.proxy_headers,
                server_hostname=rest.server_hostname,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeConnectionError(
                f"{action} failed: cannot reach the API server {self.server}: "
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
        return await self._text(checked_path(path), f"get {path}")

    async def read_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        tail_lines: int = 50,
        previous: bool = False,
    ) -> list[str]:
        """The last ``tail_lines`` lines of a container's log (current or last instance).

        ``previous`` reads the instance before a restart (``kubectl logs --previous``).
        """
        query: dict[str, str | int | bool] = {"container": container, "tailLines": tail_lines}
        if previous:
            query["previous"] = True
        path = request_path(PODS, namespace, pod, "log")
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
            "POST", request_path(kind, namespace), f"create {kind}/{name}", query=query, body=body
        )

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> KubeObject:
        """Read one object; :class:`NotFoundError` when it does not exist."""
        return await self._json("GET", request_path(kind, namespace, name), f"get {kind}/{name}")

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
        path = request_path(kind, namespace)
        while True:
            page = await self._json("GET", path, f"list {kind}", query=query)
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
            request_path(kind, namespace, name, subresource),
            f"patch {kind}/{name}",
            body=patch,
            content_type=_PATCH_CONTENT_TYPES[patch_type],
        )

    async def apply(
        self,
        kind: ResourceKind,
        namespace: str | None,
        body: KubeObject,
        *,
        field_manager: str,
        force: bool = True,
        dry_run: bool = False,
    ) -> KubeObject:
        """Server-side apply ``body`` as ``field_manager``; creates the object if it is missing.

        Fields the manager set before and ``body`` leaves out are removed. With ``force``, fields
        another manager owns are taken over instead of failing with a conflict (409). Unknown
        fields are refused (``fieldValidation=Strict``), as in :meth:`create`.
        """
        name = body["metadata"]["name"]
        query: dict[str, str | int | bool] = {
            "fieldManager": field_manager,
            "force": force,
            "fieldValidation": "Strict",
        }
        if dry_run:
            query["dryRun"] = "All"
        return await self._json(
            "PATCH",
            request_path(kind, namespace, name),
            f"apply {kind}/{name}",
            query=query,
            body=body,
            content_type="application/apply-patch+yaml",
        )

    async def delete(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        *,
        propagation: PropagationPolicy = "Foreground",
        missing_ok: bool = True,
        uid: str | None = None,
        grace_period_s: int | None = None,
    ) -> KubeObject | None:
        """Delete an object; returns what the server answered, or ``None`` if it was gone.

        With ``uid``, only the object of that uid is deleted (``preconditions.uid``): another
        object of the same name, created after it, answers :class:`ConflictError` (409).
        ``grace_period_s`` overrides the object's grace period (0: at once, as a kubelet
        removes a pod whose containers have stopped).
        """
        body: dict[str, Any] = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": propagation,
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        try:
            return await self._json(
                "DELETE", request_path(kind, namespace, name), f"delete {kind}/{name}", body=body
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
        field_selector: str | None = None,
        timeout_seconds: int | None = None,
        inactivity_timeout_s: float | None = None,
    ) -> AsyncIterator[KubeObject]:
        """Yield raw watch events (``{"type": ..., "object": ...}``) from ``resource_version``.

        Bookmarks are requested. ``ERROR`` events are yielded as they are (the caller decides what
        a 410 Gone means to it). The stream ends when the server closes it; a stream silent for
        ``inactivity_timeout_s``, or broken, raises :class:`KubeConnectionError`. Events of any
        size up to :data:`MAX_WATCH_EVENT_BYTES` arrive whole; a larger one, or a line that is
        not JSON, raises :class:`WatchError` (trying again would meet it again).
        """
        query: dict[str, str | int | bool] = {
            "watch": True,
            "allowWatchBookmarks": True,
            "resourceVersion": resource_version,
        }
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        if timeout_seconds is not None:
            query["timeoutSeconds"] = timeout_seconds
        action = f"watch {kind}"
        response = await self._open(
            "GET",
            request_path(kind, namespace),
            action,
            query=query,
            read_timeout_s=inactivity_timeout_s,
        )

        def too_large(limit: int) -> KubeDLPrefectError:
            return WatchError(
                f"{action}: the server sent an event larger than {limit} bytes",
                hint="the API server limits objects to about 1.5 MiB: check that the URL "
                "points at a Kubernetes API server and not at a proxy that rewrites its answers",
                retryable=False,
            )

        try:
            async for line in _lines(
                response, action, limit=MAX_WATCH_EVENT_BYTES, too_long=too_large
            ):
                if not line.data.strip():
                    continue
                try:
                    event: KubeObject = json.loads(line.data)
                except ValueError as exc:
                    if not line.complete:  # the connection ended in the middle of an event
                        raise KubeConnectionError(
                            f"{action}: stream ended inside an event"
                        ) from exc
                    raise WatchError(
                        f"{action}: the server sent a line that is not a watch event: {exc}"
                    ) from exc
                yield event
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
        caller removes lines it has seen already. A line longer than :data:`MAX_LOG_LINE_BYTES`
        is cut there and ends with :data:`LOG_TRUNCATION_MARKER`.
        """
        query: dict[str, str | int | bool] = {
            "container": container,
            "follow": True,
            "timestamps": True,
        }
        if since_time:
            query["sinceTime"] = since_time
        action = f"follow log of pod {namespace}/{pod} container {container}"
        path = request_path(PODS, namespace, pod, "log")
        response = await self._open(
            "GET", path, action, query=query, read_timeout_s=inactivity_timeout_s
        )
        try:
            async for line in _lines(response, action, limit=MAX_LOG_LINE_BYTES):
                yield _log_text(line)
        finally:
            response.close()


class _LineBuffer:
    """Splits a byte stream into lines, keeping at most ``limit`` bytes of the current line.

    Bytes of a line beyond the limit are counted (``dropped``), not kept: memory stays bounded by
    the limit plus one chunk, however long the line.
    """

    def __init__(self, limit: int):
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self.dropped = 0
        """Bytes of the current (unfinished) line beyond the limit."""

    def feed(self, chunk: bytes) -> list[tuple[bytes, int]]:
        """Add a chunk; return the lines it completes, each with its dropped byte count."""
        lines: list[tuple[bytes, int]] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._keep(chunk[start:end])
            lines.append(self._take())
            start = end + 1
        if start < len(chunk):
            self._keep(chunk[start:])
        return lines

    def rest(self) -> tuple[bytes, int] | None:
        """The unfinished last line, if any (the stream ended without a newline)."""
        if self._size or self.dropped:
            return self._take()
        return None

    def _keep(self, piece: bytes) -> None:
        room = self._limit - self._size
        if len(piece) > room:
            self.dropped += len(piece) - room
            piece = piece[:room]
        if piece:
            self._parts.append(piece)
            self._size += len(piece)

    def _take(self) -> tuple[bytes, int]:
        line = b"".join(self._parts)
        dropped = self.dropped
        self._parts, self._size, self.dropped = [], 0, 0
        return line, dropped


class _StreamLine(NamedTuple):
    """A line of a streamed body, without its newline."""

    data: bytes
    dropped: int
    """Bytes cut off the end of the line (it was longer than the limit)."""
    complete: bool
    """Whether its newline arrived (the last line of a body may lack one)."""


async def _lines(
    response: aiohttp.ClientResponse,
    action: str,
    *,
    limit: int,
    too_long: Callable[[int], KubeDLPrefectError] | None = None,
) -> AsyncIterator[_StreamLine]:
    """Lines of a streamed response body.

    The body is read in chunks and split here (``StreamReader.readline`` refuses lines longer than
    its buffer). A line is kept up to ``limit`` bytes: with ``too_long``, a longer line raises
    ``too_long(limit)`` as soon as it is seen; without it, the rest of the line is dropped and
    counted in the line's ``dropped``. Transport errors raise :class:`KubeConnectionError`.
    """
    buffer = _LineBuffer(limit)
    while True:
        try:
            chunk = await response.content.readany()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeConnectionError(
                f"{action}: stream interrupted: {exc or type(exc).__name__}"
            ) from exc
        if not chunk:
            break
        for data, dropped in buffer.feed(chunk):
            if dropped and too_long is not None:
                raise too_long(limit)
            yield _StreamLine(data, dropped, complete=True)
        if buffer.dropped and too_long is not None:
            raise too_long(limit)
    rest = buffer.rest()
    if rest is not None:
        yield _StreamLine(*rest, complete=False)


def _log_text(line: _StreamLine) -> str:
    """A log line as text, marked when it was truncated."""
    text = line.data.decode("utf-8", errors="replace")
    if line.dropped:
        text += LOG_TRUNCATION_MARKER.format(dropped=line.dropped)
    return text


_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SHOWN_CHARACTERS = 60


def is_dns1123_label(value: str) -> bool:
    """Whether ``value`` is a DNS-1123 label (namespaces): ``[a-z0-9-]``, at most 63."""
    return len(value) <= 63 and _DNS1123_LABEL.fullmatch(value) is not None


def is_dns1123_subdomain(value: str) -> bool:
    """Whether ``value`` is a DNS-1123 subdomain (most object names): labels joined by dots."""
    return len(value) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(value) is not None


def path_segment_problem(value: str) -> str | None:
    """Why ``value`` cannot be an object's name in a request path, or ``None`` if it can.

    The rule of the most lenient kinds (RBAC objects: ``system:auth-delegator``), the API
    server's own: not empty, ``.`` or ``..``, no ``/`` or ``%``; and, stricter, printable ASCII
    without spaces, at most 253 characters. Everything else is quoted.
    """
    if not value:
        return "it is empty"
    if value in (".", ".."):
        return "it is a relative path segment"
    if "/" in value or "%" in value:
        return "it contains '/' or '%'"
    if not all("!" <= character <= "~" for character in value):
        return "it contains a space, a control or a non-ASCII character"
    if len(value) > 253:
        return "it is longer than 253 characters"
    return None


def shown(value: str) -> str:
    """``value`` quoted for a message, shortened to a few dozen characters."""
    if len(value) <= _SHOWN_CHARACTERS:
        return repr(value)
    return f"{value[:_SHOWN_CHARACTERS]!r}... ({len(value)} characters)"


def _refused(what: str, value: str, problem: str) -> KubeAPIError:
    return KubeAPIError(
        f"request not sent: the {what} {shown(value)} cannot be part of a Kubernetes API path: "
        f"{problem}",
        reason="InvalidName",
        hint="pass the name as the cluster gave it; a reference read from a result, a file or "
        "an argument is untrusted input",
    )


def request_path(
    kind: ResourceKind,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The REST path of a collection or object, built only from segments Kubernetes allows.

    The namespace must be a DNS-1123 label, the name a path segment
    (:func:`path_segment_problem`), the kind's group a DNS-1123 subdomain, its version, plural
    and the subresource DNS-1123 labels (a plural that poses a subresource as a collection,
    ``serviceaccounts/<name>/token``, DNS-1123 names between its slashes). Names are quoted.

    Raises:
        KubeAPIError: A segment is not allowed (reason ``InvalidName``; nothing was sent).
    """
    if kind.group and not is_dns1123_subdomain(kind.group):
        raise _refused("API group", kind.group, "it is not a DNS-1123 subdomain")
    if not is_dns1123_label(kind.version):
        raise _refused("API version", kind.version, "it is not a DNS-1123 label")
    # A subresource posed as a collection (``serviceaccounts/<name>/token``) has several.
    plural, *below = kind.plural.split("/")
    if not is_dns1123_label(plural) or not all(is_dns1123_subdomain(s) for s in below):
        raise _refused(
            "resource", kind.plural, "its segments are not DNS-1123 labels or subdomains"
        )
    if kind.namespaced and namespace is not None and not is_dns1123_label(namespace):
        raise _refused(
            "namespace",
            namespace,
            "a namespace is a DNS-1123 label (lower-case letters, digits and '-', starting and "
            "ending with a letter or digit, at most 63 characters)",
        )
    if name is not None:
        problem = path_segment_problem(name)
        if problem is not None:
            raise _refused("name", name, problem)
    if subresource is not None and not is_dns1123_label(subresource):
        raise _refused("subresource", subresource, "it is not a DNS-1123 label")
    return kind.path(namespace, name, subresource)


def checked_path(path: str) -> str:
    """A non-resource path (``/metrics``) whose segments are all allowed path segments.

    Raises:
        KubeAPIError: A segment is empty, ``.``, ``..`` or otherwise refused (nothing sent).
    """
    if not path.startswith("/"):
        raise _refused("path", path, "it does not start with '/'")
    for segment in path[1:].split("/"):
        problem = path_segment_problem(segment)
        if problem is not None:
            raise _refused("path", path, f"a segment of it: {problem}")
    return path


def public_url(url: str) -> str:
    """``url`` without user info or a trailing slash (``errors.strip_user_info``).

    Example:
        >>> public_url("https://user:password@k8s.example:6443/")
        'https://k8s.example:6443'
    """
    return strip_user_info(url.rstrip("/"))


def _query_value(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
