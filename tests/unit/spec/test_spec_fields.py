"""Fields people port from real manifests, the main container across dialects, podTemplate rules."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import CrdErrors
from hypothesis import given
from hypothesis import strategies as st
from spec_helpers import V1_DIALECTS, minimal, paths
from test_spec_properties import PROPERTY_SETTINGS

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import Dialect, Framework, parse_spec, render, validate


def rejected(data: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return info.value


def pods(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    body = manifest["spec"]
    (field,) = [k for k in body if k.endswith("ReplicaSpecs")]
    return {k: v["template"]["spec"] for k, v in body[field].items()}


def xgboost(**fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "iris",
        "framework": "xgboost",
        "image": "xgb:1",
        "replicas": {"master": 1, "worker": 2},
    }
    return data | fields


# --- the main container, whatever each operator calls it --------------------------------------


@pytest.mark.parametrize("name", ["xgboost", "xgboostjob"])
def test_either_operators_name_addresses_the_main_container(name: str) -> None:
    spec = parse_spec(xgboost(podTemplate={"spec": {"containers": [{"name": name, "tty": True}]}}))
    for dialect, expected in ((Dialect.KUBEDL, "xgboostjob"), (Dialect.KUBEFLOW, "xgboost")):
        for pod in pods(render(spec, dialect)).values():
            (container,) = pod["containers"]
            assert container["name"] == expected
            assert container["image"] == "xgb:1"
            assert container["tty"] is True


def test_a_sidecar_without_an_image_is_refused() -> None:
    error = rejected(
        xgboost(podTemplate={"spec": {"containers": [{"name": "pytorch", "tty": True}]}})
    )
    (issue,) = error.issues
    assert issue.path == "podTemplate.spec.containers[0].image"
    assert "'pytorch' has no image" in issue.problem
    assert "xgboost or xgboostjob" in issue.problem
    assert "name it xgboost or xgboostjob" in issue.fix


def test_a_sidecar_gets_its_image_from_any_fragment() -> None:
    spec = parse_spec(
        xgboost(
            podTemplate={"spec": {"containers": [{"name": "shipper", "args": ["-v"]}]}},
            replicas={
                "master": {
                    "podTemplate": {"spec": {"containers": [{"name": "shipper", "image": "fb:3"}]}}
                },
                "worker": {
                    "count": 2,
                    "podTemplate": {"spec": {"containers": [{"name": "shipper", "image": "fb:3"}]}},
                },
            },
        )
    )
    for pod in pods(render(spec, "kubeflow")).values():
        assert pod["containers"][1] == {"name": "shipper", "args": ["-v"], "image": "fb:3"}
    error = rejected(
        xgboost(
            podTemplate={"spec": {"containers": [{"name": "shipper", "image": "fb:3"}]}},
            replicas={
                "master": {
                    "podTemplate": {"spec": {"containers": [{"name": "shipper", "image": None}]}}
                },
                "worker": 1,
            },
        )
    )
    assert paths(error) == ["podTemplate.spec.containers[0].image"]


@pytest.mark.parametrize(
    ("template", "path"),
    [
        (
            {"spec": {"containers": [{"name": "pytorch", "image": None}]}},
            "podTemplate.spec.containers[0].image",
        ),
        ({"spec": {"containers": None}}, "podTemplate"),
        ({"spec": {"containers": []}}, "podTemplate"),
        ({"spec": {"containers": [{"image": "x"}]}}, "podTemplate"),
        (
            {"spec": {"initContainers": [{"name": "init"}]}},
            "podTemplate.spec.initContainers[0].image",
        ),
        ({"spec": {"restartPolicy": "Always"}}, "podTemplate"),
        ({"metadata": {"name": "pod"}}, "podTemplate"),
        ({}, "podTemplate"),
    ],
)
def test_pod_template_rules(template: dict[str, Any], path: str) -> None:
    error = rejected(minimal(podTemplate=template))
    assert paths(error) == [path]
    assert all(issue.fix for issue in error.issues)


def test_pod_template_may_have_metadata_or_spec_alone() -> None:
    parse_spec(minimal(podTemplate={"metadata": {"labels": {"a": "b"}}}))
    parse_spec(minimal(podTemplate={"spec": {"priorityClassName": "high"}}))
    parse_spec(minimal(podTemplate={"metadata": {"annotations": {"a": None}}, "spec": {}}))


def test_two_items_for_the_main_container_are_refused() -> None:
    error = rejected(
        xgboost(podTemplate={"spec": {"containers": [{"name": "xgboost"}, {"name": "xgboostjob"}]}})
    )
    assert "two items address the training container" in error.issues[0].problem


container_item = st.fixed_dictionaries(
    {"name": st.sampled_from(["pytorch", "tensorflow", "mpi", "xgboost", "xgboostjob", "side"])},
    optional={"image": st.one_of(st.none(), st.just(""), st.just("img:1")), "tty": st.booleans()},
)
fragment = st.fixed_dictionaries(
    {},
    optional={
        "containers": st.lists(container_item, max_size=3, unique_by=lambda c: c["name"]),
        "initContainers": st.lists(container_item, max_size=2, unique_by=lambda c: c["name"]),
    },
).map(lambda pod: {"spec": pod})


@PROPERTY_SETTINGS
@given(
    framework=st.sampled_from(list(Framework)),
    top=st.one_of(st.none(), fragment),
    role=st.one_of(st.none(), fragment),
)
def test_no_accepted_spec_renders_a_container_without_an_image(
    framework: Framework, top: Any, role: Any
) -> None:
    roles = {
        Framework.PYTORCH: ("master", "worker"),
        Framework.TENSORFLOW: ("chief", "worker"),
        Framework.MPI: ("launcher", "worker"),
        Framework.XGBOOST: ("master", "worker"),
    }[framework]
    data = {
        "name": "job",
        "framework": framework.value,
        "image": "train:1",
        "podTemplate": top,
        "replicas": {roles[0]: {"podTemplate": role}, roles[1]: 1},
    }
    try:
        spec = parse_spec(data)
    except SpecError:
        return
    for dialect in V1_DIALECTS:
        validate(spec, dialect)
        for pod in pods(render(spec, dialect)).values():
            for container in [*pod["containers"], *pod.get("initContainers", [])]:
                assert isinstance(container.get("image"), str)
                assert container["image"]


# --- typed fields -------------------------------------------------------------------------------


def test_ports_render_and_are_checked(crd_errors: CrdErrors) -> None:
    spec = parse_spec(
        minimal(
            ports=[{"containerPort": 23456, "name": "pytorchjob-port"}],
            replicas={
                "master": 1,
                "worker": {"count": 2, "ports": [{"containerPort": 8080, "protocol": "UDP"}]},
            },
        )
    )
    for dialect in V1_DIALECTS:
        manifest = render(spec, dialect)
        assert crd_errors(dialect, Framework.PYTORCH, manifest) == []
        master, worker = pods(manifest).values()
        assert master["containers"][0]["ports"] == [
            {"containerPort": 23456, "name": "pytorchjob-port"}
        ]
        assert worker["containers"][0]["ports"] == [{"containerPort": 8080, "protocol": "UDP"}]
    bad = [
        [{"containerPort": 70000}],
        [{"containerPort": 80, "name": "Not_OK"}],
        [{"containerPort": 80}, {"containerPort": 80, "protocol": "TCP"}],
        [{"containerPort": 80, "name": "a1"}, {"containerPort": 81, "name": "a1"}],
        [{"containerPort": True}],
    ]
    for ports in bad:
        assert paths(rejected(minimal(ports=ports)))[0].startswith("ports")
    error = rejected(
        minimal(
            network={"hostNetwork": True},
            ports=[{"containerPort": 80, "hostPort": 81}],
            podSecurity="privileged",
        )
    )
    assert paths(error) == ["ports[0].hostPort"]


def test_per_role_service_account_priority_and_pull_secrets(crd_errors: CrdErrors) -> None:
    spec = parse_spec(
        minimal(
            serviceAccountName="trainer",
            priorityClassName="batch",
            replicas={
                "master": {"serviceAccountName": "coordinator", "imagePullSecrets": ["regcred"]},
                "worker": {"count": 2, "priorityClassName": "spot"},
            },
        )
    )
    master, worker = pods(render(spec, "kubedl")).values()
    assert master["serviceAccountName"] == "coordinator"
    assert master["imagePullSecrets"] == [{"name": "regcred"}]
    assert master["priorityClassName"] == "batch"
    assert worker["serviceAccountName"] == "trainer"
    assert worker["priorityClassName"] == "spot"
    assert "imagePullSecrets" not in worker
    assert crd_errors(Dialect.KUBEDL, Framework.PYTORCH, render(spec, "kubedl")) == []


def test_a_job_setting_under_a_role_says_where_it_goes() -> None:
    (issue,) = rejected(minimal(replicas={"master": {"backoffLimit": 2}})).issues
    assert issue.path == "replicas.master.backoffLimit"
    assert issue.fix == "move backoffLimit to the top level of the spec"


def test_container_name_is_for_mpi_only(crd_errors: CrdErrors) -> None:
    spec = parse_spec(
        {
            "name": "hvd",
            "framework": "mpi",
            "image": "horovod:0.28",
            "replicas": {
                "launcher": {"containerName": "mpi-launcher"},
                "worker": {"containerName": "mpi-worker"},
            },
        }
    )
    for dialect in V1_DIALECTS:
        manifest = render(spec, dialect)
        assert manifest["spec"]["mainContainer"] == "mpi-worker"
        assert [p["containers"][0]["name"] for p in pods(manifest).values()] == [
            "mpi-launcher",
            "mpi-worker",
        ]
        assert crd_errors(dialect, Framework.MPI, manifest) == []
    (issue,) = rejected(minimal(containerName="trainer")).issues
    assert issue.path == "containerName"
    assert "MPI jobs only" in issue.problem


def test_elastic_metrics(crd_errors: CrdErrors) -> None:
    metrics = [
        {
            "type": "Resource",
            "resource": {
                "name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 80},
            },
        },
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "qps"},
                "target": {"type": "AverageValue", "averageValue": "1k"},
            },
        },
        {
            "type": "Object",
            "object": {
                "describedObject": {"apiVersion": "v1", "kind": "Service", "name": "feed"},
                "metric": {"name": "lag"},
                "target": {"type": "Value", "value": 10},
            },
        },
    ]
    spec = parse_spec(
        minimal(
            replicas={"worker": 2}, elastic={"minReplicas": 1, "maxReplicas": 4, "metrics": metrics}
        )
    )
    manifest = render(spec, "kubeflow")
    assert manifest["spec"]["elasticPolicy"]["metrics"][2]["object"]["target"] == {
        "type": "Value",
        "value": "10",
    }
    assert crd_errors(Dialect.KUBEFLOW, Framework.PYTORCH, manifest) == []
    wrong = [
        {"type": "Resource", "pods": metrics[1]["pods"]},
        {
            "type": "Resource",
            "resource": {"name": "cpu", "target": {"type": "Value", "value": "1"}},
        },
        {
            "type": "Resource",
            "resource": {"name": "cpu", "target": {"type": "Utilization", "value": "1"}},
        },
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "q"},
                "target": {"type": "Utilization", "averageUtilization": 5},
            },
        },
    ]
    for metric in wrong:
        error = rejected(
            minimal(
                replicas={"worker": 2},
                elastic={"minReplicas": 1, "maxReplicas": 4, "metrics": [metric]},
            )
        )
        assert paths(error)[0].startswith("elastic.metrics[0]")
