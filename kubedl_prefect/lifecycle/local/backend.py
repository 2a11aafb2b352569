"""The local backend: a training job's replicas as processes of this machine.

The same :class:`~kubedl_prefect.lifecycle.backend.TrainingBackend` as the Kubernetes one, so
that every flow, task and block runs unchanged on a laptop: deterministic job names, adoption of
a job that is already there, a run record per logical job so that replays never train a finished
job again, admission with a reason, phases, labelled logs of every replica, failures diagnosed
into the same categories, retries that resume from the checkpoint, and cancellation that ends the
whole process tree.

Where a cluster has an API server, this backend has a *workspace*, a directory (see
:mod:`.layout`): a job is a directory there, created atomically; a
:mod:`.supervisor` process per job plays the operator and the kubelet, detached from the caller
so that the job outlives a crashed flow process; the job's ``state.json`` is its status, and the
supervisor's wake-up socket is its watch: a waiter re-reads the files on each wake-up and decides
with the pure functions of :mod:`.state`, never on a timer. A :class:`JobRef` of this backend has
``backend="local"``, ``cluster="local://<hostname>"`` and the workspace as its ``namespace``.

Blocking file work runs in worker threads (``asyncio.to_thread``), so the methods can be awaited
from any event loop (and through :class:`~kubedl_prefect.lifecycle.backend.SyncTrainingBackend`);
callbacks run on threads of their own (:mod:`..delivery`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Final

import psutil

from kubedl_prefect.errors import (
    AdmissionRefusedError,
    AdoptionRefusedError,
    ConflictError,
    JobCancelledError,
    JobFailedError,
    KubeDLPrefectError,
    WaitTimeoutError,
)
from kubedl_prefect.kube.delivery import delivered
from kubedl_prefect.lifecycle.admission import AdmissionState
from kubedl_prefect.lifecycle.backend import (
    JobOutcome,
    JobRef,
    LogCallback,
    LogLine,
    PhaseCallback,
    WaitTimeouts,
    attempt_ended,
    attempt_started,
    check_backend_of,
)
from kubedl_prefect.lifecycle.diagnosis import Diagnosis
from kubedl_prefect.lifecycle.local.capacity import LocalCapacity, admit, gpu_ids, machine_capacity
from kubedl_prefect.lifecycle.local.contract import (
    check_local,
    inherited_env,
    local_checkpoint_dir,
    ports_needed,
    replica_plans,
    success_replicas,
)
from kubedl_prefect.lifecycle.local.layout import (
    JOB_FILE,
    JOB_MARKER_ENV,
    LOG_DIR,
    NEW_PREFIX,
    STATE_FILE,
    SUPERVISOR_LOG,
    check_inside,
    check_job_name,
    check_no_link,
    check_workspace,
    checked_socket,
    job_dir,
    job_process,
    jobs_dir,
    locked,
    log_path,
    open_read,
    parse_log_line,
    private_dir,
    process_of,
    read_json,
    record_path,
    remove_socket,
    socket_path,
    write_json,
)
from kubedl_prefect.lifecycle.local.state import (
    JobDocument,
    JobState,
    admission,
    diagnose_local,
    job_status,
    lost,
    now_rfc3339,
    replica_rows,
)
from kubedl_prefect.lifecycle.records import (
    AttemptRecord,
    RunRecord,
    other_spec,
    record_name,
    record_name_of,
    recorded_failure,
)
from kubedl_prefect.lifecycle.replicas import ReplicaState as ReplicaRow
from kubedl_prefect.lifecycle.status import JobStatus, Phase
from kubedl_prefect.lifecycle.waiting import PhaseTracker, admission_timeout, phase_timeout
from kubedl_prefect.spec import TrainingJobSpec, job_name, spec_hash
from kubedl_prefect.spec.model import SPEC_API_VERSION
from kubedl_prefect.spec.types import FRAMEWORKS, Dialect

logger = logging.getLogger(__name__)

BACKEND_NAME: Final = "local"
LOCAL_DIALECT: Final = "local"
WORKSPACE_ENV: Final = "KUBEDL_PREFECT_LOCAL_WORKSPACE"
"""Environment variable naming the default workspace."""

_SUPERVISOR_MODULE: Final = "kubedl_prefect.lifecycle.local.supervisor"
_SUPERVISOR_START_S: Final = 60.0
_TAIL_LINES: Final = 20
_GONE_GRACE_S: Final = 5.0


def default_workspace() -> Path:
    """``$KUBEDL_PREFECT_LOCAL_WORKSPACE``, else ``~/.cache/kubedl-prefect/local``."""
    given = os.environ.get(WORKSPACE_ENV)
    if given:
        return Path(given).expanduser()
    return Path.home() / ".cache" / "kubedl-prefect" / "local"


class LocalBackend:
    """Runs training jobs as local processes, under the environment the operators give them.

    Args:
        workspace: The directory that holds the jobs, their logs, records and checkpoints
            (default: :func:`default_workspace`).
        capacity: What the machine offers a job (default: its CPUs, memory and GPUs).
        env: Variables for every replica; they override the spec's, stand in for its Secret
            and ConfigMap references (the tracking credentials of a model handoff), and are
            never written to disk.
        working_dir: The replicas' working directory (default: the current one).
        python: The interpreter that runs ``python`` commands (default: this one).
        labels: Labels of the jobs it creates (kept in their ``job.json``; see
            :meth:`find_jobs`).
        success_grace_s: After the job succeeded, how long the other replicas may take to end
            by themselves before they are stopped.
        dialect: The operator whose environment the replicas get: ``trainer`` gives PyTorch
            jobs Kubeflow Trainer's (``PET_*`` for torchrun), so that a program debugged here
            runs unchanged in a TrainJob; the default, the v1 operators' (``MASTER_ADDR``,
            ``RANK``...).
        termination_grace_s: How long a replica gets between SIGTERM and SIGKILL.

    Example:
        >>> import tempfile
        >>> backend = LocalBackend(tempfile.mkdtemp(), env={"MLFLOW_TRACKING_URI": "file:///t"})
        >>> backend.name, backend.cluster.startswith("local://")
        ('local', True)
    """

    name = BACKEND_NAME

    def __init__(
        self,
        workspace: str | os.PathLike[str] | None = None,
        *,
        capacity: LocalCapacity | None = None,
        env: Mapping[str, str] | None = None,
        working_dir: str | os.PathLike[str] | None = None,
        python: str | None = None,
        labels: Mapping[str, str] | None = None,
        success_grace_s: float = 5.0,
        termination_grace_s: float = 10.0,
        dialect: Dialect | str | None = None,
    ):
        self.workspace = str(Path(workspace or default_workspace()).expanduser().resolve())
        self.capacity = capacity or machine_capacity()
        self.env = dict(env or {})
        self.working_dir = str(Path(working_dir or os.getcwd()).resolve())
        self.python = python or sys.executable
        self.labels = dict(labels or {})
        self.success_grace_s = success_grace_s
        self.termination_grace_s = termination_grace_s
        self.dialect = Dialect(dialect) if dialect is not None else None
        self.host = socket.gethostname()
        self.cluster = f"local://{self.host}"
        self._noticed: set[str] = set()

    @property
    def namespace(self) -> str:
        """The workspace: what a job reference of this backend has as its namespace."""
        return self.workspace

    def __repr__(self) -> str:
        return (
            f"LocalBackend(workspace={self.workspace!r}, capacity={self.capacity!r}, "
            f"env=<{len(self.env)} variables>)"
        )

    async def close(self) -> None:
        """Nothing to release: the backend holds no connection (jobs are not touched)."""

    # -- submit or adopt -------------------------------------------------------------------

    async def submit(
        self, spec: TrainingJobSpec, *, key: str, attempt: int = 1, dry_run: bool = False
    ) -> JobRef:
        """Start the job for ``(key, attempt)``, or adopt the one that is already there.

        Nothing is started when the machine cannot fit the replicas. The attempt is added to
        the logical job's record (not for a dry run).

        Raises:
            SpecError: The spec cannot run locally (MPI, elastic, no command, Secret references).
            AdmissionRefusedError: The machine can never fit the replicas at once.
            AdoptionRefusedError: The job exists for another key or spec, or the logical job was
                recorded for another spec.
            KubeDLPrefectError: The supervisor could not be started.
        """
        check_local(spec, provided=set(self.env))
        name = job_name(spec.name, key, attempt)
        decision = admit(spec, self.capacity, host=self.host)
        if not decision.admitted:
            raise AdmissionRefusedError(
                f"{FRAMEWORKS[spec.framework].kind} {name} was refused: {decision.reason}",
                reason=decision.reason,
                blocker=str(decision.blocker),
                hint="ask for fewer replicas or less per replica, or run it on a cluster",
            )
        self._notice_image(spec)
        return await asyncio.to_thread(self._submit, spec, key, attempt, name, decision, dry_run)

    def _notice_image(self, spec: TrainingJobSpec) -> None:
        images = sorted({r.image for r in spec.resolved_roles() if r.image})
        for image in images:
            if image not in self._noticed:
                self._noticed.add(image)
                logger.warning(
                    "local backend: image %s is not used; %s runs its command in this Python "
                    "environment (%s)",
                    image,
                    spec.name,
                    self.python,
                )

    def _submit(
        self,
        spec: TrainingJobSpec,
        key: str,
        attempt: int,
        name: str,
        decision: AdmissionState,
        dry_run: bool,
    ) -> JobRef:
        wanted = spec_hash(spec)
        workspace = Path(self.workspace)
        for folder in (workspace, jobs_dir(workspace), workspace / "records"):
            if dry_run:
                check_no_link(folder)
            else:
                private_dir(folder)
        record = _read_record(self.workspace, record_name(spec.name, key))
        if record is not None and record.spec_hash != wanted:
            raise _other_spec(self.workspace, record, wanted)
        directory = job_dir(self.workspace, name)
        check_no_link(directory)
        if os.path.lexists(directory):
            document = _adoptable(directory, key, wanted)
        elif dry_run:
            return self._ref_of(self._document(spec, key, attempt, name, wanted, uid=""))
        else:
            document = self._start(spec, key, attempt, name, wanted, decision)
        ref = self._ref_of(document)
        if not dry_run:
            self._record(ref, spec.name, attempt_started(ref))
        return ref

    def _document(
        self,
        spec: TrainingJobSpec,
        key: str,
        attempt: int,
        name: str,
        wanted: str,
        *,
        uid: str,
        replicas: tuple[tuple[str, str, int], ...] = (),
        checkpoint_dir: str | None = None,
    ) -> JobDocument:
        info = FRAMEWORKS[spec.framework]
        return JobDocument(
            name=name,
            uid=uid,
            key=key,
            attempt=attempt,
            spec_name=spec.name,
            spec_hash=wanted,
            kind=info.kind,
            container=info.container_name(Dialect.KUBEFLOW),
            replicas=replicas,
            socket=socket_path(job_dir(self.workspace, name), uid),
            checkpoint_dir=checkpoint_dir,
            labels=self.labels,
        )

    def _start(
        self,
        spec: TrainingJobSpec,
        key: str,
        attempt: int,
        name: str,
        wanted: str,
        decision: AdmissionState,
    ) -> JobDocument:
        uid = uuid.uuid4().hex
        checkpoint_dir = local_checkpoint_dir(spec, key, self.workspace)
        if checkpoint_dir is not None:
            path = Path(checkpoint_dir)
            if path.is_relative_to(self.workspace):
                private_dir(check_inside(path, Path(self.workspace)))
            else:  # a file:// location of the user's: used as it is, but never through a link
                path.mkdir(mode=0o700, parents=True, exist_ok=True)
                check_no_link(path)
        plans = replica_plans(
            spec,
            job_name=name,
            ports=_free_ports(ports_needed(spec)),
            python=self.python,
            working_dir=self.working_dir,
            checkpoint_dir=checkpoint_dir,
            gpu_ids=gpu_ids()[: self.capacity.gpus],
            extra_env=self.env,
            hostname=self.host,
            inherited=os.environ,
            job_uid=uid,
            loopback_interface=loopback_interface(),
            dialect=self.dialect,
        )
        document = self._document(
            spec,
            key,
            attempt,
            name,
            wanted,
            uid=uid,
            replicas=tuple((p.name, p.role, p.index) for p in plans),
            checkpoint_dir=checkpoint_dir,
        )
        jobs = private_dir(jobs_dir(self.workspace))
        private_dir(Path(document.socket).parent)  # under TMPDIR: refused if planted
        new_dir = jobs / f"{NEW_PREFIX}{uid}"
        new_dir.mkdir(mode=0o700)
        (new_dir / LOG_DIR).mkdir(mode=0o700)
        write_json(new_dir / JOB_FILE, document.to_dict())
        write_json(new_dir / STATE_FILE, document.initial_state().to_dict())
        plan = {
            "job": document.to_dict(),
            "replicas": [p.to_dict() for p in plans],
            "success": sorted(success_replicas(spec)),
            "successGraceS": self.success_grace_s,
            "terminationGraceS": self.termination_grace_s,
            "activeDeadlineSeconds": spec.active_deadline_seconds,
            "admission": decision.reason,
            "newDir": str(new_dir),
            "jobDir": str(job_dir(self.workspace, name)),
        }
        try:
            answer = subprocess.run(
                [self.python, "-m", _SUPERVISOR_MODULE],
                input=json.dumps(plan).encode(),
                capture_output=True,
                timeout=_SUPERVISOR_START_S,
                check=False,
                cwd=self.working_dir,
                env={**inherited_env(os.environ), JOB_MARKER_ENV: uid},
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            shutil.rmtree(new_dir, ignore_errors=True)
            raise KubeDLPrefectError(
                f"the local supervisor of {name} could not be started: {exc}",
                hint=f"check that {self.python} runs and can import kubedl_prefect",
            ) from exc
        said = answer.stdout.decode(errors="replace").strip()
        if said.startswith("claimed"):
            return document
        if said == "exists":
            return _adoptable(job_dir(self.workspace, name), key, wanted)
        log = _tail_text(new_dir / SUPERVISOR_LOG) or answer.stderr.decode(errors="replace")
        shutil.rmtree(new_dir, ignore_errors=True)
        raise KubeDLPrefectError(
            f"the local supervisor of {name} did not start: {said or 'no answer'}\n{log}".strip(),
            hint=f"check that {self.python} -m {_SUPERVISOR_MODULE} runs in this environment",
        )

    def _ref_of(self, document: JobDocument) -> JobRef:
        return JobRef(
            backend=self.name,
            cluster=self.cluster,
            dialect=LOCAL_DIALECT,
            namespace=self.workspace,
            name=document.name,
            uid=document.uid,
            api_version=SPEC_API_VERSION,
            kind=document.kind,
            key=document.key,
            attempt=document.attempt,
            spec_hash=document.spec_hash,
        )

    # -- records of logical jobs -----------------------------------------------------------

    async def history(self, spec: TrainingJobSpec, *, key: str) -> RunRecord | None:
        """What was recorded of the attempts of ``(spec.name, key)`` in this workspace.

        Raises:
            AdoptionRefusedError: The logical job was recorded for another spec.
        """

        def read() -> RunRecord | None:
            record = _read_record(self.workspace, record_name(spec.name, key))
            if record is not None and record.spec_hash != spec_hash(spec):
                raise _other_spec(self.workspace, record, spec_hash(spec))
            return record

        return await asyncio.to_thread(read)

    def _record(self, ref: JobRef, spec_name: str, entry: AttemptRecord) -> None:
        path = record_path(ref.namespace, record_name_of(ref.name))
        with locked(path.with_suffix(".lock")):
            record = _read_record(ref.namespace, record_name_of(ref.name))
            if record is None:
                record = RunRecord(spec_name=spec_name, key=ref.key, spec_hash=ref.spec_hash)
            elif record.spec_hash != ref.spec_hash:
                raise _other_spec(ref.namespace, record, ref.spec_hash)
            write_json(path, _merged(record, entry).to_dict())

    def _recorded_end(self, ref: JobRef) -> AttemptRecord | None:
        record = _read_record(ref.namespace, record_name_of(ref.name))
        entry = record.get(ref.attempt) if record is not None else None
        if entry is None or not entry.finished or (ref.uid and entry.uid != ref.uid):
            return None
        return entry

    def _record_end(self, ref: JobRef, status: JobStatus, diagnosis: Diagnosis | None) -> None:
        self._record(
            ref,
            record_name_of(ref.name).rsplit("-", 1)[0],
            attempt_ended(ref, status, diagnosis),
        )

    # -- attaching -------------------------------------------------------------------------

    def _check_reference(self, ref: JobRef) -> None:
        """Refuse a reference of another backend or machine, or one that leaves its workspace."""
        check_backend_of(ref, self.name)
        if ref.cluster and ref.cluster != self.cluster:
            raise KubeDLPrefectError(
                f"job reference {ref.name} is of the machine {ref.cluster}, but this backend runs "
                f"on {self.cluster}",
                hint="attach it on the machine it was submitted on",
            )
        check_job_name(ref.name)
        check_workspace(ref.namespace)

    async def attach(self, ref: JobRef) -> JobRef:
        """Find the job of ``ref`` again, from any process of this machine.

        The reference's workspace is used, whatever this backend's. A job that is gone but whose
        end was recorded attaches too (waiting on it returns the recorded outcome).

        Raises:
            KubeDLPrefectError: ``ref`` is of another backend or another machine.
            JobCancelledError: The job is gone (or was replaced) and its end was never recorded.
        """
        self._check_reference(ref)

        def find() -> JobRef:
            try:
                document = _read_document(_checked_job_dir(ref))
            except FileNotFoundError as exc:
                if self._recorded_end(ref) is not None:
                    return ref
                raise _gone(ref) from exc
            if ref.uid and document.uid != ref.uid:
                raise JobCancelledError(
                    f"{ref.kind} {ref.name} was replaced by another job of the same name (uid "
                    f"{document.uid}, the reference has {ref.uid})",
                    hint="the job of this reference was deleted; submit again to run it",
                )
            return ref if ref.uid else replace(ref, uid=document.uid)

        return await asyncio.to_thread(find)

    # -- following a job -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _watch(self, ref: JobRef) -> AsyncIterator[_Watch]:
        self._check_reference(ref)
        watch = _Watch(ref)
        async with watch:
            yield watch

    async def wait_admitted(
        self, ref: JobRef, *, timeout_s: float | None, on_phase: PhaseCallback | None = None
    ) -> AdmissionState:
        """Wait until the job's replicas are admitted: at once, locally (it was checked).

        Raises:
            JobFailedError: The job failed before it was admitted.
            JobCancelledError: The job is gone (and its end was not recorded).
        """
        async with delivered(on_phase, f"phases of {ref.name}") as callback:
            try:
                async with self._watch(ref) as watch:
                    tracker = PhaseTracker(callback)
                    deadline = _deadline(timeout_s)
                    while True:
                        state = await watch.read()
                        status, admitted = job_status(state), admission(state, self.host)
                        tracker.observe(status, admitted)
                        if admitted.admitted or status.phase in (Phase.RUNNING, Phase.SUCCEEDED):
                            return admitted
                        if status.phase == Phase.FAILED:
                            diagnosis = await watch.diagnose(state)
                            raise _failed(ref, diagnosis)
                        await watch.wait(deadline, admission_timeout(ref, timeout_s, admitted))
            except JobCancelledError:
                ended = await asyncio.to_thread(self._recorded_end, ref)
                if ended is None:
                    raise
                if not ended.succeeded:
                    raise recorded_failure(
                        f"{ref.kind} {ref.namespace}/{ref.name}", ended
                    ) from None
                return AdmissionState(admitted=True, reason="the attempt ran and ended (recorded)")

    async def wait_completed(
        self,
        ref: JobRef,
        *,
        timeouts: WaitTimeouts = WaitTimeouts(),
        on_phase: PhaseCallback | None = None,
    ) -> JobOutcome:
        """Follow the job until Succeeded or Failed.

        A failure is returned diagnosed (``outcome.diagnosis``), not raised. The end is added
        to the logical job's record; a job that is gone but whose end was recorded returns that
        outcome (``outcome.replayed``).

        Raises:
            StartupTimeoutError, CompletionTimeoutError: A phase ran out of time (the job is
                left as it is).
            JobCancelledError: The job was cancelled meanwhile (and its end was not recorded).
        """
        async with delivered(on_phase, f"phases of {ref.name}") as callback:
            try:
                outcome = await self._follow_to_end(ref, timeouts, callback)
            except JobCancelledError:
                ended = await asyncio.to_thread(self._recorded_end, ref)
                if ended is None:
                    raise
                return JobOutcome(ref, ended.status(), ended.diagnosis, replayed=True)
            await asyncio.to_thread(self._record_end, ref, outcome.status, outcome.diagnosis)
            return outcome

    async def _follow_to_end(
        self, ref: JobRef, timeouts: WaitTimeouts, on_phase: PhaseCallback | None
    ) -> JobOutcome:
        async with self._watch(ref) as watch:
            tracker = PhaseTracker(on_phase)
            stage, deadline = "admission", _deadline(timeouts.admission_s)
            while True:
                state = await watch.read()
                status, admitted = job_status(state), admission(state, self.host)
                tracker.observe(status, admitted)
                if status.phase.terminal:
                    diagnosis = None
                    if status.phase == Phase.FAILED:
                        diagnosis = await watch.diagnose(state)
                    return JobOutcome(ref, status, diagnosis, tuple(tracker.history))
                if stage == "admission" and admitted.admitted:
                    stage, deadline = "startup", _deadline(timeouts.startup_s)
                if stage == "startup" and status.phase == Phase.RUNNING:
                    stage, deadline = "completion", _deadline(timeouts.completion_s)
                await watch.wait(deadline, phase_timeout(ref, stage, timeouts, status, admitted))

    async def follow_logs(self, ref: JobRef, on_line: LogCallback) -> None:
        """Deliver every replica's log lines, from the first, until the job has ended.

        Each line is labelled with its replica (``worker-1``) and carries the time it was
        printed. A job cancelled meanwhile ends the stream. ``on_line`` runs on a thread of its
        own, in order.

        Raises:
            JobCancelledError: The job is not there (and never was, or was cancelled before).
        """
        async with delivered(on_line, f"logs of {ref.name}") as callback:
            assert callback is not None
            async with self._watch(ref) as watch:
                offsets: dict[str, int] = {}
                while True:
                    try:
                        state = await watch.read()
                    except JobCancelledError:
                        return
                    await asyncio.to_thread(watch.deliver_lines, offsets, callback)
                    if state.terminal:
                        return
                    await watch.wait(None, None)

    async def replicas(self, ref: JobRef) -> tuple[ReplicaRow, ...]:
        """The job's replicas now, one row per process, as a cluster's replica table shows pods.

        Empty for a job that is gone.
        """
        self._check_reference(ref)

        def read() -> tuple[ReplicaRow, ...]:
            try:
                state = JobState.from_dict(read_json(_checked_job_dir(ref) / STATE_FILE))
            except FileNotFoundError:
                return ()
            return replica_rows(state, ref.name, self.host)

        return await asyncio.to_thread(read)

    def checkpoint_location(self, spec: TrainingJobSpec, key: str) -> str | None:
        """Where the replicas of ``(spec.name, key)`` keep checkpoints on this machine.

        See :func:`~kubedl_prefect.lifecycle.local.contract.local_checkpoint_dir`.
        """
        return local_checkpoint_dir(spec, key, self.workspace)

    async def find_jobs(self, labels: Mapping[str, str]) -> list[JobRef]:
        """The jobs of the workspace that carry every one of ``labels`` (ended ones too).

        As :meth:`KubernetesBackend.find_jobs
        <kubedl_prefect.lifecycle.kubernetes.KubernetesBackend.find_jobs>`: clean-up uses it to
        find what one Prefect flow run created.

        Args:
            labels: Labels the jobs must carry (``{"kubedl-prefect.io/flow-run-id": ...}``).
        """

        def find() -> list[JobRef]:
            found: list[JobRef] = []
            jobs = jobs_dir(self.workspace)
            check_no_link(jobs)
            for directory in sorted(jobs.iterdir()) if jobs.is_dir() else []:
                if directory.name.startswith(NEW_PREFIX):
                    continue  # a job being created: its supervisor renames it into place
                try:
                    check_job_name(directory.name)
                    check_no_link(directory)
                    document = _read_document(directory)
                except KubeDLPrefectError as exc:
                    logger.warning("skipping %s of the local workspace: %s", directory, exc)
                    continue
                except (FileNotFoundError, NotADirectoryError, ValueError, KeyError):
                    continue
                if all(document.labels.get(k) == v for k, v in labels.items()):
                    found.append(self._ref_of(document))
            return found

        return await asyncio.to_thread(find)

    # -- cancel ----------------------------------------------------------------------------

    async def cancel(self, ref: JobRef, *, timeout_s: float = 120.0) -> None:
        """Stop every process of the job (SIGTERM, then SIGKILL) and delete it. Idempotent.

        Returns once no process of the job is left — the replicas, whatever they started, and
        the supervisor.

        Raises:
            WaitTimeoutError: Some process of the job was still there after ``timeout_s``.
        """
        self._check_reference(ref)
        await asyncio.to_thread(_cancel, ref, timeout_s)


# -- watching one job ------------------------------------------------------------------------


def _deadline(timeout_s: float | None) -> float | None:
    return None if timeout_s is None else time.monotonic() + timeout_s


class _Watch:
    """One local job's files, re-read whenever its supervisor says something changed."""

    def __init__(self, ref: JobRef):
        self.ref = ref
        self.dir = job_dir(ref.namespace, ref.name)  # checked when it is read
        self.document: JobDocument | None = None
        self._changed = asyncio.Event()
        self._hung_up = False
        self._writer: asyncio.StreamWriter | None = None
        self._listener: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Watch:
        self.document = await asyncio.to_thread(self._read_document)
        try:
            sock = checked_socket(self.dir, self.document.uid, self.document.socket)
            reader, self._writer = await asyncio.open_unix_connection(sock)
        except OSError:  # the supervisor is gone: its state says how the job ended
            self._hung_up = True
        else:
            self._listener = asyncio.create_task(self._listen(reader))
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()

    async def _listen(self, reader: asyncio.StreamReader) -> None:
        try:
            while await reader.read(4096):
                self._changed.set()
        except OSError:
            pass
        finally:
            self._hung_up = True
            self._changed.set()

    def _read_document(self) -> JobDocument:
        try:
            document = _read_document(_checked_job_dir(self.ref))
        except FileNotFoundError:
            raise _gone(self.ref) from None
        if self.ref.uid and document.uid != self.ref.uid:
            raise _gone(self.ref)
        return document

    def _read_state(self) -> JobState:
        try:
            return JobState.from_dict(read_json(self.dir / STATE_FILE))
        except FileNotFoundError:
            raise _gone(self.ref) from None

    async def read(self) -> JobState:
        """The job's current state; a job whose supervisor is gone early reads as lost."""
        state = await asyncio.to_thread(self._read_state)
        if state.terminal or not self._hung_up:
            return state
        # The supervisor hung up: it writes the final state first, unless it was killed.
        until = time.monotonic() + _GONE_GRACE_S
        while True:
            state = await asyncio.to_thread(self._read_state)
            if state.terminal:
                return state
            if process_of(state.supervisor) is None or time.monotonic() > until:
                uid = self.document.uid if self.document is not None else ""
                return await asyncio.to_thread(_mark_lost, self.dir, state, uid)
            await asyncio.sleep(0.05)

    async def wait(self, deadline: float | None, error: Exception | None) -> None:
        """Wait for the next change; raise ``error`` when ``deadline`` (monotonic) passes first."""
        if self._hung_up:
            return  # nothing will change any more: the next read settles it
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0 and error is not None:
            raise error
        try:
            async with asyncio.timeout(left):
                await self._changed.wait()
        except TimeoutError:
            if error is not None:
                raise error from None
            return
        self._changed.clear()

    async def diagnose(self, state: JobState) -> Diagnosis:
        """Why the job failed, from its replicas and the last lines of the failed ones' logs."""
        tails = await asyncio.to_thread(self._failed_tails, state)
        assert self.document is not None
        return diagnose_local(
            state, job_name=self.ref.name, container=self.document.container, log_tails=tails
        )

    def _failed_tails(self, state: JobState) -> dict[str, list[str]]:
        return {
            r.name: [text for _, text in _tail_lines(log_path(self.dir, r.name), _TAIL_LINES)]
            for r in state.replicas
            if r.failed
        }

    def deliver_lines(self, offsets: dict[str, int], deliver: Callable[[LogLine], None]) -> None:
        """Hand every complete line written since ``offsets`` to ``deliver``; advance them."""
        assert self.document is not None
        for name, _, _ in self.document.replicas:
            path = log_path(self.dir, name)
            try:
                with open_read(path) as log:
                    log.seek(offsets.get(name, 0))
                    data = log.read()
            except FileNotFoundError:
                continue
            complete = data[: data.rfind(b"\n") + 1]
            offsets[name] = offsets.get(name, 0) + len(complete)
            for raw in complete.splitlines():
                stamp, text = parse_log_line(raw)
                deliver(
                    LogLine(
                        replica=name,
                        container=self.document.container,
                        timestamp=stamp,
                        text=text,
                        attempt=self.ref.attempt,
                    )
                )


