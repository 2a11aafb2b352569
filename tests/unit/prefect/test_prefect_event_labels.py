"""What automations match on: resource labels and related resources of every kubedl.* event.

Prefect's triggers match an event's resource labels (``match``) and its related resources
(``match_related``), never its payload; so the blocker, the diagnosis and the reason of a
``kubedl.*`` event are labels, its ids our own prefix, and the Prefect objects of the run are
related resources with the ids and roles Prefect gives them.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import yaml
from prefect.client.schemas.objects import FlowRun
from prefect.events.related import object_as_related_resource
from prefect.events.schemas.automations import AutomationCore, EventTrigger

from kubedl_prefect.errors import Diagnosis, FailureCategory
from kubedl_prefect.lifecycle.admission import AdmissionBlocker, AdmissionState
from kubedl_prefect.lifecycle.backend import JobRef, PhaseUpdate
from kubedl_prefect.lifecycle.status import JobStatus, Phase
from kubedl_prefect.prefect import events
from kubedl_prefect.prefect.collection import BLOCK_TYPES
from kubedl_prefect.prefect.context import RunContext
from kubedl_prefect.prefect.events import (
    CancelReason,
    JobEvent,
    inference_service_event,
    job_event,
    model_version_event,
    model_version_related,
    phase_event,
    training_job_related,
)
from kubedl_prefect.registry.events import PROMOTED, ModelVersionEvent
from kubedl_prefect.serving.events import NOT_READY, InferenceServiceEvent

LABELS = {value for name, value in vars(events).items() if name.startswith("LABEL_")} | set(
    events.job_resource(
        JobRef.from_dict(
            {
                "backend": "kubernetes",
                "cluster": "",
                "dialect": "kubedl",
                "namespace": "n",
                "name": "j",
                "uid": "u",
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "key": "k",
                "attempt": 1,
                "specHash": "h",
            }
        )
    )
)
"""Every label a training job's event may carry."""

REF = JobRef(
    backend="kubernetes",
    cluster="https://10.0.0.1:6443",
    dialect="kubeflow",
    namespace="ml",
    name="mnist-abc-a2",
    uid="0f1e-uid",
    api_version="kubeflow.org/v1",
    kind="PyTorchJob",
    key="nightly",
    attempt=2,
    spec_hash="ab12",
)


def queued(blocker: AdmissionBlocker = AdmissionBlocker.INSUFFICIENT_GPU) -> PhaseUpdate:
    admission = AdmissionState(False, blocker, "0/2 nodes: 2 Insufficient nvidia.com/gpu", 0, 3)
    return PhaseUpdate(
        Phase.QUEUING, JobStatus(phase=Phase.QUEUING, resource_version="5"), admission, 1.0
    )


def test_queued_carries_its_blocker_and_reason_as_labels_with_the_dialect() -> None:
    event = phase_event(REF, queued())
    assert event is not None
    assert event.resource["kubedl.blocker"] == "InsufficientGPU"
    assert event.resource["kubedl.reason"] == "InsufficientGPU"
    assert event.resource["kubedl.dialect"] == "kubeflow"
    assert "kubedl.diagnosis" not in event.resource


def test_failed_carries_its_diagnosis_as_labels() -> None:
    diagnosis = Diagnosis(FailureCategory.PREEMPTED, True, "worker-1", 143, "preempted", "again")
    event = job_event(REF, JobEvent.FAILED, diagnosis=diagnosis, blocker="InsufficientGPU")
    assert (
        event.resource.items()
        >= {
            "kubedl.reason": "Preempted",
            "kubedl.diagnosis": "Preempted",
            "kubedl.retryable": "true",
            "kubedl.replica": "worker-1",
            "kubedl.exit-code": "143",
            "kubedl.blocker": "InsufficientGPU",
            "kubedl.dialect": "kubeflow",
        }.items()
    )
    assert event.payload["diagnosis"]["hint"] == "again"


def test_a_failure_without_replica_or_exit_code_leaves_those_labels_out() -> None:
    diagnosis = Diagnosis(FailureCategory.QUEUE_NOT_FOUND, False, None, None, "no queue", "make it")
    event = job_event(REF, JobEvent.FAILED, diagnosis=diagnosis)
    assert event.resource["kubedl.retryable"] == "false"
    assert "kubedl.replica" not in event.resource
    assert "kubedl.exit-code" not in event.resource


def test_cancelled_says_why_as_a_category() -> None:
    assert job_event(REF, JobEvent.CANCELLED).resource["kubedl.reason"] == "Cancelled"
    timed_out = job_event(
        REF, JobEvent.CANCELLED, category=CancelReason.ADMISSION_TIMEOUT, blocker="QuotaExceeded"
    )
    assert timed_out.resource["kubedl.reason"] == "AdmissionTimeout"
    assert timed_out.resource["kubedl.blocker"] == "QuotaExceeded"
    assert CancelReason.of_timeout("startup") is CancelReason.STARTUP_TIMEOUT


def test_events_without_a_reason_carry_no_empty_labels() -> None:
    event = job_event(REF, JobEvent.CREATED, at=0.0)
    assert all(value for key, value in event.resource.items() if key != "kubedl.uid")
    assert "kubedl.reason" not in event.resource


