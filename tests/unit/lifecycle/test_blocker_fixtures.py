"""Why a job does not start, decided on what the real test bed showed (and a few made-up cases).

The fixtures in ``blockers/`` were recorded from the test bed by ``blockers/record.py``: the job,
its pods, PodGroups and events a few seconds after submission, with the cluster objects the
diagnosis reads (``facts``). Each is decided twice: with the facts (the backend's view with the
grants of deploy/) and without them (an identity that may read nothing but its jobs).
"""

from __future__ import annotations

import doctest
import json
from pathlib import Path
from typing import Any

import pytest

from kubedl_prefect.errors import FailureCategory
from kubedl_prefect.kube.resources import ResourceKind
from kubedl_prefect.lifecycle import admission as admission_module
from kubedl_prefect.lifecycle.admission import AdmissionBlocker, AdmissionState, Blocker
from kubedl_prefect.lifecycle.kubernetes import admission as kube_admission_module
from kubedl_prefect.lifecycle.kubernetes import operators as operators_module
from kubedl_prefect.lifecycle.kubernetes import scheduler as scheduler_module
from kubedl_prefect.lifecycle.kubernetes.admission import admission_state
from kubedl_prefect.lifecycle.kubernetes.blockers import fact_request, find_blocker
from kubedl_prefect.lifecycle.kubernetes.cluster import ClusterFacts
from kubedl_prefect.lifecycle.kubernetes.demand import placements
from kubedl_prefect.lifecycle.kubernetes.operators import OPERATOR_GRACE_S, operator_not_installed
from kubedl_prefect.lifecycle.kubernetes.taints import blocking_taints, node_matches, tolerates
from kubedl_prefect.lifecycle.waiting import ReasonKeeper, admission_timeout

FIXTURES = Path(__file__).parent / "blockers"
B = AdmissionBlocker


def fixture(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / f"{name}.json").read_text()))


def facts_of(recorded: dict[str, Any]) -> ClusterFacts:
    raw = recorded["facts"]
    return ClusterFacts(
        queues=raw["queues"],
        priority_classes=raw["priorityClasses"],
        claims=raw["claims"],
        nodes=raw["nodes"],
        quotas=raw["quotas"],
        limit_ranges=raw["limitRanges"],
    )


def decide(recorded: dict[str, Any], facts: ClusterFacts | None) -> AdmissionState:
    return admission_state(
        recorded["job"],
        pods=recorded["pods"],
        podgroups=recorded["podgroups"],
        events=recorded["events"],
        facts=facts,
    )


