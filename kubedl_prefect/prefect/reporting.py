"""What a training run tells Prefect while it runs: events, artifacts and log lines.

One :class:`JobReporter` per run ties the lifecycle's callbacks to the Prefect surface: each phase
change becomes an event (:mod:`.events`), feeds the timeline (:mod:`.results`) and refreshes the
replica table (:mod:`.artifacts`); each log line moves the progress bar when it reports progress
and goes to the run's log, labelled and rate-limited (:mod:`.logs`). Callbacks run on the
lifecycle's callback threads, inside the captured run context (:class:`.context.RunContext`);
anything that fails in them is logged as a warning and never reaches the watch or the job.

:attr:`JobReporter.calls` counts what was sent to the Prefect API (events, artifact requests, log
lines), for the benchmark; the artifact requests of a run's end are counted once the outbox sent
them (:func:`.outbox.flush_artifacts`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from kubedl_prefect.errors import Diagnosis, WaitTimeoutError
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.lifecycle.backend import JobRef, LogLine, PhaseUpdate, TrainingBackend
from kubedl_prefect.lifecycle.replicas import ReplicaState
from kubedl_prefect.lifecycle.status import Phase
from kubedl_prefect.prefect.artifacts import (
    ArtifactWriter,
    Progress,
    parse_progress,
    trainer_reported_progress,
)
from kubedl_prefect.prefect.context import RunContext
from kubedl_prefect.prefect.events import (
    CancelReason,
    JobEvent,
    emit,
    eviction_events,
    job_event,
    phase_event,
)
from kubedl_prefect.prefect.logs import DEFAULT_BURST, DEFAULT_RATE, LogForwarder
from kubedl_prefect.prefect.outbox import outbox
from kubedl_prefect.prefect.results import Timeline, TrainingResult

logger = logging.getLogger(__name__)

TRAINING_TASKS = ("run-training-job", "wait-for-completion")
"""The tasks whose runs are named ``train <spec name>``, and renamed at each later attempt."""


def task_run_label(verb: str, spec_name: str, attempt: int = 1) -> str:
    """A task run's name: what it does, the spec, and the attempt after the first.

    Example:
        >>> task_run_label("train", "mnist"), task_run_label("train", "mnist", 2)
        ('train mnist', 'train mnist (attempt 2)')
    """
    name = f"{verb} {spec_name}"
    return name if attempt <= 1 else f"{name} (attempt {attempt})"


@runtime_checkable
class ReplicaSource(Protocol):
    """A backend that can list a job's replicas (the Kubernetes backend can)."""

    async def replicas(self, ref: JobRef) -> tuple[ReplicaState, ...]:
        """The job's pods now."""
        ...


@dataclass
class PrefectCalls:
    """What one run sent to the Prefect API."""

    events: int = 0
    artifact_requests: int = 0
    log_lines: int = 0
    log_lines_held: int = 0
    task_run_names: int = 0


