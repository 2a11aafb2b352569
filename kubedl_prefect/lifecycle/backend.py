"""The backend-neutral lifecycle interface.

A backend runs training jobs somewhere: on Kubernetes through an operator
(:class:`~kubedl_prefect.lifecycle.kubernetes.KubernetesBackend`), or as local processes under the
same environment contract (the embedded default). Everything above this layer — retries, the
Prefect surface — talks to :class:`TrainingBackend` only.

Every method is a coroutine. Sync callers use :class:`SyncTrainingBackend`, which runs the same
coroutines on the process-wide Kubernetes runtime loop: one implementation, two faces.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar, runtime_checkable

from kubedl_prefect.errors import KubeDLPrefectError
from kubedl_prefect.kube.client import is_dns1123_label, is_dns1123_subdomain, shown
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.lifecycle.admission import AdmissionState
from kubedl_prefect.lifecycle.diagnosis import Diagnosis
from kubedl_prefect.lifecycle.records import AttemptRecord, RunRecord
from kubedl_prefect.lifecycle.status import JobStatus, Phase
from kubedl_prefect.spec import TrainingJobSpec

T = TypeVar("T")


def checkpoint_location(spec: TrainingJobSpec, key: str) -> str | None:
    """Where every attempt of the logical job ``(spec.name, key)`` keeps its checkpoints.

    ``<spec.checkpoint.location>/<name>-<16 hex of sha256(key)>``: the same for every attempt of
    one key, so a retry resumes; different for two keys, so two jobs never share one.
    """
    if spec.checkpoint is None:
        return None
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    return f"{spec.checkpoint.location.rstrip('/')}/{spec.name}-{digest}"


JOB_REF_SCHEMA = 2
"""Version of :meth:`JobRef.to_dict`'s layout (1: before ``cluster`` and ``dialect``)."""


