"""An in-memory Kubernetes API server, over real HTTP, for unit tests that must run in seconds.

:class:`FakeKubeAPI` is an ``aiohttp.web`` application on ``127.0.0.1`` (a free port). It is not a
mock of our client: :class:`~kubedl_prefect.kube.client.KubeClient`, the informers and the log
follower talk to it unchanged, through :func:`~kubedl_prefect.kube.credentials.connect`. It serves
any resource, from the URL alone (``/api/v1/...`` and ``/apis/<group>/<version>/...``, namespaced
and cluster-scoped, plural names as given), the way the real API server does:

=====================  ==========================================================================
request                behaviour
=====================  ==========================================================================
``POST`` collection    create: fills ``uid``, ``resourceVersion`` (one global counter, strings),
                       ``creationTimestamp``, ``generation`` and ``managedFields``; drops
                       ``status`` (pods start ``Pending``, namespaces ``Active``), as the real
                       server does for resources with a status subresource; ``generateName``;
                       ``dryRun=All`` stores nothing; 409 ``AlreadyExists``, 422 ``Invalid``.
``GET`` object         get (also ``/status``); 404 ``NotFound``.
``GET`` collection     list, ordered by namespace and name: ``labelSelector`` (``k=v``, ``k==v``,
                       ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``, joined by
                       commas), ``fieldSelector`` (``path=v``, ``path!=v`` on any dotted path),
                       ``limit``/``continue`` paging; ``metadata.resourceVersion`` of the list.
``GET ?watch=true``    watch from ``resourceVersion``: replays the stored events after it, then
                       streams new ones as JSON lines; ``""``/``"0"`` (or ``sendInitialEvents``)
                       start with synthetic ``ADDED`` events of what exists; ``ERROR`` 410
                       ``Expired`` when the version is older than the last :meth:`compact`;
                       ``allowWatchBookmarks`` sends ``BOOKMARK`` events every
                       :attr:`FakeKubeAPI.bookmark_interval_s`; ``timeoutSeconds`` ends the
                       stream cleanly; selectors apply, and an object that starts or stops
                       matching arrives as ``ADDED``/``DELETED``, as from the watch cache.
``PATCH``              server-side apply (``application/apply-patch+yaml``, JSON body) by one
                       manager: creates a missing object, else the body's labels, annotations
                       and top-level fields replace the stored ones (status kept); no field
                       ownership. Merge patch (``application/merge-patch+json``; strategic
                       merge patch is treated as a merge patch) and JSON patch; on the object
                       (status changes ignored, ``generation`` bumped when anything but
                       metadata and status changed) or on ``/status`` (only status changes kept); a
                       ``metadata.resourceVersion`` in the patch is a precondition (409
                       ``Conflict``); a patch that changes nothing changes no version.
``PUT``                update (replace), with the same rules.
``DELETE`` object      ``propagationPolicy`` (``DeleteOptions`` body or query): ``Background``
                       (default) deletes the object, then every object whose ``ownerReferences``
                       name its uid; ``Foreground`` marks it (``deletionTimestamp``, finalizer
                       ``foregroundDeletion``), deletes the dependents, then it; ``Orphan``
                       removes the owner references. An object with finalizers is only marked
                       (202) until a patch removes them. Deleting a namespace deletes its objects.
                       ``preconditions`` (``uid``, ``resourceVersion``: 409 ``Conflict``, worded as
                       the real server words it) and ``dryRun`` are honoured. Answers with the
                       object.
``DELETE`` collection  delete every object the selectors match.
``GET .../pods/x/log`` the log buffer of a container (:meth:`FakeKubeAPI.append_log`):
                       ``container`` (optional for one-container pods), ``follow``,
                       ``timestamps`` (RFC 3339, nine fraction digits, as the kubelet writes),
                       ``sinceTime`` (one-second resolution), ``sinceSeconds``, ``tailLines``,
                       ``limitBytes``. A follow ends when the test calls :meth:`close_log`, or the
                       pod is deleted. 404 for a missing pod, 400 for an unknown container.
``/healthz`` etc.      ``/healthz``, ``/livez``, ``/readyz`` (no token needed), ``/version``,
                       ``/metrics`` (``apiserver_longrunning_requests`` of open watches and logs).
=====================  ==========================================================================

Every request needs ``Authorization: Bearer <token>`` (:attr:`FakeKubeAPI.token`, or one added with
:meth:`FakeKubeAPI.add_token`); errors are Kubernetes ``Status`` objects. Kubernetes does more
than this (admission, schemas, RBAC, graceful pod deletion, a garbage collector that takes its
time): deletions here cascade at once, any object is accepted, and the ``kind`` of a resource
no object of which was stored yet is guessed from its plural (``pytorchjobs`` → ``Pytorchjob``).

Test controls, usable from the test's coroutines and, for :meth:`FakeKubeAPI.serve_in_thread`,
from any thread:

* :attr:`FakeKubeAPI.store` (:class:`ObjectStore`): play an operator or kubelet directly, without
  HTTP: ``apply(obj)`` (create or replace, status included), ``create``, ``get``, ``list``,
  ``merge(kind, namespace, name, patch)`` (status included), ``delete``; each change is an event
  the watches see.
* :meth:`~FakeKubeAPI.compact` (older resourceVersions now get 410), :meth:`~FakeKubeAPI
  .drop_watches` and :meth:`~FakeKubeAPI.drop_log_streams` (cut open streams as a broken
  connection would), :meth:`~FakeKubeAPI.send_bookmarks` (a bookmark on every watch, now).
* :meth:`~FakeKubeAPI.fail_next` (answer matching requests with an error), :meth:`~FakeKubeAPI
  .clear_failures`.
* :meth:`~FakeKubeAPI.append_log`, :meth:`~FakeKubeAPI.close_log`.
* :attr:`~FakeKubeAPI.request_log` (every request, with its verb and status),
  :attr:`~FakeKubeAPI.counts` (requests by verb), :meth:`~FakeKubeAPI.count`,
  :attr:`~FakeKubeAPI.open_watches`, :attr:`~FakeKubeAPI.open_log_streams`.
* :attr:`~FakeKubeAPI.url`, :attr:`~FakeKubeAPI.token`, :attr:`~FakeKubeAPI.credentials` (a
  :class:`~kubedl_prefect.kube.credentials.BearerToken`), :meth:`~FakeKubeAPI.kubeconfig` (the
  YAML of a kubeconfig for it); with ``tls=True`` it serves HTTPS with its own CA
  (:attr:`~FakeKubeAPI.ca_pem`, :attr:`~FakeKubeAPI.ca_file`).

Example (the ``fake_api`` fixture of tests/unit/conftest.py yields a started server)::

    async def test_sees_the_operator(fake_api: FakeKubeAPI) -> None:
        async with await connect(fake_api.credentials) as kube:
            fake_api.store.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {...}})
            assert (await kube.list(PODS, "ns")).items
        assert fake_api.counts["list"] == 1
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import builtins
import contextlib
import copy
import datetime as dt
import json
import re
import secrets
import shutil
import ssl
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, cast

import yaml
from aiohttp import web

from kubedl_prefect.kube.credentials import BearerToken
from kubedl_prefect.kube.resources import KubeObject, ResourceKind

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
Propagation = Literal["Foreground", "Background", "Orphan"]

_KINDS: dict[tuple[str, str], str] = {
    ("", "pods"): "Pod",
    ("", "namespaces"): "Namespace",
    ("", "configmaps"): "ConfigMap",
    ("", "secrets"): "Secret",
    ("", "services"): "Service",
    ("", "events"): "Event",
    ("", "nodes"): "Node",
    ("", "endpoints"): "Endpoints",
    ("", "serviceaccounts"): "ServiceAccount",
    ("", "persistentvolumeclaims"): "PersistentVolumeClaim",
}
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_HTTP_METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE"}
_UNAUTHENTICATED = {"/healthz", "/livez", "/readyz"}


# -- time --------------------------------------------------------------------------------------


def rfc3339_nano(nanos: int) -> str:
    """``nanos`` since the epoch as the kubelet stamps log lines: nine fraction digits, UTC."""
    seconds, fraction = divmod(nanos, 1_000_000_000)
    moment = dt.datetime.fromtimestamp(seconds, dt.UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{fraction:09d}Z"


def _now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time_ns(text: str) -> int:
    """An RFC 3339 time as nanoseconds since the epoch."""
    moment = dt.datetime.fromisoformat(text.replace("z", "Z"))
    if moment.tzinfo is None:
        raise ValueError(f"no time zone in {text!r}")
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


# -- errors ------------------------------------------------------------------------------------


class StatusError(Exception):
    """An error answer: a Kubernetes ``Status`` with ``code``, ``reason`` and ``message``."""

    def __init__(
        self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
    ):
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details or {})

    def status(self) -> KubeObject:
        """The ``Status`` object."""
        body: KubeObject = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body

    def response(self) -> web.Response:
        """The HTTP answer."""
        return web.json_response(self.status(), status=self.code)


def _bad_request(message: str) -> StatusError:
    return StatusError(400, "BadRequest", message)


# -- patches -----------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with the JSON merge patch (RFC 7386) ``patch`` applied (inputs unchanged)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise StatusError(422, "Invalid", f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(document: Any, tokens: list[str]) -> Any:
    node = document
    for token in tokens[:-1]:
        try:
            node = node[int(token)] if isinstance(node, list) else node[token]
        except (KeyError, IndexError, ValueError, TypeError):
            raise StatusError(422, "Invalid", f"JSON patch path not found: {token}") from None
    return node


def json_patch(document: Any, operations: Any) -> Any:
    """``document`` with the JSON patch (RFC 6902) ``operations`` applied (input unchanged)."""
    if not isinstance(operations, list):
        raise _bad_request("a JSON patch is a list of operations")
    result = copy.deepcopy(document)

    def get(path: str) -> Any:
        tokens = _pointer(path)
        if not tokens:
            return result
        node = _parent(result, tokens)
        try:
            return node[int(tokens[-1])] if isinstance(node, list) else node[tokens[-1]]
        except (KeyError, IndexError, ValueError, TypeError):
            raise StatusError(422, "Invalid", f"JSON patch path not found: {path}") from None

    def remove(path: str) -> Any:
        tokens = _pointer(path)
        node = _parent(result, tokens)
        try:
            return node.pop(int(tokens[-1]) if isinstance(node, list) else tokens[-1])
        except (KeyError, IndexError, ValueError, TypeError):
            raise StatusError(422, "Invalid", f"JSON patch path not found: {path}") from None

    def add(path: str, value: Any) -> None:
        tokens = _pointer(path)
        node = _parent(result, tokens)
        last = tokens[-1]
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if not 0 <= index <= len(node):
                raise StatusError(422, "Invalid", f"JSON patch index out of range: {path}")
            node.insert(index, value)
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise StatusError(422, "Invalid", f"JSON patch path not found: {path}")

    for operation in operations:
        if not isinstance(operation, dict):
            raise _bad_request("a JSON patch operation is an object")
        op, path = operation.get("op"), str(operation.get("path", ""))
        if op == "add":
            add(path, copy.deepcopy(operation.get("value")))
        elif op == "remove":
            remove(path)
        elif op == "replace":
            remove(path)
            add(path, copy.deepcopy(operation.get("value")))
        elif op == "test":
            if get(path) != operation.get("value"):
                raise StatusError(422, "Invalid", f"JSON patch test failed at {path}")
        elif op == "move":
            add(path, remove(str(operation.get("from", ""))))
        elif op == "copy":
            add(path, copy.deepcopy(get(str(operation.get("from", "")))))
        else:
            raise _bad_request(f"unknown JSON patch operation {op!r}")
    return result


# -- selectors ---------------------------------------------------------------------------------


class _Requirement(NamedTuple):
    key: str
    operator: Literal["=", "!=", "in", "notin", "exists", "!"]
    values: frozenset[str]


_SET_REQUIREMENT = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s*\(([^()]*)\)\s*$")


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p for p in parts if p.strip()]


class LabelSelector:
    """A parsed ``labelSelector`` (equality- and set-based requirements, all of which must hold)."""

    def __init__(self, text: str | None):
        self.requirements: list[_Requirement] = []
        for part in _split_top(text or ""):
            self.requirements.append(self._parse(part))

    @staticmethod
    def _parse(part: str) -> _Requirement:
        match = _SET_REQUIREMENT.match(part)
        if match:
            values = frozenset(v.strip() for v in match.group(3).split(",") if v.strip())
            return _Requirement(match.group(1), match.group(2), values)  # type: ignore[arg-type]
        text = part.strip()
        for operator in ("!=", "==", "="):
            if operator in text:
                key, _, value = text.partition(operator)
                if not key.strip():
                    break
                op: Literal["=", "!="] = "!=" if operator == "!=" else "="
                return _Requirement(key.strip(), op, frozenset([value.strip()]))
        if text.startswith("!") and re.fullmatch(r"![^\s!=(),]+", text):
            return _Requirement(text[1:], "!", frozenset())
        if re.fullmatch(r"[^\s!=(),]+", text):
            return _Requirement(text, "exists", frozenset())
        raise _bad_request(f"unable to parse requirement: {part!r}")

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """Whether ``labels`` satisfy every requirement."""
        labels = labels or {}
        for key, operator, values in self.requirements:
            present = key in labels
            if operator == "=" and (not present or labels[key] not in values):
                return False
            if operator == "!=" and present and labels[key] in values:
                return False
            if operator == "in" and (not present or labels[key] not in values):
                return False
            if operator == "notin" and present and labels[key] in values:
                return False
            if operator == "exists" and not present:
                return False
            if operator == "!" and present:
                return False
        return True


class FieldSelector:
    """A parsed ``fieldSelector``: ``path=value`` or ``path!=value`` terms, all must hold."""

    def __init__(self, text: str | None):
        self.requirements: list[tuple[list[str], bool, str]] = []
        for part in _split_top(text or ""):
            for operator in ("!=", "==", "="):
                if operator in part:
                    path, _, value = part.partition(operator)
                    self.requirements.append(
                        (path.strip().split("."), operator == "!=", value.strip())
                    )
                    break
            else:
                raise _bad_request(f"invalid field selector: {part!r}")

    def matches(self, obj: KubeObject) -> bool:
        """Whether ``obj`` satisfies every requirement (a missing field reads as ``""``)."""
        for path, negated, value in self.requirements:
            node: Any = obj
            for step in path:
                node = node.get(step) if isinstance(node, dict) else None
            actual = (
                "" if node is None else str(node).lower() if isinstance(node, bool) else str(node)
            )
            if (actual == value) == negated:
                return False
        return True


class _Filter(NamedTuple):
    labels: LabelSelector
    fields: FieldSelector

    def matches(self, obj: KubeObject | None) -> bool:
        if obj is None:
            return False
        return self.labels.matches(obj.get("metadata", {}).get("labels")) and self.fields.matches(
            obj
        )


# -- the store ---------------------------------------------------------------------------------


class Resource(NamedTuple):
    """A resource type as a URL names it: API group, version and plural."""

    group: str
    version: str
    plural: str

    @property
    def key(self) -> tuple[str, str]:
        """Storage key: objects of every version of a group's resource are the same objects."""
        return (self.group, self.plural)

    @property
    def api_version(self) -> str:
        """The ``apiVersion`` of its objects."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def name(self) -> str:
        """``plural.group`` (``plural`` for the core group), as the API server's messages say."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @classmethod
    def of(cls, kind: ResourceKind) -> Resource:
        """The resource of one of our kinds."""
        return cls(kind.group, kind.version, kind.plural)


