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
    │   │   └── OperatorNotInstalledError  the job's kind (its operator's CRD) is not served
    │   ├── ConflictError              409 (AlreadyExists, resourceVersion conflict)
    │   │   └── AdoptionRefusedError   a job of that name exists but is not ours or differs
    │   ├── UnauthenticatedError       401 (the credentials were not accepted)
    │   ├── ForbiddenError             403 (RBAC)
    │   ├── InvalidObjectError         422 (schema or admission rejected the object)
    │   ├── ServerError                5xx, 429                                   (retryable)
    │   └── KubeConnectionError        the API server could not be reached       (retryable)
    ├── WatchError                     a watch stream failed beyond recovery     (retryable)
    ├── WaitTimeoutError               a waiting phase ran out of time
    │   ├── AdmissionTimeoutError      the gang was not admitted in time
    │   ├── StartupTimeoutError        admitted, but replicas did not start in time
    │   └── CompletionTimeoutError     the job did not finish in time
    ├── JobFailedError                 the job failed (carries the diagnosis; retryable per cause)
    │   └── ReplicaFunctionError       a function task's function raised on a replica
    ├── FunctionPayloadTooLargeError   a function task's call is too large to send to replicas
    ├── JobCancelledError              the job was cancelled or deleted under us
    ├── AdmissionRefusedError          the machine can never fit the job (local backend)
    ├── TestbedError                   the local test bed could not be built or started
    ├── RegistryError                  the model registry refused or failed
    │   ├── ModelSourceRefusedError    a model location no serving runtime can load from
    │   ├── IncompatibleModelError     the serving runtime cannot load the version as logged
    │   └── ModelVersionNotReadyError  a version's registration failed or took too long
    └── ServingError                   the inference service could not be deployed
        ├── InferenceServiceSpecError  an InferenceService description is invalid
        ├── InferenceServiceNotReadyError  it did not become Ready (and was rolled back)
        └── LocalServerError           the local model server did not install, start or answer

Errors travel: Prefect keeps a failed task's exception in its state, and results cross processes,
so every error pickles with all it carries (message, hint, ``retryable``, its typed fields, a
chained ``__cause__``). The root's :meth:`KubeDLPrefectError.__reduce__` rebuilds an error from
its instance dictionary without calling ``__init__``, so a subclass needs nothing of its own to
pickle, whatever its constructor's signature.

The data an error carries lives here too, below every other layer: :class:`SpecIssue` and the
diagnosis of a failed job (:class:`Diagnosis`, :class:`FailureCategory`), which
:mod:`kubedl_prefect.lifecycle.diagnosis` computes and re-exports.