@dataclass(frozen=True)
class JobRef:
    """Everything needed to find a submitted job again, from any process.

    It is plain data (:meth:`to_dict`, :meth:`to_json`) and holds no credential, so a flow can
    keep it in a Prefect result and a restarted flow can re-attach to the job
    (:meth:`TrainingBackend.attach`) instead of launching a duplicate, whatever namespace or
    dialect its backend defaults to.

    Data read back is untrusted input, so every reference is checked when it is made: its name
    must be a DNS-1123 subdomain, its uid (when given) letters, digits and ``-``, its
    ``apiVersion`` and ``kind`` such as Kubernetes writes, its attempt at least 1, and, for the
    Kubernetes backend, its namespace a DNS-1123 label (the local backend's namespace is its
    workspace, which that backend checks).

    Args:
        backend: Which backend runs it (``kubernetes``, ``local``).
        cluster: Which cluster: the API server's URL (never a credential).
        dialect: Which operator runs it (``kubedl``, ``kubeflow``, ``trainer``; ``local``).
        namespace: Where it runs (a Kubernetes namespace, or the local backend's workspace).
        name: The job's name in the cluster (deterministic from the key and attempt).
        uid: The uid the cluster gave it; tells a re-created job of the same name apart.
        api_version: ``apiVersion`` of the job object.
        kind: ``kind`` of the job object.
        key: The caller's logical key (a flow run, a schedule slot).
        attempt: The attempt number, from 1.
        spec_hash: Hash of the spec it was made from.
        schema_version: Layout version of the plain data.

    Example:
        >>> ref = JobRef(backend="kubernetes", cluster="https://10.0.0.1:6443", dialect="kubedl",
        ...              namespace="ml", name="mnist-x7k2m9q4ab3c-a1", uid="0f1e",
        ...              api_version="training.kubedl.io/v1alpha1", kind="PyTorchJob",
        ...              key="nightly", attempt=1, spec_hash="ab12")
        >>> JobRef.from_json(ref.to_json()) == ref
        True
    """

    backend: str
    cluster: str
    dialect: str
    namespace: str
    name: str
    uid: str
    api_version: str
    kind: str
    key: str
    attempt: int
    spec_hash: str
    schema_version: int = JOB_REF_SCHEMA

    def __post_init__(self) -> None:
        problem = reference_problem(self)
        if problem is not None:
            raise _ref_error(
                f"job reference refused: {problem}",
                hint="use a reference exactly as JobRef.to_dict() or JobRef.to_json() wrote it; "
                "data read back from a result, a file or an argument is checked like any input",
            )

    def to_dict(self) -> dict[str, Any]:
        """The reference as plain data (camelCase keys, JSON-able)."""
        return {
            "schemaVersion": self.schema_version,
            "backend": self.backend,
            "cluster": self.cluster,
            "dialect": self.dialect,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "apiVersion": self.api_version,
            "kind": self.kind,
            "key": self.key,
            "attempt": self.attempt,
            "specHash": self.spec_hash,
        }

    def to_json(self) -> str:
        """The reference as a JSON string."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobRef:
        """Rebuild a reference saved with :meth:`to_json`."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise _ref_error(f"a job reference is not JSON: {exc}") from exc
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobRef:
        """Rebuild a reference saved with :meth:`to_dict` (also the version-1 layout).

        Raises:
            KubeDLPrefectError: The data is no job reference, or of a newer layout.
        """
        if not isinstance(data, Mapping):
            raise _ref_error(f"a job reference must be a mapping, not {type(data).__name__}")
        version = _whole_number(
            data.get("schemaVersion") or data.get("schema_version") or 1, "schemaVersion"
        )
        if version > JOB_REF_SCHEMA:
            raise _ref_error(
                f"this job reference has layout version {version}; this kubedl-prefect reads "
                f"up to {JOB_REF_SCHEMA}",
                hint="upgrade kubedl-prefect where the reference is attached",
            )

        def field_(camel: str, snake: str, default: Any = _MISSING) -> Any:
            if camel in data:
                return data[camel]
            if snake in data:
                return data[snake]
            if default is _MISSING:
                raise _ref_error(f"a job reference lacks {camel!r}")
            return default

        api_version = str(field_("apiVersion", "api_version"))
        dialect = field_("dialect", "dialect", None) or _dialect_of(api_version)
        return cls(
            backend=str(field_("backend", "backend")),
            cluster=str(field_("cluster", "cluster", "")),
            dialect=str(dialect),
            namespace=str(field_("namespace", "namespace")),
            name=str(field_("name", "name")),
            uid=str(field_("uid", "uid", "")),
            api_version=api_version,
            kind=str(field_("kind", "kind")),
            key=str(field_("key", "key")),
            attempt=_whole_number(field_("attempt", "attempt"), "attempt"),
            spec_hash=str(field_("specHash", "spec_hash", "")),
        )

    def for_attempt(self, attempt: int, *, name: str, uid: str) -> JobRef:
        """The reference of another attempt of the same logical job."""
        return replace(self, attempt=attempt, name=name, uid=uid)


_MISSING = object()

_UID = re.compile(r"[0-9A-Za-z]([-0-9A-Za-z]*[0-9A-Za-z])?")
_KIND = re.compile(r"[A-Z][0-9A-Za-z]*")
_NAMESPACED_BACKENDS = frozenset({"kubernetes"})
"""Backends whose references' namespace is a Kubernetes namespace."""


def namespace_problem(namespace: object) -> str | None:
    """Why ``namespace`` cannot be a Kubernetes namespace, or ``None`` if it can."""
    if isinstance(namespace, str) and is_dns1123_label(namespace):
        return None
    return (
        f"the namespace {_shown(namespace)} is not a Kubernetes namespace (a DNS-1123 label: "
        "lower-case letters, digits and '-', starting and ending with a letter or digit, at "
        "most 63 characters)"
    )


