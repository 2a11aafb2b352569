"""What the test bed puts in its cluster: nodes, kwok stages and configuration, CRD sources."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kubedl_prefect.testbed import content


def test_node_manifest_offers_gpus_without_taints() -> None:
    node = content.node_manifest(1, gpus=8)
    assert node["metadata"]["name"] == "kwok-node-1"
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert node["metadata"]["labels"][content.NODE_LABEL] == "true"
    assert node["status"]["capacity"][content.GPU_RESOURCE] == "8"
    assert node["status"]["allocatable"] == node["status"]["capacity"]
    assert "taints" not in node["spec"]


def test_node_without_gpus_does_not_advertise_any() -> None:
    node = content.node_manifest(0, gpus=0)
    assert content.GPU_RESOURCE not in node["status"]["capacity"]
    assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "false"


def test_kwok_configuration_sets_every_parallelism() -> None:
    # kwok applies no defaults to a configuration file; a zero parallelism stops it.
    options = content.kwok_configuration()["options"]
    for key in (
        "podPlayStageParallelism",
        "nodePlayStageParallelism",
        "nodeLeaseParallelism",
        "podsOnNodeSyncParallelism",
        "nodeLeaseDurationSeconds",
    ):
        assert options[key] > 0, key
    assert options["manageNodesWithAnnotationSelector"] == "kwok.x-k8s.io/node=fake"


@pytest.fixture(scope="module")
def stages() -> list[dict[str, Any]]:
    return [doc for path in content.stage_files() for doc in content.load_documents(path)]


def test_stages_are_kwok_stages_with_unique_names(stages: list[dict[str, Any]]) -> None:
    names = [s["metadata"]["name"] for s in stages]
    assert len(names) == len(set(names))
    assert {s["kind"] for s in stages} == {"Stage"}
    assert {s["apiVersion"] for s in stages} == {"kwok.x-k8s.io/v1alpha1"}


def test_stage_resource_refs_name_group_and_version(stages: list[dict[str, Any]]) -> None:
    # kwok wants "v1" or "<group>/<version>"; a bare group makes its discovery fail.
    refs = {
        (s["spec"]["resourceRef"]["apiGroup"], s["spec"]["resourceRef"]["kind"]) for s in stages
    }
    assert refs == {
        ("v1", "Node"),
        ("v1", "Pod"),
        ("serving.kserve.io/v1beta1", "InferenceService"),
    }


def test_pod_stages_cover_the_documented_annotations() -> None:
    text = (content.STAGES_DIR / "pod.yaml").read_text()
    for annotation in (
        content.RUN_DURATION,
        content.START_DELAY,
        content.EXIT_CODE,
        content.FAIL_REASON,
        content.EVICT,
    ):
        assert f'"{annotation}"' in text, annotation
    isvc = (content.STAGES_DIR / "inferenceservice.yaml").read_text()
    assert f'"{content.NEVER_READY}"' in isvc
    assert f'"{content.READY_DELAY}"' in isvc
    assert set(re.findall(r"testbed\.kubedl-prefect\.io/[a-z-]+", text + isvc)) <= {
        content.RUN_DURATION,
        content.START_DELAY,
        content.EXIT_CODE,
        content.FAIL_REASON,
        content.EVICT,
        content.NEVER_READY,
        content.READY_DELAY,
    }


def test_crds_come_from_the_pinned_modules() -> None:
    manifests = content.crd_manifests()
    names = [m["metadata"]["name"] for m in manifests]
    assert sorted(content.crd_names()) == sorted(names)
    for expected in (
        "pytorchjobs.training.kubedl.io",
        "tfjobs.training.kubedl.io",
        "pytorchjobs.kubeflow.org",
        "podgroups.scheduling.volcano.sh",
        "queues.scheduling.volcano.sh",
        "inferenceservices.serving.kserve.io",
    ):
        assert expected in names
    isvc = next(m for m in manifests if m["metadata"]["name"].startswith("inferenceservices."))
    schema = isvc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert "predictor" in schema["properties"]["spec"]["properties"]  # the full schema
