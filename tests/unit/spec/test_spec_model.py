"""The spec model and its validation: defaults, and every rule with its field path and fix."""

from __future__ import annotations

from typing import Any

import pytest
from spec_helpers import minimal, paths

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import (
    CleanPodPolicy,
    Dialect,
    Framework,
    RestartPolicy,
    Role,
    RoleSpec,
    TrainingJobSpec,
    parse_spec,
    validate,
)


def rejected(data: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return info.value


def test_defaults_and_role_shorthand() -> None:
    spec = parse_spec(minimal())
    assert spec.framework is Framework.PYTORCH
    assert spec.clean_pod_policy is CleanPodPolicy.RUNNING
    assert spec.replicas[Role.MASTER].count == 1
    assert spec.replicas[Role.WORKER].count == 2
    resolved = {r.role: r for r in spec.resolved_roles()}
    assert resolved[Role.MASTER].restart_policy is RestartPolicy.EXIT_CODE
    assert resolved[Role.WORKER].restart_policy is RestartPolicy.ON_FAILURE
    assert resolved[Role.WORKER].image == "busybox:1.36"


def test_snake_case_names_are_accepted_too() -> None:
    camel = parse_spec(minimal(backoffLimit=3, nodeSelector={"pool": "gpu"}))
    snake = parse_spec(minimal(backoff_limit=3, node_selector={"pool": "gpu"}))
    assert camel == snake


def test_python_construction_matches_yaml_data() -> None:
    built = TrainingJobSpec(
        name="mnist",
        image="busybox:1.36",
        replicas={Role.MASTER: RoleSpec(), Role.WORKER: RoleSpec(count=2)},
    )
    assert built == parse_spec(minimal())


def test_roles_resolve_in_framework_order_with_overrides() -> None:
    spec = parse_spec(
        minimal(
            env={"A": "1", "B": "2"},
            resources={"cpu": 2},
            replicas={
                "worker": {"count": 2, "env": {"B": "3", "C": 4}, "resources": {"cpu": 8}},
                "master": {"image": "other:1"},
            },
        )
    )
    master, worker = spec.resolved_roles()
    assert (master.role, worker.role) == (Role.MASTER, Role.WORKER)
    assert master.image == "other:1"
    assert worker.image == "busybox:1.36"
    assert {k: v.value for k, v in worker.env.items()} == {"A": "1", "B": "3", "C": "4"}
    assert worker.resources is not None
    assert worker.resources.cpu == "8"
    assert worker.resources_path == "replicas.worker.resources"
    assert master.resources is not None
    assert master.resources.cpu == "2"
    assert master.resources_path == "resources"


def test_misspelt_field_is_named_with_a_suggestion() -> None:
    error = rejected(minimal(imagePullPolicyy="IfNotPresent"))
    (issue,) = error.issues
    assert issue.path == "imagePullPolicyy"
    assert "unknown field" in issue.problem
    assert "did you mean `imagePullPolicy`?" in issue.fix


def test_misspelt_nested_field_and_role() -> None:
    error = rejected(minimal(replicas={"master": 1, "workers": 2}, gang={"minAvailible": 2}))
    by_path = {issue.path: issue for issue in error.issues}
    assert "did you mean `worker`?" in by_path["replicas.workers"].fix
    assert "did you mean `minAvailable`?" in by_path["gang.minAvailible"].fix


def test_unknown_field_without_close_match_lists_the_fields() -> None:
    (issue,) = rejected(minimal(network={"zzz": 1})).issues
    assert issue.path == "network.zzz"
    assert "ncclSocketIfname" in issue.fix
    assert "hostNetwork" in issue.fix


def test_restart_policy_always_is_refused_with_the_reason() -> None:
    error = rejected(minimal(replicas={"master": {"restartPolicy": "Always"}, "worker": 1}))
    (issue,) = error.issues
    assert issue.path == "replicas.master.restartPolicy"
    assert "never fails" in issue.problem
    assert "OnFailure" in issue.fix
    assert "ExitCode" in issue.fix


@pytest.mark.parametrize("count", [0, -1])
def test_replicas_at_least_one(count: int) -> None:
    (issue,) = rejected(minimal(replicas={"master": 1, "worker": {"count": count}})).issues
    assert issue.path == "replicas.worker.count"
    assert "at least 1" in issue.fix


def test_no_roles_at_all() -> None:
    (issue,) = rejected(minimal(replicas={})).issues
    assert issue.path == "replicas"


def test_image_must_be_present_for_every_role() -> None:
    data = minimal(replicas={"master": {"image": "a:1"}, "worker": 2})
    del data["image"]
    (issue,) = rejected(data).issues
    assert issue.path == "replicas.worker.image"
    assert "image" in issue.fix


def test_gpus_only_in_requests() -> None:
    (issue,) = rejected(minimal(resources={"requests": {"nvidia.com/gpu": 2}})).issues
    assert issue.path == "resources.requests"
    assert "limits" in issue.problem
    assert "gpus: 2" in issue.fix


def test_gpu_request_must_equal_gpus() -> None:
    (issue,) = rejected(
        minimal(replicas={"master": {"resources": {"gpus": 1, "requests": {"nvidia.com/gpu": 2}}}})
    ).issues
    assert issue.path == "replicas.master.resources.requests"
    assert "differs" in issue.problem


def test_gpu_request_equal_to_gpus_is_accepted() -> None:
    spec = parse_spec(minimal(resources={"gpus": 2, "requests": {"nvidia.com/gpu": "2"}}))
    assert spec.resources is not None
    assert spec.resources.gpus == 2


def test_gpu_in_raw_limits_is_refused() -> None:
    (issue,) = rejected(minimal(resources={"limits": {"nvidia.com/gpu": 1}})).issues
    assert issue.path == "resources.limits"
    assert "gpus" in issue.fix


def test_request_above_limit_and_duplicate_shorthand() -> None:
    error = rejected(
        minimal(
            resources={
                "cpu": 2,
                "limits": {"cpu": 4, "ephemeral-storage": "1Gi"},
                "requests": {"ephemeral-storage": "2Gi"},
            }
        )
    )
    problems = {issue.problem for issue in error.issues}
    assert any("cpu is given both" in p for p in problems)
    assert any("exceeds its limit" in p for p in problems)


@pytest.mark.parametrize("quantity", ["abc", "1.5.5", "-1", "1e99999999999"])
def test_bad_quantities(quantity: str) -> None:
    (issue,) = rejected(minimal(resources={"memory": quantity})).issues
    assert issue.path == "resources.memory"


def test_quantities_from_yaml_numbers_become_strings() -> None:
    spec = parse_spec(minimal(resources={"cpu": 0.5, "memory": 1073741824}))
    assert spec.resources is not None
    assert (spec.resources.cpu, spec.resources.memory) == ("0.5", "1073741824")


def test_elastic_min_above_max() -> None:
    error = rejected(
        minimal(
            replicas={"worker": 2},
            elastic={"minReplicas": 3, "maxReplicas": 2},
        )
    )
    assert "elastic.minReplicas" in paths(error)


def test_elastic_worker_count_within_bounds_and_pytorch_only() -> None:
    error = rejected(minimal(replicas={"worker": 5}, elastic={"minReplicas": 1, "maxReplicas": 4}))
    assert paths(error) == ["replicas.worker.count"]
    tf = rejected(
        minimal(
            framework="tensorflow",
            replicas={"worker": 2},
            elastic={"minReplicas": 1, "maxReplicas": 2},
        )
    )
    assert paths(tf) == ["elastic"]


def test_name_must_be_dns1035() -> None:
    (issue,) = rejected(minimal(name="1-Bad_Name")).issues
    assert issue.path == "name"
    assert "DNS-1035" in issue.problem


def test_name_length_depends_on_the_roles() -> None:
    # master + 2 workers: longest suffix "-worker-1" (9), attempt suffix "-<12>-a99" (17):
    # 63 - 26 = 37.
    parse_spec(minimal(name="a" * 37))
    (issue,) = rejected(minimal(name="a" * 38)).issues
    assert issue.path == "name"
    assert "at most 37" in issue.problem
    assert "'-xxxxxxxxxxxx-a99'" in issue.problem
    # 16 workers: "-worker-15" (10) leaves 36.
    (issue,) = rejected(minimal(name="a" * 37, replicas={"master": 1, "worker": 16})).issues
    assert "at most 36" in issue.problem


def test_elastic_maximum_counts_for_the_name_length() -> None:
    data = minimal(
        name="a" * 37, replicas={"worker": 2}, elastic={"minReplicas": 1, "maxReplicas": 11}
    )
    (issue,) = rejected(data).issues
    assert "at most 36" in issue.problem


@pytest.mark.parametrize(
    ("framework", "replicas", "path"),
    [
        ("pytorch", {"chief": 1}, "replicas.chief"),
        ("pytorch", {"master": 2, "worker": 1}, "replicas.master.count"),
        ("tensorflow", {"chief": 1, "master": 1}, "replicas"),
        ("tensorflow", {"ps": 1}, "replicas"),
        ("mpi", {"worker": 2}, "replicas.launcher"),
        ("mpi", {"launcher": 1}, "replicas.worker"),
        ("mpi", {"launcher": 2, "worker": 1}, "replicas.launcher.count"),
        ("xgboost", {"worker": 2}, "replicas.master"),
    ],
)
def test_roles_per_framework(framework: str, replicas: dict[str, Any], path: str) -> None:
    error = rejected(minimal(framework=framework, replicas=replicas))
    assert path in paths(error)


def test_framework_specific_fields() -> None:
    error = rejected(minimal(slotsPerWorker=2, successPolicy="AllWorkers"))
    assert sorted(paths(error)) == ["slotsPerWorker", "successPolicy"]
    (issue,) = rejected(minimal(nprocPerNode="many")).issues
    assert issue.path == "nprocPerNode"


def test_gang_min_available_cannot_exceed_replicas() -> None:
    (issue,) = rejected(minimal(gang={"minAvailable": 4})).issues
    assert issue.path == "gang.minAvailable"
    assert "3" in issue.fix


def test_env_scalars_and_references() -> None:
    spec = parse_spec(
        minimal(
            env={
                "N": 4,
                "FLAG": True,
                "TOKEN": {"secretKeyRef": {"name": "creds", "key": "token"}},
                "POD": {"fieldRef": {"fieldPath": "metadata.name"}},
            }
        )
    )
    assert spec.env is not None
    assert spec.env["N"].value == "4"
    assert spec.env["FLAG"].value == "true"
    assert spec.env["TOKEN"].secret_key_ref is not None


def test_env_reserved_and_conflicting_names() -> None:
    error = rejected(
        minimal(
            env={"KUBEDL_PREFECT_CHECKPOINT_DIR": "/x", "NCCL_SOCKET_IFNAME": "eth1"},
            network={"ncclSocketIfname": "eth0"},
        )
    )
    assert sorted(paths(error)) == ["env.KUBEDL_PREFECT_CHECKPOINT_DIR", "env.NCCL_SOCKET_IFNAME"]


def test_bad_env_name_and_two_sources() -> None:
    error = rejected(
        minimal(env={"1BAD": "x", "OK": {"value": "a", "fieldRef": {"fieldPath": "metadata.name"}}})
    )
    assert sorted(paths(error)) == ["env.OK", "env['1BAD']"]


def test_labels_and_annotations_are_checked() -> None:
    error = rejected(minimal(labels={"team": "a b"}, annotations={"bad key!": "x"}))
    assert sorted(paths(error)) == ["annotations['bad key!']", "labels.team"]


def test_volume_needs_exactly_one_source_and_unique_names_and_paths() -> None:
    error = rejected(
        minimal(
            volumes=[
                {"name": "a", "mountPath": "/a", "pvc": "p", "secret": "s"},
                {"name": "b", "mountPath": "/b"},
            ]
        )
    )
    assert paths(error) == ["volumes[0]", "volumes[1]"]
    error = rejected(
        minimal(
            volumes=[
                {"name": "a", "mountPath": "/data", "pvc": "p"},
                {"name": "a", "mountPath": "/data/", "configMap": "c"},
            ]
        )
    )
    assert paths(error) == ["volumes[1].name", "volumes[1].mountPath"]


def test_checkpoint_must_be_on_a_volume_or_a_uri() -> None:
    (issue,) = rejected(minimal(checkpoint={"location": "/ckpt/run"})).issues
    assert issue.path == "checkpoint.location"
    parse_spec(minimal(checkpoint={"location": "/checkpoints/run", "pvc": "ckpt"}))
    parse_spec(minimal(checkpoint={"location": "s3://bucket/run"}))
    parse_spec(
        minimal(
            checkpoint={"location": "/data/ckpt"},
            volumes=[{"name": "d", "mountPath": "/data", "pvc": "data"}],
        )
    )
    (issue,) = rejected(minimal(checkpoint={"location": "s3://b/r", "pvc": "ckpt"})).issues
    assert issue.path == "checkpoint.pvc"
    (issue,) = rejected(minimal(checkpoint={"location": "relative/dir", "pvc": "c"})).issues
    assert issue.path == "checkpoint.location"


def test_tolerations_are_checked_like_kubernetes() -> None:
    error = rejected(
        minimal(
            tolerations=[
                {"key": "gpu", "operator": "Exists", "value": "x"},
                {"operator": "Equal", "value": "x"},
                {"key": "gpu", "tolerationSeconds": 5},
            ]
        )
    )
    assert paths(error) == ["tolerations[0]", "tolerations[1]", "tolerations[2]"]


def test_pod_template_escape_hatch_shape() -> None:
    parse_spec(minimal(podTemplate={"spec": {"priorityClassName": "high"}}))
    (issue,) = rejected(minimal(podTemplate={"containers": []})).issues
    assert issue.path == "podTemplate"
    assert "spec" in issue.fix


def test_wrong_types_are_explained() -> None:
    error = rejected(minimal(backoffLimit="three", command="python train.py", labels=["a"]))
    by_path = {issue.path: issue for issue in error.issues}
    assert "whole number" in by_path["backoffLimit"].fix
    assert "list" in by_path["command"].fix
    assert "mapping" in by_path["labels"].fix


def test_missing_required_fields() -> None:
    error = rejected({"image": "x"})
    assert sorted(paths(error)) == ["name", "replicas"]


def test_non_mapping_document() -> None:
    (issue,) = rejected(["name", "x"]).issues
    assert issue.path == "(document)"


def test_every_problem_is_reported_at_once() -> None:
    error = rejected(
        minimal(
            image=None,
            backoffLimit=-1,
            imagePullPolicy="Sometimes",
            replicas={"master": {"restartPolicy": "Always"}, "worker": {"count": 0}},
        )
    )
    assert len(error.issues) >= 4


def test_dialect_rules() -> None:
    spec = parse_spec(
        minimal(
            replicas={"worker": 2},
            elastic={"minReplicas": 1, "maxReplicas": 4},
            nprocPerNode="2",
        )
    )
    validate(spec, Dialect.KUBEFLOW)
    validate(spec)
    with pytest.raises(SpecError) as info:
        validate(spec, "kubedl")
    assert paths(info.value) == ["replicas.master", "elastic", "nprocPerNode"]
    assert all("kubeflow" in issue.fix for issue in info.value.issues)


def test_unknown_dialect_is_a_spec_error() -> None:
    spec = parse_spec(minimal())
    with pytest.raises(SpecError) as info:
        validate(spec, "volcano")
    assert paths(info.value) == ["dialect"]


def test_models_are_frozen() -> None:
    spec = parse_spec(minimal())
    with pytest.raises(ValueError, match="frozen"):
        spec.name = "other"  # type: ignore[misc]


def test_extended_resources_follow_the_kubernetes_rules() -> None:
    parse_spec(minimal(resources={"limits": {"example.com/fpga": 2, "hugepages-2Mi": "1Gi"}}))
    error = rejected(
        minimal(
            resources={
                "requests": {"example.com/fpga": 1, "hugepages-2Mi": "1Gi"},
                "limits": {"example.com/fpga": 2, "example.com/nic": "500m"},
            }
        )
    )
    problems = sorted(issue.problem for issue in error.issues)
    assert any("example.com/fpga request (1) differs" in p for p in problems)
    assert any("hugepages-2Mi is requested without a limit" in p for p in problems)
    assert any("example.com/nic is 500m" in p for p in problems)


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("env", {"X": {"fieldRef": {"fieldPath": "spec.containers"}}}, "env.X.fieldRef.fieldPath"),
        ("env", {"X": {"secretKeyRef": {"name": "s", "key": "a b"}}}, "env.X.secretKeyRef.key"),
        ("tolerations", [{"key": "bad key", "operator": "Exists"}], "tolerations[0].key"),
        (
            "affinity",
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In"}]}
                        ]
                    }
                }
            },
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0]",
        ),
        (
            "affinity",
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "spec.x", "operator": "In", "values": ["a"]}]}
                        ]
                    }
                }
            },
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0]",
        ),
        (
            "volumes",
            [{"name": "v", "mountPath": "/v", "pvc": "p", "subPath": "../etc"}],
            "volumes[0].subPath",
        ),
    ],
)
def test_pod_rules_the_api_server_would_enforce_later(field: str, value: Any, path: str) -> None:
    assert paths(rejected(minimal(**{field: value}))) == [path]