def reference_problem(ref: JobRef) -> str | None:
    """Why ``ref`` cannot name a job, or ``None`` when every field is one a cluster would give."""
    if not isinstance(ref.backend, str) or not is_dns1123_label(ref.backend):
        return f"the backend {_shown(ref.backend)} is not a backend's name"
    if ref.backend in _NAMESPACED_BACKENDS:
        problem = namespace_problem(ref.namespace)
        if problem is not None:
            return problem
    elif not isinstance(ref.namespace, str) or not ref.namespace:
        return f"the namespace {_shown(ref.namespace)} is empty"
    if not isinstance(ref.name, str) or not is_dns1123_subdomain(ref.name):
        return (
            f"the name {_shown(ref.name)} is not a Kubernetes object name (a DNS-1123 subdomain: "
            "lower-case letters, digits, '-' and '.', starting and ending with a letter or "
            "digit, at most 253 characters)"
        )
    if not isinstance(ref.uid, str) or (
        ref.uid and (len(ref.uid) > 128 or _UID.fullmatch(ref.uid) is None)
    ):
        return f"the uid {_shown(ref.uid)} is not a uid (letters, digits and '-')"
    group, _, version = (ref.api_version if isinstance(ref.api_version, str) else "").rpartition(
        "/"
    )
    if (group and not is_dns1123_subdomain(group)) or not is_dns1123_label(version):
        return f"the apiVersion {_shown(ref.api_version)} is not a Kubernetes apiVersion"
    if not isinstance(ref.kind, str) or len(ref.kind) > 63 or _KIND.fullmatch(ref.kind) is None:
        return f"the kind {_shown(ref.kind)} is not a Kubernetes kind"
    if not isinstance(ref.attempt, int) or isinstance(ref.attempt, bool) or ref.attempt < 1:
        return f"the attempt {_shown(ref.attempt)} is not an attempt number (1 or more)"
    return None


def check_backend_of(ref: JobRef, backend: str) -> None:
    """Refuse a reference that another backend made: the check both backends start attaching with.

    Raises:
        KubeDLPrefectError: ``ref`` is of another backend, with the backend to attach it with.

    Example:
        >>> ref = JobRef(
        ...     backend="local", cluster="", dialect="kubeflow", namespace="/tmp/workspace",
        ...     name="mnist-a1", uid="u1", api_version="kubeflow.org/v1", kind="PyTorchJob",
        ...     key="nightly", attempt=1, spec_hash="",
        ... )
        >>> check_backend_of(ref, "local")
        >>> check_backend_of(ref, "kubernetes")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        kubedl_prefect.errors.KubeDLPrefectError: job reference mnist-a1 is of the ...
          hint: attach it with a local backend
    """
    if ref.backend != backend:
        raise KubeDLPrefectError(
            f"job reference {ref.name} is of the {ref.backend!r} backend, not {backend!r}",
            hint=f"attach it with a {ref.backend} backend",
        )


def attempt_started(ref: JobRef) -> AttemptRecord:
    """The run record's entry of ``ref``'s attempt as submitted: no end seen yet."""
    return AttemptRecord(attempt=ref.attempt, name=ref.name, uid=ref.uid, ref=ref.to_dict())


def attempt_ended(ref: JobRef, status: JobStatus, diagnosis: Diagnosis | None) -> AttemptRecord:
    """The run record's entry of ``ref``'s attempt once its end (``status``) was seen.

    Both backends record an attempt's end with this one constructor, so a record written on one
    machine reads the same as one written on the other.
    """
    return AttemptRecord(
        attempt=ref.attempt,
        name=ref.name,
        uid=ref.uid,
        phase=str(status.phase),
        reason=status.reason,
        message=status.message,
        start_time=status.start_time,
        completion_time=status.completion_time,
        diagnosis=diagnosis,
        ref=ref.to_dict(),
    )


