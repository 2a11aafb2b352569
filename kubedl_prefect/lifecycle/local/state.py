"""A local job as its files describe it, and what follows from them. Pure.

The supervisor of a job (:mod:`.supervisor`) writes facts to ``state.json`` in the job's
directory: which replica runs as which process (pid and start time), how each one ended (exit
code, signal, whether the supervisor stopped it), and the job's phase once it settled it with
:func:`settle`. The backend reads the same file, turns it into the lifecycle's
:class:`~kubedl_prefect.lifecycle.status.JobStatus` and
:class:`~kubedl_prefect.lifecycle.admission.AdmissionState`, and diagnoses a failure with the
same rules as a cluster's (:func:`diagnose_local` hands the replicas to
:func:`~kubedl_prefect.lifecycle.diagnosis.diagnose` shaped as pods), so that the categories and
their ``retryable`` flag mean the same on both backends.

A process killed by signal ``N`` is reported as a container is, with exit code ``128 + N``
(SIGKILL: 137, SIGTERM: 143).
"""

from __future__ import annotations

import datetime as dt
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from kubedl_prefect.errors import Diagnosis
from kubedl_prefect.kube.resources import KubeObject
from kubedl_prefect.lifecycle.admission import AdmissionBlocker, AdmissionState
from kubedl_prefect.lifecycle.diagnosis import diagnose
from kubedl_prefect.lifecycle.replicas import ReplicaState as ReplicaRow
from kubedl_prefect.lifecycle.status import JobStatus, Phase, ReplicaCounts

STATE_SCHEMA: Final = 1
"""Version of the layout of ``state.json``."""

JobPhase = Literal["Created", "Admitted", "Running", "Succeeded", "Failed"]
ReplicaPhase = Literal["pending", "running", "exited"]
StoppedBy = Literal["supervisor", "cancel"]