# fixture: (blocker, permanent, words the message must contain) with the facts, and the blocker
# without them (what the operators' and schedulers' words alone say).
CASES: dict[str, tuple[AdmissionBlocker, bool, tuple[str, ...], AdmissionBlocker]] = {
    "queue-missing-kubedl": (B.QUEUE_NOT_FOUND, True, ('Queue "rec-nosuch"',), B.WAITING),
    "queue-missing-kubeflow": (B.QUEUE_NOT_FOUND, True, ('Queue "rec-nosuch"',), B.WAITING),
    "queue-closed-kubedl": (B.QUEUE_CLOSED, True, ('Queue "rec-closed"', "Closed"), B.WAITING),
    "queue-closed-kubeflow": (B.QUEUE_CLOSED, True, ('Queue "rec-closed"',), B.WAITING),
    "queue-capability-kubedl": (
        B.QUEUE_CAPABILITY,
        True,
        ('Queue "rec-small"', "cpu=3", "cpu=2"),
        B.INSUFFICIENT_RESOURCES,
    ),
    "priority-gang-kubedl": (
        B.PRIORITY_CLASS_NOT_FOUND,
        True,
        ('PriorityClass "rec-nosuch"', "gang.priorityClass"),
        B.WAITING,
    ),
    "priority-pod-kubedl": (
        B.PRIORITY_CLASS_NOT_FOUND,
        True,
        ('PriorityClass "rec-nosuch"',),
        B.PRIORITY_CLASS_NOT_FOUND,
    ),
    "priority-pod-kubeflow": (
        B.PRIORITY_CLASS_NOT_FOUND,
        True,
        ('PriorityClass "rec-nosuch"',),
        B.PRIORITY_CLASS_NOT_FOUND,
    ),
    "node-selector-kubedl": (
        B.NO_MATCHING_NODE,
        True,
        ("nodeSelector disktype=ssd", "0 of 2 nodes"),
        B.NO_MATCHING_NODE,
    ),
    "node-selector-kubeflow": (
        B.NO_MATCHING_NODE,
        True,
        ("nodeSelector disktype=ssd",),
        B.NO_MATCHING_NODE,
    ),
    "taint-kubedl": (
        B.UNTOLERATED_TAINT,
        True,
        ("dedicated=rec:NoSchedule", "rec-tainted-node"),
        B.NO_MATCHING_NODE,
    ),
    "taint-kubeflow": (
        B.UNTOLERATED_TAINT,
        True,
        ("dedicated=rec:NoSchedule", "rec-tainted-node"),
        B.NO_MATCHING_NODE,
    ),
    "pvc-missing-kubedl": (
        B.PVC_NOT_FOUND,
        True,
        ('PersistentVolumeClaim "rec-nosuch"',),
        B.PVC_NOT_FOUND,
    ),
    "pvc-unbound-kubedl": (
        B.UNBOUND_PVC,
        False,
        ('PersistentVolumeClaim "rec-pending"', "Pending"),
        B.UNBOUND_PVC,
    ),
    "pvc-unbound-kubeflow": (
        B.UNBOUND_PVC,
        False,
        ('PersistentVolumeClaim "rec-pending"',),
        B.UNBOUND_PVC,
    ),
    "quota-kubedl": (
        B.QUOTA,
        True,
        ("team-quota", "requests.cpu=2", "requests.cpu=3"),
        B.QUOTA,
    ),
    "quota-kubeflow": (B.QUOTA, True, ("team-quota", "requests.cpu=3"), B.QUOTA),
    "limit-range-kubedl": (
        B.LIMIT_RANGE,
        True,
        ("max-cpu", "maximum cpu usage per Container is 500m"),
        B.LIMIT_RANGE,
    ),
    "invalid-template-kubedl": (
        B.POD_REFUSED,
        True,
        ('volumeMounts[0].name: Not found: "nosuch"',),
        B.POD_REFUSED,
    ),
    "invalid-template-kubeflow": (
        B.POD_REFUSED,
        True,
        ('volumeMounts[0].name: Not found: "nosuch"',),
        B.POD_REFUSED,
    ),
    "gpu-short-kubedl": (B.INSUFFICIENT_GPU, False, ("nvidia.com/gpu",), B.INSUFFICIENT_GPU),
}


def test_every_fixture_has_a_case() -> None:
    assert {p.stem for p in FIXTURES.glob("*.json")} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_recorded_job_is_diagnosed_with_the_object_it_names(name: str) -> None:
    blocker, permanent, words, _ = CASES[name]
    recorded = fixture(name)
    state = decide(recorded, facts_of(recorded))
    assert not state.admitted
    assert state.blocker is blocker, state.reason
    assert state.permanent is permanent, state.reason
    for word in words:
        assert word in state.reason
    assert "\n" not in state.reason
    assert state.hint
    if permanent:
        diagnosis = state.diagnosis()
        assert diagnosis is not None
        assert diagnosis.category is FailureCategory(blocker.value)
        assert not diagnosis.retryable
        assert diagnosis.message == state.reason
        assert diagnosis.subject == state.subject
    else:
        assert state.diagnosis() is None


@pytest.mark.parametrize("name", sorted(CASES))
def test_without_the_cluster_objects_only_the_schedulers_words_are_read(name: str) -> None:
    _, _, _, words_alone = CASES[name]
    state = decide(fixture(name), None)
    assert state.blocker is words_alone, state.reason
    # What only the cluster objects can prove is never decided from words alone.
    if words_alone in (B.NO_MATCHING_NODE, B.WAITING, B.UNBOUND_PVC, B.INSUFFICIENT_RESOURCES):
        assert not state.permanent


def test_the_requested_facts_are_what_the_recorded_job_needs() -> None:
    recorded = fixture("node-selector-kubedl")
    wanted = fact_request(
        recorded["job"],
        pods=recorded["pods"],
        podgroups=recorded["podgroups"],
        events=recorded["events"],
    )
    assert wanted.nodes is not None
    assert "node affinity/selector" in wanted.nodes
    assert wanted.quotas is None
    assert wanted.limit_ranges is None
    assert fact_request(fixture("queue-missing-kubeflow")["job"], pods=[]).queues == ("rec-nosuch",)
    quota = fixture("quota-kubedl")
    assert fact_request(quota["job"], pods=quota["pods"], events=quota["events"]).quotas