def _whole_number(value: Any, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise _ref_error(
            f"a job reference's {what} {_shown(value)} is not a whole number"
        ) from None


def _shown(value: object) -> str:
    return shown(value) if isinstance(value, str) else repr(value)[:60]


def _dialect_of(api_version: str) -> str:
    return "kubeflow" if api_version.startswith("kubeflow.org/") else "kubedl"


def _ref_error(message: str, *, hint: str | None = None) -> KubeDLPrefectError:
    return KubeDLPrefectError(
        message, hint=hint or "pass the data JobRef.to_dict() or JobRef.to_json() produced"
    )


@dataclass(frozen=True)
class WaitTimeouts:
    """Time limits for each waiting phase, in seconds (``None``: no limit).

    Deadlines are measured on a monotonic clock from the start of each phase.

    One rule for giving up, whichever wait gives up (admission, start-up, completion) and
    whether it is called directly or through ``arun_to_completion``: the job is deleted (with its
    pods and PodGroups, so it holds no GPUs) before the timeout error is raised, unless
    ``delete_on_timeout`` is false.

    Args:
        admission_s: From submission until every replica is scheduled.
        startup_s: From admission until the job is Running.
        completion_s: From Running until Succeeded or Failed.
        cancel_s: How long a cancellation waits for pods and PodGroups to be gone.
        delete_on_timeout: Delete the job when a wait gives up (keep it for inspection if false).
    """

    admission_s: float | None = 600.0
    startup_s: float | None = 600.0
    completion_s: float | None = None
    cancel_s: float = 120.0
    delete_on_timeout: bool = True


@dataclass(frozen=True)
class PhaseUpdate:
    """One observed change of a job's phase (or of its replica counts).

    Args:
        phase: The phase now.
        status: The job's status behind it.
        admission: The admission state, while queued or just admitted.
        observed_at: When we saw it (Unix time, seconds).
    """

    phase: Phase
    status: JobStatus
    admission: AdmissionState | None
    observed_at: float


@dataclass(frozen=True)
class LogLine:
    """One line of one replica's container log.

    Args:
        replica: ``master-0``, ``worker-1``...
        container: The container's name.
        timestamp: The RFC 3339 time the runtime recorded it at.
        text: The line, without its newline.
        attempt: The attempt of the job it belongs to.
    """

    replica: str
    container: str
    timestamp: str
    text: str
    attempt: int = 1


@dataclass(frozen=True)
class JobOutcome:
    """How a job ended: its final status, and the diagnosis when it failed.

    Args:
        ref: The attempt that ended.
        status: Its final status.
        diagnosis: Why it failed, for a failed job.
        history: The phase changes seen while waiting (empty for a replayed outcome).
        replayed: Whether the outcome was read from the logical job's record (the job had ended,
            and may be gone) instead of being watched.
    """

    ref: JobRef
    status: JobStatus
    diagnosis: Diagnosis | None = None
    history: tuple[PhaseUpdate, ...] = field(default=())
    replayed: bool = False

    @property
    def succeeded(self) -> bool:
        """Whether the job succeeded."""
        return self.status.phase == Phase.SUCCEEDED


PhaseCallback = Callable[[PhaseUpdate], object]
"""Called with each phase change, in order, on a thread of the wait's own (never the runtime
loop), so it may block without delaying any other job; see :mod:`.delivery`."""
LogCallback = Callable[[LogLine], object]
"""Called with each log line, like :data:`PhaseCallback`."""


@runtime_checkable
class TrainingBackend(Protocol):
    """Runs training jobs. Implemented by the Kubernetes and the local-process backends."""

    async def submit(
        self, spec: TrainingJobSpec, *, key: str, attempt: int = 1, dry_run: bool = False
    ) -> JobRef:
        """Create the job for ``(key, attempt)``, or adopt it if it exists and is ours."""
        ...

    async def attach(self, ref: JobRef) -> JobRef:
        """Find the job of ``ref`` again (from any process) and return its current reference.

        Raises ``JobCancelledError`` when it is gone and its end was never recorded.
        """
        ...

    async def history(self, spec: TrainingJobSpec, *, key: str) -> RunRecord | None:
        """What was recorded of the attempts of the logical job ``(spec.name, key)``."""
        ...

    async def wait_admitted(
        self, ref: JobRef, *, timeout_s: float | None, on_phase: PhaseCallback | None = None
    ) -> AdmissionState:
        """Wait until every replica is scheduled; raise ``AdmissionTimeoutError`` otherwise."""
        ...

    async def wait_completed(
        self,
        ref: JobRef,
        *,
        timeouts: WaitTimeouts = WaitTimeouts(),
        on_phase: PhaseCallback | None = None,
    ) -> JobOutcome:
        """Follow the job to Succeeded or Failed; failures come back diagnosed, not raised."""
        ...

    async def follow_logs(self, ref: JobRef, on_line: LogCallback) -> None:
        """Deliver every replica's log lines until the job ends."""
        ...

    async def cancel(self, ref: JobRef, *, timeout_s: float = 120.0) -> None:
        """Delete the job and wait until its pods (and PodGroups) are gone. Idempotent."""
        ...

    async def close(self) -> None:
        """Release the backend's connections (jobs are not touched)."""
        ...


class SyncTrainingBackend:
    """The blocking face of a :class:`TrainingBackend`, for sync code (Prefect sync tasks).

    Each method has the same signature as its async twin and runs it on the process-wide
    :class:`~kubedl_prefect.kube.runtime.KubeRuntime` loop.
    """

    def __init__(self, backend: TrainingBackend):
        self.backend = backend

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return KubeRuntime.get().block_on(coro)

    def submit(
        self, spec: TrainingJobSpec, *, key: str, attempt: int = 1, dry_run: bool = False
    ) -> JobRef:
        """Blocking :meth:`TrainingBackend.submit`."""
        return self._run(self.backend.submit(spec, key=key, attempt=attempt, dry_run=dry_run))

    def attach(self, ref: JobRef) -> JobRef:
        """Blocking :meth:`TrainingBackend.attach`."""
        return self._run(self.backend.attach(ref))

    def history(self, spec: TrainingJobSpec, *, key: str) -> RunRecord | None:
        """Blocking :meth:`TrainingBackend.history`."""
        return self._run(self.backend.history(spec, key=key))

    def wait_admitted(
        self, ref: JobRef, *, timeout_s: float | None, on_phase: PhaseCallback | None = None
    ) -> AdmissionState:
        """Blocking :meth:`TrainingBackend.wait_admitted`."""
        return self._run(self.backend.wait_admitted(ref, timeout_s=timeout_s, on_phase=on_phase))

    def wait_completed(
        self,
        ref: JobRef,
        *,
        timeouts: WaitTimeouts = WaitTimeouts(),
        on_phase: PhaseCallback | None = None,
    ) -> JobOutcome:
        """Blocking :meth:`TrainingBackend.wait_completed`."""
        return self._run(self.backend.wait_completed(ref, timeouts=timeouts, on_phase=on_phase))

    def follow_logs(self, ref: JobRef, on_line: LogCallback) -> None:
        """Blocking :meth:`TrainingBackend.follow_logs`."""
        return self._run(self.backend.follow_logs(ref, on_line))

    def cancel(self, ref: JobRef, *, timeout_s: float = 120.0) -> None:
        """Blocking :meth:`TrainingBackend.cancel`."""
        return self._run(self.backend.cancel(ref, timeout_s=timeout_s))

    def close(self) -> None:
        """Blocking :meth:`TrainingBackend.close`."""
        return self._run(self.backend.close())


_RENAMED = {"SyncBackend": "SyncTrainingBackend"}


def __getattr__(name: str) -> Any:
    from kubedl_prefect.deprecation import renamed

    return renamed(__name__, name, _RENAMED)
