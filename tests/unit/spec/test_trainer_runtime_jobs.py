"""A TrainJob's runtime patch follows the replicated Jobs its runtime names.

Trainer v2.3.0 merges a runtime patch into the runtime's JobSet template by replicated Job name
(a strategic merge), and finds the trainer Job by its ``trainjob-ancestor-step`` label, not by
name. The runtimes below have the shapes of the release's (``torch-distributed``,
``deepspeed-distributed``, ``torchtune-*``) and of one that names its Jobs otherwise.
"""

from __future__ import annotations

import json
from typing import Any

from kubedl_prefect.spec import Dialect, RenderOptions, parse_spec, render
from kubedl_prefect.spec.renderers.trainer import (
    RUNTIME_JOBS_ANNOTATION,
    RUNTIME_PATCH_MANAGER,
    TRAINER_ANCESTOR_LABEL,
    fit_runtime_patches,
    runtime_jobs,
    runtime_pods,
)


def job(name: str, ancestor: str | None, containers: tuple[str, ...] = ("node",)) -> dict[str, Any]:
    labels = {TRAINER_ANCESTOR_LABEL: ancestor} if ancestor else {}
    pod = {"spec": {"containers": [{"name": c, "image": "x"} for c in containers]}}
    return {"name": name, "template": {"metadata": {"labels": labels}, "spec": {"template": pod}}}


def runtime(*jobs: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "ClusterTrainingRuntime",
        "spec": {"template": {"spec": {"replicatedJobs": list(jobs)}}},
    }


TORCH = runtime(job("node", "trainer"))
DEEPSPEED = runtime(job("node", None), job("launcher", "trainer"))
TORCHTUNE = runtime(
    job("dataset-initializer", "dataset-initializer", ("dataset-initializer",)),
    job("model-initializer", "model-initializer", ("model-initializer",)),
    job("node", "trainer"),
)
WORKERS = runtime(job("driver", None, ("driver",)), job("worker", "trainer"))


def rendered(framework: str = "pytorch") -> dict[str, Any]:
    replicas = {"launcher": 1, "worker": 2} if framework == "mpi" else {"worker": 2}
    spec = parse_spec(
        {
            "name": "fit",
            "framework": framework,
            "image": "registry.example/train:1",
            "command": ["python", "train.py"],
            "replicas": replicas,
            "nodeSelector": {"pool": "gpu"},
            "volumes": [{"name": "data", "mountPath": "/data", "pvc": "data"}],
            "annotations": {"team": "vision"},
        }
    )
    return render(spec, Dialect.TRAINER, RenderOptions())


