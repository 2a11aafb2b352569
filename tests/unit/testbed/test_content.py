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
    options = content.kwok_configuration(node_port=28447)["options"]
    for key in (
        "podPlayStageParallelism",
        "nodePlayStageParallelism",
        "nodeLeaseParallelism",
        "podsOnNodeSyncParallelism",
        "nodeLeaseDurationSeconds",
    ):
        assert options[key] > 0, key
    assert options["manageNodesWithAnnotationSelector"] == "kwok.x-k8s.io/node=fake"


def test_kwok_is_the_nodes_kubelet_on_loopback() -> None:
    options = content.kwok_configuration(node_port=29847)["options"]
    assert options["nodeIP"] == "127.0.0.1"
    assert options["nodePort"] == 29847
    assert options["enableDebuggingHandlers"] is True  # the /containerLogs handler
    node_stage = (content.STAGES_DIR / "node.yaml").read_text()
    assert "Port: {{ NodePort }}" in node_stage


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
    # No InferenceService stage: the real KServe controller writes their status.
    assert refs == {("v1", "Node"), ("v1", "Pod")}


def test_pod_stages_cover_the_documented_annotations() -> None:
    text = (content.STAGES_DIR / "pod.yaml").read_text()
    for annotation in (
        content.RUN_DURATION,
        content.START_DELAY,
        content.EXIT_CODE,
        content.FAIL_REASON,
        content.EVICT,
        content.EVICT_ON_ATTEMPT,
        content.WAITING_REASON,
        content.WAITING_MESSAGE,
    ):
        assert f'"{annotation}"' in text, annotation
    assert set(re.findall(r"testbed\.kubedl-prefect\.io/[a-z-]+", text)) <= {
        content.RUN_DURATION,
        content.START_DELAY,
        content.EXIT_CODE,
        content.FAIL_REASON,
        content.EVICT,
        content.EVICT_ON_ATTEMPT,
        content.WAITING_REASON,
        content.WAITING_MESSAGE,
    }


def _pod_stage(stages: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(s for s in stages if s["metadata"]["name"] == name)


def _keys(stage: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
    return {
        e["key"]: (e["operator"], e.get("values", []))
        for e in stage["spec"]["selector"]["matchExpressions"]
    }


def test_eviction_is_decided_by_one_expression_in_every_pod_stage(
    stages: list[dict[str, Any]],
) -> None:
    evict_keys = {
        key
        for stage in stages
        for key in _keys(stage)
        if content.EVICT_ON_ATTEMPT in key or f'"{content.EVICT}"' in key
    }
    assert len(evict_keys) == 1  # the same jq expression everywhere
    (key,) = evict_keys
    assert content.ATTEMPT_LABEL in key
    assert _keys(_pod_stage(stages, "testbed-pod-evicted"))[key] == ("In", ["true"])
    for name in ("testbed-pod-succeeded", "testbed-pod-failed", "testbed-pod-restarted"):
        assert _keys(_pod_stage(stages, name))[key] == ("NotIn", ["true"]), name


def test_waiting_pods_never_get_the_running_stage(stages: list[dict[str, Any]]) -> None:
    key = f'.metadata.annotations["{content.WAITING_REASON}"]'
    assert _keys(_pod_stage(stages, "testbed-pod-running"))[key] == ("DoesNotExist", [])
    waiting = _pod_stage(stages, "testbed-pod-waiting")
    assert _keys(waiting)[key] == ("Exists", [])
    assert _keys(waiting)[".status.podIP"] == ("DoesNotExist", [])  # fires once
    template = waiting["spec"]["steps"][0]["patch"]["template"]
    assert "phase: Pending" in template
    assert "waiting:" in template


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
        # The KServe controller exits without the ones it always watches.
        "servingruntimes.serving.kserve.io",
        "clusterservingruntimes.serving.kserve.io",
        "inferencegraphs.serving.kserve.io",
        "trainedmodels.serving.kserve.io",
        "clusterstoragecontainers.serving.kserve.io",
        "logs.kwok.x-k8s.io",
    ):
        assert expected in names
    isvc = next(m for m in manifests if m["metadata"]["name"].startswith("inferenceservices."))
    schema = isvc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert "predictor" in schema["properties"]["spec"]["properties"]  # the full schema
