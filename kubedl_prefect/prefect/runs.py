"""A triggered training job: Prefect's JobRun shape, with what a distributed job needs more.

:class:`TrainingJobRun` (from :meth:`TrainingJob.trigger`) follows one logical job — a spec and a
key — through admission and every attempt: ``wait_for_admission()``, ``wait_for_completion()``
(classified retries, events, artifacts, labelled logs of every replica), ``fetch_result()`` (a
:class:`~kubedl_prefect.prefect.results.TrainingResult`), ``cancel()`` and ``logs()``. Its
:attr:`~TrainingJobRun.ref` is the current attempt's plain-data reference, and
:meth:`~TrainingJobRun.to_dict` is all another process needs, with the block's credentials, to
re-attach (:meth:`TrainingJob.attach`).

:class:`SyncTrainingJobRun` has the same methods, blocking, for sync flows and tasks; both run
one implementation (see :mod:`.sync`).

Jobs made from a flow run carry its id as a label and the flow run records where they are, so
that the run's clean-up (:mod:`.cleanup`) deletes them, and only them, when it is cancelled or
crashes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from prefect.blocks.abstract import JobRun

from kubedl_prefect.errors import (
    AdmissionTimeoutError,
    JobCancelledError,
    JobFailedError,
    KubeDLPrefectError,
    WaitTimeoutError,
)
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.lifecycle.admission import AdmissionState
from kubedl_prefect.lifecycle.backend import (
    JobOutcome,
    JobRef,
    LogCallback,
    LogLine,
    PhaseCallback,
    TrainingBackend,
    WaitTimeouts,
    checkpoint_location,
)
from kubedl_prefect.lifecycle.records import ReplayStep, RunRecord, replay_step
from kubedl_prefect.lifecycle.retry import arun_to_completion
from kubedl_prefect.lifecycle.run import as_ref
from kubedl_prefect.prefect import cleanup
from kubedl_prefect.prefect.artifacts import artifact_stem
from kubedl_prefect.prefect.context import RunContext
from kubedl_prefect.prefect.events import CancelReason
from kubedl_prefect.prefect.reporting import JobReporter
from kubedl_prefect.prefect.results import TrainingResult, training_result
from kubedl_prefect.prefect.settings import get_settings
from kubedl_prefect.prefect.sync import run_in_caller_context
from kubedl_prefect.spec import TrainingJobSpec, validate

if TYPE_CHECKING:
    from kubedl_prefect.prefect.blocks import TrainingJob

logger = logging.getLogger(__name__)

LOG_QUIET_S = 0.1
"""After a job ended, its log streams are closed once no line came for this long."""
LOG_DRAIN_LIMIT_S = 10.0
"""...or at the latest this long after the end."""

RUN_SCHEMA = 1
"""Version of :meth:`TrainingJobRun.to_dict`'s layout."""


