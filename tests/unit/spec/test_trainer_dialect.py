"""The ``trainer`` dialect: Kubeflow Trainer v2 TrainJobs rendered, refused, imported, migrated.

Facts from the v2.3.0 source (``pkg/apis/trainer/v1alpha1``, the plugins, the runtimes it
installs) and JobSet v0.12.0; the TrainJobs under ``manifests/trainer`` are written here in the
shapes of Trainer's own examples and guides.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from conftest import CrdErrors
from spec_helpers import REPO, minimal, paths

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import (
    Dialect,
    Framework,
    RenderOptions,
    import_manifest,
    job_name,
    parse_spec,
    render,
)
from kubedl_prefect.spec.porting import import_path
from kubedl_prefect.spec.renderers.trainer import (
    RUNTIME_PATCH_MANAGER,
    VOLCANO_QUEUE_ANNOTATION,
    trainer_notes,
)
from kubedl_prefect.spec.semantics import differences, operator_view
from kubedl_prefect.spec.validation import validate

TRAINJOBS = Path(__file__).resolve().parent / "manifests" / "trainer"
V1 = Path(__file__).resolve().parent / "manifests" / "kubeflow"


def trainer(**fields: Any) -> dict[str, Any]:
    return render(parse_spec(minimal(**fields)), Dialect.TRAINER)


def refusal(data: dict[str, Any], options: RenderOptions | None = None) -> list[str]:
    with pytest.raises(SpecError) as caught:
        render(parse_spec(data), Dialect.TRAINER, options)
    return paths(caught.value)


# --- rendering -------------------------------------------------------------------------------


def test_roles_become_nodes_of_the_frameworks_runtime() -> None:
    job = trainer(command=["torchrun", "t.py"], nprocPerNode="4")
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert job["kind"] == "TrainJob"
    assert job["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    assert job["spec"]["trainer"] == {
        "image": "busybox:1.36",
        "command": ["torchrun", "t.py"],
        "numNodes": 3,
        "numProcPerNode": 4,
    }
    assert "runtimePatches" not in job["spec"]


@pytest.mark.parametrize(
    ("framework", "replicas", "runtime", "nodes"),
    [
        ("xgboost", {"master": 1, "worker": 3}, "xgboost-distributed", 4),
        ("mpi", {"launcher": 1, "worker": 2}, "deepspeed-distributed", 3),
    ],
)
def test_each_framework_has_its_runtime(
    framework: str, replicas: dict[str, int], runtime: str, nodes: int
) -> None:
    job = trainer(framework=framework, replicas=replicas)
    assert job["spec"]["runtimeRef"] == {"name": runtime}
    assert job["spec"]["trainer"]["numNodes"] == nodes


def test_a_named_runtime_and_its_kind() -> None:
    job = trainer(runtime={"name": "team-torch", "kind": "TrainingRuntime"})
    assert job["spec"]["runtimeRef"] == {"name": "team-torch", "kind": "TrainingRuntime"}


def test_pod_settings_go_through_one_runtime_patch() -> None:
    job = trainer(
        serviceAccountName="trainer",
        nodeSelector={"pool": "gpu"},
        labels={"team": "a"},
        gang={"queue": "research"},
        volumes=[{"name": "data", "mountPath": "/data", "pvc": "claim"}],
    )
    (patch,) = job["spec"]["runtimePatches"]
    assert patch["manager"] == RUNTIME_PATCH_MANAGER
    template = patch["trainingRuntimeSpec"]["template"]
    assert template["metadata"] == {"annotations": {VOLCANO_QUEUE_ANNOTATION: "research"}}
    (node,) = template["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]
    assert node["name"] == "node"
    assert pod["metadata"] == {"labels": {"team": "a"}}
    assert pod["spec"]["serviceAccountName"] == "trainer"
    assert pod["spec"]["containers"] == [
        {"name": "node", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    ]
    assert job["metadata"]["labels"] == {"team": "a"}


def test_mpi_patches_the_launcher_and_the_nodes_alike() -> None:
    job = trainer(framework="mpi", replicas={"launcher": 1, "worker": 1}, nodeSelector={"a": "b"})
    jobs = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    names = [j["name"] for j in jobs["replicatedJobs"]]
    assert names == ["launcher", "node"]
    first, second = (j["template"] for j in jobs["replicatedJobs"])
    assert first == second
    assert first is not second


def test_the_renderer_is_pure() -> None:
    spec = parse_spec(minimal(gang={"queue": "q"}, labels={"a": "b"}))
    before = copy.deepcopy(spec.model_dump())
    assert render(spec, Dialect.TRAINER) == render(spec, Dialect.TRAINER)
    assert spec.model_dump() == before


def test_rendered_trainjobs_pass_the_crd(crd_errors: CrdErrors) -> None:
    job = trainer(
        command=["torchrun", "t.py"],
        resources={"cpu": "2", "gpus": 1},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        checkpoint={"location": "/ckpt/run", "pvc": "claims", "mountPath": "/ckpt"},
        gang={"queue": "q"},
        activeDeadlineSeconds=600,
    )
    assert crd_errors(Dialect.TRAINER, Framework.PYTORCH, job) == []


# --- refusals, each with the spec field ------------------------------------------------------


def test_tensorflow_has_no_runtime() -> None:
    data = minimal(framework="tensorflow", replicas={"worker": 2})
    assert refusal(data) == ["framework"]


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"env": {"PET_NNODES": "2"}}, "env.PET_NNODES"),
        ({"elastic": {"minReplicas": 1, "maxReplicas": 3}}, "elastic"),
        ({"backoffLimit": 3}, "backoffLimit"),
        ({"nprocPerNode": "gpu"}, "nprocPerNode"),
        ({"gang": {"scheduler": "volcano"}}, "gang.scheduler"),
        ({"gang": {"priorityClass": "high"}}, "gang.priorityClass"),
        ({"gang": {"minAvailable": 2}}, "gang.minAvailable"),
        ({"priorityClassName": "high"}, "priorityClassName"),
        ({"workingDir": "/w"}, "workingDir"),
        ({"network": {"hostNetwork": True}, "podSecurity": "privileged"}, "network.hostNetwork"),
        ({"podTemplate": {"spec": {"hostIPC": True}}, "podSecurity": "privileged"}, "podTemplate"),
    ],
)
def test_what_a_trainjob_cannot_say_is_refused(fields: dict[str, Any], path: str) -> None:
    assert path in refusal(minimal(**fields))


def test_a_named_runtime_may_bring_the_gang() -> None:
    job = trainer(runtime={"name": "torch-volcano"}, gang={"scheduler": "volcano", "queue": "q"})
    assert job["spec"]["runtimeRef"] == {"name": "torch-volcano"}


def test_roles_that_differ_are_refused() -> None:
    data = minimal(replicas={"master": 1, "worker": {"count": 2, "args": ["--worker"]}})
    assert refusal(data) == ["replicas.worker"]


def test_xgboost_reserves_the_trackers_variables() -> None:
    data = minimal(framework="xgboost", env={"DMLC_NUM_WORKER": "3"})
    assert refusal(data) == ["env.DMLC_NUM_WORKER"]


def test_a_name_whose_host_names_are_too_long_is_refused() -> None:
    # <name>-<12>-a99-node-0-2 must fit 63: 63 - 17 - 9 = 37 characters.
    assert refusal(minimal(name="a" * 38)) == ["name"]
    trainer(name="a" * 37)
    # With the lifecycle's own name: the job name plus -node-0-2 must fit 63.
    render(parse_spec(minimal()), "trainer", RenderOptions(job_name="a" * 54))
    long = "a" * 55
    assert refusal(minimal(), RenderOptions(job_name=long)) == ["(options).jobName"]
    render(parse_spec(minimal()), "trainer", RenderOptions(job_name=job_name("a" * 37, "k", 99)))


def test_a_runtime_is_refused_by_the_v1_operators() -> None:
    with pytest.raises(SpecError) as caught:
        validate(parse_spec(minimal(runtime={"name": "x"})), "kubeflow")
    assert paths(caught.value) == ["runtime"]


def test_notes_say_what_changes_meaning() -> None:
    spec = parse_spec(minimal(cleanPodPolicy="All", imagePullPolicy="Always"))
    found = dict(trainer_notes(spec))
    assert set(found) == {"cleanPodPolicy", "imagePullPolicy", "replicas"}
    assert "PET_MASTER_ADDR" in found["replicas"]


# --- import --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(TRAINJOBS.glob("*.yaml")), ids=lambda p: p.stem)
def test_trainjobs_import_and_render_back_the_same(path: Path) -> None:
    manifests = [m for m in _documents(path) if m["kind"] == "TrainJob"]
    (imported,) = import_path(path)
    assert imported.dialect is Dialect.TRAINER
    (manifest,) = manifests
    again = render(imported.spec, Dialect.TRAINER, RenderOptions(namespace=imported.namespace))
    found = differences(operator_view(manifest), operator_view(again))
    # The runtime's image is written out: the rendered job names it, the manifest did not.
    assert [d for d in found if not d.startswith("spec.trainer.image")] == []
    imported.to_yaml()


def test_the_kueue_queue_and_a_runtime_in_the_same_file() -> None:
    (imported,) = import_path(TRAINJOBS / "kueue-runtime-in-file.yaml")
    spec = imported.spec
    assert spec.kueue is not None
    assert spec.kueue.queue == "team-a"
    assert spec.image == "ghcr.io/example/torch-small:1.0"
    assert spec.runtime is not None
    assert spec.runtime.kind == "TrainingRuntime"


def test_the_runtimes_image_is_written_out() -> None:
    (imported,) = import_path(TRAINJOBS / "multi-node-torch.yaml")
    assert imported.spec.image == "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
    assert imported.spec.replicas["worker"].count == 3


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (
            lambda s: s.update(initializer={"dataset": {"storageUri": "hf://x/y"}}),
            "spec.initializer",
        ),
        (lambda s: s.update(podTemplateOverrides=[]), "spec.podTemplateOverrides"),
        (lambda s: s.update(annotations={VOLCANO_QUEUE_ANNOTATION: "q"}), "spec.annotations"),
        (lambda s: s.update(suspend=True), "spec.suspend"),
        (lambda s: s.update(managedBy="kueue.x-k8s.io/multikueue"), "spec.managedBy"),
    ],
)
def test_what_a_spec_cannot_hold_is_refused_on_import(change: Any, path: str) -> None:
    (manifest,) = _documents(TRAINJOBS / "xgboost.yaml")
    change(manifest["spec"])
    with pytest.raises(SpecError) as caught:
        import_manifest(manifest)
    assert path in paths(caught.value)


def test_jobset_labels_have_no_place() -> None:
    (manifest,) = _documents(TRAINJOBS / "volcano-queue.yaml")
    metadata = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["metadata"]
    metadata["labels"] = {"team": "x"}
    with pytest.raises(SpecError, match="JobSet's labels"):
        import_manifest(manifest)


# --- the migration path: v1 jobs as TrainJobs ------------------------------------------------


@pytest.mark.parametrize("name", ["pytorch-simple.yaml", "pytorch-mnist-nccl.yaml"])
def test_a_v1_pytorchjob_renders_as_a_trainjob(name: str, crd_errors: CrdErrors) -> None:
    (imported,) = import_path(V1 / name)
    job = render(imported.spec, Dialect.TRAINER)
    assert job["kind"] == "TrainJob"
    assert crd_errors(Dialect.TRAINER, Framework.PYTORCH, job) == []
    text = imported.to_yaml()
    assert "With --dialect trainer (Kubeflow Trainer v2) it renders as a TrainJob" in text
    # And back: the TrainJob imports to a spec that renders it again.
    again = import_manifest(job).spec
    assert differences(operator_view(render(again, "trainer")), operator_view(job)) == []


def test_a_v1_job_trainer_refuses_says_why_on_import() -> None:
    (imported,) = import_path(V1 / "tfjob-simple.yaml")
    assert "framework: Kubeflow Trainer v2 has no runtime for tensorflow" in imported.to_yaml()


def test_the_examples_that_trainer_runs() -> None:
    spec = import_path(REPO / "tests" / "golden" / "trainer" / "xgboost-iris.yaml")[0].spec
    assert spec.framework is Framework.XGBOOST


def _documents(path: Path) -> list[dict[str, Any]]:
    import yaml

    return [d for d in yaml.safe_load_all(path.read_text()) if d]
