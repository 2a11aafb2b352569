"""A job in a Kueue LocalQueue: labelled for Kueue, created suspended, refused for KubeDL.

Golden files in ``kueue/``, one per Kubeflow kind; regenerate after an intended change with
``UPDATE_GOLDEN=1 uv run pytest tests/unit/spec/test_kueue_render.py`` and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import Dialect, dump_manifests, parse_spec, render, spec_hash
from kubedl_prefect.spec.kueue import (
    PRIORITY_CLASS_LABEL,
    QUEUE_LABEL,
    queued_manifest,
    suspend_field,
)
from kubedl_prefect.spec.porting import import_manifest

GOLDEN = Path(__file__).parent / "kueue"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

SPECS: dict[str, dict[str, Any]] = {
    "pytorch": {
        "name": "mnist",
        "image": "ghcr.io/example/mnist:1.0",
        "replicas": {"master": 1, "worker": 2},
        "labels": {"team": "vision"},
        "kueue": {"queue": "team-a", "priorityClass": "high"},
    },
    "tensorflow": {
        "name": "resnet",
        "framework": "tensorflow",
        "image": "ghcr.io/example/resnet:1.0",
        "replicas": {"chief": 1, "worker": 2},
        "kueue": {"queue": "team-a"},
    },
    "mpi": {
        "name": "horovod",
        "framework": "mpi",
        "image": "ghcr.io/example/horovod:1.0",
        "replicas": {"launcher": 1, "worker": 2},
        "gang": {"queue": "default"},
        "kueue": {"queue": "team-b", "priorityClass": "low"},
    },
    "xgboost": {
        "name": "iris",
        "framework": "xgboost",
        "image": "ghcr.io/example/iris:1.0",
        "replicas": {"master": 1, "worker": 1},
        "kueue": {"queue": "team-a"},
    },
}


#: Kueue manages each of them as a v1 job but the MPIJob (mpi-operator's v2beta1 only): a queued
#: MPI spec renders as a TrainJob.
KUBEFLOW = sorted(name for name in SPECS if name != "mpi")
CASES = [(name, Dialect.KUBEFLOW) for name in KUBEFLOW] + [
    ("pytorch", Dialect.TRAINER),
    ("mpi", Dialect.TRAINER),
]


@pytest.mark.parametrize(("name", "dialect"), CASES, ids=[f"{n}-{d.value}" for n, d in CASES])
def test_a_queued_job_matches_its_golden_file(name: str, dialect: Dialect) -> None:
    rendered = dump_manifests([render(parse_spec(SPECS[name]), dialect)])
    golden = GOLDEN / f"{name}-{dialect.value}.yaml"
    if UPDATE:
        golden.write_text(rendered, encoding="utf-8")
    assert golden.is_file(), f"{golden} is missing: run with UPDATE_GOLDEN=1 and review it"
    assert rendered == golden.read_text(encoding="utf-8")


def test_no_stale_goldens() -> None:
    assert {p.name for p in GOLDEN.glob("*.yaml")} == {f"{n}-{d.value}.yaml" for n, d in CASES}


@pytest.mark.parametrize("name", KUBEFLOW)
def test_the_labels_go_on_the_job_only_and_it_is_created_suspended(name: str) -> None:
    manifest = render(parse_spec(SPECS[name]), Dialect.KUBEFLOW)
    labels = manifest["metadata"]["labels"]
    assert labels[QUEUE_LABEL] == SPECS[name]["kueue"]["queue"]
    assert manifest["spec"]["runPolicy"]["suspend"] is True
    replica_specs = next(v for k, v in manifest["spec"].items() if k.endswith("ReplicaSpecs"))
    for replica in replica_specs.values():
        pod_labels = (replica["template"].get("metadata") or {}).get("labels") or {}
        assert QUEUE_LABEL not in pod_labels
        assert PRIORITY_CLASS_LABEL not in pod_labels


def test_without_a_queue_nothing_changes() -> None:
    data = {k: v for k, v in SPECS["pytorch"].items() if k != "kueue"}
    manifest = render(parse_spec(data), Dialect.KUBEFLOW)
    assert "suspend" not in manifest["spec"]["runPolicy"]
    assert manifest["metadata"]["labels"] == {"team": "vision"}


def test_the_priority_class_is_optional() -> None:
    manifest = render(parse_spec(SPECS["xgboost"]), Dialect.KUBEFLOW)
    assert PRIORITY_CLASS_LABEL not in manifest["metadata"]["labels"]


def test_a_kubedl_job_with_a_queue_is_refused_with_the_reason_and_the_fix() -> None:
    with pytest.raises(SpecError) as refused:
        render(parse_spec(SPECS["pytorch"]), Dialect.KUBEDL)
    (issue,) = refused.value.issues
    assert issue.path == "kueue"
    assert "Kueue does not manage KubeDL" in issue.problem
    assert "team-a" in issue.problem
    assert "--dialect kubeflow" in issue.fix
    assert "remove kueue" in issue.fix


def test_a_queued_v1_mpijob_is_refused_offline_with_the_reason_and_the_fix() -> None:
    # Kueue v0.19.2 makes no Workload for a kubeflow.org/v1 MPIJob: it would wait for ever.
    with pytest.raises(SpecError) as refused:
        render(parse_spec(SPECS["mpi"]), Dialect.KUBEFLOW)
    (issue,) = refused.value.issues
    assert issue.path == "kueue"
    assert "kubeflow.org/v1 MPIJob" in issue.problem
    assert "v2beta1" in issue.problem
    assert "team-b" in issue.problem
    assert "--dialect trainer" in issue.fix
    assert "remove kueue" in issue.fix
    unqueued = {k: v for k, v in SPECS["mpi"].items() if k != "kueue"}
    assert render(parse_spec(unqueued), Dialect.KUBEFLOW)["kind"] == "MPIJob"


@pytest.mark.parametrize(
    ("key", "field"),
    [(QUEUE_LABEL, "queue"), (PRIORITY_CLASS_LABEL, "priorityClass")],
)
def test_kueues_labels_in_labels_are_refused_for_the_kueue_field(key: str, field: str) -> None:
    data = {**SPECS["xgboost"], "labels": {key: "team-a"}}
    with pytest.raises(SpecError) as refused:
        parse_spec(data)
    (issue,) = refused.value.issues
    assert issue.path == f"labels.{key}"
    assert f"kueue: {{{field}: team-a}}" in issue.fix


@pytest.mark.parametrize("bad", ["Team_A", "a" * 64, ""])
def test_queue_names_are_label_values_and_dns_labels(bad: str) -> None:
    with pytest.raises(SpecError):
        parse_spec({**SPECS["xgboost"], "kueue": {"queue": bad}})


def test_the_field_reads_in_camel_case_and_hashes_only_when_set() -> None:
    spec = parse_spec(SPECS["pytorch"])
    assert spec.kueue is not None
    assert spec.kueue.priority_class == "high"
    plain = parse_spec({k: v for k, v in SPECS["pytorch"].items() if k != "kueue"})
    assert spec_hash(plain) != spec_hash(spec)
    assert "kueue" not in plain.model_dump(by_alias=True, exclude_none=True)


def test_a_queued_trainjob_is_created_suspended_and_labelled() -> None:
    manifest = render(parse_spec(SPECS["pytorch"]), Dialect.TRAINER)
    assert manifest["kind"] == "TrainJob"
    assert manifest["spec"]["suspend"] is True
    assert manifest["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    assert manifest["metadata"]["labels"][PRIORITY_CLASS_LABEL] == "high"


def test_each_kind_suspends_where_it_can() -> None:
    assert suspend_field({"apiVersion": "kubeflow.org/v1", "kind": "MPIJob"}) == (
        "spec",
        "runPolicy",
        "suspend",
    )
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "spec": {}}
    assert suspend_field(trainjob) == ("spec", "suspend")
    assert suspend_field({"apiVersion": "training.kubedl.io/v1alpha1", "kind": "TFJob"}) is None
    # The hook a TrainJob renderer calls: spec.suspend, and the labels.
    queued = queued_manifest(trainjob, parse_spec(SPECS["xgboost"]))
    assert queued["spec"]["suspend"] is True
    assert queued["metadata"]["labels"] == {QUEUE_LABEL: "team-a"}


@pytest.mark.parametrize("name", KUBEFLOW)
def test_a_queued_kubeflow_job_imports_back_to_the_same_spec(name: str) -> None:
    spec = parse_spec(SPECS[name])
    imported = import_manifest(render(spec, Dialect.KUBEFLOW))
    assert imported.spec == spec
    assert any("suspend: true is Kueue's" in note.text for note in imported.notes)


def test_a_suspended_job_without_kueues_label_is_still_refused_on_import() -> None:
    data = {k: v for k, v in SPECS["xgboost"].items() if k != "kueue"}
    manifest = render(parse_spec(data), Dialect.KUBEFLOW)
    manifest["spec"]["runPolicy"]["suspend"] = True
    with pytest.raises(SpecError) as refused:
        import_manifest(manifest)
    assert refused.value.issues[0].path == "spec.runPolicy.suspend"
