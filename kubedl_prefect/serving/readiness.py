"""Is an InferenceService serving what we applied, failing, or still on its way? Pure.

Read from the InferenceService and its pods (labelled ``serving.kserve.io/inferenceservice``):

- **failed**: the model status says it will not load (``InvalidSpec``, ``BlockedByFailedLoad``,
  ``FailedToLoad``; or a last failure ``NoSupportingRuntime``, ``RuntimeNotRecognized``,
  ``RuntimeDisabled``, ``InvalidPredictorSpec``, ``ModelLoadFailed`` while nothing is loaded:
  the last failure stays recorded after a recovery), the ``Ready`` condition is False
  for a reason that does not pass (a failed revision, an exceeded progress deadline, a reconcile
  error), or a pod of the spec (its predictor's or a canary's, carrying their labels) cannot
  start at all (image pull, container configuration, crash loop);
- **ready**: the ``Ready`` condition is True (it aggregates ``PredictorReady`` and
  ``IngressReady``), the model status agrees (its target state ``Loaded``, its transition
  ``UpToDate``, when KServe reports one), the rollout is over: every pod of the current
  predictor (the pods carrying the spec's ``predictor.labels`` and the stable predictor's
  ``app`` label) is Ready, and one at least; and every canary of ``spec.canary`` is Ready in
  ``status.canaryStatuses`` (``Ready`` leaves them out), and so is every pod of it that carries
  its labels, one at least;
- **pending** otherwise, with the most telling reason (a condition's, the model status', a
  pod's).

The rollout check matters in Standard mode: KServe derives ``PredictorReady`` from the
Deployment's ``Available`` condition, which stays True while a new ReplicaSet rolls out next to
the old one, so ``Ready`` is True before a single pod of the new spec runs.

A status must be about the spec we applied. ``status.observedGeneration`` cannot tell: KServe copies
it from the predictor's Deployment. So :class:`Applied` remembers the generation and
resourceVersion our apply produced; while the object is older than that generation, or unchanged
since our write, its status is the previous spec's and reads as pending.

Example:
    >>> isvc = {"metadata": {"generation": 2, "resourceVersion": "11"},
    ...         "status": {"conditions": [{"type": "Ready", "status": "True"}],
    ...                    "url": "http://fraud-ml.example.com"}}
    >>> readiness(isvc, [], Applied(generation=2, resource_version="10", changed=True)).state
    <ServingState.READY: 'ready'>
    >>> readiness(isvc, [], Applied(generation=2, resource_version="11", changed=True)).reason
    'Reconciling'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from kubedl_prefect.kube.resources import KubeObject
from kubedl_prefect.lifecycle.diagnosis import stuck_for_good
from kubedl_prefect.serving.canary import canary_state

FAILED_MODEL_REASONS: Final = frozenset(
    {
        "NoSupportingRuntime",
        "RuntimeNotRecognized",
        "RuntimeDisabled",
        "InvalidPredictorSpec",
        "ModelLoadFailed",
    }
)
"""``modelStatus.lastFailureInfo.reason`` values that do not pass by themselves."""
FAILED_TRANSITIONS: Final = frozenset({"InvalidSpec", "BlockedByFailedLoad"})
"""``modelStatus.transitionStatus`` values of a model that will not load."""
FAILED_CONDITION_REASONS: Final = frozenset(
    {
        "RevisionFailed",
        "RevisionMissing",
        "ProgressDeadlineExceeded",
        "ReconcileFailed",
        "ServerlessModeRejected",
    }
)
"""Reasons of a False ``Ready``/``PredictorReady`` that waiting does not cure."""
CRASH_LOOP_RESTARTS: Final = 3
"""A container in ``CrashLoopBackOff`` after this many restarts is taken as failed."""


class ServingState(StrEnum):
    """Where an InferenceService stands."""

    READY = "ready"
    FAILED = "failed"
    PENDING = "pending"


@dataclass(frozen=True)
class Applied:
    """What our apply produced: the generation and resourceVersion it answered with.

    Args:
        generation: ``metadata.generation`` after the apply.
        resource_version: ``metadata.resourceVersion`` after the apply.
        changed: Whether the apply changed the spec (a no-op apply of the same spec is not).
    """

    generation: int
    resource_version: str
    changed: bool


@dataclass(frozen=True)
class Readiness:
    """The state of an InferenceService and why.

    Attributes:
        state: Ready, failed or pending.
        reason: A short reason (``NoSupportingRuntime``, ``ImagePullBackOff``, ``Reconciling``).
        message: What it means, in one line.
        url: ``status.url``, once set.
        runtime: The serving runtime KServe chose (``status.clusterServingRuntimeName`` or
            ``status.servingRuntimeName``).
    """

    state: ServingState
    reason: str
    message: str
    url: str | None = None
    runtime: str | None = None

    def summary(self) -> str:
        """One line for logs, events and errors."""
        return f"{self.reason}: {self.message}" if self.message else self.reason


def _conditions(isvc: KubeObject) -> dict[str, dict[str, Any]]:
    status = isvc.get("status") or {}
    return {str(c.get("type")): c for c in status.get("conditions") or [] if isinstance(c, dict)}


def _model_failure(isvc: KubeObject) -> tuple[str, str] | None:
    model = (isvc.get("status") or {}).get("modelStatus") or {}
    failure = model.get("lastFailureInfo") or {}
    states = model.get("states") or {}
    reason = str(failure.get("reason") or "")
    message = str(failure.get("message") or "")
    transition = str(model.get("transitionStatus") or "")
    if transition in FAILED_TRANSITIONS or states.get("targetModelState") == "FailedToLoad":
        return reason or transition or "FailedToLoad", message or f"model status {transition}"
    # The last failure stays recorded after a recovery: it counts only while nothing is loaded.
    loaded = transition == "UpToDate" or states.get("activeModelState") == "Loaded"
    if reason in FAILED_MODEL_REASONS and not loaded:
        return reason, message
    return None


def _pod_failure(pods: Sequence[KubeObject]) -> tuple[str, str] | None:
    stuck = stuck_for_good(pods)
    if stuck is not None:
        where = f" ({stuck.replica})" if stuck.replica else ""
        return str(stuck.category), f"{stuck.message}{where}"
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            restarts = int(status.get("restartCount") or 0)
            if waiting.get("reason") == "CrashLoopBackOff" and restarts >= CRASH_LOOP_RESTARTS:
                name = pod["metadata"]["name"]
                return (
                    "CrashLoopBackOff",
                    f"container {status.get('name')} of pod {name} keeps crashing "
                    f"({restarts} restarts): the model server cannot load the model",
                )
    return None


def _pod_reason(pods: Sequence[KubeObject]) -> tuple[str, str] | None:
    """Why the pods are not ready yet (unschedulable, containers waiting), if they say."""
    for pod in pods:
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                return str(condition.get("reason") or "Unschedulable"), str(
                    condition.get("message") or ""
                )
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason"):
                return str(waiting["reason"]), str(waiting.get("message") or "")
    return None


def _model_not_loaded(isvc: KubeObject) -> tuple[str, str] | None:
    """Why the model status says the model of the spec is not loaded yet, if it says so."""
    model = (isvc.get("status") or {}).get("modelStatus") or {}
    target = str((model.get("states") or {}).get("targetModelState") or "")
    transition = str(model.get("transitionStatus") or "")
    if target and target != "Loaded":
        return f"Model{target}", f"the model is {target} (modelStatus.states.targetModelState)"
    if transition and transition != "UpToDate":
        return transition, f"the model status is {transition} (modelStatus.transitionStatus)"
    return None


def _is_ready(pod: KubeObject) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def predictor_app(isvc: KubeObject, predictor: str | None = None) -> str:
    """The ``app`` label of the pods of a predictor's Deployment (Standard mode).

    KServe labels them ``isvc.<service>-predictor``, a canary's ``isvc.<service>-<canary
    name>-predictor`` (its ``predictor.name``), and selects them so in the predictor's Service.

    Example:
        >>> predictor_app({"metadata": {"name": "fraud"}}, "canary")
        'isvc.fraud-canary-predictor'
    """
    name = str((isvc.get("metadata") or {}).get("name") or "")
    return f"isvc.{name}-{predictor}-predictor" if predictor else f"isvc.{name}-predictor"


def _current(pods: Sequence[KubeObject], wanted: dict[str, Any], app: str) -> list[KubeObject]:
    """The pods of one predictor carrying the ``wanted`` labels, but those being deleted.

    A pod of another predictor (another ``app`` label) does not count; one without the label
    does.
    """
    found = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        labels = metadata.get("labels") or {}
        if metadata.get("deletionTimestamp") or labels.get("app", app) != app:
            continue
        if all(labels.get(k) == v for k, v in wanted.items()):
            found.append(pod)
    return found


def _spec_pods(isvc: KubeObject, pods: Sequence[KubeObject]) -> list[KubeObject]:
    """The pods of the spec: its stable predictor's and its canaries', with their labels.

    Not a removed canary's pods (another ``app`` label), nor those of an earlier spec: their
    crash loop is not this spec's failure (a rollback that drops a crashing canary is Ready
    once the stable predictor is).
    """
    spec = isvc.get("spec") or {}
    predictor = spec.get("predictor") or {}
    stable = predictor.get("labels") or {}
    found = _current(pods, stable, predictor_app(isvc, predictor.get("name")))
    for entry in spec.get("canary") or []:
        canary = entry.get("predictor") or {}
        wanted = {**stable, **(canary.get("labels") or {})}
        found += _current(pods, wanted, predictor_app(isvc, str(canary.get("name") or "")))
    return found


def _rollout(isvc: KubeObject, pods: Sequence[KubeObject]) -> tuple[str, str] | None:
    """Why the current predictor's pods are not all Ready yet, if they are not.

    Pods of the current spec carry its ``predictor.labels`` (KServe copies them to the pod
    template) and the stable predictor's ``app`` label (a canary's pods carry their own, and
    may carry the same model version: a promoted candidate's); pods being deleted do not count.
    Without pods to look at (``[]``), nothing is said.
    """
    if not pods:
        return None
    predictor = (isvc.get("spec") or {}).get("predictor") or {}
    wanted = predictor.get("labels") or {}
    current = _current(pods, wanted, predictor_app(isvc, predictor.get("name")))
    ready = sum(1 for p in current if _is_ready(p))
    if current and ready == len(current):
        return None
    message = f"{ready} of {len(current)} pods of the current predictor are Ready"
    why = _pod_reason([p for p in current if not _is_ready(p)])
    if why is not None:
        message += f" ({why[0]}: {why[1]})" if why[1] else f" ({why[0]})"
    return "RollingOut", message


def _canaries_waiting(isvc: KubeObject, pods: Sequence[KubeObject]) -> tuple[str, str] | None:
    """Why a canary of the spec (``spec.canary[]``) is not Ready yet, if one is not.

    KServe's ``Ready`` does not include its canaries: their state is ``status.canaryStatuses``,
    whose ``ready`` only says that the canary's Deployment has an available replica (an earlier
    candidate's, while a changed canary rolls out). So, with ``pods``, every pod of the canary
    carrying its labels must be Ready too, and one at least.
    """
    stable = ((isvc.get("spec") or {}).get("predictor") or {}).get("labels") or {}
    for entry in (isvc.get("spec") or {}).get("canary") or []:
        predictor = entry.get("predictor") or {}
        name = str(predictor.get("name") or "")
        ready, message = canary_state(isvc, name)
        if not ready:
            return "CanaryNotReady", message
        if not pods:
            continue
        wanted = {**stable, **(predictor.get("labels") or {})}
        current = _current(pods, wanted, predictor_app(isvc, name))
        up = sum(1 for p in current if _is_ready(p))
        if not current or up < len(current):
            return "CanaryNotReady", f"{up} of {len(current)} pods of {name} are Ready"
    return None


def _runtime(isvc: KubeObject) -> str | None:
    status = isvc.get("status") or {}
    name = status.get("clusterServingRuntimeName") or status.get("servingRuntimeName")
    return str(name) if name else None


def readiness(
    isvc: KubeObject, pods: Sequence[KubeObject], applied: Applied | None = None
) -> Readiness:
    """The state of ``isvc`` (with its ``pods``) for the spec ``applied`` produced.

    Args:
        isvc: The InferenceService as read.
        pods: Its pods (label ``serving.kserve.io/inferenceservice``); ``[]`` when they were not
            read, which skips the rollout check.
        applied: What our apply answered; ``None`` trusts the status whatever spec it is for.
    """
    metadata = isvc.get("metadata") or {}
    status = isvc.get("status") or {}
    url = str(status["url"]) if status.get("url") else None
    runtime = _runtime(isvc)
    if applied is not None:
        generation = int(metadata.get("generation") or 0)
        if generation < applied.generation or (
            applied.changed and str(metadata.get("resourceVersion")) == applied.resource_version
        ):
            return Readiness(
                ServingState.PENDING,
                "Reconciling",
                f"waiting for KServe to act on generation {applied.generation}",
            )
    failure = _model_failure(isvc) or _pod_failure(_spec_pods(isvc, pods))
    conditions = _conditions(isvc)
    ready = conditions.get("Ready") or {}
    if failure is None:
        for kind in ("Ready", "PredictorReady"):
            condition = conditions.get(kind) or {}
            reason = str(condition.get("reason") or "")
            if condition.get("status") == "False" and reason in FAILED_CONDITION_REASONS:
                failure = (reason, str(condition.get("message") or ""))
                break
    if failure is not None:
        return Readiness(ServingState.FAILED, failure[0], failure[1], url, runtime)
    if ready.get("status") == "True":
        waiting = _model_not_loaded(isvc) or _rollout(isvc, pods) or _canaries_waiting(isvc, pods)
        if waiting is not None:
            return Readiness(ServingState.PENDING, waiting[0], waiting[1], url, runtime)
        return Readiness(
            ServingState.READY, "Ready", f"serving at {url or '(no URL)'}", url, runtime
        )
    for kind in ("PredictorReady", "Ready", "IngressReady"):
        condition = conditions.get(kind) or {}
        if condition.get("status") in ("False", "Unknown") and (
            condition.get("reason") or condition.get("message")
        ):
            return Readiness(
                ServingState.PENDING,
                str(condition.get("reason") or kind),
                str(condition.get("message") or ""),
                url,
                runtime,
            )
    pod = _pod_reason(pods)
    if pod is not None:
        return Readiness(ServingState.PENDING, pod[0], pod[1], url, runtime)
    if not conditions:
        return Readiness(
            ServingState.PENDING, "NoStatus", "KServe has not reported yet", url, runtime
        )
    return Readiness(ServingState.PENDING, "NotReady", "Ready is not True yet", url, runtime)