class TrainingJobRun(JobRun[TrainingResult]):
    """A handle on one logical training job started by :meth:`TrainingJob.trigger`.

    Build it with :meth:`start` or :meth:`attach`, not directly.

    Args:
        job: The block it was triggered from (spec, cluster, retries, timeouts).
        spec: The typed spec.
        key: The idempotency key.
        backend: The backend that runs it.
        ctx: The Prefect run it reports to.
        ref: The current attempt's reference (``None`` for a recorded end: nothing runs).
        step: Where the record said the logical job stood when the handle was made.
    """

    def __init__(
        self,
        job: TrainingJob,
        spec: TrainingJobSpec,
        key: str,
        backend: TrainingBackend,
        ctx: RunContext,
        ref: JobRef | None,
        step: ReplayStep,
    ):
        self.job = job
        self.spec = spec
        self.key = key
        self.backend = backend
        self.ctx = ctx
        self._ref = ref
        self.step = step
        self.started_at = time.time()
        self.reporter = JobReporter(
            ctx,
            backend,
            artifact_stem(spec.name, ctx.flow_name, ctx.deployment_label()),
            stream_logs=job.stream_logs,
            log_rate=job.log_lines_per_second,
            log_burst=get_settings().log_burst,
            spec_name=spec.name,
        )
        self._result: TrainingResult | None = None
        self._error: BaseException | None = None
        if ref is not None:
            self.reporter.attempt(ref)

    # -- making one ------------------------------------------------------------------------

    @classmethod
    async def start(
        cls, job: TrainingJob, *, key: str | None = None, ctx: RunContext | None = None
    ) -> TrainingJobRun:
        """Submit (or adopt) the logical job's next attempt; see :meth:`TrainingJob.trigger`."""
        ctx = ctx or RunContext.capture()
        spec = job.training_spec()
        validate(spec, job.dialect)
        key = key or job.key or ctx.default_key(spec.name)
        namespace = job.resolved_namespace()
        backend = job.cluster.backend(
            dialect=job.dialect, namespace=namespace, labels=cleanup.job_labels(ctx)
        )
        try:
            await cleanup.track(ctx, job.cluster, namespace)
            step = replay_step(
                await backend.history(spec, key=key), max_attempts=job.retry.max_attempts
            )
            ref: JobRef | None = None
            if step.action in ("start", "follow", "next"):
                ref = await backend.submit(spec, key=key, attempt=step.attempt)
            elif step.previous is not None and step.previous.ref is not None:
                ref = JobRef.from_dict(step.previous.ref)
        except BaseException:
            await backend.close()
            raise
        run = cls(job, spec, key, backend, ctx, None, step)
        run._ref = ref
        if ref is not None and step.action in ("start", "follow", "next"):
            run.reporter.attempt(ref)
        elif ref is not None:
            run.reporter.ref = ref
        return run

    @classmethod
    async def attach(
        cls, job: TrainingJob, data: dict[str, Any] | str, *, ctx: RunContext | None = None
    ) -> TrainingJobRun:
        """Re-attach to a run saved with :meth:`to_dict` (or to a bare ``JobRef``'s data).

        Raises:
            KubeDLPrefectError: The data is no saved run, or of another spec or cluster.
            JobCancelledError: The job is gone and its end was never recorded.
        """
        run = cls.from_saved(job, data, ctx=ctx)
        try:
            current = await run.backend.attach(run.ref)
        except BaseException:
            await run.backend.close()
            raise
        if current != run.ref:
            run._ref = current
        return run

    @classmethod
    def from_saved(
        cls, job: TrainingJob, data: dict[str, Any] | str, *, ctx: RunContext | None = None
    ) -> TrainingJobRun:
        """A handle on a saved run without asking the cluster anything (:meth:`attach` does).

        Raises:
            KubeDLPrefectError: The data is no saved run, or of another spec.
        """
        ctx = ctx or RunContext.capture()
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except ValueError as exc:
                raise KubeDLPrefectError(
                    f"a saved run is not JSON: {exc}", hint="pass what run.to_dict() returned"
                ) from exc
        if not isinstance(data, dict):
            raise KubeDLPrefectError(
                f"a saved run is a mapping, not {type(data).__name__}",
                hint="pass what run.to_dict() returned",
            )
        ref = as_ref(data.get("ref", data))
        spec = job.training_spec()
        if data.get("specName", spec.name) != spec.name:
            raise KubeDLPrefectError(
                f"the saved run is of training job {data.get('specName')!r}, the block's spec "
                f"is {spec.name!r}",
                hint="attach with the training job block the run was triggered from",
            )
        backend = job.cluster.backend(dialect=ref.dialect, namespace=ref.namespace)
        run = cls(job, spec, ref.key, backend, ctx, ref, ReplayStep("follow", ref.attempt))
        submitted_at = data.get("submittedAt")
        current = run.reporter.timeline.current
        if isinstance(submitted_at, int | float) and current is not None:
            current.submitted_at = min(current.submitted_at, float(submitted_at))
        return run

    # -- plain data ------------------------------------------------------------------------

    @property
    def ref(self) -> JobRef:
        """The current attempt's reference.

        Raises:
            KubeDLPrefectError: Nothing was submitted (a recorded end without a reference).
        """
        if self._ref is None:
            raise KubeDLPrefectError(
                f"training job {self.spec.name} (key {self.key!r}) has no job: its end was "
                "recorded before any reference was",
                hint="fetch_result() tells how it ended",
            )
        return self._ref

    def to_dict(self) -> dict[str, Any]:
        """What another process needs (with the block) to re-attach: plain data, no secret."""
        data: dict[str, Any] = {
            "schemaVersion": RUN_SCHEMA,
            "specName": self.spec.name,
            "key": self.key,
            "ref": self.ref.to_dict(),
        }
        current = self.reporter.timeline.current
        if current is not None and current.attempt == self.ref.attempt:
            # The wait tasks attach in task runs of their own: the admission wait they report
            # starts at the submission, not when they attached.
            data["submittedAt"] = current.submitted_at
        return data

    # -- waiting ---------------------------------------------------------------------------

    async def wait_for_admission(self, timeout_s: float | None = None) -> AdmissionState:
        """Wait until every replica of the current attempt is scheduled together.

        Args:
            timeout_s: The limit (default: the block's admission timeout).

        Raises:
            AdmissionTimeoutError: Not admitted in time (the job is deleted), with the reason.
        """
        if self._result is not None or self.step.action in ("succeeded", "failed"):
            return AdmissionState(admitted=True, reason="the job ran and ended (recorded)")
        limit = timeout_s if timeout_s is not None else self.job.timeouts.admission_s
        try:
            return await self.backend.wait_admitted(
                self.ref, timeout_s=limit, on_phase=self.reporter.on_phase()
            )
        except JobCancelledError as exc:
            self.reporter.cancelled(self.ref, exc.message, CancelReason.DELETED)
            raise
        except AdmissionTimeoutError as exc:
            self.reporter.timed_out(self.ref, exc)  # the backend deleted the job
            raise
        except JobFailedError as exc:
            self.reporter.failed(self.ref, exc.diagnosis)
            raise

    async def wait_for_completion(self) -> None:  # type: ignore[override]
        """Follow the job through every attempt until it succeeds, or fails for good.

        Retryable failures (eviction, preemption, lost node, SIGKILL, NCCL timeout) are run
        again as the next attempt with the same checkpoint location, up to the block's attempts;
        the summary artifact is written either way.

        Raises:
            JobFailedError: A permanent failure, or retryable ones past the attempts; carries the
                diagnosis (its message is what the Prefect task's state shows).
            WaitTimeoutError: A waiting phase ran out of time.
            JobCancelledError: The job was deleted meanwhile.
        """
        if self._result is not None:
            if self._error is not None:
                raise self._error
            return
        if self.step.action in ("succeeded", "failed"):
            await self._finish_recorded()
            return
        logs: list[asyncio.Task[None]] = []
        on_line = self.reporter.on_line() if self.job.stream_logs else None

        def on_attempt(ref: JobRef) -> None:
            if ref != self._ref or not logs:
                if ref != self._ref:
                    self._ref = ref
                    self.reporter.attempt(ref)
                if on_line is not None:
                    logs.append(asyncio.ensure_future(self._follow_logs(ref, on_line)))

        outcome: JobOutcome | None = None
        error: BaseException | None = None
        try:
            outcome = await arun_to_completion(
                _Reported(self.backend, self.reporter),
                self.spec,
                key=self.key,
                retry=self.job.retry.policy(),
                timeouts=self.job.timeouts.timeouts(),
                on_phase=self.reporter.on_phase(),
                on_attempt=on_attempt,
            )
        except (KubeDLPrefectError, asyncio.CancelledError) as exc:
            error = exc
        finally:
            if logs:
                if error is None:
                    await self._drain_logs(logs)
                for task in logs:
                    task.cancel()
                await asyncio.gather(*logs, return_exceptions=True)
        if isinstance(error, asyncio.CancelledError):
            raise error
        await self._finish(outcome, error)
        if error is not None:
            raise error

    async def _drain_logs(self, logs: list[asyncio.Task[None]]) -> None:
        """Let log streams deliver their last lines: until they end, or go quiet.

        A kubelet ends a container's stream when it exits, usually before the operator marks
        the job ended; a log server that keeps following a finished file never ends it. So the
        streams get as long as lines keep coming (``log_quiet_s`` apart, up to
        ``LOG_DRAIN_LIMIT_S``), and a quiet one is closed at once.
        """
        quiet = LOG_QUIET_S
        deadline = time.monotonic() + LOG_DRAIN_LIMIT_S
        while time.monotonic() < deadline:
            pending = [task for task in logs if not task.done()]
            if not pending:
                return
            if time.monotonic() - self.reporter.last_line_at >= quiet:
                return
            await asyncio.wait(pending, timeout=quiet)

    async def _follow_logs(self, ref: JobRef, on_line: Callable[[LogLine], None]) -> None:
        try:
            await self.backend.follow_logs(ref, on_line)
        except JobCancelledError:
            pass
        except KubeDLPrefectError as exc:
            self.ctx.logger.warning("logs of %s stopped: %s", ref.name, exc.message)

    async def _finish(self, outcome: JobOutcome | None, error: BaseException | None) -> None:
        ref = outcome.ref if outcome is not None else self._ref
        if ref is None:
            return
        if isinstance(error, JobCancelledError):
            self.reporter.cancelled(ref, error.message, CancelReason.DELETED)
        diagnosis = error.diagnosis if isinstance(error, JobFailedError) else None
        if outcome is not None:
            phase = str(outcome.status.phase)
        elif isinstance(error, JobFailedError):
            phase = "Failed"
        elif isinstance(error, JobCancelledError):
            phase = "Cancelled"
        else:
            phase = type(error).__name__ if error is not None else "Unknown"
        record = None
        if ref.attempt > 1 or outcome is None or outcome.replayed:
            # Earlier attempts (and why they ended) are in the logical job's record; a first
            # attempt watched to its end is known already, without a request.
            try:
                record = await self.backend.history(self.spec, key=self.key)
            except KubeDLPrefectError:
                record = None
        result = training_result(
            spec_name=self.spec.name,
            key=self.key,
            ref=ref,
            phase=phase,
            timeline=self.reporter.timeline,
            record=record,
            started_at=self.started_at,
            checkpoint=_checkpoint(self.backend, self.spec, self.key),
            outcome=outcome,
            diagnosis=diagnosis,
        )
        self._result, self._error = result, error
        # Queues only (events, log lines, the last artifacts: sent in the background).
        self.reporter.finished(result, diagnosis)

    async def _finish_recorded(self) -> None:
        """The record says the logical job ended: report it without training again."""
        previous = self.step.previous
        assert previous is not None
        ref = self._ref
        if ref is None:
            raise KubeDLPrefectError(
                f"training job {self.spec.name} (key {self.key!r}) ended but its record holds "
                "no reference",
                hint="use another key to run it again",
            )
        outcome = JobOutcome(ref, previous.status(), previous.diagnosis, replayed=True)
        error: BaseException | None = None
        if not previous.succeeded:
            summary = (
                previous.diagnosis.summary()
                if previous.diagnosis is not None
                else previous.message or previous.reason
            )
            error = JobFailedError(
                f"training job {self.spec.name} (key {self.key!r}) failed (recorded by an earlier "
                f"run, attempt {previous.attempt}): {summary}",
                hint=previous.diagnosis.hint if previous.diagnosis is not None else None,
                retryable=False,
                diagnosis=previous.diagnosis,
                attempts=previous.attempt,
                ref=previous.ref,
            )
        await self._finish(outcome, error)
        if error is not None:
            raise error

    async def fetch_result(self) -> TrainingResult:
        """How the run ended (waits for it first if nobody did).

        A failed run's result is returned too (``phase`` ``Failed``, with ``diagnosis``) when
        :meth:`wait_for_completion` has already raised; otherwise that error is raised here.
        """
        if self._result is None:
            await self.wait_for_completion()
        assert self._result is not None
        return self._result

    # -- acting on it ----------------------------------------------------------------------

    async def cancel(self) -> None:
        """Delete the current attempt's job and wait until its pods and PodGroups are gone."""
        ref = self.ref
        await self.backend.cancel(ref, timeout_s=self.job.timeouts.cancel_s)
        self.reporter.cancelled(ref, "cancelled by the flow", CancelReason.CANCELLED)
        self.ctx.logger.info("training job %s/%s cancelled", ref.namespace, ref.name)

    async def logs(self, on_line: Callable[[LogLine], object] | None = None) -> None:
        """Follow the current attempt's logs until it ends.

        Args:
            on_line: Called with each line (on a thread of its own); by default lines go to
                the Prefect run's log, labelled and rate-limited.
        """
        callback = on_line or self.reporter.on_line()
        await self.backend.follow_logs(self.ref, callback)
        if on_line is None:
            self.reporter.forwarder.flush()

    async def close(self) -> None:
        """Release the backend's connections (the job is not touched)."""
        await self.backend.close()

    def close_later(self) -> None:
        """:meth:`close` without waiting for it (the training tasks, once the run ended).

        Closing waits for the run's end records the backend is still writing (a request to the
        API server the lifecycle sent in the background). The release runs on the Kubernetes
        runtime's loop, after them, and interpreter exit waits for it
        (:meth:`~kubedl_prefect.kube.runtime.KubeRuntime.track`); a failure is logged.
        """
        backend, name = self.backend, self._ref.name if self._ref is not None else self.key
        runtime = KubeRuntime.get()

        async def close() -> None:
            try:
                await backend.close()
            except Exception as exc:
                logger.warning(
                    "kubedl-prefect could not release the connections of training job %s: %s",
                    name,
                    exc,
                )

        def start() -> None:
            runtime.track(runtime.loop.create_task(close()))

        runtime.loop.call_soon_threadsafe(start)


