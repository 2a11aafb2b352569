"""Why a training job failed, and whether trying again can help. Pure functions.

Input is what the cluster shows after the fact: the job, its pods (container states, exit codes,
pod reasons, disruption conditions), events, and the last log lines of each replica. Output is a
:class:`Diagnosis` whose :class:`FailureCategory` is a stable contract and whose ``retryable`` flag
is the only thing the retry policy reads. Those data types live in :mod:`kubedl_prefect.errors`
(a :class:`~kubedl_prefect.errors.JobFailedError` carries one) and are re-exported here.

Precedence, when several replicas failed differently: errors in the pod's configuration (image,
container config) come first, because nothing else can succeed until they are fixed; then
disruptions by the infrastructure (eviction, preemption, a lost node), because the other replicas'
exits usually follow from them; then NCCL timeouts seen in logs; then exit codes.

Judgement calls, documented in docs/troubleshooting.md: ``OOMKilled`` is *permanent* (the same
spec will run out of memory again: raise the memory limit); exit codes 137 and 143 without
``OOMKilled`` are SIGKILL/SIGTERM from outside (node drain, preemption) and retryable; 126 and 127
mean the command cannot run and are permanent.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from kubedl_prefect.errors import RETRYABLE_CATEGORIES, Diagnosis, FailureCategory
from kubedl_prefect.kube.resources import KubeObject

__all__ = [
    "RETRYABLE_CATEGORIES",
    "Diagnosis",
    "FailureCategory",
    "diagnose",
    "replica_name",
    "stuck_for_good",
]


_HINTS: dict[FailureCategory, str] = {
    FailureCategory.EVICTED: "the node ran short of resources; the job resumes from its checkpoint",
    FailureCategory.PREEMPTED: "a higher-priority workload took the resources; set a priority "
    "class to avoid it",
    FailureCategory.NODE_LOST: "the node disappeared; the job resumes from its checkpoint",
    FailureCategory.KILLED: "the container was stopped from outside (SIGKILL/SIGTERM); the job "
    "resumes from its checkpoint",
    FailureCategory.NCCL_TIMEOUT: "a collective operation timed out; check NCCL_SOCKET_IFNAME "
    "(spec field network.ncclSocketIfname) and the network between nodes",
    FailureCategory.IMAGE_PULL: "check the image name and tag, and the registry credentials "
    "(imagePullSecrets)",
    FailureCategory.INVALID_IMAGE: "fix the image reference in the spec",
    FailureCategory.CONTAINER_CONFIG: "a referenced ConfigMap, Secret or volume is missing or "
    "wrong; fix the spec or create it",
    FailureCategory.OUT_OF_MEMORY: "raise the replica's memory limit (spec field resources.memory) "
    "or lower the batch size",
    FailureCategory.COMMAND_NOT_RUNNABLE: "the command was not found or is not executable in the "
    "image; fix command/args",
    FailureCategory.USER_CODE: "the training program exited with an error; read the replica's log",
    FailureCategory.DEADLINE_EXCEEDED: "the job ran past activeDeadlineSeconds; raise it or make "
    "the run shorter",
    FailureCategory.UNKNOWN: "read the job's events and the replicas' logs",
}

_IMAGE_PULL_REASONS = {
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "RegistryUnavailable",
}
_CONFIG_REASONS = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
_NCCL_TIMEOUT = re.compile(
    r"NCCL.*(timeout|timed out)|Watchdog caught collective operation timeout|"
    r"ProcessGroupNCCL.*Timeout",
    re.I,
)


def _diagnosis(
    category: FailureCategory,
    message: str,
    *,
    replica: str | None = None,
    exit_code: int | None = None,
) -> Diagnosis:
    return Diagnosis(
        category=category,
        retryable=category in RETRYABLE_CATEGORIES,
        replica=replica,
        exit_code=exit_code,
        message=" ".join(message.split()),
        hint=_HINTS[category],
    )


JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
"""A JobSet pod's replicated Job (a TrainJob's ``node`` or ``launcher``): its role."""
JOB_COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
"""An Indexed Job's pod's index (a TrainJob's node rank): its index within the role."""


def replica_name(pod: KubeObject) -> str:
    """The replica a pod runs (``master-0``, ``worker-1``, a TrainJob's ``node-2``).

    Read from either v1 operator's labels, or a JobSet pod's replicated Job and completion index.
    """
    labels = (pod.get("metadata") or {}).get("labels") or {}
    role = (
        labels.get("replica-type")
        or labels.get("training.kubeflow.org/replica-type")
        or labels.get(JOBSET_REPLICATED_JOB_LABEL)
    )
    index = (
        labels.get("replica-index")
        or labels.get("training.kubeflow.org/replica-index")
        or labels.get(JOB_COMPLETION_INDEX_LABEL)
    )
    if role is not None and index is not None:
        return f"{role.lower()}-{index}"
    return str((pod.get("metadata") or {}).get("name", "?"))


def _container_states(pod: KubeObject) -> Iterable[tuple[str, KubeObject]]:
    status = pod.get("status") or {}
    for container in (status.get("initContainerStatuses") or []) + (
        status.get("containerStatuses") or []
    ):
        for key in ("state", "lastState"):
            for state_name, state in (container.get(key) or {}).items():
                if state:
                    yield state_name, state


def _config_error(pod: KubeObject) -> Diagnosis | None:
    for state_name, state in _container_states(pod):
        if state_name != "waiting":
            continue
        reason = str(state.get("reason") or "")
        message = str(state.get("message") or reason)
        if reason in _IMAGE_PULL_REASONS:
            return _diagnosis(FailureCategory.IMAGE_PULL, message, replica=replica_name(pod))
        if reason == "InvalidImageName":
            return _diagnosis(FailureCategory.INVALID_IMAGE, message, replica=replica_name(pod))
        if reason in _CONFIG_REASONS:
            return _diagnosis(FailureCategory.CONTAINER_CONFIG, message, replica=replica_name(pod))
    return None


def _disruption(pod: KubeObject) -> Diagnosis | None:
    status = pod.get("status") or {}
    reason = str(status.get("reason") or "")
    message = str(status.get("message") or reason)
    replica = replica_name(pod)
    if reason == "Evicted":
        return _diagnosis(FailureCategory.EVICTED, message, replica=replica)
    if reason in ("NodeLost", "NodeShutdown", "Terminated"):
        return _diagnosis(FailureCategory.NODE_LOST, message, replica=replica)
    if reason == "Preempting":
        return _diagnosis(FailureCategory.PREEMPTED, message, replica=replica)
    for condition in status.get("conditions") or []:
        if condition.get("type") != "DisruptionTarget" or condition.get("status") != "True":
            continue
        cause = str(condition.get("reason") or "")
        text = str(condition.get("message") or cause)
        if cause == "PreemptionByScheduler":
            return _diagnosis(FailureCategory.PREEMPTED, text, replica=replica)
        if cause in ("DeletionByTaintManager", "DeletionByPodGC", "TerminationByKubelet"):
            return _diagnosis(FailureCategory.NODE_LOST, text, replica=replica)
        if cause == "EvictionByEvictionAPI":
            return _diagnosis(FailureCategory.EVICTED, text, replica=replica)
    return None


def _exit_failure(pod: KubeObject) -> Diagnosis | None:
    for state_name, state in _container_states(pod):
        if state_name != "terminated":
            continue
        code = int(state.get("exitCode") or 0)
        if code == 0:
            continue
        reason = str(state.get("reason") or "")
        message = str(state.get("message") or reason or f"exited with code {code}")
        replica = replica_name(pod)
        if reason == "OOMKilled":
            return _diagnosis(
                FailureCategory.OUT_OF_MEMORY, message, replica=replica, exit_code=code
            )
        if code in (137, 143):
            return _diagnosis(FailureCategory.KILLED, message, replica=replica, exit_code=code)
        if code in (126, 127):
            return _diagnosis(
                FailureCategory.COMMAND_NOT_RUNNABLE, message, replica=replica, exit_code=code
            )
        return _diagnosis(FailureCategory.USER_CODE, message, replica=replica, exit_code=code)
    return None


def stuck_for_good(pods: Sequence[KubeObject]) -> Diagnosis | None:
    """A permanent failure visible while the job still runs: a pod that cannot start at all.

    The operators do not fail a job whose pod waits on an image that cannot be pulled or a
    missing ConfigMap; it would wait for ever, holding its other replicas' GPUs. Such a job
    is failed by us as soon as this finds one.
    """
    for pod in pods:
        found = _config_error(pod)
        if found is not None:
            return found
    return None


def diagnose(
    job: KubeObject,
    *,
    pods: Sequence[KubeObject],
    events: Sequence[KubeObject] = (),
    log_tails: Mapping[str, Sequence[str]] | None = None,
) -> Diagnosis:
    """Find why ``job`` failed (or is failing).

    Args:
        job: The training job object.
        pods: Its pods, including failed ones still present.
        events: Events about the job and its pods.
        log_tails: The last log lines of each replica (``{"worker-1": [...]}``).
    """
    for finder in (_config_error, _disruption):
        for pod in pods:
            found = finder(pod)
            if found is not None:
                return found
    for event in events:
        if event.get("reason") in ("Preempted", "Preempting"):
            return _diagnosis(FailureCategory.PREEMPTED, str(event.get("message") or ""))
        if event.get("reason") in ("Evicted", "Evict"):
            return _diagnosis(FailureCategory.EVICTED, str(event.get("message") or ""))
    for replica, lines in (log_tails or {}).items():
        for line in reversed(lines):
            if _NCCL_TIMEOUT.search(line):
                return _diagnosis(FailureCategory.NCCL_TIMEOUT, line, replica=replica)
    exits = [d for d in map(_exit_failure, pods) if d is not None]
    if exits:
        # A replica killed from outside explains the others' errors, not the other way round.
        exits.sort(key=lambda d: d.category != FailureCategory.KILLED)
        return exits[0]
    conditions = (job.get("status") or {}).get("conditions") or []
    failed = [c for c in conditions if c.get("type") == "Failed" and c.get("status") == "True"]
    if failed:
        message = str(failed[-1].get("message") or failed[-1].get("reason") or "")
        if "deadline" in message.lower():
            return _diagnosis(FailureCategory.DEADLINE_EXCEEDED, message)
        if "evict" in str(failed[-1].get("reason") or "").lower():
            return _diagnosis(FailureCategory.EVICTED, message)
        return _diagnosis(FailureCategory.UNKNOWN, message)
    return _diagnosis(FailureCategory.UNKNOWN, "no failed replica or failure condition found")
