"""The Kubernetes backend: training jobs as KubeDL or Kubeflow custom resources.

Submission is idempotent: the job's name is derived from the caller's key and the attempt, and it
carries labels and annotations naming its owner, key and spec hash. A submission that meets an
existing job (409) adopts it when it is ours and made from the same spec, and refuses otherwise,
so a flow that crashed and restarted re-attaches instead of launching a duplicate.

Each logical job also has a small record, a ConfigMap named ``<spec name>-<key hash>`` labelled
like its jobs (the label contract is :mod:`.ownership`, the store :mod:`.record_store`):
submission adds each attempt, and a wait that sees an attempt end adds how it ended. A replay
finds there what happened even after the jobs were cleaned up.

Waiting never polls: the job, its pods, PodGroups and events are followed through the shared
informers of the cluster's :class:`~kubedl_prefect.kube.session.KubeSession`; each change wakes
the waiter, which re-reads the informers' current objects and decides with the pure functions of
:mod:`.status`, :mod:`.admission` (with :mod:`.blockers`) and :mod:`.diagnosis`. While a job
has not started, the cluster objects it refers to are read for that decision by :mod:`.facts`,
once per wait; a cause that can never clear fails the job at once, and deletes it. Every call
works on the namespace and dialect of the reference it is given, not the backend's defaults.

All I/O runs on the process-wide :class:`~kubedl_prefect.kube.runtime.KubeRuntime` loop, so the
async methods can be awaited from any event loop and :class:`~.backend.SyncTrainingBackend` gives
the same methods to sync code. Callbacks run on threads of their own (:mod:`.delivery`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from kubedl_prefect.errors import (
    AdmissionTimeoutError,
    AdoptionRefusedError,
    ConflictError,
    ForbiddenError,
    JobCancelledError,
    JobFailedError,
    KubeAPIError,
    KubeDLPrefectError,
    NotFoundError,
    SpecError,
    WaitTimeoutError,
)
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.credentials import Credentials
from kubedl_prefect.kube.deadline import Deadline
from kubedl_prefect.kube.delivery import delivered
from kubedl_prefect.kube.labels import LABEL_MANAGED_BY, MANAGED_BY
from kubedl_prefect.kube.logs import ContainerLogLine, LogFollower
from kubedl_prefect.kube.resources import (
    EVENTS,
    KUEUE_CLUSTER_QUEUES,
    KUEUE_WORKLOADS,
    PODS,
    VOLCANO_PODGROUPS,
    KubeObject,
    ResourceKind,
)
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.kube.session import KubeSession, SessionHandle, SessionPool, resolve_credentials
from kubedl_prefect.kube.watch import EventQueue, next_event
from kubedl_prefect.lifecycle.admission import AdmissionState
from kubedl_prefect.lifecycle.backend import (
    JobOutcome,
    JobRef,
    LogCallback,
    LogLine,
    PhaseCallback,
    PhaseUpdate,
    WaitTimeouts,
    attempt_ended,
    attempt_started,
    check_backend_of,
    checkpoint_location,
    namespace_problem,
)
from kubedl_prefect.lifecycle.diagnosis import Diagnosis, diagnose, replica_name, stuck_for_good
from kubedl_prefect.lifecycle.kubernetes.admission import admission_state
from kubedl_prefect.lifecycle.kubernetes.blockers import fact_request
from kubedl_prefect.lifecycle.kubernetes.cluster import FactRequest
from kubedl_prefect.lifecycle.kubernetes.dialects import (
    JobObjects,
    job_kind,
    read_runtime,
    runtime_kind,
)
from kubedl_prefect.lifecycle.kubernetes.facts import FactReader, operator_missing
from kubedl_prefect.lifecycle.kubernetes.kueue import (
    admitted_by,
    admitting_queue,
    job_workload,
    kueue_queue,
    kueue_request,
    queue_hold,
)
from kubedl_prefect.lifecycle.kubernetes.leftovers import adelete_leftovers
from kubedl_prefect.lifecycle.kubernetes.ownership import (
    adoption_problem,
    attempt_of,
    key_of,
    owner_annotations,
    owner_labels,
    spec_hash_of,
)
from kubedl_prefect.lifecycle.kubernetes.record_store import read_record, write_record
from kubedl_prefect.lifecycle.records import (
    AttemptRecord,
    RunRecord,
    other_spec,
    record_name,
    record_name_of,
    recorded_failure,
)
from kubedl_prefect.lifecycle.replicas import ReplicaState, replica_states
from kubedl_prefect.lifecycle.status import JobStatus, Phase, job_status, queued_status
from kubedl_prefect.lifecycle.waiting import (
    PhaseTracker,
    ReasonKeeper,
    admission_timeout,
    past_active_deadline,
    phase_timeout,
    seconds_until_overdue,
)
from kubedl_prefect.spec import (
    CHECKPOINT_ENV,
    Dialect,
    Framework,
    RenderOptions,
    TrainingJobSpec,
    job_name,
    job_resource,
    render,
    spec_hash,
    validate,
)
from kubedl_prefect.spec.kueue import JOB_UID_LABEL
from kubedl_prefect.spec.renderers.trainer import fit_runtime_patches, runtime_issues

logger = logging.getLogger(__name__)

T = TypeVar("T")

_OUTAGE_PATIENCE_S = 60.0
"""How long submissions, record reads and a starting wait ride out an unreachable API server."""
_FORBIDDEN_TRIES = 4
"""Tries of a submission or record read answered 403 (a restarted API server's RBAC warm-up)."""


class KubernetesBackend:
    """Runs training jobs on a Kubernetes cluster through the KubeDL or Kubeflow operator.

    A light handle: every backend of the process with the same credentials shares one session
    (one client, one watch per kind and namespace); :meth:`close` releases this handle's share.

    Args:
        namespace: Where :meth:`submit` creates jobs (every other call uses the reference's).
        dialect: Which operator :meth:`submit` renders for (``kubedl`` or ``kubeflow``).
        credentials: How to reach the cluster (a kubeconfig file or its content, a bearer token,
            in-cluster); by default ``$KUBECONFIG``/``~/.kube/config``, else the pod's account.
        kubeconfig: Shorthand for ``credentials=KubeconfigFile(kubeconfig, context)``.
        context: The kubeconfig context to use (with ``kubeconfig``).
        pool: The session pool to share (the process's one by default).
        labels: Extra labels for the jobs :meth:`submit` creates (for example the Prefect flow
            run that made them, so that its clean-up finds them). They are not part of the spec
            hash: a job adopted by another backend keeps the labels it was created with.

    Example:
        >>> from kubedl_prefect.kube.credentials import KubeconfigFile
        >>> backend = KubernetesBackend(namespace="ml", dialect="kubedl",
        ...                             credentials=KubeconfigFile(context="gpu-cluster"))
        >>> backend.namespace, backend.dialect
        ('ml', <Dialect.KUBEDL: 'kubedl'>)
    """

    name = "kubernetes"

    def __init__(
        self,
        *,
        namespace: str = "default",
        dialect: Dialect | str = Dialect.KUBEDL,
        credentials: Credentials | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        pool: SessionPool | None = None,
        labels: Mapping[str, str] | None = None,
    ):
        resolved = resolve_credentials("KubernetesBackend", credentials, kubeconfig, context)
        _check_namespace(namespace)
        self.namespace = namespace
        self.dialect = Dialect(dialect)
        self.credentials = resolved
        self.labels = dict(labels or {})
        self._writing: set[asyncio.Task[None]] = set()
        self._handle = SessionHandle(self.credentials, pool, before_release=self._flush_records)

    def __repr__(self) -> str:
        return (
            f"KubernetesBackend(namespace={self.namespace!r}, dialect={self.dialect.value!r}, "
            f"credentials={self.credentials!r})"
        )

    async def _on_runtime(self, coro: Coroutine[Any, Any, T]) -> T:
        return await KubeRuntime.get().run(coro)

    async def session(self) -> KubeSession:
        """The shared session of this backend's cluster identity, acquired on first use."""
        return await self._handle.session()

    async def client(self) -> KubeClient:
        """The shared client of this backend's cluster identity."""
        return (await self.session()).client

    async def _get_session(self) -> KubeSession:
        return await self._handle.acquire()

    async def _get_client(self) -> KubeClient:
        return (await self._get_session()).client

    async def close(self) -> None:
        """Release this handle's share of the session (other backends' waits go on).

        The backend can still be used afterwards: it acquires the session again.
        """
        await self._handle.close()

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
            labels={**self.labels, **owner_labels(key, attempt=attempt)},
            annotations=owner_annotations(key, spec_hash(spec)),
            env=extra_env,
        )
        return render(spec, self.dialect, options)

    async def submit(
        self, spec: TrainingJobSpec, *, key: str, attempt: int = 1, dry_run: bool = False
    ) -> JobRef:
        """Create the job for ``(key, attempt)``, or adopt the one that already exists.

        The attempt is added to the logical job's record (not for a dry run).

        Raises:
            SpecError: The spec is invalid for this backend's operator (nothing was sent).
            AdoptionRefusedError: A job of that name exists but is not ours or differs, or the
                logical job was recorded for another spec.
            KubeAPIError: The API server refused the job (422: schema; 403: RBAC).
        """
        manifest = self.manifest(spec, key=key, attempt=attempt)
        # Safe to repeat: a create whose answer was lost meets its job and adopts it.
        return await self._on_runtime(
            _outlasting_outages(lambda: self._submit(spec, manifest, key, attempt, dry_run))
        )

    async def _submit(
        self, spec: TrainingJobSpec, manifest: KubeObject, key: str, attempt: int, dry_run: bool
    ) -> JobRef:
        client = await self._get_client()
        kind = ResourceKind.of(manifest)
        name = manifest["metadata"]["name"]
        adopted_ended = False
        if self.dialect == Dialect.TRAINER:
            # The runtime names its replicated Jobs; our runtime patch must name the same.
            runtime = await read_runtime(client, self.namespace, manifest)
            if runtime is not None:
                issues = runtime_issues(spec, runtime)
                if issues:
                    raise SpecError(
                        issues, source=f"{spec.name} (for runtime {runtime_kind(manifest)[1]})"
                    )
                manifest = fit_runtime_patches(manifest, runtime)
        try:
            created = await client.create(kind, self.namespace, manifest, dry_run=dry_run)
        except NotFoundError as exc:
            missing = await operator_missing(client, kind, spec.framework, self.dialect)
            if missing is None:
                raise
            raise missing from exc
        except ConflictError:
            existing = await client.get(kind, self.namespace, name)
            problem = adoption_problem(
                existing, manifest["metadata"]["annotations"], self.namespace
            )
            if problem is not None:
                raise problem from None
            created = existing
            # An adopted job that has ended keeps the end its waiter recorded.
            adopted_ended = job_status(existing).phase.terminal
        ref = self._ref(created, key, attempt, client.server)
        if not dry_run and not adopted_ended:
            await write_record(
                client,
                ref,
                spec.name,
                attempt_started(ref),
            )
        return ref

    def _ref(self, obj: KubeObject, key: str, attempt: int, server: str) -> JobRef:
        metadata = obj["metadata"]
        return JobRef(
            backend=self.name,
            cluster=server,
            dialect=self.dialect.value,
            namespace=self.namespace,
            name=metadata["name"],
            uid=metadata.get("uid", ""),
            api_version=obj["apiVersion"],
            kind=obj["kind"],
            key=key,
            attempt=attempt,
            spec_hash=spec_hash_of(obj),
        )

    # -- records of logical jobs -----------------------------------------------------------

    async def history(self, spec: TrainingJobSpec, *, key: str) -> RunRecord | None:
        """What was recorded of the attempts of ``(spec.name, key)`` in :attr:`namespace`.

        Raises:
            AdoptionRefusedError: The logical job was recorded for another spec.
        """

        async def read() -> RunRecord | None:
            await self._flush_records()
            client = await self._get_client()
            name = record_name(spec.name, key)
            try:
                record = await _outlasting_outages(
                    lambda: read_record(client, self.namespace, name)
                )
            except ForbiddenError as exc:
                logger.warning(
                    "cannot read the run record %s/%s (%s): replaying without it",
                    self.namespace,
                    name,
                    exc.message,
                )
                return None
            if record is not None and record.spec_hash != spec_hash(spec):
                raise _other_spec(self.namespace, record, spec_hash(spec))
            return record

        return await self._on_runtime(read())

    async def _flush_records(self) -> None:
        """Wait for the end records this backend is still writing (before reading records)."""
        while self._writing:
            await asyncio.gather(*self._writing, return_exceptions=True)

    def _record_in_background(self, write: Coroutine[Any, Any, None]) -> None:
        """Write an end record without delaying the wait's return (one round trip saved).

        The write is awaited by every later read of records, by :meth:`close`, and at
        interpreter exit (:meth:`KubeRuntime.track`).
        """
        task = asyncio.get_running_loop().create_task(write)
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)
        KubeRuntime.get().track(task)

    async def _recorded_end(self, client: KubeClient, ref: JobRef) -> AttemptRecord | None:
        """The recorded end of ``ref``'s attempt, if one was seen (same job: same uid)."""
        await self._flush_records()
        try:
            record = await read_record(client, ref.namespace, record_name_of(ref.name))
        except (ForbiddenError, AdoptionRefusedError):
            return None
        entry = record.get(ref.attempt) if record is not None else None
        if entry is None or not entry.finished or (ref.uid and entry.uid != ref.uid):
            return None
        return entry

    async def _record_end(
        self, client: KubeClient, ref: JobRef, status: JobStatus, diagnosis: Diagnosis | None
    ) -> None:
        await write_record(
            client,
            ref,
            record_name_of(ref.name).rsplit("-", 1)[0],
            attempt_ended(ref, status, diagnosis),
        )

    # -- attaching -------------------------------------------------------------------------

    async def attach(self, ref: JobRef) -> JobRef:
        """Find the job of ``ref`` again, from any process, and return its current reference.

        Works whatever this backend's namespace and dialect: the reference says where the job
        is. A job that is gone but whose end was recorded attaches too (waiting on it returns
        the recorded outcome).

        Raises:
            KubeDLPrefectError: ``ref`` is of another backend or another cluster.
            JobCancelledError: The job is gone (or was replaced) and its end was never recorded.
        """

        async def find() -> JobRef:
            client = await self._get_client()
            self._check_reference(ref, client)
            try:
                job = await client.get(job_kind(ref.api_version, ref.kind), ref.namespace, ref.name)
            except NotFoundError as exc:
                if await self._recorded_end(client, ref) is not None:
                    return ref
                raise _gone(ref) from exc
            uid = job["metadata"].get("uid", "")
            if ref.uid and uid != ref.uid:
                raise JobCancelledError(
                    f"{ref.kind} {ref.namespace}/{ref.name} was replaced by another job of the "
                    f"same name (uid {uid}, the reference has {ref.uid})",
                    hint="the job of this reference was deleted; submit again to run it",
                )
            return ref if ref.uid else JobRef.from_dict({**ref.to_dict(), "uid": uid})

        return await self._on_runtime(find())

    def _check_reference(self, ref: JobRef, client: KubeClient) -> None:
        check_backend_of(ref, self.name)
        if ref.cluster and ref.cluster.rstrip("/") != client.server.rstrip("/"):
            raise KubeDLPrefectError(
                f"job reference {ref.namespace}/{ref.name} is of the cluster {ref.cluster}, but "
                f"this backend talks to {client.server}",
                hint="attach it with credentials for the cluster it was submitted to",
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
        session = await self._get_session()
        client, hub = session.client, session.hub
        namespace = ref.namespace
        kind = job_kind(ref.api_version, ref.kind)
        select = JobObjects(Dialect(ref.dialect), ref.name)
        queue: EventQueue = asyncio.Queue()
        async with contextlib.AsyncExitStack() as stack:
            kinds: list[tuple[ResourceKind, Callable[[KubeObject], bool]]] = [
                (kind, select.is_job),
                (PODS, select.is_pod),
                (VOLCANO_PODGROUPS, select.is_podgroup),
            ]
            if events:
                kinds.append((EVENTS, select.is_event))
            for watched, accepts in kinds:
                await stack.enter_async_context(
                    hub.subscribe(client, watched, namespace, accepts, queue)
                )
            jobs = hub.informer(client, kind, namespace)
            pods = hub.informer(client, PODS, namespace)
            podgroups = hub.informer(client, VOLCANO_PODGROUPS, namespace)
            event_log = hub.informer(client, EVENTS, namespace) if events else None
            view = _JobView(
                ref,
                job=lambda: [job] if (job := jobs.get(ref.name)) is not None else [],
                pods=lambda: [p for p in pods.by_label(*select.pod_label) if select.is_pod(p)],
                podgroups=lambda: podgroups.select(select.is_podgroup),
                events=lambda: event_log.select(select.is_event) if event_log else [],
            )
            while require_job and not view.job():
                try:
                    # Through an API-server restart, and the 403s right after one, the shared
                    # informers ride on and will deliver the job: ask again meanwhile.
                    await _outlasting_outages(lambda: client.get(kind, namespace, ref.name))
                except NotFoundError as exc:
                    raise view.deleted() from exc
                await next_event(queue)  # its ADDED event is on the way
            found = view.job()
            if ref.uid and found and kueue_queue(found[0]) is not None:
                # Kueue decides on the job's Workload after the job last changed (quota
                # reserved or not, evicted): watch it too, through the namespace's shared
                # informer, instead of reading it again only when the job changes.
                uid = ref.uid

                def is_workload(obj: KubeObject) -> bool:
                    return (obj["metadata"].get("labels") or {}).get(JOB_UID_LABEL) == uid

                await stack.enter_async_context(
                    hub.subscribe(client, KUEUE_WORKLOADS, namespace, is_workload, queue)
                )
                workloads = hub.informer(client, KUEUE_WORKLOADS, namespace)
                view.workloads = lambda: workloads.by_label(JOB_UID_LABEL, uid)
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
            JobFailedError: The job failed before it was admitted, or can never be (a permanent
                blocker, see :mod:`.blockers`: the job was deleted and its end recorded).
            JobCancelledError: The job was deleted meanwhile (and its end was not recorded).
        """
        try:
            async with delivered(on_phase, f"phases of {ref.name}") as callback:
                return await self._on_runtime(self._wait_admitted(ref, timeout_s, callback))
        except AdmissionTimeoutError:
            if delete_on_timeout:
                await self.cancel(ref)
            raise

    async def _wait_admitted(
        self, ref: JobRef, timeout_s: float | None, on_phase: PhaseCallback | None
    ) -> AdmissionState:
        deadline = Deadline(timeout_s)
        client = await self._get_client()
        try:
            async with self._follow(ref) as (view, queue):
                tracker = PhaseTracker(on_phase)
                reader, keeper = FactReader(client, ref.namespace), ReasonKeeper()
                while True:
                    job = view.current_job()
                    status = await _status_now(view, job, reader)
                    admission = await _admission_now(view, job, status, reader, keeper)
                    tracker.observe(status, admission)
                    if admission.admitted or status.phase in (Phase.RUNNING, Phase.SUCCEEDED):
                        return admission
                    if status.phase == Phase.FAILED:
                        raise self._failed(view, job)
                    never = admission.diagnosis()
                    if never is not None:
                        # It can never be admitted: fail it now, leave nothing of it behind.
                        await self._cancel(ref, 120.0)
                        failed = _failed_status(status, never)
                        self._record_in_background(self._record_end(client, ref, failed, never))
                        raise _never_starts(ref, never)
                    try:
                        async with asyncio.timeout(admission.recheck_in_s):
                            await deadline.wait(queue, admission_timeout(ref, timeout_s, admission))
                    except TimeoutError:
                        continue  # a grace period ran out: decide again
        except JobCancelledError:
            ended = await self._recorded_end(client, ref)
            if ended is None:
                raise
            if not ended.succeeded:
                raise recorded_failure(f"{ref.kind} {ref.namespace}/{ref.name}", ended) from None
            return AdmissionState(admitted=True, reason="the attempt ran and ended (recorded)")

    async def phases(self, ref: JobRef) -> AsyncIterator[PhaseUpdate]:
        """Yield each change of the job's phase or replica counts, until it is terminal.

        Must be iterated on the runtime loop; :meth:`wait_completed` is the portable way. Its
        admission reasons are the operators' and schedulers' words only (no cluster objects are
        read, nothing is failed).
        """
        async with self._follow(ref) as (view, queue):
            tracker = PhaseTracker(None)
            while True:
                job = view.current_job()
                status = queued_status(job_status(job), queue_hold(job, None))
                update = tracker.observe(status, view.admission(job))
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
        decides about retries. The end is added to the logical job's record; a job that is gone
        but whose end was recorded returns that outcome (``outcome.replayed``).

        Raises:
            AdmissionTimeoutError, StartupTimeoutError, CompletionTimeoutError: A phase ran out
                of time; the job was deleted first unless ``timeouts.delete_on_timeout`` is false.
            JobCancelledError: The job was deleted meanwhile (and its end was not recorded).
        """
        try:
            async with delivered(on_phase, f"phases of {ref.name}") as callback:
                return await self._on_runtime(self._wait_completed(ref, timeouts, callback))
        except WaitTimeoutError:
            if timeouts.delete_on_timeout:
                await self.cancel(ref, timeout_s=timeouts.cancel_s)
            raise

    async def _wait_completed(
        self, ref: JobRef, timeouts: WaitTimeouts, on_phase: PhaseCallback | None
    ) -> JobOutcome:
        client = await self._get_client()
        try:
            outcome = await self._follow_to_end(ref, timeouts, on_phase)
        except JobCancelledError:
            ended = await self._recorded_end(client, ref)
            if ended is None:
                raise
            return JobOutcome(ref, ended.status(), ended.diagnosis, replayed=True)
        self._record_in_background(self._record_end(client, ref, outcome.status, outcome.diagnosis))
        return outcome

    async def _follow_to_end(
        self, ref: JobRef, timeouts: WaitTimeouts, on_phase: PhaseCallback | None
    ) -> JobOutcome:
        async with self._follow(ref) as (view, queue):
            tracker = PhaseTracker(on_phase)
            client = await self._get_client()
            reader, keeper = FactReader(client, ref.namespace), ReasonKeeper()
            stage, deadline = "admission", Deadline(timeouts.admission_s)
            while True:
                job = view.current_job()
                status = await _status_now(view, job, reader)
                if stage != "admission" and status.reason == "Requeued":
                    # Kueue evicted the job and queues it again: the same job waits to be
                    # admitted again (no new attempt), with a fresh admission deadline.
                    stage, deadline = "admission", Deadline(timeouts.admission_s)
                if stage == "admission":
                    admission = await _admission_now(view, job, status, reader, keeper)
                else:
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
                stuck = (
                    stuck_for_good(view.pods())
                    or past_active_deadline(job, status)
                    or (admission.diagnosis() if stage == "admission" else None)
                )
                if stuck is not None:
                    # The operator would leave it pending for ever: fail it now and free the GPUs.
                    await self._cancel(ref, timeouts.cancel_s)
                    failed = _failed_status(status, stuck)
                    return JobOutcome(ref, failed, stuck, tuple(tracker.history))
                if stage == "admission" and (
                    admission.admitted
                    or (status.phase != Phase.CREATED and status.phase != Phase.QUEUING)
                ):
                    stage, deadline = "startup", Deadline(timeouts.startup_s)
                if stage == "startup" and status.phase in (Phase.RUNNING, Phase.RESTARTING):
                    stage, deadline = "completion", Deadline(timeouts.completion_s)
                overdue_in = seconds_until_overdue(job, status)
                recheck_in = admission.recheck_in_s if stage == "admission" else None
                wake_in = min((t for t in (overdue_in, recheck_in) if t is not None), default=None)
                try:
                    async with asyncio.timeout(wake_in):
                        await deadline.wait(
                            queue, phase_timeout(ref, stage, timeouts, status, admission)
                        )
                except TimeoutError:
                    continue  # the active deadline or a grace period passed: decide again

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

    def _failed(self, view: _JobView, job: KubeObject) -> JobFailedError:
        diagnosis = diagnose(job, pods=view.pods(), events=view.events())
        return JobFailedError(
            f"{view.ref.kind} {view.ref.namespace}/{view.ref.name} failed: {diagnosis.summary()}",
            hint=diagnosis.hint,
            retryable=diagnosis.retryable,
            diagnosis=diagnosis,
            ref=view.ref.to_dict(),
        )

    async def follow_logs(self, ref: JobRef, on_line: LogCallback) -> None:
        """Deliver every replica's log lines until the job ends and its containers have exited.

        Each line is labelled with its replica (``worker-1``); pods re-created by the operator
        and broken streams are followed on without losing or repeating lines. ``on_line`` runs
        on a thread of its own, in order.
        """
        async with delivered(on_line, f"logs of {ref.name}") as callback:
            assert callback is not None
            await self._on_runtime(self._follow_logs(ref, callback))

    async def _follow_logs(self, ref: JobRef, on_line: Callable[[LogLine], None]) -> None:
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

    # -- what the Prefect surface reads ----------------------------------------------------

    async def replicas(self, ref: JobRef) -> tuple[ReplicaState, ...]:
        """The job's pods now (role, index, pod, node, phase, restarts), from the shared watch.

        While a wait follows the job this reads the informer's cache (no request); otherwise
        it joins the namespace's pod watch for the moment.
        """

        async def read() -> tuple[ReplicaState, ...]:
            session = await self._get_session()
            select = JobObjects(Dialect(ref.dialect), ref.name)
            async with session.hub.subscribe(session.client, PODS, ref.namespace, select.is_pod):
                informer = session.hub.informer(session.client, PODS, ref.namespace)
                pods = [p for p in informer.by_label(*select.pod_label) if select.is_pod(p)]
            return replica_states(pods)

        return await self._on_runtime(read())

    async def find_jobs(
        self, labels: Mapping[str, str], *, namespace: str | None = None
    ) -> list[JobRef]:
        """The training jobs of both operators in ``namespace`` that carry every one of ``labels``.

        Only jobs kubedl-prefect made are returned (it adds its own ``managed-by`` label to the
        selector). Kinds whose CRD is not installed, or that the credentials may not list, are
        skipped. Clean-up uses this to find what one Prefect flow run created.

        Args:
            labels: Labels the jobs must carry (``{"kubedl-prefect.io/flow-run-id": ...}``).
            namespace: Where to look (default: :attr:`namespace`).
        """
        where = namespace or self.namespace
        _check_namespace(where)
        wanted = {**labels, LABEL_MANAGED_BY: MANAGED_BY}
        selector = ",".join(f"{key}={value}" for key, value in sorted(wanted.items()))

        async def find() -> list[JobRef]:
            client = await self._get_client()
            found: list[JobRef] = []
            seen: set[tuple[str, str]] = set()
            for dialect in Dialect:
                for framework in Framework:
                    resource = job_resource(dialect, framework)
                    if (resource.api_version, resource.kind) in seen:
                        continue  # Trainer's one kind, TrainJob, serves every framework
                    seen.add((resource.api_version, resource.kind))
                    kind = job_kind(resource.api_version, resource.kind)
                    try:
                        listing = await client.list(kind, where, label_selector=selector)
                    except (NotFoundError, ForbiddenError):
                        continue
                    for obj in listing.items:
                        metadata = obj["metadata"]
                        found.append(
                            JobRef(
                                backend=self.name,
                                cluster=client.server,
                                dialect=dialect.value,
                                namespace=where,
                                name=metadata["name"],
                                uid=metadata.get("uid", ""),
                                api_version=obj.get("apiVersion") or resource.api_version,
                                kind=obj.get("kind") or resource.kind,
                                key=key_of(obj),
                                attempt=attempt_of(obj),
                                spec_hash=spec_hash_of(obj),
                            )
                        )
            return found

        return await self._on_runtime(find())

    # -- cancel ----------------------------------------------------------------------------

    async def cancel(self, ref: JobRef, *, timeout_s: float = 120.0) -> None:
        """Delete the job (foreground propagation) and wait until its pods and PodGroups are gone.

        Only the job of the reference's uid is deleted (a ``preconditions.uid`` the API server
        checks): a job deleted and created again under the same name, by anyone, is left alone.
        Idempotent: cancelling a job that is already gone returns at once.

        Raises:
            ConflictError: The job of that name is another one now (its uid differs).
            WaitTimeoutError: Something was still there after ``timeout_s``.
        """
        await self._on_runtime(self._cancel(ref, timeout_s))

    async def _cancel(self, ref: JobRef, timeout_s: float) -> None:
        client = await self._get_client()
        kind = job_kind(ref.api_version, ref.kind)
        try:
            await client.delete(
                kind, ref.namespace, ref.name, propagation="Foreground", uid=ref.uid or None
            )
        except ConflictError as exc:
            if not ref.uid:
                raise
            raise await _replaced(client, kind, ref, exc) from exc
        await adelete_leftovers(client, ref)  # a TrainJob's PodGroup (kubeflow/trainer#4033)
        deadline = Deadline(timeout_s)
        async with self._follow(ref, events=False, require_job=False) as (view, queue):
            while True:
                left = [
                    f"{what}/{obj['metadata']['name']}"
                    for what, objects in (
                        (ref.kind, view.job()),
                        ("Pod", view.pods()),
                        ("PodGroup", view.podgroups()),
                    )
                    for obj in objects
                    if not _of_another_job(obj, ref)
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
        #: The job's Kueue Workloads, when they are watched (a job in a Kueue LocalQueue).
        self.workloads: Callable[[], list[KubeObject]] | None = None

    def deleted(self) -> JobCancelledError:
        return _gone(self.ref)

    def current_job(self) -> KubeObject:
        jobs = self.job()
        if not jobs or (self.ref.uid and jobs[0]["metadata"].get("uid") != self.ref.uid):
            raise self.deleted()
        return jobs[0]

    def admission(self, job: KubeObject) -> AdmissionState:
        return admission_state(
            job, pods=self.pods(), podgroups=self.podgroups(), events=self.events()
        )


async def _status_now(view: _JobView, job: KubeObject, reader: FactReader) -> JobStatus:
    """The job's status; for a job in a Kueue LocalQueue, as its Workload says.

    A job Kueue has not admitted is ``Queuing``, and one it evicted and queues again is
    ``Queuing`` with the reason ``Requeued``
    (:func:`~kubedl_prefect.lifecycle.status.queued_status`): never failed, never a new
    attempt. The Workloads come from the view's watch; without one, they are read through the
    wait's :class:`.facts.FactReader`, again only when the job has changed.
    """
    status = job_status(job)
    request = kueue_request(job)
    if request is None:
        return status
    return queued_status(status, queue_hold(job, await _workload(view, job, request, reader)))


async def _workload(
    view: _JobView, job: KubeObject, request: FactRequest, reader: FactReader
) -> KubeObject | None:
    """The Kueue Workload of a job in a LocalQueue (``request``: :func:`.kueue.kueue_request`).

    From the view's watch; without one, read through the wait's reader (again only when the
    job has changed).
    """
    if view.workloads is not None:
        workloads = view.workloads()
    else:
        workloads = list((await reader.read(request)).workloads or [])
    return job_workload(job, workloads)


async def _admission_now(
    view: _JobView, job: KubeObject, status: JobStatus, reader: FactReader, keeper: ReasonKeeper
) -> AdmissionState:
    """The admission state of a job that has not started, with the cluster facts it needs.

    The facts are read only while the job is not admitted (and only what is not known yet, see
    :class:`.facts.FactReader`); the reason is kept against vaguer ones (:class:`ReasonKeeper`).
    """
    pods, podgroups, events = view.pods(), view.podgroups(), view.events()
    state = admission_state(job, pods=pods, podgroups=podgroups, events=events)
    if state.admitted and status.queue is not None and status.queue.admitted:
        state = await _admitted_by(view, job, state, reader)
    if state.admitted or status.phase not in (Phase.CREATED, Phase.QUEUING):
        return keeper.keep(state)
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    request = fact_request(job, pods=live, podgroups=podgroups, events=events)
    if view.workloads is not None and request.workloads is not None:
        request = dataclasses.replace(request, workloads=None)  # watched: not read again
        facts = dataclasses.replace(await reader.read(request), workloads=view.workloads())
    else:
        facts = await reader.read(request)
    state = admission_state(
        job, pods=pods, podgroups=podgroups, events=events, facts=facts, now=time.time()
    )
    return keeper.keep(state)


async def _admitted_by(
    view: _JobView, job: KubeObject, state: AdmissionState, reader: FactReader
) -> AdmissionState:
    """An admitted Kueue job's state, saying so when Kueue lent it quota from the cohort.

    Reads the admitting ClusterQueue once more (one GET per admission): its usage now is
    Kueue's since it admitted the job (:func:`.kueue.admitted_by`).
    """
    request = kueue_request(job)
    if request is None:
        return state
    workload = await _workload(view, job, request, reader)
    name = admitting_queue(workload)
    if name is None:
        return state
    queue = await reader.current(KUEUE_CLUSTER_QUEUES, None, name)
    return admitted_by(state, workload, queue)


def _failed_status(status: JobStatus, diagnosis: Diagnosis) -> JobStatus:
    """The status of a job we failed ourselves (it would never have ended by itself)."""
    return JobStatus(
        phase=Phase.FAILED,
        reason=str(diagnosis.category),
        message=diagnosis.message,
        replicas=status.replicas,
        start_time=status.start_time,
        resource_version=status.resource_version,
    )


def _never_starts(ref: JobRef, diagnosis: Diagnosis) -> JobFailedError:
    return JobFailedError(
        f"{ref.kind} {ref.namespace}/{ref.name} can never start, and was deleted: "
        f"{diagnosis.summary()}",
        hint=diagnosis.hint,
        retryable=False,
        diagnosis=diagnosis,
        attempts=ref.attempt,
        ref=ref.to_dict(),
    )


async def _outlasting_outages(call: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``call()``, made again while the API server cannot be reached (a restart, 5xx, 429).

    A job's start is a few single requests; without this, each of them failing during an
    API-server restart failed the whole task, while the waits ride such outages out. An API
    server that has just restarted also refuses requests (403) until its RBAC caches are
    filled: ``_FORBIDDEN_TRIES`` refusals in a row are tolerated, as the watches do.

    Raises:
        KubeAPIError: A non-retryable error, or retryable ones for ``_OUTAGE_PATIENCE_S``.
    """
    started, delay, refused = time.monotonic(), 0.5, 0
    while True:
        try:
            return await call()
        except ForbiddenError:
            refused += 1
            if refused >= _FORBIDDEN_TRIES:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
        except KubeAPIError as exc:
            refused = 0
            if not exc.retryable or time.monotonic() - started > _OUTAGE_PATIENCE_S:
                raise
            logger.info("the API server cannot be reached (%s); trying again", exc.message)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


def _check_namespace(namespace: str) -> None:
    problem = namespace_problem(namespace)
    if problem is not None:
        raise KubeDLPrefectError(
            f"KubernetesBackend refused: {problem}",
            hint="name an existing namespace, as `kubectl get namespaces` lists it",
        )


def _of_another_job(obj: KubeObject, ref: JobRef) -> bool:
    """Whether ``obj`` is, or is owned by, another job of ``ref``'s name (another uid)."""
    if not ref.uid:
        return False
    metadata = obj.get("metadata") or {}
    if obj.get("kind") == ref.kind and metadata.get("name") == ref.name:
        return bool(metadata.get("uid")) and metadata.get("uid") != ref.uid
    owners = [o for o in metadata.get("ownerReferences") or [] if o.get("kind") == ref.kind]
    return bool(owners) and all(o.get("uid") != ref.uid for o in owners)


async def _replaced(
    client: KubeClient, kind: ResourceKind, ref: JobRef, refused: ConflictError
) -> ConflictError:
    """The error for a cancel whose uid precondition failed: the name is another job's now."""
    try:
        current = (await client.get(kind, ref.namespace, ref.name))["metadata"].get("uid", "?")
    except KubeAPIError:
        current = "unknown (it could not be read)"
    return ConflictError(
        f"cancelling {ref.kind} {ref.namespace}/{ref.name}: the job was replaced: its uid is now "
        f"{current}, not {ref.uid}, the one the reference names; it was left alone "
        f"({refused.message})",
        status=refused.status,
        reason=refused.reason,
        hint="the job of this reference is gone already; the job now of that name was created "
        "by someone else, or by another submission: delete it by name if it must go",
    )


def _gone(ref: JobRef) -> JobCancelledError:
    return JobCancelledError(
        f"{ref.kind} {ref.namespace}/{ref.name} was deleted while being waited on",
        hint="someone or something deleted it (a cancellation, TTL, or kubectl delete)",
    )


def _other_spec(namespace: str, record: RunRecord, wanted_hash: str) -> AdoptionRefusedError:
    return other_spec(
        namespace,
        record,
        wanted_hash,
        f"delete the ConfigMap {record_name(record.spec_name, record.key)}",
    )


def _has_failed_container(pod: KubeObject) -> bool:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            if int((state.get("terminated") or {}).get("exitCode") or 0) != 0:
                return True
    return False