No error shows credentials of a URL: every message and hint goes through :func:`redact_urls`
(``https://user:password@host`` is shown as ``https://***@host``); :func:`redact_url`,
:func:`strip_user_info` and :func:`has_user_info` serve the layers that take URLs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

_E = TypeVar("_E", bound="KubeDLPrefectError")

_USER_INFO: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")
"""A URL's scheme and its user info (up to the last ``@`` before the path, as URL parsers read
it), wherever a URL starts in a text."""


def redact_urls(text: str) -> str:
    """``text`` with the user info of every URL in it replaced by ``***``.

    Example:
        >>> redact_urls("GET 'https://ci:s3cr3t@mlflow:5000/api' failed; see http://docs/x@y")
        "GET 'https://***@mlflow:5000/api' failed; see http://docs/x@y"
    """
    return _USER_INFO.sub(r"\1***@", text)


def redact_url(url: str) -> str:
    """``url`` with its user info replaced by ``***`` (``https://***@host``), for messages.

    Example:
        >>> redact_url("https://admin:pw@[::1]:6443/api")
        'https://***@[::1]:6443/api'
    """
    return redact_urls(url)


def strip_user_info(url: str) -> str:
    """``url`` without user info at all, for a URL that names a server (``https://host``).

    Example:
        >>> strip_user_info("https://admin:pw@k8s:6443")
        'https://k8s:6443'
    """
    return _USER_INFO.sub(r"\1", url)


def has_user_info(url: str) -> bool:
    """Whether ``url`` carries user info (``user@`` or ``user:password@``) before its host.

    Example:
        >>> has_user_info("https://ci:pw@mlflow"), has_user_info("s3://bucket/a@b")
        (True, False)
    """
    try:
        parts = urlsplit(url.strip())
        parsed = parts.username is not None or parts.password is not None
    except ValueError:  # a malformed host (an unclosed IPv6 bracket)
        parsed = False
    return parsed or _USER_INFO.match(url.strip()) is not None


class KubeDLPrefectError(Exception):
    """Root of every error raised by kubedl-prefect.

    Args:
        message: What went wrong, and where.
        hint: What the user can do about it, if anything.
        retryable: Whether trying the same thing again may succeed.
    """

    default_retryable: bool = False

    def __init__(self, message: str, *, hint: str | None = None, retryable: bool | None = None):
        # A URL quoted in a message (ours, or a library's text) never shows its credentials.
        message = redact_urls(message)
        hint = None if hint is None else redact_urls(hint)
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.retryable = self.default_retryable if retryable is None else retryable

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as (class, ``args``, instance dictionary, cause): no ``__init__`` call needed.

        The default pickling of exceptions calls ``cls(*args)``, which fails or loses fields for
        constructors with keyword-only or derived arguments, and it drops ``__cause__``. A
        cause that cannot itself be pickled travels as an :class:`UnpicklableCause`.
        """
        return (
            _rebuild,
            (type(self), self.args, dict(self.__dict__), _portable_cause(self.__cause__)),
        )


class UnpicklableCause(Exception):
    """Stands in, after pickling, for a chained cause that could not be pickled.

    Its message is the original cause's qualified type name and text
    (``aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host ...``).
    """


def _rebuild(
    cls: type[_E],
    args: tuple[Any, ...],
    state: dict[str, Any],
    cause: BaseException | None,
) -> _E:
    error = cls.__new__(cls, *args)
    error.__dict__.update(state)
    if cause is not None:
        error.__cause__ = cause
    return error


def _portable_cause(cause: BaseException | None) -> BaseException | None:
    """``cause`` if it survives a pickle round trip, else a :class:`UnpicklableCause` for it."""
    if cause is None or isinstance(cause, KubeDLPrefectError):
        return cause
    import pickle  # here, not at the top: kubedl-prefect validate starts sooner

    try:
        pickle.loads(pickle.dumps(cause))
    except Exception:
        kind = type(cause)
        return UnpicklableCause(f"{kind.__module__}.{kind.__qualname__}: {cause}")
    return cause


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


class UnauthenticatedError(KubeAPIError):
    """The API server did not accept the credentials (401).

    A wrong, expired or revoked token, or a client certificate it does not trust; not a missing
    permission (that is a 403, :class:`ForbiddenError`).
    """


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
    """The job's replicas were not admitted (gang-scheduled) in time.

    Args:
        blocker: What held it back, last: the value of an
            :class:`~kubedl_prefect.lifecycle.admission.AdmissionBlocker` (``InsufficientGPU``,
            ``UnboundPVC``...), if one was found.
        subject: The object that blocker names (``PersistentVolumeClaim ml/data``), if any.
    """

    phase = "admission"

    def __init__(
        self,
        message: str,
        *,
        timeout_s: float,
        last_reason: str | None = None,
        hint: str | None = None,
        blocker: str | None = None,
        subject: str | None = None,
    ):
        super().__init__(message, timeout_s=timeout_s, last_reason=last_reason, hint=hint)
        self.blocker = blocker
        self.subject = subject


class StartupTimeoutError(WaitTimeoutError):
    """The job was admitted but its replicas did not start in time."""

    phase = "startup"


class CompletionTimeoutError(WaitTimeoutError):
    """The job did not reach a terminal state in time."""

    phase = "completion"


class FailureCategory(StrEnum):
    """Causes of a failed job: a stable contract, automations may match on these values.

    The set is open: later versions add categories (never rename or remove one). Code that reads
    recorded categories should expect values it does not know; :meth:`Diagnosis.from_dict` reads
    them as :attr:`UNKNOWN`.
    """

    EVICTED = "Evicted"
    PREEMPTED = "Preempted"
    NODE_LOST = "NodeLost"
    KILLED = "Killed"
    NCCL_TIMEOUT = "NCCLTimeout"
    IMAGE_PULL = "ImagePullError"
    INVALID_IMAGE = "InvalidImageName"
    CONTAINER_CONFIG = "ContainerConfigError"
    OUT_OF_MEMORY = "OutOfMemory"
    COMMAND_NOT_RUNNABLE = "CommandNotRunnable"
    USER_CODE = "UserCodeError"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    # A job that can never start, failed at once by its admission wait (or refused at submission);
    # each value is also the AdmissionBlocker a wait reports before it decides.
    OPERATOR_NOT_INSTALLED = "OperatorNotInstalled"
    QUEUE_NOT_FOUND = "QueueNotFound"
    QUEUE_CLOSED = "QueueClosed"
    QUEUE_CAPABILITY_EXCEEDED = "QueueCapabilityExceeded"
    PRIORITY_CLASS_NOT_FOUND = "PriorityClassNotFound"
    NO_MATCHING_NODE = "NoMatchingNode"
    UNTOLERATED_TAINT = "UntoleratedTaint"
    PVC_NOT_FOUND = "PVCNotFound"
    QUOTA_EXCEEDED = "QuotaExceeded"
    LIMIT_RANGE_VIOLATED = "LimitRangeViolated"
    POD_REFUSED = "PodRefused"
    NO_MATCHING_FLAVOR = "NoMatchingFlavor"
    QUEUE_MISCONFIGURED = "QueueMisconfigured"
    REQUEUING_LIMIT_EXCEEDED = "RequeuingLimitExceeded"
    WORKLOAD_DEACTIVATED = "WorkloadDeactivated"
    UNKNOWN = "Unknown"


RETRYABLE_CATEGORIES: Final = frozenset(
    {
        FailureCategory.EVICTED,
        FailureCategory.PREEMPTED,
        FailureCategory.NODE_LOST,
        FailureCategory.KILLED,
        FailureCategory.NCCL_TIMEOUT,
    }
)
"""The categories whose failures resubmitting the same spec may cure (infrastructure, network)."""


@dataclass(frozen=True)
class Diagnosis:
    """A failure's cause, where it happened, and what to do.

    Args:
        category: The cause.
        retryable: Whether resubmitting the same spec may succeed.
        replica: The replica that showed it (``worker-1``), if one did.
        exit_code: The container's exit code, if it exited.
        message: One line that says what happened.
        hint: What to do about it.
        subject: The object the cause names, for a job that never started (``Queue gpu-team``,
            ``PersistentVolumeClaim ml/data``); ``None`` otherwise.

    Example:
        >>> d = Diagnosis(FailureCategory.KILLED, True, "worker-1", 137, "killed", "resume")
        >>> d.summary()
        'Killed on worker-1 (exit code 137): killed'
        >>> Diagnosis.from_dict(d.to_dict()) == d
        True
    """

    category: FailureCategory
    retryable: bool
    replica: str | None
    exit_code: int | None
    message: str
    hint: str
    subject: str | None = None

    def summary(self) -> str:
        """One line for logs and events."""
        where = f" on {self.replica}" if self.replica else ""
        code = f" (exit code {self.exit_code})" if self.exit_code is not None else ""
        return f"{self.category}{where}{code}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (camelCase keys, the category's value): for records and events.

        ``subject`` is written only when there is one, so records of failures without one read
        the same in every version.

        Example:
            >>> Diagnosis(FailureCategory.USER_CODE, False, None, 1, "exit 1", "read it").to_dict()
            {'category': 'UserCodeError', 'retryable': False, 'replica': None, 'exitCode': 1, \
'message': 'exit 1', 'hint': 'read it'}
        """
        data: dict[str, Any] = {
            "category": self.category.value,
            "retryable": self.retryable,
            "replica": self.replica,
            "exitCode": self.exit_code,
            "message": self.message,
            "hint": self.hint,
        }
        if self.subject is not None:
            data["subject"] = self.subject
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Diagnosis:
        """Rebuild a diagnosis written by :meth:`to_dict`.

        A category this version does not know (written by a newer one) reads as
        :attr:`FailureCategory.UNKNOWN`; ``retryable`` is kept as recorded.

        Raises:
            ValueError: If ``data`` lacks a field or a field has the wrong type.
        """
        try:
            raw_category = data["category"]
            retryable = data["retryable"]
            replica = data.get("replica")
            exit_code = data.get("exitCode")
            message = data["message"]
            hint = data["hint"]
            subject = data.get("subject")
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a recorded diagnosis: missing {exc}") from exc
        if not (
            isinstance(raw_category, str)
            and isinstance(retryable, bool)
            and (replica is None or isinstance(replica, str))
            and (
                exit_code is None
                or (isinstance(exit_code, int) and not isinstance(exit_code, bool))
            )
            and isinstance(message, str)
            and isinstance(hint, str)
            and (subject is None or isinstance(subject, str))
        ):
            raise ValueError(f"not a recorded diagnosis: a field has the wrong type in {data!r}")
        try:
            category = FailureCategory(raw_category)
        except ValueError:
            category = FailureCategory.UNKNOWN
        return cls(category, retryable, replica, exit_code, message, hint, subject)


class JobFailedError(KubeDLPrefectError):
    """The training job failed. ``retryable`` follows the diagnosed cause.

    Args:
        diagnosis: The lifecycle's diagnosis of the failure (category, replica, exit code).
        attempts: How many attempts were made before giving up.
        ref: The failed attempt's job reference as plain data (``JobRef.to_dict()``; read it
            back with ``JobRef.from_dict``), when one was made: where its pods are.
    """

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        retryable: bool | None = None,
        diagnosis: Diagnosis | None = None,
        attempts: int = 1,
        ref: Mapping[str, str | int] | None = None,
    ):
        super().__init__(message, hint=hint, retryable=retryable)
        self.diagnosis = diagnosis
        self.attempts = attempts
        self.ref: dict[str, str | int] | None = None if ref is None else dict(ref)


