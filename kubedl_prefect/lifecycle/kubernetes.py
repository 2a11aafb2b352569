"""The Kubernetes backend: training jobs as KubeDL or Kubeflow custom resources.

Submission is idempotent: the job's name is derived from the caller's key and the attempt, and it
carries labels and annotations naming its owner, key and spec hash. A submission that meets an
existing job (409) adopts it when it is ours and made from the same spec, and refuses otherwise,
so a flow that crashed and restarted re-attaches instead of launching a duplicate.

Waiting never polls: the job, its pods, PodGroups and events are followed through the shared
informers of :mod:`kubedl_prefect.kube.watch`; each change wakes the waiter, which re-reads the
informers' current objects and decides with the pure functions of :mod:`.status`,
:mod:`.admission` and :mod:`.diagnosis`.

All I/O runs on the process-wide :class:`~kubedl_prefect.kube.runtime.KubeRuntime` loop, so the
async methods can be awaited from any event loop and :class:`~.backend.SyncBackend` gives the same
methods to sync code.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from kubedl_prefect.errors import (
    AdmissionTimeoutError,
    AdoptionRefusedError,
    CompletionTimeoutError,
    ConflictError,
    JobCancelledError,
    JobFailedError,
    KubeAPIError,
    NotFoundError,
    StartupTimeoutError,
    WaitTimeoutError,
)
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.logs import ContainerLogLine, LogFollower
from kubedl_prefect.kube.resources import EVENTS, PODS, VOLCANO_PODGROUPS, KubeObject, ResourceKind
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.kube.watch import EventQueue, WatchHub, next_event
from kubedl_prefect.lifecycle.admission import AdmissionBlocker, AdmissionState, admission_state
from kubedl_prefect.lifecycle.backend import (
    JobOutcome,
    JobRef,
    LogCallback,
    LogLine,
    PhaseCallback,
    PhaseUpdate,
    WaitTimeouts,
    checkpoint_location,
)
from kubedl_prefect.lifecycle.diagnosis import (
    Diagnosis,
    FailureCategory,
    diagnose,
    replica_name,
    stuck_for_good,
)
from kubedl_prefect.lifecycle.status import JobStatus, Phase, job_status
from kubedl_prefect.spec import (
    CHECKPOINT_ENV,
    Dialect,
    RenderOptions,
    TrainingJobSpec,
    job_name,
    key_hash,
    render,
    spec_hash,
    validate,
)

T = TypeVar("T")

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "kubedl-prefect"
LABEL_KEY_HASH = "kubedl-prefect.io/key-hash"
LABEL_ATTEMPT = "kubedl-prefect.io/attempt"
ANNOTATION_KEY = "kubedl-prefect.io/key"
ANNOTATION_SPEC_HASH = "kubedl-prefect.io/spec-hash"

_SHARED_HUB: WatchHub | None = None


def shared_hub() -> WatchHub:
    """The process's one :class:`WatchHub` (must be called on the runtime loop)."""
    global _SHARED_HUB
    if _SHARED_HUB is None:
        _SHARED_HUB = WatchHub()
    return _SHARED_HUB


@dataclass(frozen=True)
class _JobObjects:
    """Selectors for the objects that belong to one job, per operator."""

    dialect: Dialect
    name: str

    @property
    def pod_label(self) -> tuple[str, str]:
        """The label (key, value) every pod of the job carries."""
        if self.dialect == Dialect.KUBEDL:
            return ("job-name", self.name)
        return ("training.kubeflow.org/job-name", self.name)

    def is_job(self, obj: KubeObject) -> bool:
        return bool(obj["metadata"]["name"] == self.name)

    def is_pod(self, obj: KubeObject) -> bool:
        labels = obj["metadata"].get("labels") or {}
        if self.dialect == Dialect.KUBEDL:
            return bool(
                labels.get("group-name") == "training.kubedl.io"
                and labels.get("job-name") == self.name
            )
        return bool(labels.get("training.kubeflow.org/job-name") == self.name)

    def is_podgroup(self, obj: KubeObject) -> bool:
        if self.dialect == Dialect.KUBEDL:
            labels = obj["metadata"].get("labels") or {}
            return bool(labels.get("kubedl.io/gang-job-name") == self.name)
        return bool(obj["metadata"]["name"] == self.name)


