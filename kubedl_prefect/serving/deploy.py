"""Deploying an InferenceService: server-side apply, wait for Ready, roll back what fails.

:meth:`InferenceServiceDeployer.deploy`:

1. renders the manifest (:mod:`.render`) and refuses an invalid one before anything is sent;
2. reads the live service, if any; a service of that name not managed by kubedl-prefect is left
   alone (refused);
3. applies the manifest server-side as the field manager ``kubedl-prefect``, then writes what
   it applied and the spec that was serving before into the service's record, a ConfigMap it
   owns (:mod:`.record`): that is what a rollback restores, from any process;
4. waits until the service is Ready for the applied spec, through the shared watches of the
   InferenceServices and their pods (no polling; see :mod:`.readiness` for what "for the applied
   spec" means without ``observedGeneration``);
5. on a failure or a timeout, adds the model server's own error from the log of the container
   that tells why (:mod:`.diagnosis`: MLServer logs a model it cannot load and exits 0, so
   nothing in the status carries it), restores the previous spec (or deletes the service when
   nothing was serving before), calls ``on_rollback`` (the Prefect surface passes the registry's
   :meth:`~kubedl_prefect.registry.ModelRegistry.restore_alias` there), and raises
   :class:`~kubedl_prefect.errors.InferenceServiceNotReadyError` with the reason.

Each step is reported to ``on_event`` as an :class:`~.events.InferenceServiceEvent`, on a
thread of its own (:mod:`kubedl_prefect.kube.delivery`).

All Kubernetes I/O runs on the process-wide :class:`~kubedl_prefect.kube.runtime.KubeRuntime`
loop; :class:`SyncInferenceServiceDeployer` gives the same methods to sync code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Final, TypeVar

from kubedl_prefect.errors import (
    InferenceServiceNotReadyError,
    KubeDLPrefectError,
    NotFoundError,
    ServingError,
)
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.credentials import Credentials
from kubedl_prefect.kube.deadline import Deadline
from kubedl_prefect.kube.delivery import delivered
from kubedl_prefect.kube.labels import LABEL_MANAGED_BY, MANAGED_BY
from kubedl_prefect.kube.resources import INFERENCE_SERVICES, PODS, KubeObject
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.kube.session import KubeSession, SessionHandle, SessionPool, resolve_credentials
from kubedl_prefect.kube.watch import EventQueue, next_event
from kubedl_prefect.lifecycle.backend import namespace_problem
from kubedl_prefect.serving import events
from kubedl_prefect.serving.diagnosis import server_error, telling_container
from kubedl_prefect.serving.events import InferenceServiceEvent, ServingCallback
from kubedl_prefect.serving.readiness import Applied, Readiness, ServingState, readiness
from kubedl_prefect.serving.record import (
    LEGACY_ANNOTATION_APPLIED,
    LEGACY_ANNOTATION_PREVIOUS,
    ServingRecord,
    foreign_fields,
    forged,
    read_record,
    rendered_fields,
    write_record,
)
from kubedl_prefect.serving.render import (
    ISVC_POD_LABEL,
    render_inference_service,
)
from kubedl_prefect.serving.spec import InferenceServiceSpec

logger = logging.getLogger(__name__)

T = TypeVar("T")

FIELD_MANAGER: Final = "kubedl-prefect"
"""The server-side apply field manager of every service we deploy."""

RollbackCallback = Callable[[], object]
"""Called (in a worker thread) after a failed deployment was rolled back."""


@dataclass(frozen=True)
class ServingOutcome:
    """A service that became Ready for the spec we applied.

    Attributes:
        namespace: Its namespace.
        name: Its name.
        uid: Its uid.
        generation: The generation that is serving.
        url: Its URL (``status.url``).
        runtime: The serving runtime KServe chose, when it reports one.
        storage_uri: The model location being served.
        changed: Whether the spec changed (``False``: the same spec was serving already).
        readiness: The state it was found in.
    """

    namespace: str
    name: str
    uid: str
    generation: int
    url: str | None
    runtime: str | None
    storage_uri: str
    changed: bool
    readiness: Readiness


class _NotReady(Exception):
    """The wait ended without Ready (internal)."""

    def __init__(self, state: Readiness, *, timed_out: bool):
        super().__init__(state.summary())
        self.state = state
        self.timed_out = timed_out


class _TimedOut(Exception):
    """The deadline of a wait passed (internal)."""


def _view(manifest: KubeObject) -> dict[str, Any]:
    """What a rollback needs to restore an applied manifest: labels, annotations, spec."""
    metadata = manifest["metadata"]
    annotations = {
        k: v
        for k, v in (metadata.get("annotations") or {}).items()
        if k not in (LEGACY_ANNOTATION_APPLIED, LEGACY_ANNOTATION_PREVIOUS)
    }
    return {
        "labels": dict(metadata.get("labels") or {}),
        "annotations": annotations,
        "spec": manifest["spec"],
    }


def _encode(view: dict[str, Any]) -> str:
    return json.dumps(view, sort_keys=True, separators=(",", ":"))


def _from_view(text: str, namespace: str, name: str) -> KubeObject:
    view = json.loads(text)
    return {
        "apiVersion": INFERENCE_SERVICES.api_version,
        "kind": INFERENCE_SERVICES.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": view["labels"],
            "annotations": view["annotations"],
        },
        "spec": view["spec"],
    }


def previous_spec(
    current: KubeObject | None, record: ServingRecord, wanted: KubeObject
) -> str | None:
    """The applied spec a rollback of ``wanted`` would restore (pure).

    Judged from the live ``current`` and its ``record``: a retry of the same deployment keeps
    what the first try recorded; a change over a service that is Ready records the current
    spec; over one that is not Ready (an earlier deployment that nobody rolled back), the spec
    that served before it. Without a record, a Ready service restores itself as it is live.
    """
    if current is None:
        return None
    ready = readiness(current, []).state is ServingState.READY
    if record.applied is None:
        # No record (none written yet, none readable, or lost): what serves now is the service
        # itself, with only the fields the renderer writes (not what KServe's defaulter added).
        return _encode(rendered_fields(_view(current))) if ready else None
    if record.applied == _encode(_view(wanted)):
        return record.previous
    if ready:
        return record.applied
    return record.previous


class InferenceServiceDeployer:
    """Deploys KServe InferenceServices, waits for them, and rolls back what fails.

    A light handle on the process's Kubernetes session for these credentials (shared with the
    training backends: one watch per kind and namespace); :meth:`close` releases it.

    Args:
        namespace: Where services go unless their spec names a namespace.
        credentials: How to reach the cluster (default: ``$KUBECONFIG``, else in-cluster).
        kubeconfig: Shorthand for ``credentials=KubeconfigFile(kubeconfig, context)``.
        context: The kubeconfig context (with ``kubeconfig``).
        pool: The session pool to share (the process's one by default).
        field_manager: The server-side apply field manager.

    Example:
        >>> deployer = InferenceServiceDeployer(namespace="ml", kubeconfig="/tmp/kubeconfig")
        >>> service = InferenceServiceSpec(name="fraud", storage_uri="s3://ml/m-ab/artifacts")
        >>> deployer.manifest(service)["metadata"]["namespace"]
        'ml'
    """

    def __init__(
        self,
        *,
        namespace: str = "default",
        credentials: Credentials | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        pool: SessionPool | None = None,
        field_manager: str = FIELD_MANAGER,
    ):
        resolved = resolve_credentials("InferenceServiceDeployer", credentials, kubeconfig, context)
        problem = namespace_problem(namespace)
        if problem is not None:
            raise KubeDLPrefectError(
                f"InferenceServiceDeployer refused: {problem}",
                hint="name an existing namespace, as `kubectl get namespaces` lists it",
            )
        self.namespace = namespace
        self.field_manager = field_manager
        self._sessions = SessionHandle(resolved, pool)

    def __repr__(self) -> str:
        return f"InferenceServiceDeployer(namespace={self.namespace!r})"

    async def _on_runtime(self, coro: Coroutine[Any, Any, T]) -> T:
        return await KubeRuntime.get().run(coro)

    async def close(self) -> None:
        """Release this handle's share of the session."""
        await self._sessions.close()

    def manifest(self, service: InferenceServiceSpec) -> KubeObject:
        """The manifest :meth:`deploy` applies, without the rollback annotations (pure).

        Raises:
            InferenceServiceSpecError: ``service`` has problems.
        """
        return render_inference_service(service, namespace=self.namespace)

    async def deploy(
        self,
        service: InferenceServiceSpec,
        *,
        timeout_s: float = 600.0,
        rollback_timeout_s: float = 300.0,
        on_event: ServingCallback | None = None,
        on_rollback: RollbackCallback | None = None,
        restore: InferenceServiceSpec | None = None,
    ) -> ServingOutcome:
        """Apply ``service`` and wait until it is Ready; roll back if it is not.

        Args:
            service: What to serve.
            timeout_s: How long the new spec may take to become Ready.
            rollback_timeout_s: How long the restored spec may take to become Ready again.
            on_event: Called with each :class:`~.events.InferenceServiceEvent`.
            on_rollback: Called after a rollback (e.g. to restore the registry alias).
            restore: What a rollback restores, when not the spec that serves now (a promoted
                canary restores the stable model alone, not the stable model with its canary).

        Raises:
            InferenceServiceSpecError: ``service`` is invalid (nothing was applied).
            ServingError: A service of that name exists and is not managed by kubedl-prefect,
                its record's name is taken by another ConfigMap, the spec its record would
                restore has fields the renderer never writes (nothing was applied in these
                three cases), or the service was deleted while being waited on.
            InferenceServiceNotReadyError: It failed or timed out, and was rolled back.
            KubeAPIError: The API server refused the apply (RBAC, schema).
        """
        manifest = self.manifest(service)
        restored = None if restore is None else _encode(_view(self.manifest(restore)))
        if restore is not None and restore.name != service.name:
            raise KubeDLPrefectError(
                f"InferenceServiceDeployer.deploy refused: restore names {restore.name!r}, "
                f"not the service {service.name!r} it would restore",
                hint="pass the earlier spec of the same service as restore",
            )
        async with delivered(on_event, f"events of {service.name}") as callback:
            return await self._on_runtime(
                self._deploy(
                    manifest,
                    service,
                    timeout_s,
                    rollback_timeout_s,
                    callback,
                    on_rollback,
                    restored,
                )
            )

    async def _deploy(
        self,
        manifest: KubeObject,
        service: InferenceServiceSpec,
        timeout_s: float,
        rollback_timeout_s: float,
        emit: Callable[[InferenceServiceEvent], None] | None,
        on_rollback: RollbackCallback | None,
        restore: str | None,
    ) -> ServingOutcome:
        session = await self._sessions.session()
        client = session.client
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        current = await _get(client, namespace, name)
        if current is not None:
            _check_ours(current)
        record = ServingRecord.of(current, await read_record(client, namespace, name))
        previous = previous_spec(current, record, manifest) if restore is None else restore
        if previous is not None and restore is None:
            fields = foreign_fields(previous)
            if fields:
                raise forged(namespace, name, fields)
        answer = await client.apply(
            INFERENCE_SERVICES, namespace, manifest, field_manager=self.field_manager
        )
        await write_record(client, answer, ServingRecord(_encode(_view(manifest)), previous))
        before = int((current or {}).get("metadata", {}).get("generation") or 0)
        applied = _applied(answer, changed=current is None or _generation(answer) != before)
        _report(
            emit,
            events.APPLIED,
            answer,
            {"changed": str(applied.changed).lower(), "storageUri": service.storage_uri},
        )
        try:
            state = await self._wait(session, namespace, name, applied, timeout_s)
        except _NotReady as failure:
            failure = await _explained(client, namespace, name, manifest, failure)
            _report(
                emit,
                events.NOT_READY,
                answer,
                {
                    "reason": failure.state.reason,
                    "message": failure.state.message,
                    "timedOut": str(failure.timed_out).lower(),
                },
            )
            raise await self._roll_back(
                session, namespace, name, previous, failure, rollback_timeout_s, emit, on_rollback
            ) from None
        live = await client.get(INFERENCE_SERVICES, namespace, name)
        _report(emit, events.READY, live, {"url": state.url or "", "runtime": state.runtime or ""})
        return ServingOutcome(
            namespace=namespace,
            name=name,
            uid=str(live["metadata"].get("uid") or ""),
            generation=_generation(live),
            url=state.url,
            runtime=state.runtime,
            storage_uri=service.storage_uri,
            changed=applied.changed,
            readiness=state,
        )

    async def _wait(
        self,
        session: KubeSession,
        namespace: str,
        name: str,
        applied: Applied | None,
        timeout_s: float,
    ) -> Readiness:
        """Follow the service and its pods until Ready; raise :class:`_NotReady` otherwise."""
        client, hub = session.client, session.hub
        queue: EventQueue = asyncio.Queue()

        def is_service(obj: KubeObject) -> bool:
            return bool(obj["metadata"].get("name") == name)

        def is_pod(obj: KubeObject) -> bool:
            return bool((obj["metadata"].get("labels") or {}).get(ISVC_POD_LABEL) == name)

        async with contextlib.AsyncExitStack() as stack:
            for kind, accepts in ((INFERENCE_SERVICES, is_service), (PODS, is_pod)):
                await stack.enter_async_context(
                    hub.subscribe(client, kind, namespace, accepts, queue)
                )
            services = hub.informer(client, INFERENCE_SERVICES, namespace)
            pods = hub.informer(client, PODS, namespace)
            deadline = Deadline(timeout_s)
            state = Readiness(ServingState.PENDING, "NotSeen", "not in the shared watch yet")
            while True:
                obj = services.get(name)
                if obj is None:
                    if await _get(client, namespace, name) is None:
                        raise ServingError(
                            f"InferenceService {namespace}/{name} was deleted while being "
                            "waited on",
                            hint="someone or something deleted it; deploy again",
                        )
                    await next_event(queue)  # just applied: its event is on the way
                    continue
                state = readiness(obj, pods.by_label(ISVC_POD_LABEL, name), applied)
                if state.state is ServingState.READY:
                    return state
                if state.state is ServingState.FAILED:
                    raise _NotReady(state, timed_out=False)
                try:
                    await deadline.wait(queue, _TimedOut())
                except _TimedOut:
                    raise _NotReady(state, timed_out=True) from None

    async def _roll_back(
        self,
        session: KubeSession,
        namespace: str,
        name: str,
        previous: str | None,
        failure: _NotReady,
        timeout_s: float,
        emit: Callable[[InferenceServiceEvent], None] | None,
        on_rollback: RollbackCallback | None,
    ) -> InferenceServiceNotReadyError:
        """Restore ``previous`` (or delete the service); the error to raise, with what was done."""
        client = session.client
        what = failure.state
        verb = "did not become Ready" if failure.timed_out else "failed"
        notes: list[str] = []
        restored: KubeObject | None = None
        try:
            if previous is not None:
                restored = await client.apply(
                    INFERENCE_SERVICES,
                    namespace,
                    _from_view(previous, namespace, name),
                    field_manager=self.field_manager,
                )
                await write_record(client, restored, ServingRecord(previous, None))
                applied = _applied(restored, changed=True)
                try:
                    await self._wait(session, namespace, name, applied, timeout_s)
                    notes.append("the previous spec was restored and is Ready again")
                except _NotReady as again:
                    notes.append(
                        f"the previous spec was restored but is not Ready: {again.state.summary()}"
                    )
            else:
                await client.delete(INFERENCE_SERVICES, namespace, name, propagation="Background")
                notes.append("nothing was serving before, so the new service was deleted")
        except KubeDLPrefectError as exc:
            notes.append(f"the rollback failed: {exc.message}")
            return _not_ready(namespace, name, verb, what, failure.timed_out, False, notes)
        if on_rollback is not None:
            try:
                await asyncio.to_thread(on_rollback)
                notes.append("on_rollback ran (the registry alias was restored)")
            except Exception as exc:
                logger.exception("the rollback callback of %s/%s raised", namespace, name)
                notes.append(f"on_rollback raised: {exc}")
        _report(
            emit,
            events.ROLLED_BACK,
            restored or {"metadata": {"namespace": namespace, "name": name}},
            {"reason": what.reason, "restored": str(previous is not None).lower()},
        )
        return _not_ready(namespace, name, verb, what, failure.timed_out, True, notes)

    async def get(self, name: str, *, namespace: str | None = None) -> KubeObject | None:
        """The live service of that name, or ``None`` when there is none."""

        async def read() -> KubeObject | None:
            client = (await self._sessions.session()).client
            return await _get(client, namespace or self.namespace, name)

        return await self._on_runtime(read())

    async def status(self, name: str, *, namespace: str | None = None) -> Readiness:
        """The service's state now (read once, not awaited), whatever spec it serves."""

        async def read() -> Readiness:
            session = await self._sessions.session()
            where = namespace or self.namespace
            obj = await session.client.get(INFERENCE_SERVICES, where, name)
            listed = await session.client.list(
                PODS, where, label_selector=f"{ISVC_POD_LABEL}={name}"
            )
            return readiness(obj, listed.items)

        return await self._on_runtime(read())

    async def delete(self, name: str, *, namespace: str | None = None) -> None:
        """Delete a service we manage (idempotent).

        Raises:
            ServingError: It is not managed by kubedl-prefect.
        """

        async def remove() -> None:
            client = (await self._sessions.session()).client
            where = namespace or self.namespace
            current = await _get(client, where, name)
            if current is None:
                return
            _check_ours(current)
            await client.delete(INFERENCE_SERVICES, where, name, propagation="Background")

        await self._on_runtime(remove())


LOG_TAIL_LINES: Final = 80
"""How much of a failing container's log is read for the model server's own error."""


async def _explained(
    client: KubeClient, namespace: str, name: str, manifest: KubeObject, failure: _NotReady
) -> _NotReady:
    """``failure`` with the model server's own error from its log, when it logged one.

    Read from the container that tells why the applied spec's pods are not Ready
    (:func:`~.diagnosis.telling_container`); a log that cannot be read (no ``get`` on
    ``pods/log``, the pod gone) leaves the failure as it was, saying so.
    """
    labels = manifest["spec"]["predictor"].get("labels") or {}
    try:
        listed = await client.list(PODS, namespace, label_selector=f"{ISVC_POD_LABEL}={name}")
        source = telling_container(listed.items, labels)
        if source is None:
            return failure
        lines = await client.read_log(
            namespace,
            source.pod,
            source.container,
            tail_lines=LOG_TAIL_LINES,
            previous=source.previous,
        )
    except KubeDLPrefectError as exc:
        logger.info("no log of %s/%s's predictor to explain it: %s", namespace, name, exc)
        return failure
    error = server_error(lines)
    if error is None:
        return failure
    state = failure.state
    which = "its previous instance" if source.previous else "it"
    message = f"{state.message}; {source.container} of pod {source.pod} ({which}) logged: {error}"
    return _NotReady(replace(state, message=message.lstrip("; ")), timed_out=failure.timed_out)


def _not_ready(
    namespace: str,
    name: str,
    verb: str,
    state: Readiness,
    timed_out: bool,
    rolled_back: bool,
    notes: list[str],
) -> InferenceServiceNotReadyError:
    return InferenceServiceNotReadyError(
        f"InferenceService {namespace}/{name} {verb}: {state.summary()}; " + "; ".join(notes),
        namespace=namespace,
        name=name,
        reason=state.reason,
        timed_out=timed_out,
        rolled_back=rolled_back,
        hint=_hint(state.reason),
    )


_HINTS: Final = MappingProxyType(
    {
        "NoSupportingRuntime": "no ServingRuntime supports this model format and protocol: "
        "check model_format and protocol (MLflow models need v2), or install the runtime",
        "RuntimeNotRecognized": "the runtime named in the spec does not exist in the cluster",
        "RuntimeDisabled": "the chosen runtime is disabled; enable it or pick another",
        "ModelLoadFailed": "the model server could not load the files: check the version's "
        "compatibility (ModelRegistry.check_compatible) and the storage credentials",
        "ImagePullError": "the runtime's image cannot be pulled: check the image and pull secret",
        "CrashLoopBackOff": "read the predictor pod's log: the model server exits while loading",
        "RollingOut": "the new spec's pods did not become Ready while the old ones kept serving "
        "(KServe reports Ready from them): the message gives the pods' reason, such as more "
        "GPUs than any node has",
    }
)


def _hint(reason: str) -> str:
    return _HINTS.get(
        reason, "describe the InferenceService and its predictor pods for the full status"
    )


def _generation(obj: KubeObject) -> int:
    return int(obj["metadata"].get("generation") or 0)


def _applied(answer: KubeObject, *, changed: bool) -> Applied:
    return Applied(
        generation=_generation(answer),
        resource_version=str(answer["metadata"].get("resourceVersion") or ""),
        changed=changed,
    )


async def _get(client: KubeClient, namespace: str, name: str) -> KubeObject | None:
    try:
        return await client.get(INFERENCE_SERVICES, namespace, name)
    except NotFoundError:
        return None


def _check_ours(obj: KubeObject) -> None:
    metadata = obj["metadata"]
    if (metadata.get("labels") or {}).get(LABEL_MANAGED_BY) != MANAGED_BY:
        raise ServingError(
            f"InferenceService {metadata.get('namespace')}/{metadata['name']} exists and is not "
            "managed by kubedl-prefect; it is left alone",
            hint="deploy under another name, or delete it first",
        )


def _report(
    emit: Callable[[InferenceServiceEvent], None] | None,
    event: str,
    obj: KubeObject,
    payload: dict[str, str],
) -> None:
    if emit is None:
        return
    metadata = obj.get("metadata") or {}
    emit(
        InferenceServiceEvent(
            event=event,
            namespace=str(metadata.get("namespace") or ""),
            name=str(metadata.get("name") or ""),
            uid=str(metadata.get("uid") or ""),
            resource_version=str(metadata.get("resourceVersion") or ""),
            payload=MappingProxyType(payload),
        )
    )


class SyncInferenceServiceDeployer:
    """The blocking face of an :class:`InferenceServiceDeployer`, for sync code.

    Each method has the same signature as its async twin and runs it on the process-wide
    :class:`~kubedl_prefect.kube.runtime.KubeRuntime` loop.
    """

    def __init__(self, deployer: InferenceServiceDeployer):
        self.deployer = deployer

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return KubeRuntime.get().block_on(coro)

    def deploy(
        self,
        service: InferenceServiceSpec,
        *,
        timeout_s: float = 600.0,
        rollback_timeout_s: float = 300.0,
        on_event: ServingCallback | None = None,
        on_rollback: RollbackCallback | None = None,
        restore: InferenceServiceSpec | None = None,
    ) -> ServingOutcome:
        """Blocking :meth:`InferenceServiceDeployer.deploy`."""
        return self._run(
            self.deployer.deploy(
                service,
                timeout_s=timeout_s,
                rollback_timeout_s=rollback_timeout_s,
                on_event=on_event,
                on_rollback=on_rollback,
                restore=restore,
            )
        )

    def get(self, name: str, *, namespace: str | None = None) -> KubeObject | None:
        """Blocking :meth:`InferenceServiceDeployer.get`."""
        return self._run(self.deployer.get(name, namespace=namespace))

    def status(self, name: str, *, namespace: str | None = None) -> Readiness:
        """Blocking :meth:`InferenceServiceDeployer.status`."""
        return self._run(self.deployer.status(name, namespace=namespace))

    def delete(self, name: str, *, namespace: str | None = None) -> None:
        """Blocking :meth:`InferenceServiceDeployer.delete`."""
        return self._run(self.deployer.delete(name, namespace=namespace))

    def close(self) -> None:
        """Blocking :meth:`InferenceServiceDeployer.close`."""
        return self._run(self.deployer.close())
