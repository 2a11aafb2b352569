"""Whether Kueue admitted a job on quota borrowed from its cohort (issue 19, item 3).

``kueue/recorded-borrowed.json`` was recorded from the real Kueue v0.19.2 on the test bed: a
PyTorchJob of 2 replicas x 2 GPUs in a ClusterQueue of 2 GPUs (``cq-borrower``, cohort
``research``) beside an idle one of 4 GPUs in the same cohort; Kueue admitted it, borrowing 2.
It holds the job, its Workload, the LocalQueue and the ClusterQueue as the API server returned
them once the Workload was admitted.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from kubedl_prefect.lifecycle.admission import AdmissionState
from kubedl_prefect.lifecycle.kubernetes.kueue import (
    admitted_by,
    admitting_queue,
    cohort_borrowing,
    queue_hold,
)

RECORDED = Path(__file__).parent / "kueue" / "recorded-borrowed.json"


def recorded() -> dict[str, Any]:
    return dict(json.loads(RECORDED.read_text()))


def test_a_workload_admitted_on_borrowed_quota_says_how_much_from_which_cohort() -> None:
    found = recorded()
    line = cohort_borrowing(found["workload"], found["clusterQueue"])
    assert line == (
        "admitted on quota borrowed from cohort research: 2 nvidia.com/gpu in flavor kwok-gpu "
        "(ClusterQueue cq-borrower: nominal quota 2, 4 in use)"
    )
    # The same Workload reads as admitted, not queued.
    hold = queue_hold(found["job"], found["workload"])
    assert hold is not None
    assert hold.admitted


def test_nothing_is_borrowed_without_a_cohort_or_while_the_queue_borrows_nothing() -> None:
    found = recorded()
    alone = copy.deepcopy(found["clusterQueue"])
    del alone["spec"]["cohortName"]
    assert cohort_borrowing(found["workload"], alone) is None
    within = copy.deepcopy(found["clusterQueue"])  # the job fits in the queue's own quota
    for group in within["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            for resource in flavor["resources"]:
                resource["nominalQuota"] = "1Ti" if resource["name"] == "memory" else "1000"
    for flavor in within["status"]["flavorsUsage"]:
        for resource in flavor["resources"]:
            resource["borrowed"] = "0"
    assert cohort_borrowing(found["workload"], within) is None


def test_what_the_job_alone_holds_above_the_quota_is_borrowed_before_kueue_writes_the_usage() -> (
    None
):
    # Kueue writes the ClusterQueue's usage a moment after it admits: a wait that reads the
    # queue first (as one CI run did, under load) still says what the job borrowed.
    found = recorded()
    queue = copy.deepcopy(found["clusterQueue"])
    queue["status"]["flavorsUsage"] = []
    assert cohort_borrowing(found["workload"], queue) == (
        "admitted on quota borrowed from cohort research: 2 nvidia.com/gpu in flavor kwok-gpu "
        "(ClusterQueue cq-borrower: nominal quota 2, 4 in use)"
    )


def test_only_the_resources_the_job_holds_count_and_at_most_what_it_holds() -> None:
    found = recorded()
    queue = copy.deepcopy(found["clusterQueue"])
    for flavor in queue["status"]["flavorsUsage"]:
        for resource in flavor["resources"]:
            # The queue borrows more than this job holds (other jobs borrow too), and cpu the
            # job holds too.
            resource["borrowed"] = {"nvidia.com/gpu": "6", "cpu": "500m"}.get(resource["name"], "0")
    line = cohort_borrowing(found["workload"], queue)
    assert line is not None
    assert "4 nvidia.com/gpu in flavor kwok-gpu" in line  # all the job holds: 2 x 2
    assert "0.5 cpu in flavor kwok-gpu" in line
    assert "memory" not in line


def test_no_borrowing_is_said_of_a_workload_holding_no_quota_or_of_another_queue() -> None:
    found = recorded()
    waiting = copy.deepcopy(found["workload"])
    waiting["status"]["conditions"] = [
        {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "..."}
    ]
    assert cohort_borrowing(waiting, found["clusterQueue"]) is None
    other = copy.deepcopy(found["clusterQueue"])
    other["metadata"]["name"] = "cq-other"
    assert cohort_borrowing(found["workload"], other) is None
    assert cohort_borrowing(found["workload"], None) is None


def test_the_admitted_state_of_a_job_kueue_lent_quota_says_so_in_its_one_line() -> None:
    found = recorded()
    admitted = AdmissionState(admitted=True, scheduled=2, expected=2)
    told = admitted_by(admitted, found["workload"], found["clusterQueue"])
    assert admitting_queue(found["workload"]) == "cq-borrower"
    assert str(told) == (
        "admitted: 2/2 replicas scheduled; admitted on quota borrowed from cohort research: "
        "2 nvidia.com/gpu in flavor kwok-gpu (ClusterQueue cq-borrower: nominal quota 2, 4 in use)"
    )
    # Nothing borrowed, the queue not read, or not admitted yet: the state is left as it is.
    within = copy.deepcopy(found["clusterQueue"])
    del within["spec"]["cohortName"]
    assert admitted_by(admitted, found["workload"], within) == admitted
    assert admitted_by(admitted, found["workload"], None) == admitted
    assert str(admitted) == "admitted: 2/2 replicas scheduled"
    waiting = AdmissionState(admitted=False, reason="no room yet")
    assert admitted_by(waiting, found["workload"], found["clusterQueue"]) == waiting
    assert admitting_queue(None) is None
