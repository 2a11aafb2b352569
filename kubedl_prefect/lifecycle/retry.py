"""Running a logical training job to the end: attempts, classified retries, checkpoint resume.

A logical job is a spec plus the caller's key. Each attempt is a separate cluster job
(``<name>-<key hash>-a<n>``) that gets the same checkpoint location, so a resubmission after an
eviction resumes where the last checkpoint left off. Only failures the diagnosis calls retryable
(eviction, preemption, a lost node, SIGKILL/SIGTERM, NCCL timeouts) are retried, after a growing
pause, up to a limit; anything else fails at once with its diagnosis.

Because names are deterministic and submission adopts what exists, a flow that crashed and runs
again with the same key replays its attempts against the jobs already in the cluster instead of
launching duplicates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from kubedl_prefect.errors import JobFailedError, SpecError, SpecIssue
from kubedl_prefect.lifecycle.backend import (
    JobOutcome,
    JobRef,
    PhaseCallback,
    TrainingBackend,
    WaitTimeouts,
)
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


async def run_to_completion(
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

    Returns:
        The outcome of the attempt that succeeded.

    Raises:
        JobFailedError: A permanent failure, or retryable ones until ``retry.max_attempts``;
            ``diagnosis`` and ``attempts`` say what and how often.
        WaitTimeoutError: A waiting phase ran out of time.
    """
    attempt = 1
    while True:
        ref = await backend.submit(spec, key=key, attempt=attempt)
        if on_attempt is not None:
            on_attempt(ref)
        outcome = await backend.wait_completed(ref, timeouts=timeouts, on_phase=on_phase)
        if outcome.succeeded:
            return outcome
        diagnosis = outcome.diagnosis
        assert diagnosis is not None, "a failed outcome always carries a diagnosis"
        if not diagnosis.retryable or attempt >= retry.max_attempts:
            why = "not retryable" if not diagnosis.retryable else f"after {attempt} attempts"
            raise JobFailedError(
                f"training job {spec.name} (key {key!r}) failed, {why}: {diagnosis.summary()}",
                hint=diagnosis.hint,
                retryable=False,
                diagnosis=diagnosis,
                attempts=attempt,
            )
        await asyncio.sleep(retry.delay_s(attempt))
        attempt += 1
