import pytest

from kubedl_prefect.lifecycle.admission import AdmissionBlocker
from kubedl_prefect.lifecycle.kubernetes.admission import admission_state, expected_replicas
from kubedl_prefect.lifecycle.kubernetes.scheduler import classify_reason

JOB = {
    "metadata": {"name": "j"},
    "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 2}}},
}


def pod(name: str, *, node: str | None = None, unschedulable: str | None = None) -> dict:
    status: dict = {"phase": "Pending"}
    if unschedulable:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": unschedulable,
            }
        ]
    return {
        "metadata": {"name": name},
        "spec": {"nodeName": node} if node else {},
        "status": status,
    }


def test_expected_replicas_sums_every_role() -> None:
    assert expected_replicas(JOB) == 3
    assert (
        expected_replicas({"spec": {"tfReplicaSpecs": {"Chief": {}, "PS": {"replicas": 2}}}}) == 3
    )


def test_admitted_when_every_replica_is_bound() -> None:
    state = admission_state(JOB, pods=[pod(f"p{i}", node="n") for i in range(3)])
    assert state.admitted
    assert (state.scheduled, state.expected) == (3, 3)


def test_podgroup_condition_says_why() -> None:
    podgroup = {
        "metadata": {"name": "j-worker"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "Unschedulable",
                    "status": "True",
                    "reason": "NotEnoughResources",
                    "message": "3/3 tasks in gang unschedulable: pod group is not ready, "
                    "3 Pending, 3 minAvailable; Pending: 3 Unschedulable;\n"
                    "all nodes are unavailable: 2 Insufficient nvidia.com/gpu.",
                }
            ],
        },
    }
    state = admission_state(JOB, pods=[pod("p0"), pod("p1"), pod("p2")], podgroups=[podgroup])
    assert not state.admitted
    assert state.blocker is AdmissionBlocker.INSUFFICIENT_GPU
    assert "\n" not in state.reason
    assert "Insufficient nvidia.com/gpu" in state.reason


def test_pod_condition_when_no_podgroup() -> None:
    message = "0/2 nodes are available: 2 node(s) had untolerated taint {gpu: true}."
    state = admission_state(JOB, pods=[pod("p0", node="n"), pod("p1", unschedulable=message)])
    assert state.blocker is AdmissionBlocker.UNTOLERATED_TAINT
    assert state.scheduled == 1


def test_failed_create_quota_event() -> None:
    event = {
        "reason": "FailedCreate",
        "message": 'pods "j-worker-0" is forbidden: exceeded quota: gpu, requested: '
        "requests.nvidia.com/gpu=1",
        "lastTimestamp": "2026-11-30T10:00:00Z",
    }
    state = admission_state(JOB, pods=[], events=[event])
    assert state.blocker is AdmissionBlocker.QUOTA


def test_kubeflow_podgroup_waiting_to_be_enqueued() -> None:
    podgroup = {"metadata": {"name": "j"}, "status": {"phase": "Pending"}}
    state = admission_state(JOB, pods=[], podgroups=[podgroup])
    assert state.blocker is AdmissionBlocker.WAITING
    assert "PodGroup j" in state.reason


@pytest.mark.parametrize(
    ("message", "blocker"),
    [
        (
            "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
            AdmissionBlocker.INSUFFICIENT_GPU,
        ),
        ("0/2 nodes are available: 2 Insufficient cpu.", AdmissionBlocker.INSUFFICIENT_RESOURCES),
        (
            "pod has unbound immediate PersistentVolumeClaims. preemption: 0/2 nodes",
            AdmissionBlocker.UNBOUND_PVC,
        ),
        (
            "queue resource quota insufficient: insufficient nvidia.com/gpu",
            AdmissionBlocker.INSUFFICIENT_GPU,
        ),
        (
            "queue resource quota insufficient: insufficient cpu",
            AdmissionBlocker.INSUFFICIENT_RESOURCES,
        ),
        ("something else", AdmissionBlocker.WAITING),
    ],
)
def test_classify_reason(message: str, blocker: AdmissionBlocker) -> None:
    assert classify_reason(message) is blocker


def test_an_event_naming_the_resource_beats_a_generic_podgroup_condition() -> None:
    # As seen on the test bed: KubeDL's PodGroup says only that the gang is not ready, while
    # Volcano's event on it names the missing GPUs.
    podgroup = {
        "metadata": {"name": "j"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "Unschedulable",
                    "status": "True",
                    "reason": "NotEnoughResources",
                    "message": "3/3 tasks in gang unschedulable: pod group is not ready, "
                    "3 Pending, 3 minAvailable; Pending: 3 Unschedulable",
                }
            ],
        },
    }
    event = {
        "reason": "Unschedulable",
        "message": "queue resource quota insufficient: insufficient nvidia.com/gpu",
        "lastTimestamp": "2026-12-01T00:00:00Z",
    }
    state = admission_state(JOB, pods=[pod("p0")], podgroups=[podgroup], events=[event])
    assert state.blocker is AdmissionBlocker.INSUFFICIENT_GPU
    assert state.reason == "queue resource quota insufficient: insufficient nvidia.com/gpu"