class ReplicaFunctionError(JobFailedError):
    """A function task's function raised on a replica: which one, how it exited, and why.

    Args:
        replica: The replica's name (``worker-0``).
        rank: Its rank.
        exit_code: The code it exited with.
        last_line: The traceback's last line (``ValueError: bad shard``).
        error_type: The exception's class name.
    """

    def __init__(
        self,
        message: str,
        *,
        replica: str,
        rank: int,
        exit_code: int | None,
        last_line: str,
        error_type: str,
        hint: str | None = None,
        retryable: bool | None = None,
        diagnosis: Diagnosis | None = None,
        attempts: int = 1,
        ref: Mapping[str, str | int] | None = None,
    ):
        super().__init__(
            message,
            hint=hint,
            retryable=retryable,
            diagnosis=diagnosis,
            attempts=attempts,
            ref=ref,
        )
        self.replica = replica
        self.rank = rank
        self.exit_code = exit_code
        self.last_line = last_line
        self.error_type = error_type


class FunctionPayloadTooLargeError(KubeDLPrefectError, ValueError):
    """A function task's call (the function and its arguments) is too large to send.

    Args:
        size: The serialized call's size, in bytes.
        limit: The most a function task may carry, in bytes.
    """

    def __init__(self, message: str, *, size: int, limit: int, hint: str | None = None):
        super().__init__(
            message,
            hint=hint
            or (
                "pass large data as a path or URL the replicas read (a dataset on a shared "
                "volume, an object store), not as an argument or a global the function uses"
            ),
        )
        self.size = size
        self.limit = limit


