"""The process node's pure deciders: what a container runs, what is reported, names, addresses."""

from __future__ import annotations

import base64
import doctest
import ipaddress
from pathlib import Path
from types import ModuleType

import pytest

from kubedl_prefect.testbed.nodeagent import images, network, node, podspec, podstatus, sandbox
from kubedl_prefect.testbed.nodeagent.podstatus import ContainerRecord, Running, Terminated, Waiting

FACTS = podspec.PodFacts(pod_ip="169.254.104.7", host_ip="127.0.0.1", venv=Path("/v"))


def a_pod(**container: object) -> dict[str, object]:
    return {
        "metadata": {"name": "job-worker-0", "namespace": "ml", "uid": "u1", "labels": {"r": "w"}},
        "spec": {"nodeName": "process-node-0", "containers": [{"name": "main", **container}]},
    }


@pytest.mark.parametrize(
    "module", [images, network, node, podspec, podstatus], ids=lambda m: m.__name__
)
def test_docstring_examples(module: ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0
    assert result.failed == 0


def test_a_container_gets_its_environment_resolved_and_expanded() -> None:
    secret = {"data": {"token": base64.b64encode(b"s3cret").decode()}}
    pod = a_pod(
        image="docker.io/library/python:3.11",
        command=["python", "train.py"],
        args=["--rank=$(RANK)", "--ip=$(IP)"],
        env=[
            {"name": "RANK", "value": "3"},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['r']"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}},
        ],
    )
    plan = podspec.plan_container(
        pod["spec"]["containers"][0], pod, FACTS, secrets={"s": secret}, config_maps={}
    )

    assert isinstance(plan, podspec.ContainerPlan)
    assert plan.argv == ("python", "train.py", "--rank=3", "--ip=169.254.104.7")
    assert (plan.env["ROLE"], plan.env["TOKEN"]) == ("w", "s3cret")
    assert plan.env["PATH"].startswith("/v/bin:")
    assert plan.env["HOSTNAME"] == "job-worker-0"


def test_a_container_that_cannot_start_says_why_as_a_kubelet_would() -> None:
    missing = a_pod(
        image="python",
        command=["true"],
        env=[{"name": "T", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k"}}}],
    )
    unmapped = a_pod(image="nvcr.io/nvidia/pytorch:24.01-py3", command=["true"])

    refused = [
        podspec.plan_container(p["spec"]["containers"][0], p, FACTS, secrets={}, config_maps={})
        for p in (missing, unmapped)
    ]

    assert [
        (r.reason, r.message[:30]) for r in refused if isinstance(r, podspec.ContainerProblem)
    ] == [
        ("CreateContainerConfigError", 'secret "gone" not found'),
        ("ErrImagePull", 'Failed to pull image "nvcr.io/'),
    ]


def test_the_service_account_volume_holds_token_ca_and_namespace() -> None:
    volume = {
        "name": "kube-api-access-x",
        "projected": {
            "sources": [
                {"serviceAccountToken": {"path": "token"}},
                {
                    "configMap": {
                        "name": "kube-root-ca.crt",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}],
                    }
                },
                {
                    "downwardAPI": {
                        "items": [
                            {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
                        ]
                    }
                },
            ]
        },
    }
    files = podspec.volume_files(
        volume,
        a_pod(),
        FACTS,
        secrets={},
        config_maps={"kube-root-ca.crt": {"data": {"ca.crt": "PEM"}}},
        token="jwt",
    )

    assert isinstance(files, podspec.VolumeFiles)
    assert {k: v[0] for k, v in files.files.items()} == {
        "token": b"jwt",
        "ca.crt": b"PEM",
        "namespace": b"ml",
    }


def test_phases_follow_init_containers_and_the_restart_policy() -> None:
    failed = ContainerRecord("init", "i", Terminated(1, "t", "t"))
    waiting = ContainerRecord("main", "i", Waiting("PodInitializing"))
    running = ContainerRecord("main", "i", Running("t"))
    crashing = ContainerRecord("main", "i", Waiting("CrashLoopBackOff"), restart_count=1)
    pulling = ContainerRecord("main", "i", Waiting("ImagePullBackOff"))

    assert podstatus.phase("Never", [failed], [waiting]) == "Failed"
    assert podstatus.phase("OnFailure", [failed], [waiting]) == "Pending"
    assert podstatus.phase("OnFailure", [], [running]) == "Running"
    assert podstatus.phase("OnFailure", [], [crashing]) == "Running"
    assert podstatus.phase("Never", [], [pulling]) == "Pending"


def test_a_termination_message_is_reported_cut_at_4_kib_and_never_mounted_in_shared_trees() -> None:
    ended = ContainerRecord("main", "i", Terminated(0, "t", "t", message='{"result": 1}'))
    status = podstatus.container_status(ended)
    assert status["state"]["terminated"]["message"] == '{"result": 1}'
    silent = podstatus.container_status(ContainerRecord("main", "i", Terminated(1, "t", "t")))
    assert "message" not in silent["state"]["terminated"]
    assert podstatus.termination_message("é".encode() * 3000) == "é" * 2048  # 4096 bytes
    path = podstatus.termination_message_path
    assert path({"terminationMessagePath": "/tmp/./last//word"}) == "/tmp/last/word"
    for shared in ("/dev/termination-log", "/sys/x", "/proc/1/x", "/a/../dev/x", "relative"):
        assert path({"terminationMessagePath": shared}) is None, shared


def test_pod_networks_are_link_local_never_private_nor_the_metadata_address() -> None:
    metadata = ipaddress.IPv4Address("169.254.169.254")
    for base in range(1024, 65400, 100):
        net = network.subnet(base)
        assert net.subnet_of(ipaddress.IPv4Network("169.254.0.0/16"))
        assert not net.is_private or net.is_link_local
        assert metadata not in net


def test_a_symbolic_link_on_a_mount_path_stays_inside_the_container_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    (root / "var").mkdir()
    (root / "var" / "run").symlink_to("/run")

    target = sandbox.inside(str(root), "/var/run/secrets/kubernetes.io/serviceaccount")

    assert target == f"{root}/run/secrets/kubernetes.io/serviceaccount"
    assert sandbox.inside(str(root), "/../../etc/hosts") == f"{root}/etc/hosts"