def test_nodes_that_cannot_be_read_are_said_and_the_verdict_stays_transient() -> None:
    recorded = fixture("node-selector-kubedl")
    facts = ClusterFacts(unchecked=("Nodes (forbidden)",))
    state = decide(recorded, facts)
    assert state.blocker is B.NO_MATCHING_NODE
    assert not state.permanent
    assert "could not check: Nodes (forbidden)" in state.reason
    assert "deploy/" in state.hint


def test_a_cluster_autoscaler_scaling_up_makes_an_unmatched_selector_wait() -> None:
    recorded = fixture("node-selector-kubedl")
    scale_up = {"reason": "TriggeredScaleUp", "message": "pod triggered scale-up: [{pool 0->1}]"}
    state = admission_state(
        recorded["job"],
        pods=recorded["pods"],
        podgroups=recorded["podgroups"],
        events=[*recorded["events"], scale_up],
        facts=facts_of(recorded),
    )
    assert state.blocker is B.NO_MATCHING_NODE
    assert not state.permanent


def test_a_cordoned_node_is_waited_for_and_a_deliberate_taint_is_not() -> None:
    recorded = fixture("taint-kubedl")
    facts = facts_of(recorded)
    assert facts.nodes is not None
    tainted = next(n for n in facts.nodes if n["metadata"]["name"] == "rec-tainted-node")
    cordoned = {**tainted, "spec": {"unschedulable": True}}
    nodes = [n for n in facts.nodes if n is not tainted] + [cordoned]
    state = decide(recorded, ClusterFacts(nodes=nodes))
    assert state.blocker is B.UNTOLERATED_TAINT
    assert not state.permanent
    assert "node.kubernetes.io/unschedulable" in state.reason
    tolerated = {**tainted, "spec": {"taints": [{"key": "x", "effect": "PreferNoSchedule"}]}}
    nodes = [n for n in facts.nodes if n is not tainted] + [tolerated]
    assert decide(recorded, ClusterFacts(nodes=nodes)).blocker is not B.UNTOLERATED_TAINT


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (
            {"key": "gpu", "operator": "Exists"},
            {"key": "gpu", "value": "a", "effect": "NoSchedule"},
            True,
        ),
        ({"key": "gpu", "value": "a"}, {"key": "gpu", "value": "a", "effect": "NoSchedule"}, True),
        ({"key": "gpu", "value": "b"}, {"key": "gpu", "value": "a", "effect": "NoSchedule"}, False),
        ({"operator": "Exists"}, {"key": "any", "effect": "NoExecute"}, True),
        (
            {"key": "gpu", "operator": "Exists", "effect": "NoExecute"},
            {"key": "gpu", "effect": "NoSchedule"},
            False,
        ),
    ],
)
def test_tolerations_match_as_kubernetes_matches_them(
    toleration: dict[str, str], taint: dict[str, str], tolerated: bool
) -> None:
    assert tolerates([toleration], taint) is tolerated
    node = {"metadata": {"name": "n"}, "spec": {"taints": [taint]}}
    assert (blocking_taints(node, [toleration]) == []) is tolerated


def _job(template_spec: dict[str, Any], replicas: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "training.kubedl.io/v1alpha1",
        "kind": "PyTorchJob",
        "metadata": {"name": "j", "namespace": "ml", "creationTimestamp": "2026-12-01T10:00:00Z"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {"replicas": replicas, "template": {"spec": template_spec}}
            }
        },
    }