# -- files and processes ---------------------------------------------------------------------


def _read_document(directory: Path) -> JobDocument:
    document = JobDocument.from_dict(read_json(directory / JOB_FILE))
    if document.name != directory.name:
        raise KubeDLPrefectError(
            f"{directory / JOB_FILE} describes the job {document.name!r}, not {directory.name!r}",
            hint="the file was changed by someone else: remove the job's folder by hand",
        )
    return document


def _checked_job_dir(ref: JobRef) -> Path:
    """The folder of ``ref``'s job, checked to be a real folder inside its workspace."""
    workspace = check_workspace(ref.namespace)
    return check_inside(job_dir(workspace, ref.name), jobs_dir(workspace))


def loopback_interface() -> str:
    """The name of this machine's loopback interface (``lo``; ``lo0`` on macOS)."""
    with contextlib.suppress(OSError):
        for name, addresses in psutil.net_if_addrs().items():
            if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
                return name
    return "lo0" if sys.platform == "darwin" else "lo"


def _read_record(workspace: str, name: str) -> RunRecord | None:
    try:
        return RunRecord.from_dict(read_json(record_path(workspace, name)))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        logger.warning("ignoring the unreadable run record %s: %s", name, exc)
        return None


def _merged(record: RunRecord, entry: AttemptRecord) -> RunRecord:
    """``record`` with ``entry`` written in.

    A recorded end is never replaced by ``Submitted`` (a late submission that adopted the job);
    an entry of a re-created job (another uid) replaces the old one.
    """
    entry = replace(entry, recorded_at=entry.recorded_at or time.time())
    old = record.get(entry.attempt)
    if old is not None and old.finished and not entry.finished and old.uid == entry.uid:
        return record
    others = tuple(a for a in record.attempts if a.attempt != entry.attempt)
    return replace(record, attempts=tuple(sorted((*others, entry), key=lambda a: a.attempt)))