@runtime_checkable
class CheckpointPlace(Protocol):
    """A backend that keeps checkpoints somewhere of its own (the local one: its workspace)."""

    def checkpoint_location(self, spec: TrainingJobSpec, key: str) -> str | None:
        """Where every attempt of ``(spec.name, key)`` keeps its checkpoints."""
        ...


def _checkpoint(backend: TrainingBackend, spec: TrainingJobSpec, key: str) -> str | None:
    """Where the job's checkpoints are, as its backend sees them (the cluster's path by default).

    The local backend keeps a cluster path's checkpoints in its workspace, and says so.
    """
    if isinstance(backend, CheckpointPlace):
        return backend.checkpoint_location(spec, key)
    return checkpoint_location(spec, key)


class _Reported:
    """A backend whose attempt ends are told to the reporter as they happen.

    The retry loop learns each attempt's diagnosis from ``wait_completed``; the run's reporter
    learns it here, so that each attempt's ``failed`` event carries its diagnosis, and a wait
    that ran out of time (the backend deleted the job) is told as ``cancelled``.
    """

    def __init__(self, backend: TrainingBackend, reporter: JobReporter):
        self.backend = backend
        self.reporter = reporter

    async def submit(
        self, spec: TrainingJobSpec, *, key: str, attempt: int = 1, dry_run: bool = False
    ) -> JobRef:
        return await self.backend.submit(spec, key=key, attempt=attempt, dry_run=dry_run)

    async def attach(self, ref: JobRef) -> JobRef:
        return await self.backend.attach(ref)

    async def history(self, spec: TrainingJobSpec, *, key: str) -> RunRecord | None:
        return await self.backend.history(spec, key=key)

    async def wait_admitted(
        self, ref: JobRef, *, timeout_s: float | None, on_phase: PhaseCallback | None = None
    ) -> AdmissionState:
        return await self.backend.wait_admitted(ref, timeout_s=timeout_s, on_phase=on_phase)

    async def wait_completed(
        self,
        ref: JobRef,
        *,
        timeouts: WaitTimeouts = WaitTimeouts(),
        on_phase: PhaseCallback | None = None,
    ) -> JobOutcome:
        try:
            outcome = await self.backend.wait_completed(ref, timeouts=timeouts, on_phase=on_phase)
        except WaitTimeoutError as exc:
            if timeouts.delete_on_timeout:
                self.reporter.timed_out(ref, exc)
            raise
        if not outcome.succeeded and not outcome.replayed:
            self.reporter.failed(outcome.ref, outcome.diagnosis)
        return outcome

    async def follow_logs(self, ref: JobRef, on_line: LogCallback) -> None:
        await self.backend.follow_logs(ref, on_line)

    async def cancel(self, ref: JobRef, *, timeout_s: float = 120.0) -> None:
        await self.backend.cancel(ref, timeout_s=timeout_s)

    async def close(self) -> None:
        await self.backend.close()


