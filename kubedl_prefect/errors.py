"""The one exception tree of kubedl-prefect.

Every error the library raises on purpose derives from :class:`KubeDLPrefectError`. Errors from
libraries underneath (the Kubernetes client, MLflow, pydantic) are translated at the boundary of
the layer that calls them and chained (``raise ... from exc``), so callers only ever catch ours.

Each error says what was wrong, where, and what to do (``hint``), and carries ``retryable``: the
one flag a retry policy (a Prefect ``retry_condition_fn``, our own resubmission loop) reads.

Tree::

    KubeDLPrefectError
    ├── SpecError                      a training-job spec is invalid (never reaches a cluster)
    ├── KubeAPIError                   the Kubernetes API answered with an error
    │   ├── NotFoundError              404
    │   ├── ConflictError              409 (AlreadyExists, resourceVersion conflict)
    │   │   └── AdoptionRefusedError   a job of that name exists but is not ours or differs
    │   ├── ForbiddenError             401/403 (RBAC)
    │   ├── InvalidObjectError         422 (schema or admission rejected the object)
    │   ├── ServerError                5xx, 429                                   (retryable)
    │   └── KubeConnectionError        the API server could not be reached       (retryable)
    ├── WatchError                     a watch stream failed beyond recovery     (retryable)
    ├── WaitTimeoutError               a waiting phase ran out of time
    │   ├── AdmissionTimeoutError      the gang was not admitted in time
    │   ├── StartupTimeoutError        admitted, but replicas did not start in time
    │   └── CompletionTimeoutError     the job did not finish in time
    ├── JobFailedError                 the job failed (carries the diagnosis; retryable per cause)
    ├── JobCancelledError              the job was cancelled or deleted under us
    ├── TestbedError                   the local test bed could not be built or started
    ├── RegistryError                  the model registry refused or failed
    └── ServingError                   the inference service could not be deployed
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class KubeDLPrefectError(Exception):
    """Root of every error raised by kubedl-prefect.

    Args:
        message: What went wrong, and where.
        hint: What the user can do about it, if anything.
        retryable: Whether trying the same thing again may succeed.
    """

    default_retryable: bool = False

    def __init__(self, message: str, *, hint: str | None = None, retryable: bool | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.retryable = self.default_retryable if retryable is None else retryable

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a spec: the field path (``replicas.worker.gpus``), what is wrong, the fix."""

    path: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem} (fix: {self.fix})"


class SpecError(KubeDLPrefectError, ValueError):
    """A training-job spec is invalid. Raised before anything reaches a cluster.

    ``issues`` lists every problem found, each with its field path and fix.
    """

    def __init__(self, issues: Sequence[SpecIssue], *, source: str | None = None):
        self.issues = tuple(issues)
        self.source = source
        where = f" in {source}" if source else ""
        count = len(self.issues)
        lines = [f"{count} problem{'s' if count != 1 else ''} in the training-job spec{where}:"]
        lines += [f"  - {issue}" for issue in self.issues]
        super().__init__("\n".join(lines))


class KubeAPIError(KubeDLPrefectError):
    """The Kubernetes API answered with an error.

    Args:
        status: The HTTP status code (0 when there was no answer).
        reason: The ``reason`` of the Kubernetes ``Status`` (``AlreadyExists``, ``Forbidden``...).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        reason: str | None = None,
        hint: str | None = None,
        retryable: bool | None = None,
    ):
        super().__init__(message, hint=hint, retryable=retryable)
        self.status = status
        self.reason = reason


class NotFoundError(KubeAPIError):
    """The object (or its kind: a CRD that is not installed) does not exist."""


class ConflictError(KubeAPIError):
    """The object already exists, or was changed by someone else meanwhile."""


class AdoptionRefusedError(ConflictError):
    """A job of the deterministic name exists, but is not ours or was made from another spec."""


class ForbiddenError(KubeAPIError):
    """The credentials are not allowed to do this (RBAC)."""


class InvalidObjectError(KubeAPIError):
    """The API server rejected the object (CRD schema, admission webhook)."""


class ServerError(KubeAPIError):
    """The API server failed or throttled the request; trying again later may succeed."""

    default_retryable = True


class KubeConnectionError(KubeAPIError):
    """The API server could not be reached."""

    default_retryable = True


class WatchError(KubeDLPrefectError):
    """A watch stream failed and could not be resumed."""

    default_retryable = True


class WaitTimeoutError(KubeDLPrefectError):
    """A waiting phase ran out of time.

    Args:
        phase: The phase that timed out (``admission``, ``startup``, ``completion``).
        timeout_s: The limit that was exceeded, in seconds.
        last_reason: The last reason observed while waiting (why the job was not done).
    """

    phase: str = "wait"

    def __init__(
        self,
        message: str,
        *,
        timeout_s: float,
        last_reason: str | None = None,
        hint: str | None = None,
    ):
        super().__init__(message, hint=hint)
        self.timeout_s = timeout_s
        self.last_reason = last_reason


class AdmissionTimeoutError(WaitTimeoutError):
    """The job's replicas were not admitted (gang-scheduled) in time."""

    phase = "admission"


class StartupTimeoutError(WaitTimeoutError):
    """The job was admitted but its replicas did not start in time."""

    phase = "startup"


class CompletionTimeoutError(WaitTimeoutError):
    """The job did not reach a terminal state in time."""

    phase = "completion"


class JobFailedError(KubeDLPrefectError):
    """The training job failed. ``retryable`` follows the diagnosed cause.

    Args:
        diagnosis: The lifecycle's diagnosis of the failure (category, replica, exit code).
        attempts: How many attempts were made before giving up.
    """

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        retryable: bool | None = None,
        diagnosis: object | None = None,
        attempts: int = 1,
    ):
        super().__init__(message, hint=hint, retryable=retryable)
        self.diagnosis = diagnosis
        self.attempts = attempts


class JobCancelledError(KubeDLPrefectError):
    """The training job was cancelled, or deleted while being waited on."""


class TestbedError(KubeDLPrefectError):
    """The local Kubernetes test bed could not be built, started or reached."""

    __test__ = False  # not a pytest test class, despite its name


class RegistryError(KubeDLPrefectError):
    """The model registry (MLflow) refused or failed a request."""


class ServingError(KubeDLPrefectError):
    """An inference service could not be deployed or did not become ready."""