def _adoptable(directory: Path, key: str, wanted: str) -> JobDocument:
    check_inside(directory, directory.parent)
    document = _read_document(directory)
    if document.key != key:
        raise AdoptionRefusedError(
            f"{document.kind} {document.name} already exists in {directory.parent.parent} and "
            "was not created for this key",
            status=409,
            reason="AlreadyExists",
            hint="cancel it, or submit with another key or spec name",
        )
    if document.spec_hash != wanted:
        raise AdoptionRefusedError(
            f"{document.kind} {document.name} exists for this key but was made from another "
            f"spec (spec hash {document.spec_hash[:12]}, now {wanted[:12]})",
            status=409,
            reason="AlreadyExists",
            hint="a changed spec needs a new key (or cancel the old job first)",
        )
    return document


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports of the loopback interface."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _tail_lines(path: Path, count: int) -> list[tuple[str, str]]:
    try:
        with open_read(path) as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 64 * 1024))
            lines = log.read().splitlines()[-count:]
    except FileNotFoundError:
        return []
    return [parse_log_line(line) for line in lines]


def _tail_text(path: Path) -> str:
    try:
        with open_read(path) as log:
            return log.read().decode(errors="replace")[-4000:]
    except (OSError, KubeDLPrefectError):
        return ""


def _job_processes(state: JobState, uid: str) -> list[psutil.Process]:
    """Every process of the job still running: supervisor, replicas and their descendants.

    Raises:
        KubeDLPrefectError: A process ``state`` names is not verifiably the job's
            (:func:`~.layout.job_process`).
    """
    found: dict[int, psutil.Process] = {}
    named = [state.supervisor] + [r.process for r in state.replicas]
    roots = [job_process(who, uid) for who in named]
    for root in roots:
        if root is None:
            continue
        found[root.pid] = root
        with contextlib.suppress(psutil.Error):
            for child in root.children(recursive=True):
                found[child.pid] = child
    return [p for p in found.values() if _running(p)]


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill(processes: list[psutil.Process], number: int) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error, OSError):
            process.send_signal(number)