class JobCancelledError(KubeDLPrefectError):
    """The training job was cancelled, or deleted while being waited on."""


class TestbedError(KubeDLPrefectError):
    """The local Kubernetes test bed could not be built, started or reached."""

    __test__ = False  # not a pytest test class, despite its name


class RegistryError(KubeDLPrefectError):
    """The model registry (MLflow) refused or failed a request."""


class ServingError(KubeDLPrefectError):
    """An inference service could not be deployed or did not become ready."""


class ModelSourceRefusedError(RegistryError):
    """A model location that a serving runtime cannot load from was refused.

    Raised before anything is applied: a ``runs:/`` source (it names a run's artifacts, not a
    model), an ``mlflow-artifacts:/`` location without a configured artifact destination, or a
    scheme KServe's storage initializer does not know.

    Args:
        uri: The refused URI.
    """

    def __init__(self, message: str, *, uri: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.uri = uri


class IncompatibleModelError(RegistryError):
    """The chosen serving runtime cannot load the model version as it was logged.

    Args:
        runtime: The serving runtime checked against (``kserve-mlserver``).
        problems: Every problem found, each with what to change.
    """

    def __init__(
        self,
        message: str,
        *,
        runtime: str,
        problems: Sequence[str] = (),
        hint: str | None = None,
    ):
        super().__init__(message, hint=hint)
        self.runtime = runtime
        self.problems = tuple(problems)


class ModelVersionNotReadyError(RegistryError):
    """A model version did not become ``READY``: its registration failed or took too long.

    Args:
        name: The registered model.
        version: The version.
        status: Its last status (``PENDING_REGISTRATION``, ``FAILED_REGISTRATION``).
    """

    def __init__(
        self,
        message: str,
        *,
        name: str,
        version: str,
        status: str,
        hint: str | None = None,
        retryable: bool | None = None,
    ):
        super().__init__(message, hint=hint, retryable=retryable)
        self.name = name
        self.version = version
        self.status = status


class InferenceServiceSpecError(ServingError, ValueError):
    """An InferenceService description is invalid; refused before anything is applied.

    ``issues`` lists every problem, each with its field path and fix.
    """

    def __init__(self, issues: Sequence[SpecIssue], *, name: str | None = None):
        self.issues = tuple(issues)
        self.name = name
        where = f" {name!r}" if name else ""
        count = len(self.issues)
        lines = [f"{count} problem{'s' if count != 1 else ''} in the InferenceService{where}:"]
        lines += [f"  - {issue}" for issue in self.issues]
        super().__init__("\n".join(lines))


class InferenceServiceNotReadyError(ServingError):
    """An InferenceService did not become Ready; what was live before has been restored.

    Args:
        namespace: Its namespace.
        name: Its name.
        reason: Why it was not ready (from its conditions, model status and pods).
        timed_out: Whether the wait ran out of time (else a failure was seen).
        rolled_back: Whether the previous spec (and alias) were restored.
    """

    def __init__(
        self,
        message: str,
        *,
        namespace: str,
        name: str,
        reason: str,
        timed_out: bool = False,
        rolled_back: bool = False,
        hint: str | None = None,
    ):
        super().__init__(message, hint=hint)
        self.namespace = namespace
        self.name = name
        self.reason = reason
        self.timed_out = timed_out
        self.rolled_back = rolled_back


class AdmissionRefusedError(KubeDLPrefectError):
    """A job was refused at submission: the machine can never fit its replicas at once.

    The local backend's answer where a cluster would leave the gang queued: nothing frees up on
    one machine by waiting, so nothing is started and the reason is given at once, worded and
    categorised like a scheduler's (``Insufficient cpu``).

    Args:
        reason: What does not fit (processes, CPU, memory, GPUs), with the numbers.
        blocker: The :class:`~kubedl_prefect.lifecycle.admission.AdmissionBlocker` value
            (``InsufficientResources``, ``InsufficientGPU``).
    """

    def __init__(self, message: str, *, reason: str, blocker: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.reason = reason
        self.blocker = blocker


class OperatorNotInstalledError(NotFoundError):
    """The cluster does not serve the job's kind: the operator (its CRD) is not installed.

    Raised by submission, before anything was created. The message names the kind and API group
    that are missing; the hint says which operator to install, or which dialect the cluster does
    serve.

    Args:
        diagnosis: The cause as a :class:`Diagnosis` (category
            :attr:`FailureCategory.OPERATOR_NOT_INSTALLED`, the missing CRD as its subject).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 404,
        reason: str | None = "NotFound",
        hint: str | None = None,
        diagnosis: Diagnosis | None = None,
    ):
        super().__init__(message, status=status, reason=reason, hint=hint)
        self.diagnosis = diagnosis


class LocalServerError(ServingError):
    """The local model server could not be installed, started or asked for a prediction.

    Raised by :mod:`kubedl_prefect.serving.local`: its environment is missing or could not be
    built, the server exited or did not become ready in time (the message ends with the tail of
    its log), or it answered a prediction with an error.

    Args:
        log_tail: The last lines of the server's log, when there is one.
    """

    def __init__(self, message: str, *, log_tail: str = "", hint: str | None = None):
        super().__init__(message, hint=hint)
        self.log_tail = log_tail


class MissingExtraError(KubeDLPrefectError, ImportError):
    """A part of kubedl-prefect needs packages of one of its extras, and they are not installed.

    Also an :class:`ImportError`, which it stands for.

    Attributes:
        extra: The extra that brings them (``pip install 'kubedl-prefect[<extra>]'``).
        missing: What could not be found: top-level modules, or the distribution that
            provides a part (``kubedl-prefect-testbed``).
    """

    def __init__(self, feature: str, *, extra: str, missing: Sequence[str]):
        super().__init__(
            f"{feature} needs {', '.join(missing)}, which is not installed",
            hint=f"install the extra {extra!r}: pip install 'kubedl-prefect[{extra}]' "
            f"(in a checkout of kubedl-prefect: uv sync --extra {extra})",
        )
        self.extra = extra
        self.missing = tuple(missing)


def require_extra(feature: str, extra: str, *modules: str) -> None:
    """Raise :class:`MissingExtraError` unless every top-level module in ``modules`` can be found.

    Nothing is imported: the check only looks the modules up.

    Example:
        >>> require_extra("the JSON codec", "none", "json")
        >>> try:
        ...     require_extra("the test bed", "testbed", "no_such_module_here")
        ... except MissingExtraError as exc:
        ...     print(exc.message, exc.extra, isinstance(exc, ImportError))
        the test bed needs no_such_module_here, which is not installed testbed True
    """
    import importlib.util

    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    if missing:
        raise MissingExtraError(feature, extra=extra, missing=missing)
