"""Rendering: every field where each operator expects it, and nothing else differing."""

from __future__ import annotations

from typing import Any

import pytest
from spec_helpers import EXAMPLES, V1_DIALECTS, minimal, paths

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import (
    Dialect,
    RenderOptions,
    import_manifest,
    job_name,
    load_spec,
    parse_spec,
    render,
)
from kubedl_prefect.spec.renderers import deep_merge


def leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten a manifest to ``{"spec.x.y": leaf}`` (list items by index)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out |= leaves(item, f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(value, list):
        out = {}
        for index, item in enumerate(value):
            out |= leaves(item, f"{prefix}[{index}]")
        return out
    return {prefix: value}


def pod(manifest: dict[str, Any], field: str, role: str) -> dict[str, Any]:
    spec: dict[str, Any] = manifest["spec"][field][role]["template"]["spec"]
    return spec


def test_mnist_differs_exactly_where_the_operators_differ() -> None:
    spec = load_spec(EXAMPLES / "pytorch-mnist.yaml")
    kubedl = leaves(render(spec, Dialect.KUBEDL))
    kubeflow = leaves(render(spec, Dialect.KUBEFLOW))
    moved = {
        "cleanPodPolicy": "Running",
        "ttlSecondsAfterFinished": 3600,
        "activeDeadlineSeconds": 86400,
        "backoffLimit": 3,
        "schedulingPolicy.minAvailable": 3,
        "schedulingPolicy.queue": "default",
    }
    only_kubedl = {k: v for k, v in kubedl.items() if kubeflow.get(k, object()) != v}
    only_kubeflow = {k: v for k, v in kubeflow.items() if kubedl.get(k, object()) != v}
    assert only_kubedl == {"apiVersion": "training.kubedl.io/v1alpha1"} | {
        f"spec.{k}": v for k, v in moved.items()
    }
    assert only_kubeflow == {"apiVersion": "kubeflow.org/v1"} | {
        f"spec.runPolicy.{k}": v for k, v in moved.items()
    }


def test_run_policy_placement_per_kind() -> None:
    data = minimal(backoffLimit=2, gang={"queue": "q", "priorityClass": "high"})
    pytorch = parse_spec(data)
    kubedl = render(pytorch, "kubedl")["spec"]
    assert kubedl["backoffLimit"] == 2
    assert kubedl["schedulingPolicy"] == {"queue": "q", "priorityClassName": "high"}
    assert "runPolicy" not in kubedl
    kubeflow = render(pytorch, "kubeflow")["spec"]
    assert kubeflow["runPolicy"]["backoffLimit"] == 2
    assert kubeflow["runPolicy"]["schedulingPolicy"] == {"queue": "q", "priorityClass": "high"}
    assert "backoffLimit" not in kubeflow

    mpi = parse_spec(data | {"framework": "mpi", "replicas": {"launcher": 1, "worker": 2}})
    for dialect in V1_DIALECTS:
        body = render(mpi, dialect)["spec"]
        assert body["runPolicy"]["backoffLimit"] == 2
        assert body["mainContainer"] == "mpi"
    # KubeDL v0.5.0 reads an MPIJob's run policy in both places (the reconciler the nested one,
    # the event handlers the inline legacy pointer, which must not stay nil): both, identical.
    kubedl_mpi = render(mpi, "kubedl")["spec"]
    inline = {k: kubedl_mpi[k] for k in kubedl_mpi["runPolicy"]}
    assert inline == kubedl_mpi["runPolicy"]
    assert inline["schedulingPolicy"] == {"queue": "q", "priorityClassName": "high"}
    assert inline["schedulingPolicy"] is not kubedl_mpi["runPolicy"]["schedulingPolicy"]
    assert "backoffLimit" not in render(mpi, "kubeflow")["spec"]


@pytest.mark.parametrize(
    ("framework", "replicas", "field", "role", "kubedl", "kubeflow"),
    [
        ("pytorch", {"master": 1}, "pytorchReplicaSpecs", "Master", "pytorch", "pytorch"),
        ("tensorflow", {"worker": 1}, "tfReplicaSpecs", "Worker", "tensorflow", "tensorflow"),
        ("mpi", {"launcher": 1, "worker": 1}, "mpiReplicaSpecs", "Launcher", "mpi", "mpi"),
        ("xgboost", {"master": 1}, "xgbReplicaSpecs", "Master", "xgboostjob", "xgboost"),
    ],
)
def test_container_names_and_kinds(
    framework: str,
    replicas: dict[str, int],
    field: str,
    role: str,
    kubedl: str,
    kubeflow: str,
) -> None:
    spec = parse_spec(minimal(framework=framework, replicas=replicas))
    for dialect, expected in ((Dialect.KUBEDL, kubedl), (Dialect.KUBEFLOW, kubeflow)):
        manifest = render(spec, dialect)
        assert pod(manifest, field, role)["containers"][0]["name"] == expected


def test_replica_types_restart_policies_and_order() -> None:
    spec = parse_spec(
        minimal(
            framework="tensorflow",
            replicas={"worker": 2, "ps": {"count": 1, "restartPolicy": "Never"}, "chief": 1},
            successPolicy="AllWorkers",
        )
    )
    body = render(spec, "kubeflow")["spec"]
    specs = body["tfReplicaSpecs"]
    assert list(specs) == ["Chief", "PS", "Worker"]
    assert [specs[r]["restartPolicy"] for r in specs] == ["ExitCode", "Never", "OnFailure"]
    assert [specs[r]["replicas"] for r in specs] == [1, 1, 2]
    assert body["successPolicy"] == "AllWorkers"
    assert render(spec, "kubedl")["spec"]["successPolicy"] == "AllWorkers"


def test_gpus_render_as_limits_with_equal_requests() -> None:
    # Equal requests let the operators count the GPUs in the gang's PodGroup minResources.
    spec = parse_spec(minimal(resources={"cpu": "500m", "memory": "1Gi", "gpus": 2}))
    container = pod(render(spec, "kubedl"), "pytorchReplicaSpecs", "Worker")["containers"][0]
    assert container["resources"] == {
        "limits": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": 2},
        "requests": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": 2},
    }


def test_host_network_and_scheduler() -> None:
    spec = parse_spec(
        minimal(
            network={"hostNetwork": True}, gang={"scheduler": "volcano"}, podSecurity="privileged"
        )
    )
    kubedl = render(spec, "kubedl")
    kubeflow = render(spec, "kubeflow")
    assert kubedl["metadata"]["annotations"] == {"kubedl.io/network-mode": "host"}
    assert "annotations" not in kubeflow["metadata"]
    for manifest in (kubedl, kubeflow):
        template = pod(manifest, "pytorchReplicaSpecs", "Worker")
        assert template["hostNetwork"] is True
        assert template["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert template["schedulerName"] == "volcano"
        assert "schedulingPolicy" not in manifest["spec"].get("runPolicy", manifest["spec"])


def test_elastic_and_nproc_render_for_kubeflow_only() -> None:
    spec = parse_spec(
        minimal(
            replicas={"worker": 2},
            elastic={"minReplicas": 1, "maxReplicas": 3},
            nprocPerNode="gpu",
        )
    )
    body = render(spec, "kubeflow")["spec"]
    assert body["elasticPolicy"] == {"minReplicas": 1, "maxReplicas": 3, "rdzvBackend": "c10d"}
    assert body["nprocPerNode"] == "gpu"
    with pytest.raises(SpecError) as info:
        render(spec, "kubedl")
    assert paths(info.value) == ["replicas.master", "elastic", "nprocPerNode"]


def test_env_order_nccl_checkpoint_and_options() -> None:
    spec = parse_spec(
        minimal(
            env={"A": "1", "TOKEN": {"secretKeyRef": {"name": "s", "key": "k"}}},
            network={"ncclSocketIfname": "eth0"},
            checkpoint={"location": "/checkpoints/mnist", "pvc": "ckpt"},
        )
    )
    options = RenderOptions(env={"A": "override", "KUBEDL_PREFECT_CHECKPOINT_DIR": "/c/run-1"})
    container = pod(render(spec, "kubeflow", options), "pytorchReplicaSpecs", "Master")[
        "containers"
    ][0]
    assert container["env"] == [
        {"name": "A", "value": "override"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
        {"name": "KUBEDL_PREFECT_CHECKPOINT_DIR", "value": "/c/run-1"},
    ]
    assert container["volumeMounts"] == [
        {"name": "kubedl-prefect-checkpoint", "mountPath": "/checkpoints"}
    ]
    template = pod(render(spec, "kubeflow"), "pytorchReplicaSpecs", "Master")
    assert template["volumes"] == [
        {"name": "kubedl-prefect-checkpoint", "persistentVolumeClaim": {"claimName": "ckpt"}}
    ]


def test_volumes_of_every_source() -> None:
    spec = parse_spec(
        minimal(
            volumes=[
                {"name": "a", "mountPath": "/a", "pvc": "claim", "readOnly": True},
                {"name": "b", "mountPath": "/b", "emptyDir": {"medium": "Memory"}},
                {"name": "c", "mountPath": "/c", "hostPath": {"path": "/mnt", "type": "Directory"}},
                {"name": "d", "mountPath": "/d", "configMap": "cm", "subPath": "x"},
                {"name": "e", "mountPath": "/e", "secret": "sec"},
            ],
            podSecurity="privileged",  # the hostPath volume breaks the Baseline level
        )
    )
    template = pod(render(spec, "kubedl"), "pytorchReplicaSpecs", "Master")
    assert template["volumes"] == [
        {"name": "a", "persistentVolumeClaim": {"claimName": "claim", "readOnly": True}},
        {"name": "b", "emptyDir": {"medium": "Memory"}},
        {"name": "c", "hostPath": {"path": "/mnt", "type": "Directory"}},
        {"name": "d", "configMap": {"name": "cm"}},
        {"name": "e", "secret": {"secretName": "sec"}},
    ]
    assert template["containers"][0]["volumeMounts"] == [
        {"name": "a", "mountPath": "/a", "readOnly": True},
        {"name": "b", "mountPath": "/b"},
        {"name": "c", "mountPath": "/c"},
        {"name": "d", "mountPath": "/d", "subPath": "x"},
        {"name": "e", "mountPath": "/e"},
    ]


def test_placement_and_pod_settings() -> None:
    spec = parse_spec(
        minimal(
            nodeSelector={"pool": "gpu"},
            tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            affinity={
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 10,
                            "podAffinityTerm": {
                                "topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchLabels": {"app": "x"}},
                            },
                        }
                    ]
                }
            },
            serviceAccountName="trainer",
            imagePullSecrets=["regcred"],
            replicas={"master": {"nodeSelector": {"pool": "cpu"}}, "worker": 1},
        )
    )
    manifest = render(spec, "kubeflow")
    master = pod(manifest, "pytorchReplicaSpecs", "Master")
    worker = pod(manifest, "pytorchReplicaSpecs", "Worker")
    assert master["nodeSelector"] == {"pool": "cpu"}
    assert worker["nodeSelector"] == {"pool": "gpu"}
    assert worker["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    term = worker["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert worker["serviceAccountName"] == "trainer"
    assert worker["imagePullSecrets"] == [{"name": "regcred"}]


def test_pod_template_escape_hatch_is_merged_last() -> None:
    spec = parse_spec(
        minimal(
            gang={"scheduler": "volcano"},
            podTemplate={
                "metadata": {"annotations": {"sidecar.istio.io/inject": "false"}},
                "spec": {
                    "priorityClassName": "high",
                    "schedulerName": None,
                    "containers": [
                        {"name": "pytorch", "securityContext": {"privileged": False}},
                        {"name": "sidecar", "image": "busybox"},
                    ],
                },
            },
            replicas={
                "master": {"podTemplate": {"spec": {"priorityClassName": "highest"}}},
                "worker": 1,
            },
        )
    )
    manifest = render(spec, "kubedl")
    master = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    worker = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert master["spec"]["priorityClassName"] == "highest"
    assert worker["spec"]["priorityClassName"] == "high"
    assert "schedulerName" not in worker["spec"]
    assert worker["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    containers = worker["spec"]["containers"]
    assert [c["name"] for c in containers] == ["pytorch", "sidecar"]
    assert containers[0]["image"] == "busybox:1.36"
    assert containers[0]["securityContext"] == {"privileged": False}


def test_render_options_name_labels_annotations_namespace() -> None:
    spec = parse_spec(minimal(labels={"team": "a", "keep": "x"}, annotations={"note": "n"}))
    name = job_name(spec.name, "flow-run/task", 2)
    options = RenderOptions(
        job_name=name,
        namespace="ml",
        labels={"team": "b", "kubedl-prefect.io/owner": "flow"},
        annotations={"kubedl-prefect.io/spec-hash": "abc"},
    )
    manifest = render(spec, "kubeflow", options)
    assert manifest["metadata"] == {
        "name": name,
        "namespace": "ml",
        "labels": {"team": "b", "keep": "x", "kubedl-prefect.io/owner": "flow"},
        "annotations": {"note": "n", "kubedl-prefect.io/spec-hash": "abc"},
    }
    template = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert template["metadata"]["labels"] == manifest["metadata"]["labels"]


@pytest.mark.parametrize("name", ["Bad", "a" * 55, "-x"])
def test_render_options_job_name_is_checked(name: str) -> None:
    spec = parse_spec(minimal())
    with pytest.raises(SpecError) as info:
        render(spec, "kubedl", RenderOptions(job_name=name))
    assert "jobName" in info.value.issues[0].path


def test_rendering_does_not_share_state() -> None:
    spec = parse_spec(minimal(podTemplate={"spec": {"containers": [{"name": "pytorch"}]}}))
    first = render(spec, "kubedl")
    first["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"].clear()
    assert render(spec, "kubedl") != first
    assert spec.pod_template == {"spec": {"containers": [{"name": "pytorch"}]}}


def test_deep_merge_rules() -> None:
    base = {"a": {"b": 1, "c": 2}, "l": [1, 2], "n": [{"name": "x", "v": 1}]}
    override = {"a": {"c": None, "d": 3}, "l": [3], "n": [{"name": "x", "w": 2}, {"name": "y"}]}
    assert deep_merge(base, override) == {
        "a": {"b": 1, "d": 3},
        "l": [3],
        "n": [{"name": "x", "v": 1, "w": 2}, {"name": "y"}],
    }
    assert base == {"a": {"b": 1, "c": 2}, "l": [1, 2], "n": [{"name": "x", "v": 1}]}


def test_kubedl_mpijob_imports_back_with_its_inline_copy_and_refuses_a_disagreeing_one() -> None:
    data = minimal(
        framework="mpi",
        replicas={"launcher": 1, "worker": 2},
        backoffLimit=2,
        gang={"queue": "q"},
    )
    spec = parse_spec(data)
    manifest = render(spec, "kubedl")
    assert import_manifest(manifest).spec == spec
    manifest["spec"]["backoffLimit"] = 5
    with pytest.raises(SpecError) as caught:
        import_manifest(manifest)
    assert paths(caught.value) == ["spec.backoffLimit"]