def test_model_chain_resources_use_our_prefix_and_label_their_reason() -> None:
    version = model_version_event(
        ModelVersionEvent(PROMOTED, "fraud", "3", {"kubedl-prefect.io/gate.decision": "promoted"})
    )
    assert version.resource["prefect.resource.id"] == "kubedl.model-version.fraud.3"
    assert version.resource["kubedl.reason"] == "promoted"
    assert model_version_related("fraud", "3")["prefect.resource.id"] == (
        "kubedl.model-version.fraud.3"
    )
    service = inference_service_event(
        InferenceServiceEvent(NOT_READY, "ml", "fraud", "u1", "9", {"reason": "ModelLoadFailed"})
    )
    assert service.resource["prefect.resource.id"] == "kubedl.inference-service.ml.fraud"
    assert service.resource["kubedl.reason"] == "ModelLoadFailed"
    prose = inference_service_event(
        InferenceServiceEvent(NOT_READY, "ml", "fraud", "u1", "9", {"reason": "it broke, badly"})
    )
    assert "kubedl.reason" not in prose.resource
    assert training_job_related("u1")[0]["prefect.resource.id"] == "kubedl.training-job.u1"
    for spec in (version, service):
        assert not spec.resource["prefect.resource.id"].startswith(("mlflow.", "kubernetes."))


def flow_run() -> FlowRun:
    return FlowRun(
        id=uuid.uuid4(),
        name="brave-otter",
        flow_id=uuid.uuid4(),
        deployment_id=uuid.uuid4(),
        work_pool_id=uuid.uuid4(),
        work_pool_name="gpu-pool",
        work_queue_id=uuid.uuid4(),
        work_queue_name="default",
        tags=["nightly"],
    )


def test_related_resources_are_the_runs_prefect_objects_as_prefect_names_them() -> None:
    run = flow_run()
    related = RunContext.of_flow_run(run, "retrain").related()
    by_role = {r["prefect.resource.role"]: r for r in related}
    assert set(by_role) == {"flow-run", "flow", "deployment", "work-pool", "work-queue", "tag"}
    # The ids and names Prefect gives these objects itself (prefect.events.related).
    assert by_role["flow-run"] == dict(object_as_related_resource("flow-run", "flow-run", run))
    assert by_role["deployment"]["prefect.resource.id"] == f"prefect.deployment.{run.deployment_id}"
    assert by_role["work-pool"] == {
        "prefect.resource.id": f"prefect.work-pool.{run.work_pool_id}",
        "prefect.resource.role": "work-pool",
        "prefect.resource.name": "gpu-pool",
    }
    assert by_role["work-queue"]["prefect.resource.id"] == f"prefect.work-queue.{run.work_queue_id}"
    assert by_role["tag"]["prefect.resource.id"] == "prefect.tag.nightly"
    assert by_role["flow"]["prefect.resource.name"] == "retrain"


def test_a_run_outside_a_deployment_relates_only_what_it_has() -> None:
    run = FlowRun(id=uuid.uuid4(), name="calm-fox", flow_id=uuid.uuid4())
    roles = [r["prefect.resource.role"] for r in RunContext.of_flow_run(run).related()]
    assert roles == ["flow-run", "flow"]


# -- the documented automations ---------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[3] / "docs"


def documented_automations() -> list[dict[str, Any]]:
    """Every YAML block of docs/prefect.md that is an automation (it has a trigger)."""
    text = (DOCS / "prefect.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```yaml\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    found = [yaml.safe_load(block) for block in blocks]
    return [data for data in found if isinstance(data, dict) and "trigger" in data]


def test_the_documented_automations_are_valid_and_match_our_labels() -> None:
    automations = {data["name"]: data for data in documented_automations()}
    assert {"kubedl-queued-for-gpus", "kubedl-preempted-three-times"} <= set(automations)
    for data in automations.values():
        automation = AutomationCore.model_validate(data)  # what `prefect automation create` does
        trigger = automation.trigger
        assert isinstance(trigger, EventTrigger)
        for label, _ in trigger.match.items():
            assert label.startswith("prefect.resource.") or label in LABELS, label
        assert all(name.startswith("kubedl.") for name in trigger.expect | trigger.after)


def test_the_tutorial_counts_the_block_types_there_are() -> None:
    text = " ".join((DOCS / "tutorial.md").read_text(encoding="utf-8").split())
    words = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}
    assert f"the {words[len(BLOCK_TYPES)]} block types" in text
    for block in BLOCK_TYPES:
        assert f"**{block.get_block_type_name()}**" in text


def test_a_rollouts_model_version_events_relate_to_the_endpoint() -> None:
    from kubedl_prefect.prefect.model_blocks import KServeServing
    from kubedl_prefect.prefect.serving_tasks import rollback_related
    from kubedl_prefect.serving import ModelLink

    spec = KServeServing(namespace="ml").service(
        "fraud", "s3://x/m", link=ModelLink("fraud", "3", "ml", "fraud-x7k2-a1", "uid-job")
    )
    related = {
        r["prefect.resource.role"]: r["prefect.resource.id"] for r in rollback_related(spec, "ml")
    }
    assert related == {
        "inference-service": "kubedl.inference-service.ml.fraud",
        "training-job": "kubedl.training-job.uid-job",
    }