class KubernetesBackend:
    """Runs training jobs on a Kubernetes cluster through the KubeDL or Kubeflow operator.

    Args:
        namespace: Where jobs are created.
        dialect: Which operator runs them (``kubedl`` or ``kubeflow``).
        kubeconfig: Path of a kubeconfig; ``None`` for ``$KUBECONFIG`` or ``~/.kube/config``.
        context: The kubeconfig context to use.
        client_factory: Makes the client instead (in-cluster, tests); called on the runtime loop.

    Example:
        >>> backend = KubernetesBackend(namespace="ml", dialect="kubedl")  # doctest: +SKIP
        >>> ref = await backend.submit(spec, key="nightly-2026-11-30")  # doctest: +SKIP
        >>> outcome = await backend.wait_completed(ref)  # doctest: +SKIP
    """

    name = "kubernetes"

    def __init__(
        self,
        *,
        namespace: str = "default",
        dialect: Dialect | str = Dialect.KUBEDL,
        kubeconfig: str | None = None,
        context: str | None = None,
        client_factory: Callable[[], Coroutine[Any, Any, KubeClient]] | None = None,
    ):
        self.namespace = namespace
        self.dialect = Dialect(dialect)
        self._kubeconfig = kubeconfig
        self._context = context
        self._client_factory = client_factory
        self._client: KubeClient | None = None

    async def _on_runtime(self, coro: Coroutine[Any, Any, T]) -> T:
        return await KubeRuntime.get().run(coro)

    async def client(self) -> KubeClient:
        """The backend's client, created on first use on the runtime loop."""
        return await self._on_runtime(self._get_client())

    async def _get_client(self) -> KubeClient:
        if self._client is None:
            if self._client_factory is not None:
                self._client = await self._client_factory()
            else:
                self._client = await KubeClient.from_kubeconfig(
                    self._kubeconfig, context=self._context
                )
        return self._client

    async def close(self) -> None:
        """Close the backend's client (shared watches of other backends go on)."""

        async def _close() -> None:
            if self._client is not None:
                await self._client.close()
                self._client = None

        await self._on_runtime(_close())

    # -- submit or adopt -------------------------------------------------------------------

    def manifest(self, spec: TrainingJobSpec, *, key: str, attempt: int = 1) -> KubeObject:
        """The job object :meth:`submit` would create for ``(key, attempt)`` (pure)."""
        validate(spec, self.dialect)
        name = job_name(spec.name, key, attempt)
        extra_env: dict[str, str] = {}
        checkpoint = checkpoint_location(spec, key)
        if checkpoint is not None:
            extra_env[CHECKPOINT_ENV] = checkpoint
        options = RenderOptions(
            job_name=name,
            namespace=self.namespace,
            labels={
                LABEL_MANAGED_BY: MANAGED_BY,
                LABEL_KEY_HASH: key_hash(key),
                LABEL_ATTEMPT: str(attempt),
            },
            annotations={ANNOTATION_KEY: key, ANNOTATION_SPEC_HASH: spec_hash(spec)},
            env=extra_env,
        )
        return render(spec, self.dialect, options)

    async def submit(
        self, spec: TrainingJobSpec, *, key: str, attempt: int = 1, dry_run: bool = False
    ) -> JobRef:
        """Create the job for ``(key, attempt)``, or adopt the one that already exists.

        Raises:
            SpecError: The spec is invalid for this backend's operator (nothing was sent).
            AdoptionRefusedError: A job of that name exists but is not ours or differs.
            KubeAPIError: The API server refused the job (422: schema; 403: RBAC).
        """
        manifest = self.manifest(spec, key=key, attempt=attempt)
        return await self._on_runtime(self._submit(manifest, key, attempt, dry_run))

    async def _submit(self, manifest: KubeObject, key: str, attempt: int, dry_run: bool) -> JobRef:
        client = await self._get_client()
        kind = ResourceKind.of(manifest)
        name = manifest["metadata"]["name"]
        try:
            created = await client.create(kind, self.namespace, manifest, dry_run=dry_run)
        except ConflictError:
            existing = await client.get(kind, self.namespace, name)
            self._check_adoptable(existing, manifest)
            created = existing
        return self._ref(created, key, attempt)

    def _check_adoptable(self, existing: KubeObject, wanted: KubeObject) -> None:
        name = existing["metadata"]["name"]
        labels = existing["metadata"].get("labels") or {}
        annotations = existing["metadata"].get("annotations") or {}
        want = wanted["metadata"]["annotations"]
        if (
            labels.get(LABEL_MANAGED_BY) != MANAGED_BY
            or annotations.get(ANNOTATION_KEY) != want[ANNOTATION_KEY]
        ):
            raise AdoptionRefusedError(
                f"{existing['kind']} {self.namespace}/{name} already exists and was not created "
                "by kubedl-prefect for this key",
                status=409,
                reason="AlreadyExists",
                hint="delete it, or submit with another key or spec name",
            )
        if annotations.get(ANNOTATION_SPEC_HASH) != want[ANNOTATION_SPEC_HASH]:
            raise AdoptionRefusedError(
                f"{existing['kind']} {self.namespace}/{name} exists for this key but was made "
                f"from another spec (spec hash {annotations.get(ANNOTATION_SPEC_HASH)}, now "
                f"{want[ANNOTATION_SPEC_HASH]})",
                status=409,
                reason="AlreadyExists",
                hint="a changed spec needs a new key (or cancel the old job first)",
            )

    def _ref(self, obj: KubeObject, key: str, attempt: int) -> JobRef:
        metadata = obj["metadata"]
        return JobRef(
            backend=self.name,
            namespace=self.namespace,
            name=metadata["name"],
            uid=metadata.get("uid", ""),
            api_version=obj["apiVersion"],
            kind=obj["kind"],
            key=key,
            attempt=attempt,
            spec_hash=(metadata.get("annotations") or {}).get(ANNOTATION_SPEC_HASH, ""),
        )

    # -- following a job -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _follow(
        self, ref: JobRef, *, events: bool = True, require_job: bool = True
    ) -> AsyncIterator[tuple[_JobView, EventQueue]]:
        """Subscribe to the job, its pods, PodGroups (and events) through the shared informers.

        With ``require_job``, it first waits until the informer holds the job: a job created a
        moment ago may not have reached a shared watch yet, which must not read as a deletion.
        """
        client = await self._get_client()
        hub = shared_hub()
        job_kind = _job_kind(ref)
        select = _JobObjects(self.dialect, ref.name)
        queue: EventQueue = asyncio.Queue()
        async with contextlib.AsyncExitStack() as stack:
            kinds: list[tuple[ResourceKind, Callable[[KubeObject], bool]]] = [
                (job_kind, select.is_job),
                (PODS, select.is_pod),
                (VOLCANO_PODGROUPS, select.is_podgroup),
            ]
            if events:
                kinds.append((EVENTS, lambda e: _event_about(e, ref.name)))
            for kind, accepts in kinds:
                await stack.enter_async_context(
                    hub.subscribe(client, kind, self.namespace, accepts, queue)
                )
            jobs = hub.informer(client, job_kind, self.namespace)
            pods = hub.informer(client, PODS, self.namespace)
            podgroups = hub.informer(client, VOLCANO_PODGROUPS, self.namespace)
            event_log = hub.informer(client, EVENTS, self.namespace) if events else None
            view = _JobView(
                ref,
                job=lambda: [job] if (job := jobs.get(ref.name)) is not None else [],
                pods=lambda: [p for p in pods.by_label(*select.pod_label) if select.is_pod(p)],
                podgroups=lambda: podgroups.select(select.is_podgroup),
                events=lambda: (
                    event_log.select(lambda e: _event_about(e, ref.name)) if event_log else []
                ),
            )
            while require_job and not view.job():
                try:
                    await client.get(job_kind, self.namespace, ref.name)
                except NotFoundError as exc:
                    raise view.deleted() from exc
                await next_event(queue)  # its ADDED event is on the way
            yield view, queue

    async def wait_admitted(
        self,
        ref: JobRef,
        *,
        timeout_s: float | None,
        on_phase: PhaseCallback | None = None,
        delete_on_timeout: bool = True,
    ) -> AdmissionState:
        """Wait until every replica is scheduled (the gang is admitted).

        Raises:
            AdmissionTimeoutError: Not admitted in time; carries the last reason. The job is
                deleted first unless ``delete_on_timeout`` is false.
            JobFailedError: The job failed before it was admitted.
            JobCancelledError: The job was deleted meanwhile.
        """
        try:
            return await self._on_runtime(self._wait_admitted(ref, timeout_s, on_phase))
        except AdmissionTimeoutError:
            if delete_on_timeout:
                await self.cancel(ref)
            raise

    async def _wait_admitted(
        self, ref: JobRef, timeout_s: float | None, on_phase: PhaseCallback | None
    ) -> AdmissionState:
        deadline = _Deadline(timeout_s)
        async with self._follow(ref) as (view, queue):
            tracker = _PhaseTracker(on_phase)
            while True:
                job = view.current_job()
                admission = view.admission(job)
                status = job_status(job)
                tracker.observe(status, admission)
                if admission.admitted or status.phase in (Phase.RUNNING, Phase.SUCCEEDED):
                    return admission
                if status.phase == Phase.FAILED:
                    raise self._failed(view, job, status)
                await deadline.wait(queue, _admission_timeout(ref, timeout_s, admission))

    async def phases(self, ref: JobRef) -> AsyncIterator[PhaseUpdate]:
        """Yield each change of the job's phase or replica counts, until it is terminal.

        Must be iterated on the runtime loop; :meth:`wait_completed` is the portable way.
        """
        async with self._follow(ref) as (view, queue):
            tracker = _PhaseTracker(None)
            while True:
                job = view.current_job()
                update = tracker.observe(job_status(job), view.admission(job))
                if update is not None:
                    yield update
                    if update.phase.terminal:
                        return
                await next_event(queue)

    async def wait_completed(
        self,
        ref: JobRef,
        *,
        timeouts: WaitTimeouts = WaitTimeouts(),
        on_phase: PhaseCallback | None = None,
    ) -> JobOutcome:
        """Follow the job until Succeeded or Failed, through admission, start-up and running.

        A failure is returned diagnosed (``outcome.diagnosis``), not raised, so that the caller
        decides about retries.

        Raises:
            AdmissionTimeoutError, StartupTimeoutError, CompletionTimeoutError: A phase ran out
                of time (the job is left as it is).
            JobCancelledError: The job was deleted meanwhile.
        """
        return await self._on_runtime(self._wait_completed(ref, timeouts, on_phase))

    async def _wait_completed(
        self, ref: JobRef, timeouts: WaitTimeouts, on_phase: PhaseCallback | None
    ) -> JobOutcome:
        async with self._follow(ref) as (view, queue):
            tracker = _PhaseTracker(on_phase)
            stage, deadline = "admission", _Deadline(timeouts.admission_s)
            while True:
                job = view.current_job()
                status = job_status(job)
                admission = view.admission(job)
                tracker.observe(status, admission)
                if status.phase.terminal:
                    diagnosis = None
                    if status.phase == Phase.FAILED:
                        pods = view.pods()
                        diagnosis = diagnose(
                            job,
                            pods=pods,
                            events=view.events(),
                            log_tails=await self._failed_log_tails(pods),
                        )
                    return JobOutcome(ref, status, diagnosis, tuple(tracker.history))
                stuck = stuck_for_good(view.pods()) or _past_active_deadline(job, status)
                if stuck is not None:
                    # The operator would leave it pending for ever: fail it now and free the GPUs.
                    await self._cancel(ref, timeouts.cancel_s)
                    failed = JobStatus(
                        phase=Phase.FAILED,
                        reason=str(stuck.category),
                        message=stuck.message,
                        replicas=status.replicas,
                        resource_version=status.resource_version,
                    )
                    return JobOutcome(ref, failed, stuck, tuple(tracker.history))
                if stage == "admission" and (
                    admission.admitted
                    or (status.phase != Phase.CREATED and status.phase != Phase.QUEUING)
                ):
                    stage, deadline = "startup", _Deadline(timeouts.startup_s)
                if stage == "startup" and status.phase in (Phase.RUNNING, Phase.RESTARTING):
                    stage, deadline = "completion", _Deadline(timeouts.completion_s)
                overdue_in = _seconds_until_overdue(job, status)
                try:
                    async with asyncio.timeout(overdue_in):
                        await deadline.wait(
                            queue, _timeout(ref, stage, timeouts, status, admission)
                        )
                except TimeoutError:
                    continue  # the active deadline passed: the next round fails the job

    async def _failed_log_tails(
        self, pods: list[KubeObject], *, limit: int = 8
    ) -> dict[str, list[str]]:
        """Last log lines of replicas whose containers exited with an error (best effort).

        They let the diagnosis see causes only logs tell (an NCCL timeout). A log that cannot be
        read (the node is gone, RBAC) is left out rather than failing the wait.
        """
        client = await self._get_client()
        tails: dict[str, list[str]] = {}
        failed = [p for p in pods if _has_failed_container(p)][:limit]
        for pod in failed:
            for container in (pod.get("spec") or {}).get("containers") or []:
                try:
                    lines = await client.read_log(
                        pod["metadata"]["namespace"], pod["metadata"]["name"], container["name"]
                    )
                except KubeAPIError:
                    continue
                tails.setdefault(replica_name(pod), []).extend(lines)
        return tails

    def _failed(self, view: _JobView, job: KubeObject, status: JobStatus) -> JobFailedError:
        diagnosis = diagnose(job, pods=view.pods(), events=view.events())
        return JobFailedError(
            f"{view.ref.kind} {view.ref.namespace}/{view.ref.name} failed: {diagnosis.summary()}",
            hint=diagnosis.hint,
            retryable=diagnosis.retryable,
        )

    async def follow_logs(self, ref: JobRef, on_line: LogCallback) -> None:
        """Deliver every replica's log lines until the job ends and its containers have exited.

        Each line is labelled with its replica (``worker-1``); pods re-created by the operator
        and broken streams are followed on without losing or repeating lines.
        """
        await self._on_runtime(self._follow_logs(ref, on_line))

    async def _follow_logs(self, ref: JobRef, on_line: LogCallback) -> None:
        client = await self._get_client()

        def deliver(line: ContainerLogLine) -> None:
            on_line(
                LogLine(
                    replica=replica_name(line.pod),
                    container=line.container,
                    timestamp=line.timestamp,
                    text=line.text,
                    attempt=ref.attempt,
                )
            )

        follower = LogFollower(client, deliver)
        try:
            async with self._follow(ref, events=False) as (view, queue):
                ended = False
                while True:
                    for pod in view.pods():
                        follower.update(pod)
                    jobs = view.job()
                    ended = ended or not jobs or job_status(jobs[0]).phase.terminal
                    if ended:
                        await follower.finish()
                        return
                    waiting: set[asyncio.Future[Any]] = {asyncio.ensure_future(next_event(queue))}
                    if follower.following:
                        waiting.add(asyncio.ensure_future(follower.wait()))
                    done, pending = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                    for task in pending:
                        task.cancel()
                    for task in done:
                        task.result()  # raises the informer's or a stream's error, if any
        finally:
            await follower.close()

    # -- cancel ----------------------------------------------------------------------------

    async def cancel(self, ref: JobRef, *, timeout_s: float = 120.0) -> None:
        """Delete the job (foreground propagation) and wait until its pods and PodGroups are gone.

        Idempotent: cancelling a job that is already gone returns at once.

        Raises:
            WaitTimeoutError: Something was still there after ``timeout_s``.
        """
        await self._on_runtime(self._cancel(ref, timeout_s))

    async def _cancel(self, ref: JobRef, timeout_s: float) -> None:
        client = await self._get_client()
        await client.delete(_job_kind(ref), ref.namespace, ref.name, propagation="Foreground")
        deadline = _Deadline(timeout_s)
        async with self._follow(ref, events=False, require_job=False) as (view, queue):
            while True:
                left = [
                    f"{kind}/{obj['metadata']['name']}"
                    for kind, objects in (
                        (ref.kind, view.job()),
                        ("Pod", view.pods()),
                        ("PodGroup", view.podgroups()),
                    )
                    for obj in objects
                ]
                if not left:
                    return
                names = ", ".join(left[:5])
                await deadline.wait(
                    queue,
                    WaitTimeoutError(
                        f"cancelling {ref.kind} {ref.namespace}/{ref.name}: still present after "
                        f"{timeout_s:g}s: {names}",
                        timeout_s=timeout_s,
                        last_reason=names,
                        hint="check for finalizers on these objects",
                    ),
                )