def _mark_lost(directory: Path, state: JobState, uid: str) -> JobState:
    """Stop what is left of a job whose supervisor died, and record it as lost."""
    left = [p for p in _job_processes(state, uid) if p.pid != (state.supervisor or _NOBODY).pid]
    _kill(left, signal.SIGKILL)
    psutil.wait_procs(left, timeout=5.0)
    with locked(directory / ".state.lock"):
        current = JobState.from_dict(read_json(directory / STATE_FILE))
        if current.terminal:
            return current
        ended = lost(current, now_rfc3339())
        write_json(directory / STATE_FILE, ended.to_dict())
        return ended


class _Nobody:
    pid = -1


_NOBODY: Final = _Nobody()


def _cancel(ref: JobRef, timeout_s: float) -> None:
    directory = _checked_job_dir(ref)
    try:
        document = _read_document(directory)
        state = JobState.from_dict(read_json(directory / STATE_FILE))
    except FileNotFoundError:
        return
    if ref.uid and document.uid != ref.uid:
        raise ConflictError(
            f"{ref.kind} {ref.name} in {ref.namespace} was replaced by another job of the same "
            f"name (uid {document.uid}, the reference has {ref.uid}): not cancelling it",
            status=409,
            reason="Conflict",
            hint="the job of this reference is gone; cancel the new one with its own reference",
        )
    until = time.monotonic() + timeout_s
    _job_processes(state, document.uid)  # every process it names is checked before any signal
    supervisor = job_process(state.supervisor, document.uid)
    if supervisor is not None:
        # The supervisor stops its replicas and everything below them, then exits.
        with contextlib.suppress(psutil.Error):
            supervisor.terminate()
        psutil.wait_procs([supervisor], timeout=max(0.0, until - time.monotonic()))
    left = _job_processes(state, document.uid)
    if left:  # the supervisor did not finish in time, or was already gone: stop them here
        _kill(left, signal.SIGKILL)
        psutil.wait_procs(left, timeout=max(1.0, until - time.monotonic()))
        left = [p for p in left if _running(p)]
    if left:
        names = ", ".join(str(p.pid) for p in left[:5])
        raise WaitTimeoutError(
            f"cancelling {ref.kind} {ref.name}: processes still running after {timeout_s:g}s: "
            f"pids {names}",
            timeout_s=timeout_s,
            last_reason=f"pids {names}",
            hint="they ignore SIGKILL (uninterruptible I/O?); check them with ps",
        )
    with contextlib.suppress(KubeDLPrefectError):
        remove_socket(checked_socket(directory, document.uid, document.socket))
    shutil.rmtree(directory, ignore_errors=True)


def _gone(ref: JobRef) -> JobCancelledError:
    return JobCancelledError(
        f"{ref.kind} {ref.name} is not in the local workspace {ref.namespace}",
        hint="it was cancelled (or its directory deleted); submit again to run it",
    )


def _failed(ref: JobRef, diagnosis: Diagnosis) -> JobFailedError:
    return JobFailedError(
        f"{ref.kind} {ref.name} failed: {diagnosis.summary()}",
        hint=diagnosis.hint,
        retryable=diagnosis.retryable,
        diagnosis=diagnosis,
        ref=ref.to_dict(),
    )


def _other_spec(workspace: str, record: RunRecord, wanted: str) -> AdoptionRefusedError:
    return other_spec(
        workspace,
        record,
        wanted,
        f"delete {record_path(workspace, record_name(record.spec_name, record.key))}",
    )