# --- models imported when a spec first holds one (spec.fields.LazyModel) -------------------


def test_lazily_imported_models_report_as_the_others() -> None:
    # The same problems, paths and order as when these models were built with the spec's.
    error = rejected(
        minimal(
            affinity={"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]}},
            elastic={
                "minReplicas": 1,
                "maxReplicas": 2,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu", "bogus": 1}}, 7, None],
            },
            replicas={"master": 1, "worker": {"count": 1, "affinity": 5}},
        )
    )
    assert [str(issue) for issue in error.issues] == [
        "affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey: "
        "this field is required (fix: add `topologyKey`)",
        "replicas.worker.affinity: Input should be a valid dictionary or instance of Affinity "
        "(fix: write a mapping (`key: value` lines))",
        "elastic.metrics[0].resource.target: this field is required (fix: add `target`)",
        "elastic.metrics[0].resource.bogus: unknown field 'bogus' "
        "(fix: remove it; the fields here are: name, target)",
        "elastic.metrics[1]: Input should be a valid dictionary or instance of MetricSpec "
        "(fix: write a mapping (`key: value` lines))",
        "elastic.metrics[2]: Input should be a valid dictionary or instance of MetricSpec "
        "(fix: write a mapping (`key: value` lines))",
    ]


def test_lazily_imported_models_dump_and_describe_as_the_others() -> None:
    from kubedl_prefect.spec import Affinity, MetricSpec, spec_to_data

    affinity = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 5,
                    "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
                }
            ]
        }
    }
    metric = {
        "type": "Pods",
        "pods": {
            "metric": {"name": "qps"},
            "target": {"type": "AverageValue", "averageValue": "10"},
        },
    }
    spec = parse_spec(
        minimal(
            affinity=affinity, elastic={"minReplicas": 1, "maxReplicas": 2, "metrics": [metric]}
        )
    )
    assert isinstance(spec.affinity, Affinity)
    assert spec.elastic is not None
    assert spec.elastic.metrics is not None
    assert isinstance(spec.elastic.metrics[0], MetricSpec)
    data = spec_to_data(spec)
    assert data["affinity"] == affinity
    assert data["elastic"]["metrics"] == [metric]
    assert parse_spec(data) == spec
    schema = TrainingJobSpec.model_json_schema()
    assert {"Affinity", "MetricSpec", "NodeAffinity"} <= set(schema["$defs"])