class SyncTrainingJobRun:
    """The blocking face of :class:`TrainingJobRun`: the same methods, for sync code.

    Args:
        run: The run it drives.
    """

    def __init__(self, run: TrainingJobRun):
        self.run = run

    @classmethod
    def start(cls, job: TrainingJob, *, key: str | None = None) -> SyncTrainingJobRun:
        """Blocking :meth:`TrainingJobRun.start`."""
        ctx = RunContext.capture()
        return cls(run_in_caller_context(lambda: TrainingJobRun.start(job, key=key, ctx=ctx)))

    @classmethod
    def attach(cls, job: TrainingJob, data: dict[str, Any] | str) -> SyncTrainingJobRun:
        """Blocking :meth:`TrainingJobRun.attach`."""
        ctx = RunContext.capture()
        return cls(run_in_caller_context(lambda: TrainingJobRun.attach(job, data, ctx=ctx)))

    @classmethod
    def from_saved(cls, job: TrainingJob, data: dict[str, Any] | str) -> SyncTrainingJobRun:
        """:meth:`TrainingJobRun.from_saved` (asks the cluster nothing)."""
        return cls(TrainingJobRun.from_saved(job, data))

    @property
    def ref(self) -> JobRef:
        """:attr:`TrainingJobRun.ref`."""
        return self.run.ref

    def to_dict(self) -> dict[str, Any]:
        """:meth:`TrainingJobRun.to_dict`."""
        return self.run.to_dict()

    def wait_for_admission(self, timeout_s: float | None = None) -> AdmissionState:
        """Blocking :meth:`TrainingJobRun.wait_for_admission`."""
        return run_in_caller_context(lambda: self.run.wait_for_admission(timeout_s))

    def wait_for_completion(self) -> None:
        """Blocking :meth:`TrainingJobRun.wait_for_completion`."""
        return run_in_caller_context(self.run.wait_for_completion)

    def fetch_result(self) -> TrainingResult:
        """Blocking :meth:`TrainingJobRun.fetch_result`."""
        return run_in_caller_context(self.run.fetch_result)

    def cancel(self) -> None:
        """Blocking :meth:`TrainingJobRun.cancel`."""
        return run_in_caller_context(self.run.cancel)

    def logs(self, on_line: Callable[[LogLine], object] | None = None) -> None:
        """Blocking :meth:`TrainingJobRun.logs`."""
        return run_in_caller_context(lambda: self.run.logs(on_line))

    def close(self) -> None:
        """Blocking :meth:`TrainingJobRun.close`."""
        return run_in_caller_context(self.run.close)

    def close_later(self) -> None:
        """:meth:`TrainingJobRun.close_later` (returns at once)."""
        self.run.close_later()