class JobReporter:
    """Reports one training run to Prefect.

    Args:
        ctx: The Prefect run the job belongs to.
        backend: The backend that runs the job (asked for replicas, if it can list them).
        stem: The artifacts' key stem (:func:`~.artifacts.artifact_stem`: the deployment or
            flow, and the spec).
        stream_logs: Whether log lines go to the run's log.
        log_rate: Lines a second per replica after ``log_burst``.
        log_burst: Lines a replica may send at once.
        spec_name: The spec's name: a training task's run is named after it and the attempt
            (``train mnist (attempt 2)``).
    """

    def __init__(
        self,
        ctx: RunContext,
        backend: TrainingBackend,
        stem: str,
        *,
        stream_logs: bool = True,
        log_rate: float = DEFAULT_RATE,
        log_burst: int = DEFAULT_BURST,
        spec_name: str = "",
    ):
        self.ctx = ctx
        self.backend = backend
        self.stream_logs = stream_logs
        self.timeline = Timeline()
        self.artifacts = ArtifactWriter(stem, ctx.flow_run_id, ctx.task_run_id)
        self.forwarder = LogForwarder(ctx.logger, rate=log_rate, burst=log_burst)
        self.ref: JobRef | None = None
        self.spec_name = spec_name
        self.task_run_name = ctx.task_run_name
        """The task run's name as this run last knew or set it."""
        self.calls = PrefectCalls()
        self._progressed = False
        self._trainer_reported: Progress | None = None
        self._told: tuple[str, str, str] | None = None
        self._admitted: set[str] = set()
        self._evicted: set[str] = set()
        """uids whose eviction by their queue was told and which are not admitted again yet."""
        self._blockers: dict[str, str] = {}
        """uid -> what the attempt last waited for (a label of its later events)."""
        self._failures: dict[str, tuple[JobRef, PhaseUpdate]] = {}
        """uid -> the Failed update whose event waits for the diagnosis (:meth:`failed`)."""
        self._failed_told: set[str] = set()
        self._ended = False
        """Set by :meth:`finished`: the artifacts are final, a late callback item moves none."""
        self.last_line_at = 0.0
        """When the last log line arrived (monotonic clock)."""

    # -- what the run calls ----------------------------------------------------------------

    def attempt(self, ref: JobRef) -> None:
        """An attempt was submitted or adopted (called on the run's own loop)."""
        self.ref = ref
        self.timeline.submitted(ref)
        self._safely(
            "the created event",
            self._emit,
            job_event(ref, JobEvent.CREATED, related=self.ctx.related()),
        )
        self.ctx.logger.info(
            "training job %s/%s (attempt %d) submitted", ref.namespace, ref.name, ref.attempt
        )
        self._safely("the task run's name", self._name_task_run, ref)

    def _name_task_run(self, ref: JobRef) -> None:
        """Name a training task's run after the spec and the attempt, when that changed.

        The task's ``task_run_name`` names it ``train <spec>`` when it starts (``train
        <block name>`` for a block given by name); a later attempt, or the spec's own name,
        renames it: one request, only when the name changes.
        """
        ctx = self.ctx
        if ctx.task_run_id is None or ctx.task_name not in TRAINING_TASKS or not self.spec_name:
            return
        name = task_run_label("train", self.spec_name, ref.attempt)
        if name == self.task_run_name:
            return
        task_run_id = ctx.task_run_id

        def rename() -> None:
            from prefect.client.orchestration import get_client

            with get_client(sync_client=True) as client:
                client.set_task_run_name(task_run_id, name)

        ctx.call(rename)
        self.task_run_name = name
        self.ctx = replace(ctx, task_run_name=name)  # events name the task run as it is now
        self.calls.task_run_names += 1

    def on_phase(self) -> Callable[[PhaseUpdate], None]:
        """A phase callback for the lifecycle, bound to the run's context."""
        return self.ctx.bind(self._phase)

    def on_line(self) -> Callable[[LogLine], None]:
        """A log callback for the lifecycle, bound to the run's context."""
        return self.ctx.bind(self._line)

    def cancelled(
        self, ref: JobRef, reason: str, category: CancelReason = CancelReason.CANCELLED
    ) -> None:
        """The job was cancelled (deleted by us, or under us)."""
        self._safely(
            "the cancelled event",
            self._emit,
            job_event(
                ref,
                JobEvent.CANCELLED,
                reason=reason,
                related=self.ctx.related(),
                category=category,
                blocker=self._blockers.get(ref.uid, ""),
            ),
        )

    def timed_out(self, ref: JobRef, error: WaitTimeoutError) -> None:
        """A wait ran out of time and the job was deleted: a ``cancelled`` event says why.

        An admission that timed out names what held it back last (``kubedl.blocker``).
        """
        blocker = getattr(error, "blocker", None)
        if blocker:
            self._blockers[ref.uid] = str(blocker)
        self.cancelled(ref, error.message, CancelReason.of_timeout(error.phase))

    def failed(self, ref: JobRef, diagnosis: Diagnosis | None) -> None:
        """An attempt failed and was diagnosed: its ``failed`` event, with the diagnosis.

        The event is the one of the Failed phase change the watch saw (same id and time), held
        back until the diagnosis is known; without one (a job failed before it was watched, a
        permanent blocker) it is told from the diagnosis alone. Told once per attempt.
        """
        if ref.uid in self._failed_told:
            return
        self._failed_told.add(ref.uid)
        held = self._failures.pop(ref.uid, None)
        update = held[1] if held is not None else None
        event = job_event(
            ref,
            JobEvent.FAILED,
            update=update,
            diagnosis=diagnosis,
            related=self.ctx.related(),
            blocker=self._blockers.get(ref.uid, ""),
        )
        self._safely("the failed event", self.ctx.call, self._emit, event)

    def finished(self, result: TrainingResult, diagnosis: Diagnosis | None = None) -> None:
        """The run ended: held-back log counts now; the progress at 100% and the summary next.

        A Failed phase whose diagnosis was not told yet is told now, with the run's diagnosis
        when it is that attempt's. Events and log lines are queued (Prefect sends them in the
        background); the last artifact writes are final, so they go to the process's outbox
        (:mod:`.outbox`) and the caller does not wait for the Prefect API: they reach it right
        after, and at the latest when the process exits (:func:`.outbox.flush_artifacts`).
        """
        final = diagnosis or result.failure()
        for ref, _ in list(self._failures.values()):
            self.failed(ref, final if ref.uid == result.ref.get("uid") else None)
        self._ended = True
        self.ctx.call(self.forwarder.flush)
        self.calls.log_lines = self.forwarder.sent_total
        self.calls.log_lines_held = self.forwarder.held_total
        job = self.ref.name if self.ref is not None else result.spec_name
        outbox().submit(
            f"the last artifacts of training job {job}",
            lambda: self.ctx.call(self._final_artifacts, result),
        )

    def _final_artifacts(self, result: TrainingResult) -> None:
        """The run's last artifact writes, in order (on an outbox thread, in the run's context)."""
        try:
            # The terminal phase change refreshed the replica table; an update Prefect never
            # got (it was down) goes again now.
            self._safely("the replica table", self._resend)
            if self._progressed and result.succeeded:
                self._safely("the progress artifact", self._progress_done)
            self._safely("the summary artifact", self._summary, result)
        finally:
            self.artifacts.close()

    # -- on callback threads ---------------------------------------------------------------

    def _phase(self, update: PhaseUpdate) -> None:
        ref = self.ref
        if ref is None:
            return
        self.timeline.observe(update)
        self._safely("the replica table", self._refresh_replicas, ref, update)
        if update.status.trainer is not None:
            # A TrainJob's program may report to Trainer's status server instead of printing
            # progress lines: the same artifact shows it (only when it changed).
            reported = trainer_reported_progress(update.status.trainer)
            if reported is not None and reported != self._trainer_reported:
                self._trainer_reported = reported
                self._show_progress(reported)
        # Replica counts change often within a phase: the table shows them; events and log
        # lines tell a new phase (or, while queued, a new reason) once.
        reason = (
            update.admission.reason if update.phase == Phase.QUEUING and update.admission else ""
        )
        told = (ref.uid, update.phase, reason)
        if told == self._told:
            return
        self._told = told
        if update.phase == Phase.QUEUING and update.admission and update.admission.blocker:
            self._blockers[ref.uid] = str(update.admission.blocker)
        blocker = self._blockers.get(ref.uid, "")
        hold = update.status.queue
        if update.phase == Phase.QUEUING and hold is not None and hold.requeued:
            if ref.uid not in self._evicted:
                # Its queue evicted the job (the same job is admitted again later): told once
                # per eviction, and its next admission is told again.
                self._evicted.add(ref.uid)
                self._admitted.discard(ref.uid)
                for eviction in eviction_events(ref, update, self.ctx.related(), blocker=blocker):
                    self._safely(f"the {eviction.event} event", self._emit, eviction)
        elif update.phase != Phase.QUEUING:
            self._evicted.discard(ref.uid)
        started = (Phase.RUNNING, Phase.RESTARTING, Phase.SUCCEEDED)
        if update.phase == Phase.ADMITTED:
            self._admitted.add(ref.uid)
        elif update.phase in started and ref.uid not in self._admitted:
            # The wait first saw the job past admission (it was admitted before anyone
            # looked): admission is still a milestone automations wait for.
            self._admitted.add(ref.uid)
            admitted = job_event(
                ref, JobEvent.ADMITTED, update=update, related=self.ctx.related(), blocker=blocker
            )
            admitted.payload["phase"] = str(Phase.ADMITTED)
            self._safely("the admitted event", self._emit, admitted)
        if update.phase == Phase.FAILED:
            # Told by failed(), with the diagnosis the run gets next.
            if ref.uid not in self._failed_told:
                self._failures[ref.uid] = (ref, update)
        else:
            event = phase_event(ref, update, self.ctx.related(), blocker=blocker)
            if event is not None:
                self._safely(f"the {event.event} event", self._emit, event)
        if update.phase.terminal:
            level = logging.INFO if update.phase == "Succeeded" else logging.WARNING
            self.ctx.logger.log(level, "training job %s: %s", ref.name, update.phase)
        elif update.admission is not None and not update.admission.admitted:
            self.ctx.logger.info("training job %s queued: %s", ref.name, update.admission.reason)
        elif update.phase == Phase.ADMITTED and update.admission and update.admission.reason:
            # How it was admitted, when that is news (Kueue lent it quota from the cohort).
            how = update.admission.reason
            self.ctx.logger.info("training job %s: %s (%s)", ref.name, update.phase, how)
        else:
            self.ctx.logger.info("training job %s: %s", ref.name, update.phase)

    def _line(self, line: LogLine) -> None:
        self.last_line_at = time.monotonic()
        progress = parse_progress(line.text)
        if progress is not None:
            self._show_progress(progress)
        if self.stream_logs:
            self.forwarder(line)

    # -- helpers ---------------------------------------------------------------------------

    def _show_progress(self, progress: Progress) -> None:
        if self.ref is None or self._ended:
            return
        self._progressed = True
        before = self.artifacts.requests
        self._safely("the progress artifact", self.artifacts.progress, progress, self.ref.name)
        self.calls.artifact_requests += self.artifacts.requests - before

    def _emit(self, event: object) -> None:
        from kubedl_prefect.prefect.events import EventSpec

        assert isinstance(event, EventSpec)
        if emit(event):
            self.calls.events += 1

    def _refresh_replicas(self, ref: JobRef, update: PhaseUpdate) -> None:
        if not isinstance(self.backend, ReplicaSource) or self._ended:
            return
        states = KubeRuntime.get().block_on(self.backend.replicas(ref))
        before = self.artifacts.requests
        queued = update.phase == Phase.QUEUING and update.admission is not None
        waiting = update.admission.reason if queued and update.admission is not None else ""
        self.artifacts.replicas(states, ref.name, waiting=waiting)
        self.calls.artifact_requests += self.artifacts.requests - before

    def _resend(self) -> None:
        before = self.artifacts.requests
        self.artifacts.resend()
        self.calls.artifact_requests += self.artifacts.requests - before

    def _progress_done(self) -> None:
        latest = self.artifacts.latest
        if self.ref is not None and latest is not None:
            before = self.artifacts.requests
            self.artifacts.progress(latest.done(), self.ref.name)
            self.calls.artifact_requests += self.artifacts.requests - before

    def _summary(self, result: TrainingResult) -> None:
        before = self.artifacts.requests
        self.artifacts.summary(result)
        self.calls.artifact_requests += self.artifacts.requests - before

    def _safely(self, what: str, function: Callable[..., object], *args: object) -> None:
        try:
            function(*args)
        except Exception as exc:
            self.ctx.logger.warning(
                "kubedl-prefect could not update %s: %s: %s", what, type(exc).__name__, exc
            )