def now_rfc3339() -> str:
    """The current UTC time, RFC 3339 with microseconds (``2026-12-01T10:00:00.123456Z``)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9, ``signal 64`` for a number without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class ProcessIdentity:
    """A process, told apart from a later one that reuses its pid by its start time.

    Args:
        pid: The process id.
        create_time: When it started (``psutil.Process.create_time()``, Unix time).
    """

    pid: int
    create_time: float

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {"pid": self.pid, "createTime": self.create_time}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ProcessIdentity | None:
        """Rebuild one written by :meth:`to_dict` (``None`` for ``None``)."""
        if not data:
            return None
        return cls(int(data["pid"]), float(data["createTime"]))


@dataclass(frozen=True)
class ReplicaState:
    """One replica's process and how it ended.

    Args:
        name: ``master-0``.
        role: ``master``.
        index: Its index in the role.
        phase: ``pending`` (not started), ``running`` or ``exited``.
        process: Its process, once started.
        exit_code: Its exit code as a container reports it (``128 + N`` for signal ``N``).
        signal: The signal that ended it, if one did.
        stopped_by: Who ended it when it did not end by itself: the ``supervisor`` (the job
            settled) or a ``cancel``ation.
        message: One line about how it ended.
        started_at: When it started (RFC 3339).
        finished_at: When it ended (RFC 3339).
    """

    name: str
    role: str
    index: int
    phase: ReplicaPhase = "pending"
    process: ProcessIdentity | None = None
    exit_code: int | None = None
    signal: int | None = None
    stopped_by: StoppedBy | None = None
    message: str = ""
    started_at: str | None = None
    finished_at: str | None = None

    @property
    def failed(self) -> bool:
        """Whether it ended by itself with an error (not stopped by us)."""
        return self.phase == "exited" and self.stopped_by is None and self.exit_code != 0

    @property
    def succeeded(self) -> bool:
        """Whether it exited with code 0."""
        return self.phase == "exited" and self.exit_code == 0

    def exited(
        self,
        returncode: int,
        *,
        at: str,
        stopped_by: StoppedBy | None = None,
        message: str | None = None,
    ) -> ReplicaState:
        """This replica after its process ended with ``returncode`` (negative: a signal)."""
        if returncode < 0:
            number = -returncode
            code, sig = 128 + number, number
            message = message or f"killed by {signal_name(number)}"
        else:
            code, sig = returncode, None
            message = message or f"exited with code {returncode}"
        if stopped_by is not None:
            message += f" (stopped by the {stopped_by})"
        return replace(
            self,
            phase="exited",
            exit_code=code,
            signal=sig,
            stopped_by=stopped_by,
            message=message,
            finished_at=at,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {
            "name": self.name,
            "role": self.role,
            "index": self.index,
            "phase": self.phase,
            "process": self.process.to_dict() if self.process else None,
            "exitCode": self.exit_code,
            "signal": self.signal,
            "stoppedBy": self.stopped_by,
            "message": self.message,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplicaState:
        """Rebuild one written by :meth:`to_dict`."""
        return cls(
            name=str(data["name"]),
            role=str(data["role"]),
            index=int(data["index"]),
            phase=data.get("phase") or "pending",
            process=ProcessIdentity.from_dict(data.get("process")),
            exit_code=data.get("exitCode"),
            signal=data.get("signal"),
            stopped_by=data.get("stoppedBy"),
            message=str(data.get("message") or ""),
            started_at=data.get("startedAt"),
            finished_at=data.get("finishedAt"),
        )


@dataclass(frozen=True)
class JobState:
    """The content of a local job's ``state.json``.

    Args:
        phase: ``Created`` (the supervisor is starting), ``Admitted`` (it holds the job),
            ``Running`` (every replica started), ``Succeeded`` or ``Failed`` (every process of
            the job is gone).
        reason: Why it is in that phase (``JobRunning``, ``ReplicaFailed``...).
        message: One line about it.
        replicas: Every replica, in the framework's order.
        supervisor: The supervisor's process, once it started.
        start_time: When every replica was started (RFC 3339).
        completion_time: When the job settled (RFC 3339).
        version: Increased by every write: the local ``resourceVersion``.
    """

    phase: JobPhase
    replicas: tuple[ReplicaState, ...]
    reason: str = ""
    message: str = ""
    supervisor: ProcessIdentity | None = None
    start_time: str | None = None
    completion_time: str | None = None
    version: int = 0

    @property
    def terminal(self) -> bool:
        """Whether the job settled (and every process of it is gone)."""
        return self.phase in ("Succeeded", "Failed")

    def replica(self, name: str) -> ReplicaState:
        """The replica called ``name``."""
        return next(r for r in self.replicas if r.name == name)

    def with_replica(self, updated: ReplicaState) -> JobState:
        """This state with one replica replaced."""
        return replace(
            self,
            replicas=tuple(updated if r.name == updated.name else r for r in self.replicas),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data, with its schema version."""
        return {
            "schemaVersion": STATE_SCHEMA,
            "phase": self.phase,
            "reason": self.reason,
            "message": self.message,
            "replicas": [r.to_dict() for r in self.replicas],
            "supervisor": self.supervisor.to_dict() if self.supervisor else None,
            "startTime": self.start_time,
            "completionTime": self.completion_time,
            "version": self.version,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobState:
        """Rebuild a state written by :meth:`to_dict`."""
        return cls(
            phase=data["phase"],
            replicas=tuple(ReplicaState.from_dict(r) for r in data.get("replicas") or []),
            reason=str(data.get("reason") or ""),
            message=str(data.get("message") or ""),
            supervisor=ProcessIdentity.from_dict(data.get("supervisor")),
            start_time=data.get("startTime"),
            completion_time=data.get("completionTime"),
            version=int(data.get("version") or 0),
        )


@dataclass(frozen=True)
class Settlement:
    """How a job ends, decided from its replicas (:func:`settle`)."""

    phase: Literal["Succeeded", "Failed"]
    reason: str
    message: str


def settle(state: JobState, success: frozenset[str]) -> Settlement | None:
    """Whether the job has ended, from its replicas, as the operators decide it.

    A replica that ended by itself with an error fails the job (no in-place restarts locally: a
    data-parallel group cannot take a restarted member back without a new rendezvous, so the
    whole attempt ends and the retry policy starts the next one from the checkpoint). Otherwise
    the job succeeds once every replica in ``success`` exited 0
    (:func:`~.contract.success_replicas`); ``None`` while neither.

    Example:
        >>> master = ReplicaState("master-0", "master", 0, phase="running")
        >>> state = JobState("Running", (master,))
        >>> settle(state, frozenset({"master-0"})) is None
        True
        >>> ended = state.with_replica(master.exited(-9, at="t"))
        >>> settle(ended, frozenset({"master-0"})).message
        'master-0 was killed by SIGKILL'
    """
    failed = sorted((r for r in state.replicas if r.failed), key=lambda r: r.finished_at or "")
    if failed:
        first = failed[0]
        verb = "was " if first.signal is not None else ""
        return Settlement("Failed", "ReplicaFailed", f"{first.name} {verb}{first.message}")
    done = [state.replica(name) for name in sorted(success)]
    if done and all(r.succeeded for r in done):
        names = ", ".join(r.name for r in done)
        return Settlement("Succeeded", "JobSucceeded", f"{names} exited with code 0")
    return None


LOST_REASON: Final = "SupervisorLost"
"""The reason of a job whose supervisor ended before the job did."""


def lost(state: JobState, at: str) -> JobState:
    """The state of a job whose supervisor is gone although the job had not ended.

    Like a node that disappeared: its replicas are lost with it (the backend stops any that
    survived), and the failure is retryable.
    """
    pid = state.supervisor.pid if state.supervisor else "?"
    return replace(
        state,
        phase="Failed",
        reason=LOST_REASON,
        message=f"the local supervisor of the job (pid {pid}) ended before the job did",
        completion_time=at,
        version=state.version + 1,
    )


_PHASES: Final[Mapping[str, Phase]] = {
    "Created": Phase.CREATED,
    "Admitted": Phase.CREATED,
    "Running": Phase.RUNNING,
    "Succeeded": Phase.SUCCEEDED,
    "Failed": Phase.FAILED,
}


def job_status(state: JobState) -> JobStatus:
    """The lifecycle's view of a local job (``Admitted`` reads as Created + admitted).

    Example:
        >>> status = job_status(
        ...     JobState("Running", (ReplicaState("master-0", "master", 0, "running"),))
        ... )
        >>> str(status.phase), status.replicas["master"].active
        ('Running', 1)
    """
    counts: dict[str, ReplicaCounts] = {}
    for replica in state.replicas:
        old = counts.get(replica.role, ReplicaCounts())
        counts[replica.role] = ReplicaCounts(
            active=old.active + (replica.phase == "running"),
            succeeded=old.succeeded + replica.succeeded,
            failed=old.failed + replica.failed,
            evicted=0,
        )
    return JobStatus(
        phase=_PHASES[state.phase],
        reason=state.reason,
        message=state.message,
        replicas=counts,
        start_time=state.start_time,
        completion_time=state.completion_time,
        resource_version=str(state.version),
    )


def admission(state: JobState, host: str) -> AdmissionState:
    """Admitted once the supervisor holds the job (the capacity was checked at submission)."""
    expected = len(state.replicas)
    if state.phase == "Created":
        return AdmissionState(
            admitted=False,
            blocker=AdmissionBlocker.NOT_CREATED,
            reason="the local supervisor is starting",
            expected=expected,
        )
    return AdmissionState(
        admitted=True,
        reason=f"admitted on {host}: {expected} replicas",
        scheduled=expected,
        expected=expected,
    )


def replica_rows(state: JobState, job_name: str, host: str) -> tuple[ReplicaRow, ...]:
    """The job's replicas as a cluster's replica table shows pods: one row per process.

    The "pod" is ``<job>-<replica>`` (with its pid while it runs), the "node" this machine.

    Example:
        >>> state = JobState("Running", (ReplicaState("master-0", "master", 0, "running",
        ...                                           ProcessIdentity(41, 0.0)),
        ...                              ReplicaState("worker-0", "worker", 0, "exited",
        ...                                           exit_code=1)))
        >>> [(r.replica, r.pod, r.phase) for r in replica_rows(state, "mnist-a1", "box")]
        [('master-0', 'mnist-a1-master-0 (pid 41)', 'Running'), \
('worker-0', 'mnist-a1-worker-0', 'Failed')]
    """
    rows = []
    for replica in state.replicas:
        if replica.phase == "pending":
            phase = "Pending"
        elif replica.phase == "running":
            phase = "Running"
        else:
            phase = "Succeeded" if replica.exit_code == 0 else "Failed"
        pod = f"{job_name}-{replica.name}"
        if replica.phase == "running" and replica.process is not None:
            pod = f"{pod} (pid {replica.process.pid})"
        rows.append(
            ReplicaRow(
                replica=replica.name,
                role=replica.role.lower(),
                index=replica.index,
                pod=pod,
                node=host if replica.phase != "pending" else "",
                phase=phase,
                restarts=0,
            )
        )
    return tuple(rows)


def _as_pod(replica: ReplicaState, job_name: str, container: str) -> KubeObject:
    status: dict[str, Any] = {}
    if replica.failed:
        terminated = {
            "exitCode": replica.exit_code,
            "reason": "Error",
            "message": replica.message,
            "finishedAt": replica.finished_at,
        }
        status["containerStatuses"] = [{"name": container, "state": {"terminated": terminated}}]
    return {
        "metadata": {
            "name": f"{job_name}-{replica.name}",
            "labels": {"replica-type": replica.role, "replica-index": str(replica.index)},
        },
        "status": status,
    }


def diagnose_local(
    state: JobState,
    *,
    job_name: str,
    container: str,
    log_tails: Mapping[str, Sequence[str]] | None = None,
) -> Diagnosis:
    """Why a local job failed, by the cluster's rules (exit codes, signals, NCCL in the logs).

    Replicas the supervisor stopped after another failed are not causes; a lost supervisor
    reads as a lost node (retryable).

    Example:
        >>> state = JobState("Failed", (ReplicaState("worker-0", "worker", 0).exited(
        ...     -9, at="t"),), reason="ReplicaFailed")
        >>> d = diagnose_local(state, job_name="j", container="pytorch")
        >>> (str(d.category), d.retryable, d.replica, d.exit_code)
        ('Killed', True, 'worker-0', 137)
    """
    pods = [_as_pod(r, job_name, container) for r in state.replicas if r.failed]
    if state.reason == LOST_REASON:
        pods.insert(
            0,
            {
                "metadata": {"name": job_name},
                "status": {"reason": "NodeLost", "message": state.message},
            },
        )
    job: KubeObject = {
        "status": {
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": state.reason,
                    "message": state.message,
                }
            ]
        }
    }
    return diagnose(job, pods=pods, log_tails=log_tails)


