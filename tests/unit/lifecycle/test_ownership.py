"""The label contract and the run-record ConfigMaps of the Kubernetes wing (pure parts)."""

from __future__ import annotations

import doctest
import json
from types import ModuleType

import pytest

from kubedl_prefect.errors import AdoptionRefusedError
from kubedl_prefect.kube.labels import LABEL_MANAGED_BY, MANAGED_BY
from kubedl_prefect.lifecycle.backend import JobRef
from kubedl_prefect.lifecycle.kubernetes import ownership, record_store
from kubedl_prefect.lifecycle.kubernetes.ownership import (
    LABEL_ATTEMPT,
    LABEL_KEY_HASH,
    LABEL_RECORD,
    adoption_problem,
    attempt_of,
    key_of,
    owner_annotations,
    owner_labels,
    spec_hash_of,
)
from kubedl_prefect.lifecycle.kubernetes.record_store import (
    attempt_data_key,
    parse_record,
    record_object,
)
from kubedl_prefect.lifecycle.records import AttemptRecord
from kubedl_prefect.spec import key_hash


def _job(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, object]:
    return {
        "kind": "PyTorchJob",
        "metadata": {"name": "mnist-a1", "labels": labels, "annotations": annotations},
    }


def test_a_job_of_ours_for_the_same_key_and_spec_is_adopted() -> None:
    job = _job(owner_labels("k", attempt=3), owner_annotations("k", "h1"))
    assert adoption_problem(job, owner_annotations("k", "h1"), "ml") is None
    assert (key_of(job), attempt_of(job), spec_hash_of(job)) == ("k", 3, "h1")


@pytest.mark.parametrize(
    ("labels", "annotations", "wanted", "said"),
    [
        ({}, owner_annotations("k", "h1"), owner_annotations("k", "h1"), "not created"),
        (
            owner_labels("k"),
            owner_annotations("other", "h1"),
            owner_annotations("k", "h1"),
            "not created",
        ),
        (
            owner_labels("k"),
            owner_annotations("k", "h0"),
            owner_annotations("k", "h1"),
            "another spec",
        ),
    ],
    ids=["foreign", "other-key", "other-spec"],
)
def test_refusals_say_why(
    labels: dict[str, str], annotations: dict[str, str], wanted: dict[str, str], said: str
) -> None:
    problem = adoption_problem(_job(labels, annotations), wanted, "ml")
    assert isinstance(problem, AdoptionRefusedError)
    assert said in problem.message
    assert "ml/mnist-a1" in problem.message
    assert problem.hint


def test_owner_labels_carry_the_managed_by_label_and_the_key_hash() -> None:
    labels = owner_labels("nightly@slot", attempt=1)
    assert labels[LABEL_MANAGED_BY] == MANAGED_BY
    assert labels[LABEL_KEY_HASH] == key_hash("nightly@slot")
    assert labels[LABEL_ATTEMPT] == "1"
    assert LABEL_ATTEMPT not in owner_labels("nightly@slot")


def test_a_record_reads_back_what_was_written() -> None:
    ref = JobRef(
        "kubernetes",
        "https://c",
        "kubedl",
        "ml",
        "mnist-ab12-a2",
        "u2",
        "training.kubedl.io/v1alpha1",
        "PyTorchJob",
        "k",
        2,
        "h1",
    )
    entries = {
        attempt_data_key(n): AttemptRecord(attempt=n, name=f"mnist-ab12-a{n}", uid=f"u{n}")
        for n in (2, 1)
    }
    obj = record_object(
        "mnist-ab12", ref, "mnist", {k: json.dumps(v.to_dict()) for k, v in entries.items()}
    )
    obj["data"]["unrelated"] = "x"
    obj["data"][attempt_data_key(9)] = "{not json"
    assert obj["metadata"]["labels"][LABEL_RECORD] == "true"
    record = parse_record(obj)
    assert (record.spec_name, record.key, record.spec_hash) == ("mnist", "k", "h1")
    assert [a.attempt for a in record.attempts] == [1, 2]


@pytest.mark.parametrize("module", [ownership, record_store])
def test_docstring_examples(module: ModuleType) -> None:
    result = doctest.testmod(module, raise_on_error=False)
    assert result.attempted > 0
    assert result.failed == 0