class _JobView:
    """The current objects of one job, read from the shared informers."""

    def __init__(
        self,
        ref: JobRef,
        *,
        job: Callable[[], list[KubeObject]],
        pods: Callable[[], list[KubeObject]],
        podgroups: Callable[[], list[KubeObject]],
        events: Callable[[], list[KubeObject]],
    ):
        self.ref = ref
        self.job, self.pods, self.podgroups, self.events = job, pods, podgroups, events

    def deleted(self) -> JobCancelledError:
        return JobCancelledError(
            f"{self.ref.kind} {self.ref.namespace}/{self.ref.name} was deleted while being "
            "waited on",
            hint="someone or something deleted it (a cancellation, TTL, or kubectl delete)",
        )

    def current_job(self) -> KubeObject:
        jobs = self.job()
        if not jobs or (self.ref.uid and jobs[0]["metadata"].get("uid") != self.ref.uid):
            raise self.deleted()
        return jobs[0]

    def admission(self, job: KubeObject) -> AdmissionState:
        return admission_state(
            job, pods=self.pods(), podgroups=self.podgroups(), events=self.events()
        )


class _PhaseTracker:
    """Turns observed states into :class:`PhaseUpdate`s, reporting each change once."""

    def __init__(self, callback: PhaseCallback | None):
        self.callback = callback
        self.history: list[PhaseUpdate] = []
        self._last: tuple[Phase, str, Any] | None = None

    def observe(self, status: JobStatus, admission: AdmissionState) -> PhaseUpdate | None:
        phase = status.phase
        if phase in (Phase.CREATED, Phase.QUEUING):
            if admission.admitted:
                phase = Phase.ADMITTED
            elif admission.blocker not in (None, AdmissionBlocker.NOT_CREATED):
                phase = Phase.QUEUING
        # While queued, a new reason is news too: it is what the user waits on.
        reason = admission.reason if phase == Phase.QUEUING else ""
        key = (phase, reason, tuple(sorted(status.replicas.items())))
        if key == self._last:
            return None
        self._last = key
        update = PhaseUpdate(
            phase=phase,
            status=status,
            admission=admission if phase in (Phase.QUEUING, Phase.ADMITTED) else None,
            observed_at=time.time(),
        )
        self.history.append(update)
        if self.callback is not None:
            self.callback(update)
        return update