@dataclass(frozen=True)
class ReplicaPlan:
    """One replica as the supervisor launches it.

    Args:
        name: ``master-0``, ``worker-1``: the replica's label in logs and diagnoses.
        role: The role (``master``).
        index: The index within the role.
        argv: The command line, resolved for this machine.
        env: The replica's whole environment (it may hold secrets: it is passed to the
            supervisor on its standard input and never written to disk).
        cwd: The working directory.
    """

    name: str
    role: str
    index: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "."

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the supervisor's launch plan."""
        return {
            "name": self.name,
            "role": self.role,
            "index": self.index,
            "argv": list(self.argv),
            "env": dict(self.env),
            "cwd": self.cwd,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplicaPlan:
        """Rebuild a plan written by :meth:`to_dict`."""
        return cls(
            name=str(data["name"]),
            role=str(data["role"]),
            index=int(data["index"]),
            argv=tuple(str(a) for a in data["argv"]),
            env={str(k): str(v) for k, v in dict(data["env"]).items()},
            cwd=str(data["cwd"]),
        )


@dataclass(frozen=True)
class JobDocument:
    """The content of a local job's ``job.json``: what it is, written once at submission.

    Args:
        name: The job's name.
        uid: A random id given at creation (tells a re-created job of the same name apart).
        key: The caller's logical key.
        attempt: The attempt number.
        spec_name: The spec's name.
        spec_hash: Hash of the spec.
        kind: The job's kind (``PyTorchJob``).
        container: The container name an operator would give the replicas (``pytorch``).
        replicas: ``(name, role, index)`` of every replica.
        socket: The supervisor's wake-up socket.
        checkpoint_dir: The checkpoint directory, if the spec has a checkpoint.
        created_at: When it was submitted (RFC 3339).
        labels: The caller's labels (the Prefect flow run that made it), as on a cluster's job.
    """

    name: str
    uid: str
    key: str
    attempt: int
    spec_name: str
    spec_hash: str
    kind: str
    container: str
    replicas: tuple[tuple[str, str, int], ...]
    socket: str
    checkpoint_dir: str | None = None
    created_at: str = field(default_factory=now_rfc3339)
    labels: Mapping[str, str] = field(default_factory=dict)

    def initial_state(self) -> JobState:
        """The state before the supervisor starts."""
        return JobState(
            phase="Created",
            reason="JobCreated",
            message="the job was submitted",
            replicas=tuple(ReplicaState(n, role, i) for n, role, i in self.replicas),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data, with its schema version."""
        return {
            "schemaVersion": STATE_SCHEMA,
            "name": self.name,
            "uid": self.uid,
            "key": self.key,
            "attempt": self.attempt,
            "specName": self.spec_name,
            "specHash": self.spec_hash,
            "kind": self.kind,
            "container": self.container,
            "replicas": [list(r) for r in self.replicas],
            "socket": self.socket,
            "checkpointDir": self.checkpoint_dir,
            "createdAt": self.created_at,
            "labels": dict(self.labels),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobDocument:
        """Rebuild one written by :meth:`to_dict`."""
        return cls(
            name=str(data["name"]),
            uid=str(data["uid"]),
            key=str(data["key"]),
            attempt=int(data["attempt"]),
            spec_name=str(data["specName"]),
            spec_hash=str(data["specHash"]),
            kind=str(data["kind"]),
            container=str(data["container"]),
            replicas=tuple((str(n), str(r), int(i)) for n, r, i in data["replicas"]),
            socket=str(data["socket"]),
            checkpoint_dir=data.get("checkpointDir"),
            created_at=str(data.get("createdAt") or ""),
            labels={str(k): str(v) for k, v in (data.get("labels") or {}).items()},
        )
