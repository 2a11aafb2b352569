"""Running a logical training job to the end: attempts, classified retries, checkpoint resume.

A logical job is a spec plus the caller's key. Each attempt is a separate cluster job
(``<name>-<key hash>-a<n>``) that gets the same checkpoint location, so a resubmission after an
eviction resumes where the last checkpoint left off. Only failures the diagnosis calls retryable
(eviction, preemption, a lost node, SIGKILL/SIGTERM, NCCL timeouts) are retried, after a growing
pause, up to a limit; anything else fails at once with its diagnosis.

Because names are deterministic and submission adopts what exists, a flow that crashed and runs
again with the same key replays its attempts against the jobs already in the cluster instead of
launching duplicates. And because each attempt's end is recorded (:mod:`.records`), a replay after
the jobs were cleaned up starts where the record says: it returns a recorded success or raises a
recorded permanent failure without training again, and resumes at the latest attempt otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from kubedl_prefect.deprecation import called_in_a_loop, renamed, warn_face_changed
from kubedl_prefect.errors import JobFailedError, SpecError, SpecIssue
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.lifecycle.backend import (
    JobOutcome,
    JobRef,
    PhaseCallback,
    TrainingBackend,
    WaitTimeouts,
)
from kubedl_prefect.lifecycle.diagnosis import Diagnosis
from kubedl_prefect.lifecycle.records import AttemptRecord, replay_step
from kubedl_prefect.spec import TrainingJobSpec
from kubedl_prefect.spec.naming import MAX_ATTEMPT


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how soon a retryable failure is tried again.

    Args:
        max_attempts: Attempts in all, the first included (2-3 is what teams find worth paying).
        backoff_s: Pause before the second attempt.
        backoff_factor: Each further pause is this many times longer.
        max_backoff_s: Longest pause.
    """

    max_attempts: int = 3
    backoff_s: float = 10.0
    backoff_factor: float = 2.0
    max_backoff_s: float = 300.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= MAX_ATTEMPT:
            raise SpecError(
                [
                    SpecIssue(
                        "retry.max_attempts",
                        f"{self.max_attempts} is out of range",
                        f"use 1 to {MAX_ATTEMPT}",
                    )
                ]
            )

    def delay_s(self, failed_attempt: int) -> float:
        """Pause after attempt ``failed_attempt`` (1-based) failed."""
        return min(self.backoff_s * self.backoff_factor ** (failed_attempt - 1), self.max_backoff_s)


AttemptCallback = Callable[[JobRef], None]


async def arun_to_completion(
    backend: TrainingBackend,
    spec: TrainingJobSpec,
    *,
    key: str,
    retry: RetryPolicy = RetryPolicy(),
    timeouts: WaitTimeouts = WaitTimeouts(),
    on_phase: PhaseCallback | None = None,
    on_attempt: AttemptCallback | None = None,
) -> JobOutcome:
    """Submit (or adopt) and follow attempts of ``spec`` for ``key`` until one succeeds.

    A replay (the same spec and key again) starts from the logical job's record: a recorded
    success is returned (``outcome.replayed``) and a recorded permanent failure raised, without
    submitting anything; otherwise it goes on at the latest recorded attempt.

    Returns:
        The outcome of the attempt that succeeded.

    Raises:
        JobFailedError: A permanent failure, or retryable ones until ``retry.max_attempts``;
            ``diagnosis`` and ``attempts`` say what and how often.
        WaitTimeoutError: A waiting phase ran out of time.
        AdoptionRefusedError: The key was used for another spec.

    Example:
        >>> from kubedl_prefect import KubernetesBackend, load_spec, arun_to_completion
        >>> async def nightly() -> None:
        ...     backend = KubernetesBackend(namespace="ml")
        ...     outcome = await arun_to_completion(
        ...         backend, load_spec("examples/pytorch-mnist.yaml"), key="nightly-2026-12-01"
        ...     )
        ...     print(outcome.status.phase, outcome.ref.attempt)
    """
    step = replay_step(await backend.history(spec, key=key), max_attempts=retry.max_attempts)
    previous = step.previous
    if step.action == "succeeded" and previous is not None and previous.ref is not None:
        ref = JobRef.from_dict(previous.ref)
        if on_attempt is not None:
            on_attempt(ref)
        return JobOutcome(ref, previous.status(), None, replayed=True)
    if step.action == "failed" and previous is not None:
        raise _gave_up(spec, key, previous.attempt, previous.diagnosis, previous, previous.ref)
    attempt = step.attempt
    while True:
        ref = await backend.submit(spec, key=key, attempt=attempt)
        if on_attempt is not None:
            on_attempt(ref)
        outcome = await backend.wait_completed(ref, timeouts=timeouts, on_phase=on_phase)
        if outcome.succeeded:
            return outcome
        diagnosis = outcome.diagnosis
        if diagnosis is None or not diagnosis.retryable or attempt >= retry.max_attempts:
            raise _gave_up(spec, key, attempt, diagnosis, None, outcome.ref.to_dict())
        await asyncio.sleep(retry.delay_s(attempt))
        attempt += 1


def run_to_completion(
    backend: TrainingBackend,
    spec: TrainingJobSpec,
    *,
    key: str,
    retry: RetryPolicy = RetryPolicy(),
    timeouts: WaitTimeouts = WaitTimeouts(),
    on_phase: PhaseCallback | None = None,
    on_attempt: AttemptCallback | None = None,
) -> JobOutcome:
    """Blocking :func:`arun_to_completion`, for sync code (same arguments, same result).

    Until the next release, a call from code that runs an event loop (an old ``await
    run_to_completion(...)``, from when this name was the coroutine) warns and returns
    :func:`arun_to_completion`'s coroutine instead of blocking.
    """
    coroutine = arun_to_completion(
        backend,
        spec,
        key=key,
        retry=retry,
        timeouts=timeouts,
        on_phase=on_phase,
        on_attempt=on_attempt,
    )
    if called_in_a_loop():
        warn_face_changed("run_to_completion", "arun_to_completion")
        return cast(JobOutcome, coroutine)
    return KubeRuntime.get().block_on(coroutine)


_RENAMED = {"run_to_completion_sync": "run_to_completion"}


def __getattr__(name: str) -> Any:
    return renamed(__name__, name, _RENAMED)


def _gave_up(
    spec: TrainingJobSpec,
    key: str,
    attempt: int,
    diagnosis: Diagnosis | None,
    recorded: AttemptRecord | None,
    ref: Mapping[str, Any] | None,
) -> JobFailedError:
    """The failure that ends the logical job, carrying the failed attempt's reference."""
    if diagnosis is None:
        why, hint = "with no diagnosis", None
        summary = (recorded.message if recorded is not None else "") or "unknown cause"
    else:
        why = "not retryable" if not diagnosis.retryable else f"after {attempt} attempts"
        hint, summary = diagnosis.hint, diagnosis.summary()
    seen = " (recorded by an earlier run)" if recorded is not None else ""
    return JobFailedError(
        f"training job {spec.name} (key {key!r}) failed{seen}, {why}: {summary}",
        hint=hint,
        retryable=False,
        diagnosis=diagnosis,
        attempts=attempt,
        ref=ref,
    )