@pytest.mark.parametrize(
    ("expression", "labels", "matches"),
    [
        ({"key": "zone", "operator": "In", "values": ["a", "b"]}, {"zone": "b"}, True),
        ({"key": "zone", "operator": "NotIn", "values": ["a"]}, {"zone": "a"}, False),
        ({"key": "zone", "operator": "NotIn", "values": ["a"]}, {}, True),
        ({"key": "gpu", "operator": "Exists"}, {"gpu": ""}, True),
        ({"key": "gpu", "operator": "DoesNotExist"}, {"gpu": ""}, False),
        ({"key": "mem", "operator": "Gt", "values": ["64"]}, {"mem": "128"}, True),
        ({"key": "mem", "operator": "Lt", "values": ["64"]}, {"mem": "128"}, False),
    ],
)
def test_required_node_affinity_is_matched_like_the_scheduler(
    expression: dict[str, Any], labels: dict[str, str], matches: bool
) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [expression]}]
            }
        }
    }
    placement = placements(_job({"affinity": affinity, "containers": []}))[0]
    assert node_matches({"metadata": {"name": "n", "labels": labels}}, placement) is matches


def _refused(message: str) -> dict[str, Any]:
    return {
        "reason": "FailedCreatePod",
        "message": f"Error creating: {message}",
        "lastTimestamp": "2026-12-01T10:00:01Z",
        "involvedObject": {"name": "j"},
    }


@pytest.mark.parametrize(
    ("message", "blocker", "permanent", "named"),
    [
        (
            'pods "j-worker-0" is forbidden: exceeded quota: gpu, requested: '
            "requests.nvidia.com/gpu=4, used: requests.nvidia.com/gpu=0, limited: "
            "requests.nvidia.com/gpu=2",
            B.QUOTA,
            True,
            "ResourceQuota ml/gpu",
        ),
        (
            'pods "j-worker-0" is forbidden: failed quota: compute: must specify limits.cpu '
            "for: pytorch",
            B.QUOTA,
            True,
            "ResourceQuota ml/compute",
        ),
        (
            'pods "j-worker-0" is forbidden: error looking up service account ml/trainer: '
            'serviceaccount "trainer" not found',
            B.POD_REFUSED,
            True,
            "ServiceAccount ml/trainer",
        ),
        (
            'admission webhook "policy.example.com" denied the request: images must come from '
            "registry.example",
            B.POD_REFUSED,
            True,
            "admission webhook policy.example.com",
        ),
        (
            'pods "j-worker-0" is forbidden: violates PodSecurity "restricted:latest": '
            "allowPrivilegeEscalation != false",
            B.POD_REFUSED,
            True,
            "Pod ml/j-worker-0",
        ),
        (
            "Internal error occurred: resource quota evaluation timed out",
            B.NOT_CREATED,
            False,
            "",
        ),
        ("etcdserver: request timed out", B.NOT_CREATED, False, ""),
    ],
)
def test_pods_the_api_server_refuses_are_named_and_decided(
    message: str, blocker: AdmissionBlocker, permanent: bool, named: str
) -> None:
    found = find_blocker(_job({"containers": []}), pods=[], events=[_refused(message)])
    assert found.category is blocker, found.message
    assert found.permanent is permanent
    if named:
        assert found.subject == named
        assert found.subject.split()[-1].split("/")[-1] in found.message


def test_a_refusal_is_history_once_every_pod_exists() -> None:
    pods = [
        {"metadata": {"name": f"j-worker-{i}"}, "spec": {}, "status": {"phase": "Pending"}}
        for i in range(2)
    ]
    event = _refused('Pod "j-worker-0" is invalid: spec.containers[0].image: Required value')
    found = find_blocker(_job({"containers": []}), pods=pods, events=[event])
    assert not found.permanent
    assert found.category is B.WAITING


def test_a_queue_at_its_capability_waits_and_names_the_queue() -> None:
    recorded = fixture("queue-capability-kubedl")
    facts = facts_of(recorded)
    queue = json.loads(json.dumps(facts.queues["rec-small"]))
    queue["spec"]["capability"] = {"cpu": "4"}
    queue["status"]["allocated"] = {"cpu": "2"}
    state = decide(recorded, ClusterFacts(queues={"rec-small": queue}))
    assert state.blocker is B.QUEUE_CAPABILITY
    assert not state.permanent
    assert 'Queue "rec-small" is at its capability: cpu 2 of 4 allocated' in state.reason


NOW = 1796119200.0  # 2026-12-01T10:00:00Z