class _Deadline:
    """A deadline on the monotonic clock; ``None`` waits for ever."""

    def __init__(self, timeout_s: float | None):
        self.timeout_s = timeout_s
        self.at = None if timeout_s is None else time.monotonic() + timeout_s

    async def wait(self, queue: EventQueue, error: Exception) -> None:
        """Wait for the next event; raise ``error`` if the deadline passes first."""
        if self.at is None:
            await next_event(queue)
            return
        left = self.at - time.monotonic()
        if left <= 0:
            raise error
        try:
            async with asyncio.timeout(left):
                await next_event(queue)
        except TimeoutError:
            raise error from None


ACTIVE_DEADLINE_GRACE_S = 15.0
"""How long past ``activeDeadlineSeconds`` we wait for the operator before failing the job."""


def _active_deadline_at(job: KubeObject, status: JobStatus) -> float | None:
    """Wall-clock time by which the operator should have failed the job, if it has a deadline."""
    spec = job.get("spec") or {}
    seconds = spec.get("activeDeadlineSeconds") or (spec.get("runPolicy") or {}).get(
        "activeDeadlineSeconds"
    )
    if not seconds or not status.start_time:
        return None
    started = dt.datetime.fromisoformat(status.start_time.replace("Z", "+00:00")).timestamp()
    return started + float(seconds) + ACTIVE_DEADLINE_GRACE_S