@dataclass(frozen=True)
class StoredEvent:
    """A change in the store: what a watch from before ``resource_version`` replays."""

    resource_version: int
    resource: tuple[str, str]
    namespace: str | None
    type: EventType
    object: KubeObject
    previous: KubeObject | None


class ObjectStore:
    """The objects and their history. Thread-safe; every change wakes the watches.

    Methods taking a ``kind`` (:class:`~kubedl_prefect.kube.resources.ResourceKind`) are for
    tests playing a controller; they return copies and raise :class:`StatusError` as the HTTP
    API would answer (404, 409).
    """

    def __init__(self, wake: Callable[[], None] = lambda: None):
        self._lock = threading.RLock()
        self._wake = wake
        self._objects: dict[tuple[str, str], dict[tuple[str, str], KubeObject]] = {}
        self._kinds: dict[tuple[str, str], str] = dict(_KINDS)
        self._events: builtins.list[StoredEvent] = []
        self._event_versions: builtins.list[int] = []
        self._rv = 100
        self.compacted = 0
        """Watches and continue tokens from a resourceVersion below this get 410 Gone."""

    # -- for tests ------------------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        """The latest resourceVersion (of the last change, of any resource)."""
        with self._lock:
            return str(self._rv)

    def apply(self, obj: KubeObject, kind: ResourceKind | None = None) -> KubeObject:
        """Create ``obj``, or replace the object of its name (status included), like a controller.

        ``kind`` defaults to :meth:`ResourceKind.of` the manifest (plural: lowercase kind + s).
        """
        kind = kind or ResourceKind.of(obj)
        resource = Resource.of(kind)
        namespace = self._namespace_of(kind, obj)
        name = obj.get("metadata", {}).get("name", "")
        with self._lock:
            if self._find(resource, namespace, name) is None:
                return copy.deepcopy(self.create_object(resource, namespace, obj, keep_status=True))
            return copy.deepcopy(
                self.replace_object(
                    resource, namespace, name, obj, keep_status=True, check_version=False
                )
            )

    def create(self, obj: KubeObject, kind: ResourceKind | None = None) -> KubeObject:
        """Create ``obj`` (status included); :class:`StatusError` 409 when it exists."""
        kind = kind or ResourceKind.of(obj)
        namespace = self._namespace_of(kind, obj)
        return copy.deepcopy(
            self.create_object(Resource.of(kind), namespace, obj, keep_status=True)
        )

    def get(self, kind: ResourceKind, namespace: str | None, name: str) -> KubeObject | None:
        """The object, or ``None``."""
        with self._lock:
            found = self._find(Resource.of(kind), namespace if kind.namespaced else None, name)
            return copy.deepcopy(found)

    def list(
        self, kind: ResourceKind, namespace: str | None = None, label_selector: str | None = None
    ) -> builtins.list[KubeObject]:
        """The objects of ``kind`` (in ``namespace``, or all), ordered by namespace and name."""
        selector = _Filter(LabelSelector(label_selector), FieldSelector(None))
        with self._lock:
            return copy.deepcopy(self.select(Resource.of(kind), namespace, selector))

    def merge(
        self, kind: ResourceKind, namespace: str | None, name: str, patch: KubeObject
    ) -> KubeObject:
        """Merge-patch the object, status included (``{"status": {"phase": "Running"}}``)."""
        resource = Resource.of(kind)
        return copy.deepcopy(
            self.patch_object(
                resource,
                namespace if kind.namespaced else None,
                name,
                "merge",
                patch,
                keep_status=True,
            )
        )

    def delete(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        *,
        propagation: Propagation = "Background",
    ) -> KubeObject:
        """Delete the object (finalizers honoured, dependents cascaded); 404 when missing."""
        deleted, _ = self.delete_object(
            Resource.of(kind), namespace if kind.namespaced else None, name, propagation=propagation
        )
        return copy.deepcopy(deleted)

    def events(self, kind: ResourceKind | None = None) -> builtins.list[StoredEvent]:
        """Every change so far (of ``kind``, or all), oldest first."""
        with self._lock:
            if kind is None:
                return list(self._events)
            key = Resource.of(kind).key
            return [e for e in self._events if e.resource == key]

    def compact(self) -> None:
        """Forget history: watches from any resourceVersion before now get 410 Gone."""
        with self._lock:
            self.compacted = self._rv

    # -- the API's operations -------------------------------------------------------------------

    @staticmethod
    def _namespace_of(kind: ResourceKind, obj: KubeObject) -> str | None:
        if not kind.namespaced:
            return None
        namespace = obj.get("metadata", {}).get("namespace")
        if not namespace:
            raise ValueError(f"a {kind.kind} needs metadata.namespace")
        return str(namespace)

    def kind_of(self, resource: Resource) -> str:
        """The ``kind`` of a resource's objects (learned from creations, or guessed)."""
        with self._lock:
            known = self._kinds.get(resource.key)
        if known:
            return known
        singular = resource.plural[:-1] if resource.plural.endswith("s") else resource.plural
        return singular[:1].upper() + singular[1:]

    def _find(self, resource: Resource, namespace: str | None, name: str) -> KubeObject | None:
        return self._objects.get(resource.key, {}).get((namespace or "", name))

    def find(self, resource: Resource, namespace: str | None, name: str) -> KubeObject:
        """The stored object (not a copy): 404 when missing."""
        with self._lock:
            found = self._find(resource, namespace, name)
        if found is None:
            raise StatusError(
                404,
                "NotFound",
                f'{resource.name} "{name}" not found',
                {"name": name, "group": resource.group, "kind": resource.plural},
            )
        return found

    def select(
        self, resource: Resource, namespace: str | None, selector: _Filter
    ) -> builtins.list[KubeObject]:
        """Stored objects (not copies) matching, ordered by namespace and name."""
        with self._lock:
            objects = self._objects.get(resource.key, {})
            return [
                objects[key]
                for key in sorted(objects)
                if (namespace is None or key[0] == namespace) and selector.matches(objects[key])
            ]

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _record(
        self,
        event_type: EventType,
        resource: Resource,
        obj: KubeObject,
        previous: KubeObject | None,
    ) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        namespace = obj["metadata"].get("namespace")
        self._events.append(
            StoredEvent(rv, resource.key, namespace, event_type, copy.deepcopy(obj), previous)
        )
        self._event_versions.append(rv)
        self._wake()

    def create_object(
        self,
        resource: Resource,
        namespace: str | None,
        body: Any,
        *,
        dry_run: bool = False,
        keep_status: bool = False,
    ) -> KubeObject:
        """Create; the stored object (not a copy)."""
        if not isinstance(body, dict):
            raise _bad_request("the body must be a JSON object")
        obj = copy.deepcopy(body)
        metadata = obj.setdefault("metadata", {})
        if not isinstance(metadata, dict):
            raise _bad_request("metadata must be an object")
        if obj.get("apiVersion") not in (None, resource.api_version):
            raise _bad_request(
                f"the API version in the data ({obj['apiVersion']}) does not match the expected "
                f"API version ({resource.api_version})"
            )
        if namespace is not None and metadata.get("namespace") not in (None, "", namespace):
            raise _bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        with self._lock:
            if obj.get("kind"):
                self._kinds.setdefault(resource.key, str(obj["kind"]))
            obj["apiVersion"] = resource.api_version
            obj["kind"] = obj.get("kind") or self.kind_of(resource)
            name = metadata.get("name") or ""
            if not name and metadata.get("generateName"):
                name = f"{metadata['generateName']}{secrets.token_hex(3)[:5]}"
            self._validate_name(resource, name)
            if self._find(resource, namespace, name) is not None:
                raise StatusError(
                    409,
                    "AlreadyExists",
                    f'{resource.name} "{name}" already exists',
                    {"name": name, "group": resource.group, "kind": resource.plural},
                )
            for server_field in (
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "resourceVersion",
            ):
                metadata.pop(server_field, None)
            metadata["name"] = name
            if namespace is not None:
                metadata["namespace"] = namespace
            else:
                metadata.pop("namespace", None)
            metadata["uid"] = str(uuid.uuid4())
            metadata["creationTimestamp"] = _now_rfc3339()
            metadata["generation"] = 1
            metadata["managedFields"] = [
                {
                    "manager": "fakeapi",
                    "operation": "Update",
                    "apiVersion": resource.api_version,
                    "time": metadata["creationTimestamp"],
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {}},
                }
            ]
            if not keep_status:
                obj.pop("status", None)
            if resource.key == ("", "pods") and "status" not in obj:
                obj["status"] = {"phase": "Pending"}
            if resource.key == ("", "namespaces"):
                obj.setdefault("status", {"phase": "Active"})
            if dry_run:
                return obj
            metadata["resourceVersion"] = str(self._next_rv())
            self._objects.setdefault(resource.key, {})[(namespace or "", name)] = obj
            self._record("ADDED", resource, obj, None)
            return obj

    @staticmethod
    def _validate_name(resource: Resource, name: str) -> None:
        if not name:
            raise StatusError(
                422,
                "Invalid",
                f'{resource.name} "" is invalid: metadata.name: Required value: name or '
                "generateName is required",
            )
        if len(name) > 253 or not _NAME.match(name):
            raise StatusError(
                422,
                "Invalid",
                f'{resource.name} "{name}" is invalid: metadata.name: Invalid value: "{name}": '
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                "characters, '-' or '.', and must start and end with an alphanumeric character",
            )

    def replace_object(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        keep_status: bool = False,
        check_version: bool = True,
    ) -> KubeObject:
        """Update (PUT): the stored object (not a copy)."""
        if not isinstance(body, dict):
            raise _bad_request("the body must be a JSON object")
        with self._lock:
            old = self.find(resource, namespace, name)
            given = (body.get("metadata") or {}).get("resourceVersion")
            if check_version and given and given != old["metadata"]["resourceVersion"]:
                raise self._conflict(resource, name)
            return self._update(resource, old, copy.deepcopy(body), subresource, keep_status)

    def apply_object(
        self, resource: Resource, namespace: str | None, name: str, body: Any
    ) -> KubeObject:
        """Server-side apply by one field manager: the stored object (not a copy).

        Creates the object when it is missing; otherwise its labels, annotations and every
        top-level field but ``status`` become the body's (what the body leaves out is removed,
        as a manager's own fields are). One manager only: no field ownership, no conflicts.
        """
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise _bad_request("an applied configuration is a JSON object with metadata")
        if body["metadata"].get("name") not in (None, name):
            raise _bad_request("the name of the object does not match the name on the URL")
        with self._lock:
            old = self._find(resource, namespace, name)
            if old is None:
                return self.create_object(
                    resource, namespace, {**body, "metadata": {**body["metadata"], "name": name}}
                )
            new = {k: copy.deepcopy(v) for k, v in body.items() if k not in ("metadata", "status")}
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            metadata = copy.deepcopy(old["metadata"])
            for key in ("labels", "annotations"):
                metadata.pop(key, None)
                if body["metadata"].get(key):
                    metadata[key] = copy.deepcopy(body["metadata"][key])
            new["metadata"] = metadata
            return self._update(resource, old, new, None, keep_status=True)

    def patch_object(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch_type: Literal["merge", "json"],
        patch: Any,
        *,
        subresource: str | None = None,
        keep_status: bool = False,
    ) -> KubeObject:
        """Patch: the stored object (not a copy)."""
        with self._lock:
            old = self.find(resource, namespace, name)
            if patch_type == "merge":
                if not isinstance(patch, dict):
                    raise _bad_request("a merge patch is a JSON object")
                patched = merge_patch(old, patch)
            else:
                patched = json_patch(old, patch)
            if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
                raise StatusError(422, "Invalid", f'{resource.name} "{name}" is invalid: metadata')
            if patched["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
                raise self._conflict(resource, name)
            return self._update(resource, old, copy.deepcopy(patched), subresource, keep_status)

    @staticmethod
    def _conflict(resource: Resource, name: str) -> StatusError:
        return StatusError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {resource.name} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again",
            {"name": name, "group": resource.group, "kind": resource.plural},
        )

    def _update(
        self,
        resource: Resource,
        old: KubeObject,
        new: KubeObject,
        subresource: str | None,
        keep_status: bool,
    ) -> KubeObject:
        if subresource == "status":
            status = new.get("status")
            new = copy.deepcopy(old)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
        elif not keep_status:
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        metadata = new.setdefault("metadata", {})
        for kept in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "generation",
            "managedFields",
        ):
            if kept in old["metadata"]:
                metadata[kept] = old["metadata"][kept]
            else:
                metadata.pop(kept, None)
        for server_field in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            # Only a deletion sets these; clients cannot.
            if server_field in old["metadata"]:
                metadata[server_field] = old["metadata"][server_field]
            else:
                metadata.pop(server_field, None)
        new["apiVersion"] = old.get("apiVersion", resource.api_version)
        new["kind"] = old.get("kind", self.kind_of(resource))
        metadata["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return old  # nothing changed: no new version, no event
        if _spec_of(new) != _spec_of(old):
            metadata["generation"] = int(old["metadata"].get("generation") or 0) + 1
        metadata["resourceVersion"] = str(self._next_rv())
        namespace = metadata.get("namespace")
        if metadata.get("deletionTimestamp") and not metadata.get("finalizers"):
            # The last finalizer is gone: the deletion completes, and the dependents go too.
            self._objects[resource.key].pop((namespace or "", metadata["name"]), None)
            self._record("DELETED", resource, new, copy.deepcopy(old))
            self._cascade(metadata.get("uid"), "Background")
            return new
        self._objects[resource.key][(namespace or "", metadata["name"])] = new
        self._record("MODIFIED", resource, new, copy.deepcopy(old))
        return new

    def delete_object(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        *,
        propagation: Propagation | None = None,
        preconditions: Mapping[str, Any] | None = None,
        dry_run: bool = False,
    ) -> tuple[KubeObject, bool]:
        """Delete; the object's last state and whether it is gone (not waiting on finalizers)."""
        with self._lock:
            old = self.find(resource, namespace, name)
            for field_name, said, why in (
                ("uid", "UID", "deleted and then recreated"),
                ("resourceVersion", "ResourceVersion", "modified"),
            ):
                wanted = (preconditions or {}).get(field_name)
                if wanted and wanted != old["metadata"].get(field_name):
                    # As the real server's early check words it (a group and *kind*, not plural).
                    kind = self.kind_of(resource)
                    qualified = f"{kind}.{resource.group}" if resource.group else kind
                    raise StatusError(
                        409,
                        "Conflict",
                        f'Operation cannot be fulfilled on {qualified} "{name}": the {said} in '
                        f"the precondition ({wanted}) does not match the {said} in record "
                        f"({old['metadata'].get(field_name)}). The object might have been {why}",
                        {"name": name, "group": resource.group, "kind": kind},
                    )
            if dry_run:
                return copy.deepcopy(old), True
            return self._delete(resource, old, propagation or "Background")

    def _delete(
        self, resource: Resource, old: KubeObject, propagation: Propagation
    ) -> tuple[KubeObject, bool]:
        metadata = old["metadata"]
        key = (metadata.get("namespace") or "", metadata["name"])
        finalizers = [f for f in metadata.get("finalizers") or [] if f != "foregroundDeletion"]
        if finalizers:
            if metadata.get("deletionTimestamp"):
                return old, False
            marked = copy.deepcopy(old)
            marked["metadata"]["deletionTimestamp"] = _now_rfc3339()
            marked["metadata"]["deletionGracePeriodSeconds"] = 0
            marked["metadata"]["resourceVersion"] = str(self._next_rv())
            self._objects[resource.key][key] = marked
            self._record("MODIFIED", resource, marked, copy.deepcopy(old))
            return marked, False
        uid = metadata.get("uid")
        current = old
        if propagation == "Foreground" or resource.key == ("", "namespaces"):
            current = copy.deepcopy(old)
            current["metadata"]["deletionTimestamp"] = _now_rfc3339()
            current["metadata"]["deletionGracePeriodSeconds"] = 0
            if resource.key == ("", "namespaces"):
                current["status"] = {"phase": "Terminating"}
            else:
                current["metadata"]["finalizers"] = ["foregroundDeletion"]
            current["metadata"]["resourceVersion"] = str(self._next_rv())
            self._objects[resource.key][key] = current
            self._record("MODIFIED", resource, current, copy.deepcopy(old))
            self._cascade(uid, "Foreground")
            if resource.key == ("", "namespaces"):
                self._delete_namespace_contents(metadata["name"])
            marked_at = current
            current = copy.deepcopy(current)
            current["metadata"].pop("finalizers", None)
            self._objects[resource.key].pop(key, None)
            current["metadata"]["resourceVersion"] = str(self._next_rv())
            self._record("DELETED", resource, current, marked_at)
            return current, True
        if propagation == "Orphan":
            self._orphan(uid)
        gone = copy.deepcopy(old)
        self._objects[resource.key].pop(key, None)
        gone["metadata"]["resourceVersion"] = str(self._next_rv())
        self._record("DELETED", resource, gone, old)
        if propagation == "Background":
            self._cascade(uid, "Background")
        return gone, True

    def _dependents(self, uid: str | None) -> builtins.list[tuple[Resource, KubeObject]]:
        found: builtins.list[tuple[Resource, KubeObject]] = []
        if not uid:
            return found
        for (group, plural), objects in self._objects.items():
            for obj in list(objects.values()):
                owners = obj["metadata"].get("ownerReferences") or []
                if any(ref.get("uid") == uid for ref in owners):
                    version = str(obj.get("apiVersion", "v1")).rpartition("/")[2]
                    found.append((Resource(group, version, plural), obj))
        return found

    def _cascade(self, uid: str | None, propagation: Propagation) -> None:
        # As the garbage collector does: a dependent of a foreground deletion is deleted in the
        # foreground only if it has dependents of its own.
        for resource, obj in self._dependents(uid):
            key = (obj["metadata"].get("namespace") or "", obj["metadata"]["name"])
            if self._objects.get(resource.key, {}).get(key) is obj:
                nested = propagation == "Foreground" and self._dependents(
                    obj["metadata"].get("uid")
                )
                self._delete(resource, obj, "Foreground" if nested else "Background")

    def _orphan(self, uid: str | None) -> None:
        for resource, obj in self._dependents(uid):
            new = copy.deepcopy(obj)
            new["metadata"]["ownerReferences"] = [
                ref for ref in obj["metadata"]["ownerReferences"] if ref.get("uid") != uid
            ]
            if not new["metadata"]["ownerReferences"]:
                del new["metadata"]["ownerReferences"]
            self._update(resource, obj, new, None, keep_status=True)

    def _delete_namespace_contents(self, namespace: str) -> None:
        for (group, plural), objects in list(self._objects.items()):
            for (ns, _), obj in sorted(objects.items()):
                if ns == namespace and objects.get((ns, obj["metadata"]["name"])) is obj:
                    version = str(obj.get("apiVersion", "v1")).rpartition("/")[2]
                    self._delete(Resource(group, version, plural), obj, "Background")

    def since(self, cursor: int) -> tuple[builtins.list[StoredEvent], int, int]:
        """Events from index ``cursor`` on, the next cursor, and the resourceVersion now."""
        with self._lock:
            events = self._events[cursor:]
            return events, len(self._events), self._rv

    def cursor_after(self, resource_version: int) -> int:
        """The index of the first event after ``resource_version``."""
        with self._lock:
            return bisect.bisect_right(self._event_versions, resource_version)


def _spec_of(obj: KubeObject) -> KubeObject:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


# -- streams -----------------------------------------------------------------------------------


@dataclass
class RequestRecord:
    """One request the server answered."""

    method: str
    path: str
    query: dict[str, str]
    verb: str = ""
    """``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``,
    ``deletecollection``, ``log``; ``""`` for non-resource paths."""
    status: int = 0


@dataclass
class _Failure:
    method: str
    path_prefix: str
    status: int
    reason: str
    message: str
    remaining: int | None

    def matches(self, method: str, verb: str, path: str) -> bool:
        return self.method in ("*", method, verb) and path.startswith(self.path_prefix)


@dataclass(eq=False)
class _Stream:
    kind: Literal["watch", "log"]
    request: web.Request
    resource: Resource
    namespace: str | None
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    dropped: bool = False
    bookmark_now: bool = False

    def drop(self) -> None:
        self.dropped = True
        transport = self.request.transport
        if transport is not None:
            transport.abort()
        self.wakeup.set()


@dataclass
class _LogBuffer:
    lines: list[tuple[int, str, str]] = field(default_factory=list)
    closed: bool = False


def _flag(query: Mapping[str, str], name: str) -> bool:
    return query.get(name, "").lower() in ("true", "1")


def _int(query: Mapping[str, str], name: str) -> int | None:
    text = query.get(name)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise _bad_request(f"invalid {name}: {text!r}") from None
    if value < 0:
        raise _bad_request(f"{name} must not be negative")
    return value


class _Route(NamedTuple):
    resource: Resource
    namespace: str | None
    name: str | None
    subresource: str | None


def _route(path: str) -> _Route | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if not rest:
        return None
    namespace: str | None = None
    if (
        rest[0] == "namespaces"
        and len(rest) >= 3
        and not (len(rest) == 3 and group == "" and rest[2] in ("status", "finalize"))
    ):
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = "/".join(rest[2:]) or None
    return _Route(Resource(group, version, plural), namespace, name, subresource)


class FakeKubeAPI:
    """The in-memory API server (see the module docstring for what it serves and its controls).

    Args:
        token: The bearer token requests must carry.
        bookmark_interval_s: How often a watch that allows bookmarks gets one (the real API
            server: about a minute). May be changed while running.
        tls: Serve HTTPS with a fresh CA (:attr:`ca_pem`, :attr:`ca_file`).
    """

    def __init__(
        self,
        *,
        token: str = "fake-token-0123456789",
        bookmark_interval_s: float = 1.0,
        tls: bool = False,
    ):
        self.token = token
        self.bookmark_interval_s = bookmark_interval_s
        self.tls = tls
        self.store = ObjectStore(self._wake)
        self.request_log: list[RequestRecord] = []
        self.counts: Counter[str] = Counter()
        """Requests by verb (see :class:`RequestRecord`), authorized ones only."""
        self.dropped_streams = 0
        self._tokens = {token}
        self._failures: list[_Failure] = []
        self._logs: dict[tuple[str, str, str], _LogBuffer] = {}
        self._streams: set[_Stream] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_id: int | None = None
        self._runner: web.AppRunner | None = None
        self._tls_dir: Path | None = None
        self._port = 0
        self.ca_pem: str | None = None
        """The CA certificate (PEM) with ``tls=True``."""
        self.ca_file: str | None = None
        """A file holding :attr:`ca_pem`, with ``tls=True``."""

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> FakeKubeAPI:
        """Listen on 127.0.0.1 (a free port); returns itself."""
        self._loop = asyncio.get_running_loop()
        self._thread_id = threading.get_ident()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        ssl_context = self._serving_context() if self.tls else None
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        self._port = self._runner.addresses[0][1]
        return self

    def _serving_context(self) -> ssl.SSLContext:
        from kubedl_prefect.testbed.pki import CertificateAuthority

        self._tls_dir = Path(tempfile.mkdtemp(prefix="fakeapi-pki-"))
        authority = CertificateAuthority(self._tls_dir)
        cert, key = authority.serving()
        self.ca_file = str(authority.cert_path)
        self.ca_pem = authority.cert_path.read_text()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        return context

    async def close(self) -> None:
        """Cut every open stream and stop listening."""
        for stream in list(self._streams):
            stream.drop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._tls_dir is not None:
            shutil.rmtree(self._tls_dir, ignore_errors=True)
            self._tls_dir = None

    async def __aenter__(self) -> FakeKubeAPI:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @classmethod
    @contextlib.contextmanager
    def serve_in_thread(cls, **kwargs: Any) -> Iterator[FakeKubeAPI]:
        """A server on its own thread and loop, for sync tests (controls work from any thread)."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="fakeapi", daemon=True)
        thread.start()
        server = cls(**kwargs)
        try:
            asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
            yield server
        finally:
            asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(30)
            loop.close()

    # -- addresses and credentials --------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http(s)://127.0.0.1:<port>``."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self._port}"

    @property
    def credentials(self) -> BearerToken:
        """Token credentials for this server (with its CA when serving TLS)."""
        return BearerToken(server=self.url, token=self.token, ca_cert=self.ca_pem)

    def add_token(self, token: str) -> None:
        """Accept another bearer token."""
        self._tokens.add(token)

    def kubeconfig(self, *, token: str | None = None, namespace: str | None = None) -> str:
        """The YAML text of a kubeconfig for this server (context ``fake``, a token user)."""
        cluster: dict[str, Any] = {"server": self.url}
        if self.ca_pem is not None:
            cluster["certificate-authority-data"] = base64.b64encode(self.ca_pem.encode()).decode()
        context: dict[str, str] = {"cluster": "fake", "user": "fake-user"}
        if namespace:
            context["namespace"] = namespace
        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": cluster}],
            "users": [{"name": "fake-user", "user": {"token": token or self.token}}],
            "contexts": [{"name": "fake", "context": context}],
            "current-context": "fake",
        }
        return yaml.safe_dump(document, sort_keys=False)

    # -- controls -----------------------------------------------------------------------------

    def _on_loop(self, action: Callable[[], None]) -> None:
        """Run ``action`` on the server's loop and wait for it."""
        if self._loop is None or threading.get_ident() == self._thread_id:
            action()
            return

        async def run() -> None:
            action()

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(30)

    def _wake(self) -> None:
        if self._loop is None:
            return
        if threading.get_ident() == self._thread_id:
            self._wake_all()
        else:
            self._loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        for stream in self._streams:
            stream.wakeup.set()

    def compact(self) -> None:
        """Compact the history: watches from an older resourceVersion get ``ERROR`` 410."""
        self.store.compact()

    def drop_watches(self) -> int:
        """Cut every open watch stream as a broken connection would; returns how many."""
        return self._drop("watch")

    def drop_log_streams(self) -> int:
        """Cut every open log stream as a broken connection would; returns how many."""
        return self._drop("log")

    def _drop(self, kind: str) -> int:
        dropped: list[_Stream] = []

        def drop() -> None:
            for stream in list(self._streams):
                if stream.kind == kind:
                    stream.drop()
                    dropped.append(stream)

        self._on_loop(drop)
        self.dropped_streams += len(dropped)
        return len(dropped)

    def send_bookmarks(self) -> None:
        """Send a bookmark on every open watch that allows them, now."""

        def mark() -> None:
            for stream in self._streams:
                stream.bookmark_now = True
                stream.wakeup.set()

        self._on_loop(mark)

    def fail_next(
        self,
        method: str,
        path_prefix: str,
        status: int,
        reason: str,
        *,
        message: str | None = None,
        times: int | None = 1,
    ) -> None:
        """Answer the next ``times`` matching requests (``None``: all) with an error ``Status``.

        Args:
            method: An HTTP method in capitals (``GET``, ``POST``...), a verb in lower case
                (``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``,
                ``deletecollection``, ``log``), or ``*``.
            path_prefix: Requests whose path starts with this (``/apis/training.kubedl.io``).
            status: The HTTP status (500, 403, 404, 429...).
            reason: The ``Status`` reason (``InternalError``, ``Forbidden``...).
            message: The ``Status`` message (default: says it was injected).
            times: How many requests fail; ``None`` until :meth:`clear_failures`.
        """
        self._failures.append(
            _Failure(method, path_prefix, status, reason, message or f"injected {reason}", times)
        )

    def clear_failures(self) -> None:
        """Forget every injected failure not used up yet."""
        self._failures.clear()

    def append_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *lines: str,
        at: dt.datetime | None = None,
    ) -> list[str]:
        """Append lines to a container's log (embedded newlines make several), stamped now or
        ``at``; returns them as a ``timestamps=true`` request serves them."""
        stamp_ns = 0
        if at is not None:
            if at.tzinfo is None:
                raise ValueError("at needs a time zone")
            stamp_ns = int(at.timestamp()) * 1_000_000_000 + at.microsecond * 1000
        served = []
        with self.store._lock:
            buffer = self._logs.setdefault((namespace, pod, container), _LogBuffer())
            for text in lines:
                for line in text.split("\n"):
                    nanos = stamp_ns if at is not None else time.time_ns()
                    if at is None and buffer.lines:
                        nanos = max(nanos, buffer.lines[-1][0])
                    stamp = rfc3339_nano(nanos)
                    buffer.lines.append((nanos, stamp, line))
                    served.append(f"{stamp} {line}")
        self._wake()
        return served

    def close_log(self, namespace: str, pod: str, container: str) -> None:
        """The container ended: follow streams of its log end once they have sent every line."""
        with self.store._lock:
            self._logs.setdefault((namespace, pod, container), _LogBuffer()).closed = True
        self._wake()

    def count(self, verb: str, path_prefix: str = "") -> int:
        """How many requests of ``verb`` (see :class:`RequestRecord`) under ``path_prefix``."""
        return sum(1 for r in self.request_log if r.verb == verb and r.path.startswith(path_prefix))

    @property
    def open_watches(self) -> int:
        """Watch streams open now."""
        return sum(1 for s in list(self._streams) if s.kind == "watch")

    @property
    def open_log_streams(self) -> int:
        """Log follow streams open now."""
        return sum(1 for s in list(self._streams) if s.kind == "log")

    # -- HTTP ---------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        record = RequestRecord(request.method, request.path, dict(request.query))
        self.request_log.append(record)
        try:
            response = await self._dispatch(request, record)
        except StatusError as exc:
            response = exc.response()
        if not record.status:
            record.status = response.status
        return response

    def _check_auth(self, request: web.Request) -> None:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or token.strip() not in self._tokens:
            raise StatusError(401, "Unauthorized", "Unauthorized")

    def _injected(self, method: str, verb: str, path: str) -> StatusError | None:
        for failure in self._failures:
            if failure.matches(method, verb, path):
                if failure.remaining is not None:
                    failure.remaining -= 1
                    if failure.remaining <= 0:
                        self._failures.remove(failure)
                return StatusError(failure.status, failure.reason, failure.message)
        return None

    async def _dispatch(self, request: web.Request, record: RequestRecord) -> web.StreamResponse:
        path = request.path
        if path in _UNAUTHENTICATED:
            return web.Response(text="ok")
        self._check_auth(request)
        route = _route(path)
        if route is None:
            if path == "/version":
                return web.json_response(
                    {"major": "1", "minor": "34", "gitVersion": "v1.34.0-fakeapi"}
                )
            if path == "/metrics":
                return web.Response(text=self._metrics(), content_type="text/plain")
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        query = request.query
        verb = self._verb(request.method, route, query)
        record.verb = verb
        self.counts[verb] += 1
        injected = self._injected(request.method, verb, path)
        if injected is not None:
            raise injected
        resource, namespace, name, subresource = route
        if subresource not in (None, "status", "log") or (
            subresource == "log" and resource.key != ("", "pods")
        ):
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        if verb == "watch":
            return await self._watch(request, record, route)
        if verb == "log":
            return await self._log(request, record, route)
        if verb == "list":
            return web.json_response(self._list(route, query))
        if verb == "get":
            return web.json_response(self.store.find(resource, namespace, name or ""))
        dry_run = query.get("dryRun") == "All"
        body = await self._body(request)
        if verb == "create":
            if subresource is not None:
                raise StatusError(405, "MethodNotAllowed", "the server does not allow this method")
            created = self.store.create_object(resource, namespace, body, dry_run=dry_run)
            return web.json_response(created, status=201)
        if verb == "update":
            return web.json_response(
                self.store.replace_object(
                    resource, namespace, name or "", body, subresource=subresource
                )
            )
        if verb == "patch":
            content_type = request.content_type
            if content_type in (
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
            ):
                patch_type: Literal["merge", "json"] = "merge"
            elif content_type == "application/json-patch+json":
                patch_type = "json"
            elif content_type == "application/apply-patch+yaml" and subresource is None:
                return web.json_response(
                    self.store.apply_object(resource, namespace, name or "", body)
                )
            else:
                raise StatusError(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format ({content_type}) - "
                    "accepted media types include: application/json-patch+json, "
                    "application/merge-patch+json, application/strategic-merge-patch+json",
                )
            return web.json_response(
                self.store.patch_object(
                    resource, namespace, name or "", patch_type, body, subresource=subresource
                )
            )
        if verb == "delete":
            options = body if isinstance(body, dict) else {}
            policy = options.get("propagationPolicy") or query.get("propagationPolicy")
            if policy not in (None, "Foreground", "Background", "Orphan"):
                raise _bad_request(f"unknown propagationPolicy {policy!r}")
            propagation = cast("Propagation | None", policy)
            if (options.get("dryRun") or []) == ["All"]:
                dry_run = True
            deleted, gone = self.store.delete_object(
                resource,
                namespace,
                name or "",
                propagation=propagation,
                preconditions=options.get("preconditions"),
                dry_run=dry_run,
            )
            return web.json_response(deleted, status=200 if gone else 202)
        if verb == "deletecollection":
            selector = _Filter(
                LabelSelector(query.get("labelSelector")), FieldSelector(query.get("fieldSelector"))
            )
            items = []
            for obj in self.store.select(resource, namespace, selector):
                if not dry_run:
                    deleted, _ = self.store.delete_object(
                        resource, obj["metadata"].get("namespace"), obj["metadata"]["name"]
                    )
                    items.append(deleted)
            return web.json_response(
                {
                    "kind": f"{self.store.kind_of(resource)}List",
                    "apiVersion": resource.api_version,
                    "metadata": {"resourceVersion": self.store.resource_version},
                    "items": items,
                }
            )
        raise StatusError(405, "MethodNotAllowed", "the server does not allow this method")

    @staticmethod
    def _verb(method: str, route: _Route, query: Mapping[str, str]) -> str:
        if method == "GET":
            if route.name is None:
                return "watch" if _flag(query, "watch") else "list"
            return "log" if route.subresource == "log" else "get"
        if method == "POST":
            return "create"
        if method == "PUT":
            return "update"
        if method == "PATCH":
            return "patch"
        if method == "DELETE":
            return "delete" if route.name is not None else "deletecollection"
        return method.lower()

    @staticmethod
    async def _body(request: web.Request) -> Any:
        if not request.can_read_body:
            return None
        text = await request.text()
        if not text.strip():
            return None
        try:
            return json.loads(text)
        except ValueError:
            raise _bad_request("the request body is not JSON") from None

    def _list(self, route: _Route, query: Mapping[str, str]) -> KubeObject:
        resource, namespace, _, _ = route
        selector = _Filter(
            LabelSelector(query.get("labelSelector")), FieldSelector(query.get("fieldSelector"))
        )
        limit = _int(query, "limit") or 0
        start = ""
        with self.store._lock:
            list_rv = self.store._rv
            token = query.get("continue")
            if token:
                try:
                    state = json.loads(base64.urlsafe_b64decode(token.encode()))
                    list_rv, start = int(state["rv"]), str(state["start"])
                except (ValueError, KeyError, TypeError):
                    raise _bad_request("invalid continue token") from None
                if list_rv < self.store.compacted:
                    raise StatusError(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent "
                        "list result. You can start a new list without the continue parameter.",
                    )
            items = [
                obj
                for obj in self.store.select(resource, namespace, selector)
                if f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}" > start
            ]
            metadata: dict[str, Any] = {"resourceVersion": str(list_rv)}
            if limit and len(items) > limit:
                last = items[limit - 1]["metadata"]
                position = f"{last.get('namespace', '')}/{last['name']}"
                metadata["continue"] = base64.urlsafe_b64encode(
                    json.dumps({"rv": list_rv, "start": position}).encode()
                ).decode()
                metadata["remainingItemCount"] = len(items) - limit
                items = items[:limit]
            return {
                "kind": f"{self.store.kind_of(resource)}List",
                "apiVersion": resource.api_version,
                "metadata": metadata,
                "items": copy.deepcopy(items),
            }

    @staticmethod
    async def _write(response: web.StreamResponse, value: Any, *, text: bool = False) -> None:
        data = value.encode() if text else json.dumps(value, separators=(",", ":")).encode() + b"\n"
        await response.write(data)

    async def _watch(
        self, request: web.Request, record: RequestRecord, route: _Route
    ) -> web.StreamResponse:
        resource, namespace, _, _ = route
        query = request.query
        selector = _Filter(
            LabelSelector(query.get("labelSelector")), FieldSelector(query.get("fieldSelector"))
        )
        bookmarks = _flag(query, "allowWatchBookmarks")
        send_initial = _flag(query, "sendInitialEvents")
        timeout = _int(query, "timeoutSeconds")
        since = query.get("resourceVersion", "")
        expired: int | None = None
        initial: list[KubeObject] = []
        with self.store._lock:
            if since in ("", "0") or send_initial:
                initial = copy.deepcopy(self.store.select(resource, namespace, selector))
                cursor = len(self.store._events)
            else:
                try:
                    version = int(since)
                except ValueError:
                    raise _bad_request(f"invalid resourceVersion {since!r}") from None
                if version < self.store.compacted:
                    expired = version
                cursor = self.store.cursor_after(version)
        kind = self.store.kind_of(resource)
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        record.status = 200
        await response.prepare(request)
        stream = _Stream("watch", request, resource, namespace)
        self._streams.add(stream)
        loop = asyncio.get_running_loop()
        try:
            if expired is not None:
                status = StatusError(
                    410, "Expired", f"too old resource version: {expired} ({self.store.compacted})"
                ).status()
                await self._write(response, {"type": "ERROR", "object": status})
                return response
            for obj in initial:
                await self._write(response, {"type": "ADDED", "object": obj})
            if send_initial and bookmarks:
                await self._write(
                    response,
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": kind,
                            "apiVersion": resource.api_version,
                            "metadata": {
                                "resourceVersion": self.store.resource_version,
                                "annotations": {"k8s.io/initial-events-end": "true"},
                            },
                        },
                    },
                )
            deadline = loop.time() + timeout if timeout else None
            next_bookmark = loop.time() + self.bookmark_interval_s
            while not stream.dropped:
                stream.wakeup.clear()
                events, cursor, rv_now = self.store.since(cursor)
                for event in events:
                    translated = self._translate(event, resource, namespace, selector)
                    if translated is not None:
                        await self._write(response, translated)
                now = loop.time()
                if bookmarks and (stream.bookmark_now or now >= next_bookmark):
                    stream.bookmark_now = False
                    next_bookmark = now + self.bookmark_interval_s
                    bookmark = {
                        "kind": kind,
                        "apiVersion": resource.api_version,
                        "metadata": {"resourceVersion": str(rv_now)},
                    }
                    await self._write(response, {"type": "BOOKMARK", "object": bookmark})
                if deadline is not None and now >= deadline:
                    break
                waits = [next_bookmark - now] if bookmarks else []
                if deadline is not None:
                    waits.append(deadline - now)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stream.wakeup.wait(), min(waits) if waits else None)
        except ConnectionError:
            pass  # the client went away, or the test cut the stream
        finally:
            self._streams.discard(stream)
        return response

    @staticmethod
    def _translate(
        event: StoredEvent, resource: Resource, namespace: str | None, selector: _Filter
    ) -> KubeObject | None:
        if event.resource != resource.key or (
            namespace is not None and event.namespace != namespace
        ):
            return None
        obj = event.object
        now = selector.matches(obj)
        if event.type == "MODIFIED":
            before = selector.matches(event.previous)
            if now and before:
                return {"type": "MODIFIED", "object": obj}
            if now:
                return {"type": "ADDED", "object": obj}
            if before:
                return {"type": "DELETED", "object": obj}
            return None
        return {"type": event.type, "object": obj} if now else None

    async def _log(
        self, request: web.Request, record: RequestRecord, route: _Route
    ) -> web.StreamResponse:
        _, namespace, pod_name, _ = route
        namespace = namespace or ""
        pod_name = pod_name or ""
        pods = Resource("", "v1", "pods")
        pod = self.store.find(pods, namespace, pod_name)
        uid = pod["metadata"].get("uid")
        spec = pod.get("spec") or {}
        names = [
            str(c.get("name"))
            for group in ("initContainers", "containers", "ephemeralContainers")
            for c in spec.get(group) or []
        ]
        query = request.query
        container = query.get("container") or ""
        if not container:
            if len(spec.get("containers") or []) != 1:
                choices = f", choose one of: [{' '.join(names)}]" if names else ""
                raise _bad_request(
                    f"a container name must be specified for pod {pod_name}{choices}"
                )
            container = str(spec["containers"][0].get("name"))
        if names and container not in names:
            raise _bad_request(f"container {container} is not valid for pod {pod_name}")
        follow = _flag(query, "follow")
        timestamps = _flag(query, "timestamps")
        tail = _int(query, "tailLines")
        limit_bytes = _int(query, "limitBytes")
        since_ns: int | None = None
        if query.get("sinceTime"):
            try:
                since_ns = _parse_time_ns(query["sinceTime"]) // 1_000_000_000 * 1_000_000_000
            except ValueError:
                raise _bad_request(f"invalid sinceTime {query['sinceTime']!r}") from None
        since_seconds = _int(query, "sinceSeconds")
        if since_seconds is not None:
            since_ns = max(since_ns or 0, time.time_ns() - since_seconds * 1_000_000_000)

        def render(lines: Iterable[tuple[int, str, str]]) -> str:
            return "".join(
                f"{stamp} {text}\n" if timestamps else f"{text}\n"
                for nanos, stamp, text in lines
                if since_ns is None or nanos >= since_ns
            )

        with self.store._lock:
            buffer = self._logs.setdefault((namespace, pod_name, container), _LogBuffer())
            lines = buffer.lines[-tail:] if tail else ([] if tail == 0 else buffer.lines)
            cursor = len(buffer.lines)
            text = render(lines)
        if limit_bytes is not None:
            text = text.encode()[:limit_bytes].decode(errors="ignore")
        if not follow:
            return web.Response(text=text, content_type="text/plain")
        response = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        record.status = 200
        await response.prepare(request)
        stream = _Stream("log", request, pods, namespace)
        self._streams.add(stream)
        try:
            if text:
                await self._write(response, text, text=True)
            while not stream.dropped:
                stream.wakeup.clear()
                with self.store._lock:
                    fresh = buffer.lines[cursor:]
                    cursor += len(fresh)
                    closed = buffer.closed
                    current = self.store._find(pods, namespace, pod_name)
                if fresh:
                    await self._write(response, render(fresh), text=True)
                if closed or current is None or current["metadata"].get("uid") != uid:
                    break
                await stream.wakeup.wait()
        except ConnectionError:
            pass
        finally:
            self._streams.discard(stream)
        return response

    def _metrics(self) -> str:
        counts: Counter[tuple[str, str, str, str, str]] = Counter()
        for stream in self._streams:
            resource = stream.resource
            scope = "namespace" if stream.namespace is not None else "cluster"
            verb, sub = ("WATCH", "") if stream.kind == "watch" else ("GET", "log")
            counts[(resource.group, resource.plural, scope, sub, verb)] += 1
        lines = ["# TYPE apiserver_longrunning_requests gauge"]
        for (group, plural, scope, sub, verb), value in sorted(counts.items()):
            lines.append(
                f'apiserver_longrunning_requests{{component="apiserver",group="{group}",'
                f'resource="{plural}",scope="{scope}",subresource="{sub}",verb="{verb}"}} {value}'
            )
        return "\n".join(lines) + "\n"