@pytest.mark.parametrize(
    ("job", "operator"),
    [
        (_job({"containers": []}), "the KubeDL operator"),
        (
            {
                **_job({"containers": []}),
                "apiVersion": "kubeflow.org/v1",
                "spec": {
                    **_job({"containers": []})["spec"],
                    "runPolicy": {"managedBy": "kueue.x-k8s.io/multikueue"},
                },
            },
            "kueue.x-k8s.io/multikueue",
        ),
    ],
)
def test_no_operator_acting_on_a_job_is_said_once_the_grace_has_passed(
    job: dict[str, Any], operator: str
) -> None:
    early = find_blocker(job, pods=[], now=NOW + 1)
    assert early.category is B.NOT_CREATED
    assert early.recheck_in_s == pytest.approx(OPERATOR_GRACE_S - 1)
    late = find_blocker(job, pods=[], now=NOW + OPERATOR_GRACE_S + 1)
    assert late.category is B.OPERATOR_NOT_RUNNING
    assert not late.permanent
    assert operator in late.message
    assert "PyTorchJob ml/j" in late.message
    assert find_blocker(job, pods=[]).category is B.NOT_CREATED  # no clock, no verdict on time
    acted = {**job, "status": {"conditions": [{"type": "Created", "status": "True"}]}}
    assert find_blocker(acted, pods=[], now=NOW + 999).category is B.NOT_CREATED


def test_a_missing_crd_names_the_operator_and_the_dialect_that_is_served() -> None:
    kind = ResourceKind("kubeflow.org", "v1", "TFJob", "tfjobs")
    found = operator_not_installed(kind, "kubeflow", "https://k:6443", [])
    assert found.permanent
    assert found.category is B.OPERATOR_NOT_INSTALLED
    assert "tfjobs.kubeflow.org" in found.message
    assert "the Kubeflow training operator" in found.message
    assert found.diagnosis().category is FailureCategory.OPERATOR_NOT_INSTALLED
    served = operator_not_installed(
        kind, "kubeflow", "https://k", [("kubedl", "training.kubedl.io/v1alpha1")]
    )
    assert 'dialect="kubedl"' in served.hint


def test_every_blocker_that_can_be_permanent_is_a_failure_category() -> None:
    permanent = {
        B.QUEUE_NOT_FOUND,
        B.QUEUE_CLOSED,
        B.QUEUE_CAPABILITY,
        B.PRIORITY_CLASS_NOT_FOUND,
        B.NO_MATCHING_NODE,
        B.UNTOLERATED_TAINT,
        B.PVC_NOT_FOUND,
        B.QUOTA,
        B.LIMIT_RANGE,
        B.POD_REFUSED,
        B.OPERATOR_NOT_INSTALLED,
    }
    for blocker in permanent:
        made = Blocker(blocker, "m", "h", permanent=True).diagnosis()
        assert made.category.value == blocker.value


def test_a_vaguer_reason_later_does_not_replace_a_specific_one() -> None:
    keeper = ReasonKeeper()
    specific = AdmissionState(
        False, B.QUOTA, "ResourceQuota ml/q is used up", 0, 3, subject="ResourceQuota ml/q", pods=2
    )
    vague = AdmissionState(False, B.WAITING, "pod group is not ready", 0, 3, pods=2)
    assert keeper.keep(specific) is specific
    assert keeper.keep(vague).reason == specific.reason
    moved = AdmissionState(False, B.WAITING, "pod group is not ready", 0, 3, pods=3)
    assert keeper.keep(moved) is moved  # progress: the old reason no longer holds
    assert keeper.keep(vague) is vague


def test_an_admission_timeout_carries_the_blocker_and_its_object() -> None:
    from kubedl_prefect.lifecycle.backend import JobRef

    ref = JobRef(
        "kubernetes",
        "",
        "kubedl",
        "ml",
        "j-a1",
        "u",
        "training.kubedl.io/v1alpha1",
        "PyTorchJob",
        "k",
        1,
        "h",
    )
    state = decide(fixture("pvc-unbound-kubedl"), facts_of(fixture("pvc-unbound-kubedl")))
    error = admission_timeout(ref, 5.0, state)
    assert error.blocker == "UnboundPVC"
    assert error.subject is not None
    assert error.subject.endswith("/rec-pending")
    assert error.last_reason == state.reason
    assert error.hint == state.hint


@pytest.mark.parametrize(
    "module", [admission_module, kube_admission_module, scheduler_module, operators_module]
)
def test_docstring_examples(module: Any) -> None:
    result = doctest.testmod(module, raise_on_error=False)
    assert result.attempted > 0
    assert result.failed == 0