def _seconds_until_overdue(job: KubeObject, status: JobStatus) -> float | None:
    at = _active_deadline_at(job, status)
    return None if at is None else max(at - time.time(), 0.0)


def _past_active_deadline(job: KubeObject, status: JobStatus) -> Diagnosis | None:
    """A job the operator left running past its active deadline (some versions never fail it)."""
    at = _active_deadline_at(job, status)
    if at is None or time.time() < at:
        return None
    return Diagnosis(
        category=FailureCategory.DEADLINE_EXCEEDED,
        retryable=False,
        replica=None,
        exit_code=None,
        message=f"the job ran past activeDeadlineSeconds (started {status.start_time}) and the "
        "operator did not stop it; kubedl-prefect deleted it",
        hint="raise activeDeadlineSeconds or make the run shorter",
    )


def _has_failed_container(pod: KubeObject) -> bool:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            if int((state.get("terminated") or {}).get("exitCode") or 0) != 0:
                return True
    return False


def _job_kind(ref: JobRef) -> ResourceKind:
    return ResourceKind.of({"apiVersion": ref.api_version, "kind": ref.kind})


def _event_about(event: KubeObject, job: str) -> bool:
    involved = str((event.get("involvedObject") or {}).get("name") or "")
    return involved == job or involved.startswith(f"{job}-")