def patched_jobs(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (patch,) = [
        p for p in manifest["spec"]["runtimePatches"] if p["manager"] == RUNTIME_PATCH_MANAGER
    ]
    jobs = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return {j["name"]: j["template"]["spec"]["template"] for j in jobs}


def test_runtime_jobs_read_names_ancestors_containers_and_pods() -> None:
    found = runtime_jobs(TORCHTUNE)
    assert [(j.name, j.ancestor, j.is_trainer, j.is_initializer) for j in found] == [
        ("dataset-initializer", "dataset-initializer", False, True),
        ("model-initializer", "model-initializer", False, True),
        ("node", "trainer", True, False),
    ]
    parallel = runtime(job("worker", "trainer"))
    parallel["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = 4
    assert [(j.name, j.pods, j.containers) for j in runtime_jobs(parallel)] == [
        ("worker", 4, ("node",))
    ]
    assert runtime_jobs({"spec": {}}) == ()


def test_release_runtimes_keep_the_rendered_patch() -> None:
    torch = rendered()
    assert fit_runtime_patches(torch, TORCH) == torch
    mpi = rendered("mpi")
    assert sorted(patched_jobs(fit_runtime_patches(mpi, DEEPSPEED))) == ["launcher", "node"]
    assert patched_jobs(fit_runtime_patches(mpi, DEEPSPEED)) == patched_jobs(mpi)


def test_a_runtime_with_other_names_gets_its_own_names_and_no_stray_node_job() -> None:
    manifest = rendered()
    assert list(patched_jobs(manifest)) == ["node"]
    fitted = patched_jobs(fit_runtime_patches(manifest, WORKERS))
    assert list(fitted) == ["driver", "worker"]
    # Pod settings reach every Job; the training container's mounts only the Jobs that have it.
    for pod in fitted.values():
        assert pod["spec"]["nodeSelector"] == {"pool": "gpu"}
        assert pod["metadata"]["annotations"]["team"] == "vision"
        assert pod["spec"]["volumes"][0]["name"] == "data"
    assert "containers" not in fitted["driver"]["spec"]
    assert fitted["worker"]["spec"]["containers"][0]["name"] == "node"
    assert fitted["worker"]["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] == "/data"


def test_initializers_get_no_training_pod_settings() -> None:
    fitted = patched_jobs(fit_runtime_patches(rendered(), TORCHTUNE))
    assert list(fitted) == ["node"]


def test_the_input_is_not_changed_and_other_managers_patches_are_left_alone() -> None:
    manifest = rendered()
    other = {"manager": "example.com/other", "trainingRuntimeSpec": {"template": {"spec": {}}}}
    manifest["spec"]["runtimePatches"].append(other)
    before = repr(manifest)
    fitted = fit_runtime_patches(manifest, WORKERS)
    assert repr(manifest) == before
    assert fitted["spec"]["runtimePatches"][1] == other
    assert fit_runtime_patches(manifest, runtime()) == manifest


def test_runtime_pods_count_as_trainer_does() -> None:
    assert runtime_pods(TORCH, 3) == {"node": 3}
    mpi = runtime(job("node", None), job("launcher", "trainer"))
    mpi["spec"]["mlPolicy"] = {"numNodes": 1, "mpi": {"runLauncherAsNode": True}}
    assert runtime_pods(mpi, 3) == {"node": 2, "launcher": 1}
    assert runtime_pods(WORKERS, 4) == {"driver": 1, "worker": 4}


def test_release_names_get_no_layout_annotation_and_other_names_do() -> None:
    assert RUNTIME_JOBS_ANNOTATION not in fit_runtime_patches(rendered(), TORCH)["metadata"].get(
        "annotations", {}
    )
    fitted = fit_runtime_patches(rendered(), WORKERS)
    layout = json.loads(fitted["metadata"]["annotations"][RUNTIME_JOBS_ANNOTATION])
    assert layout == {"driver": {"pods": 1}, "worker": {"pods": 2, "trainer": True}}


def test_a_not_started_diagnosis_sees_the_runtimes_own_roles() -> None:
    from kubedl_prefect.lifecycle.kubernetes.admission import expected_replicas
    from kubedl_prefect.lifecycle.kubernetes.demand import job_total, placements

    spec = parse_spec(
        {
            "name": "fit",
            "image": "i",
            "replicas": {"worker": 3},
            "resources": {"cpu": "2", "gpus": 1},
            "nodeSelector": {"pool": "gpu"},
        }
    )
    fitted = fit_runtime_patches(render(spec, Dialect.TRAINER, RenderOptions()), WORKERS)
    found = {p.role: p for p in placements(fitted)}
    assert {role: p.count for role, p in found.items()} == {"driver": 1, "worker": 3}
    assert dict(found["driver"].node_selector) == {"pool": "gpu"}
    assert expected_replicas(fitted) == 4
    # resourcesPerNode is the trainer Job's: the driver asks for no GPU.
    assert job_total(fitted, "requests.nvidia.com/gpu") == 3


def gang_spec(**gang: str) -> Any:
    return parse_spec(
        {
            "name": "g",
            "image": "i",
            "replicas": {"worker": 2},
            "runtime": {"name": "r"},
            "gang": gang,
        }
    )


def with_policy(policy: dict[str, Any] | None) -> dict[str, Any]:
    found = runtime(job("node", "trainer"))
    found["metadata"] = {"name": "r"}
    if policy is not None:
        found["spec"]["podGroupPolicy"] = policy
    return found


def test_what_the_gang_says_must_be_what_the_runtime_does() -> None:
    from kubedl_prefect.spec.renderers.trainer import runtime_issues

    volcano, cosched = with_policy({"volcano": {}}), with_policy({"coscheduling": {}})
    assert runtime_issues(gang_spec(queue="research"), volcano) == []
    assert runtime_issues(gang_spec(scheduler="volcano"), volcano) == []
    assert runtime_issues(gang_spec(scheduler="scheduler-plugins-scheduler"), cosched) == []
    assert [i.path for i in runtime_issues(gang_spec(queue="research"), cosched)] == ["gang.queue"]
    assert [i.path for i in runtime_issues(gang_spec(scheduler="volcano"), cosched)] == [
        "gang.scheduler"
    ]
    (issue,) = runtime_issues(gang_spec(queue="research"), with_policy(None))
    assert issue.path == "gang"
    assert "no podGroupPolicy" in issue.problem
    # A spec without gang settings asks nothing of the runtime.
    plain = parse_spec({"name": "g", "image": "i", "replicas": {"worker": 2}})
    assert runtime_issues(plain, with_policy(None)) == []
