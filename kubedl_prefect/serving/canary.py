"""Promote a canary or roll it back, from its answers to test traffic next to the stable model's.

In Standard mode KServe (v0.20) runs the candidate of ``spec.canary`` in a Deployment and Service
of its own, ``<service>-<canary>-predictor``, and reports it in ``status.canaryStatuses``
(``name``, ``ready``: its Deployment has an available replica, ``trafficPercent``) and the
condition ``CanaryPredictorReady``; it fills no ``modelStatus`` for a canary. Once both are
Ready, the caller sends the same requests to the stable Service and the candidate's, and
:func:`canary_verdict` decides from what came back. :class:`CanaryCheck` is the documented check:

- at least ``min_requests`` requests went to the candidate;
- its error rate (requests without an answer) is at most ``max_error_rate``;
- every answer of the candidate is finite numbers;
- with ``max_difference`` set, each candidate answer is within it of the stable model's answer
  to the same request (element by element, same shape): a candidate may differ, not go wild;
  a request the stable model failed is not compared, and one answer of the stable model at
  least is needed.

Promote: deploy the candidate as the stable model without a canary. Roll back: deploy the stable
model without a canary and restore the registry alias. Pure.

Example:
    >>> check = CanaryCheck(min_requests=2, max_error_rate=0.0, max_difference=0.5)
    >>> canary_verdict([[1.0, 2.0], [3.0]], [[1.1, 2.0], [3.2]], check).promote
    True
    >>> verdict = canary_verdict([[1.0], [3.0]], [[1.0], None], check)
    >>> verdict.promote, verdict.reason
    (False, 'the candidate failed 1 of 2 requests (50%), more than 0%')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Answer = Sequence[float] | None
"""A model's output for one request, flattened; ``None`` when the request failed."""


@dataclass(frozen=True)
class CanaryCheck:
    """When a candidate's answers let it replace the stable model.

    Args:
        min_requests: The fewest requests the candidate must have answered or failed.
        max_error_rate: The largest share of failed requests (0.0 to 1.0).
        max_difference: The largest absolute difference of any output from the stable model's
            output for the same request; ``None`` does not compare them.
    """

    min_requests: int = 10
    max_error_rate: float = 0.0
    max_difference: float | None = None


@dataclass(frozen=True)
class CanaryVerdict:
    """What the check found.

    Attributes:
        promote: Whether the candidate passed.
        reason: Why (the first check it failed, or what it passed).
        requests: Requests sent to the candidate.
        errors: Those it did not answer.
        largest_difference: The largest difference from the stable model's answers, when
            compared.
    """

    promote: bool
    reason: str
    requests: int
    errors: int
    largest_difference: float | None = None


def _finite(answer: Sequence[float]) -> bool:
    return all(isinstance(x, int | float) and math.isfinite(x) for x in answer)


def canary_verdict(
    stable: Sequence[Answer], candidate: Sequence[Answer], check: CanaryCheck
) -> CanaryVerdict:
    """Whether the candidate passes ``check``, from both models' answers to the same requests.

    Args:
        stable: The stable model's answers, request by request.
        candidate: The candidate's answers to the same requests, in the same order.
        check: The thresholds.
    """
    requests = len(candidate)
    errors = sum(1 for answer in candidate if answer is None)
    if requests < check.min_requests:
        return CanaryVerdict(
            False,
            f"the candidate got {requests} requests, fewer than {check.min_requests}",
            requests,
            errors,
        )
    rate = errors / requests
    if rate > check.max_error_rate:
        return CanaryVerdict(
            False,
            f"the candidate failed {errors} of {requests} requests ({rate:.0%}), more than "
            f"{check.max_error_rate:.0%}",
            requests,
            errors,
        )
    answered = [(i, a) for i, a in enumerate(candidate) if a is not None]
    for index, answer in answered:
        if not _finite(answer):
            return CanaryVerdict(
                False, f"the candidate's answer {index} is not finite numbers", requests, errors
            )
    if check.max_difference is None:
        return CanaryVerdict(
            True,
            f"the candidate answered {requests - errors} of {requests} requests",
            requests,
            errors,
        )
    if len(stable) != requests:
        return CanaryVerdict(
            False,
            f"{len(stable)} stable answers for {requests} candidate requests: not the same "
            "requests",
            requests,
            errors,
        )
    if answered and all(stable[index] is None for index, _ in answered):
        return CanaryVerdict(
            False,
            f"the stable model answered none of the {len(answered)} requests the candidate "
            "answered: nothing to compare the candidate with",
            requests,
            errors,
        )
    largest = 0.0
    for index, answer in answered:
        reference = stable[index]
        if reference is None:
            continue  # the stable model failed it: nothing to compare with
        if len(reference) != len(answer):
            return CanaryVerdict(
                False,
                f"the candidate's answer {index} has {len(answer)} values, the stable model's "
                f"{len(reference)}",
                requests,
                errors,
            )
        largest = max([largest, *(abs(a - b) for a, b in zip(answer, reference, strict=True))])
    if largest > check.max_difference:
        return CanaryVerdict(
            False,
            f"the candidate's answers differ from the stable model's by up to {largest:.4g}, "
            f"more than {check.max_difference:.4g}",
            requests,
            errors,
            largest,
        )
    return CanaryVerdict(
        True,
        f"the candidate answered {requests - errors} of {requests} requests, within "
        f"{check.max_difference:.4g} of the stable model",
        requests,
        errors,
        largest,
    )


def canary_state(isvc: Mapping[str, Any], name: str) -> tuple[bool, str]:
    """Whether KServe reports the canary ``name`` Ready, and what it reports.

    From ``status.canaryStatuses`` (KServe v0.20, Standard mode) and the condition
    ``CanaryPredictorReady``; a canary not listed yet is not Ready.

    Example:
        >>> canary_state({"status": {"canaryStatuses": [
        ...     {"name": "canary", "ready": True, "trafficPercent": 50}]}}, "canary")
        (True, 'canary ready, 50% of the traffic')
    """
    status = isvc.get("status") or {}
    for entry in status.get("canaryStatuses") or []:
        if entry.get("name") == name:
            ready = bool(entry.get("ready"))
            percent = entry.get("trafficPercent", 0)
            word = "ready" if ready else "not ready"
            return ready, f"{name} {word}, {percent}% of the traffic"
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    reason = (conditions.get("CanaryPredictorReady") or {}).get("reason") or "not reported yet"
    return False, f"{name} not in status.canaryStatuses ({reason})"