def _admission_hint(admission: AdmissionState) -> str:
    hints = {
        AdmissionBlocker.INSUFFICIENT_GPU: "ask for fewer GPUs per replica or fewer replicas, or "
        "wait for GPUs to free up",
        AdmissionBlocker.INSUFFICIENT_RESOURCES: "lower the replicas' CPU/memory requests",
        AdmissionBlocker.UNBOUND_PVC: "create the PersistentVolumeClaim or fix its storage class",
        AdmissionBlocker.UNTOLERATED_TAINT: "add a toleration for the nodes' taint to the spec",
        AdmissionBlocker.QUOTA: "raise the namespace's ResourceQuota or the Volcano queue's "
        "capability",
    }
    default = "describe the job's pods and PodGroups"
    return hints.get(admission.blocker, default) if admission.blocker else default


def _admission_timeout(
    ref: JobRef, timeout_s: float | None, admission: AdmissionState
) -> AdmissionTimeoutError:
    return AdmissionTimeoutError(
        f"{ref.kind} {ref.namespace}/{ref.name} was not admitted within {timeout_s or 0:g}s: "
        f"{admission.reason}",
        timeout_s=timeout_s or 0.0,
        last_reason=admission.reason,
        hint=_admission_hint(admission),
    )


def _timeout(
    ref: JobRef, stage: str, timeouts: WaitTimeouts, status: JobStatus, admission: AdmissionState
) -> WaitTimeoutError:
    where = f"{ref.kind} {ref.namespace}/{ref.name}"
    if stage == "admission":
        return _admission_timeout(ref, timeouts.admission_s, admission)
    if stage == "startup":
        return StartupTimeoutError(
            f"{where} was admitted but did not start within {timeouts.startup_s or 0:g}s "
            f"(phase {status.phase})",
            timeout_s=timeouts.startup_s or 0.0,
            last_reason=status.message or str(status.phase),
        )
    return CompletionTimeoutError(
        f"{where} did not finish within {timeouts.completion_s or 0:g}s (phase {status.phase})",
        timeout_s=timeouts.completion_s or 0.0,
        last_reason=status.message or str(status.phase),
    )
