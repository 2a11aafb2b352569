"""Rendered manifests against the operators' real CRD schemas (strict, offline).

The CRDs are read from the pinned KubeDL and Kubeflow modules in the Go module cache; the
checker refuses unknown keys where the API server would silently prune them.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from conftest import CrdErrors
from spec_helpers import EXAMPLES, TRAINER_SPECS, refused

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import Dialect, Framework, load_spec, render

RENDERABLE = [
    *(
        (example, dialect)
        for example in sorted(EXAMPLES.glob("*.yaml"))
        for dialect in Dialect
        if not refused(example, dialect.value)
    ),
    *((spec, Dialect.TRAINER) for spec in sorted(TRAINER_SPECS.glob("*.yaml"))),
]


@pytest.mark.parametrize(
    ("example", "dialect"), RENDERABLE, ids=[f"{e.stem}-{d.value}" for e, d in RENDERABLE]
)
def test_examples_pass_the_crd_schema(
    example: Path, dialect: Dialect, crd_errors: CrdErrors
) -> None:
    spec = load_spec(example)
    assert crd_errors(dialect, spec.framework, render(spec, dialect)) == []


def test_elastic_example_is_refused_for_kubedl() -> None:
    spec = load_spec(EXAMPLES / "pytorch-elastic.yaml")
    with pytest.raises(SpecError, match="elastic"):
        render(spec, Dialect.KUBEDL)


@pytest.fixture
def mnist_kubedl() -> dict[str, Any]:
    return render(load_spec(EXAMPLES / "pytorch-mnist.yaml"), Dialect.KUBEDL)


def test_checker_catches_a_misplaced_run_policy(
    mnist_kubedl: dict[str, Any], crd_errors: CrdErrors
) -> None:
    manifest = copy.deepcopy(mnist_kubedl)
    manifest["spec"]["runPolicy"] = {"backoffLimit": manifest["spec"].pop("backoffLimit")}
    errors = crd_errors(Dialect.KUBEDL, Framework.PYTORCH, manifest)
    assert errors == ["spec: Additional properties are not allowed ('runPolicy' was unexpected)"]
    # And the other way round: Kubeflow has no inline run policy.
    assert (
        crd_errors(
            Dialect.KUBEFLOW, Framework.PYTORCH, mnist_kubedl | {"apiVersion": "kubeflow.org/v1"}
        )
        != []
    )


def test_checker_catches_unknown_pod_fields_and_ranges(
    mnist_kubedl: dict[str, Any], crd_errors: CrdErrors
) -> None:
    manifest = copy.deepcopy(mnist_kubedl)
    master = manifest["spec"]["pytorchReplicaSpecs"]["Master"]
    master["replicas"] = 2**31
    master["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    master["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "four"
    errors = crd_errors(Dialect.KUBEDL, Framework.PYTORCH, manifest)
    assert len(errors) == 3
    assert any("2147483648 is greater than the maximum" in e for e in errors)
    assert any("'imagePullPolicyy' was unexpected" in e for e in errors)
    assert any("limits.cpu" in e for e in errors)


def test_checker_accepts_int_or_string_and_checks_list_maps(
    mnist_kubedl: dict[str, Any], crd_errors: CrdErrors
) -> None:
    manifest = copy.deepcopy(mnist_kubedl)
    container = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][
        0
    ]
    container["resources"]["limits"]["cpu"] = 4
    container["ports"] = [{"containerPort": 1, "protocol": "TCP"}]
    assert crd_errors(Dialect.KUBEDL, Framework.PYTORCH, manifest) == []
    container["ports"].append({"containerPort": 1, "protocol": "TCP"})
    errors = crd_errors(Dialect.KUBEDL, Framework.PYTORCH, manifest)
    assert any("duplicate entry for list-map keys" in e for e in errors)


def test_checker_checks_kind_api_version_and_metadata(
    mnist_kubedl: dict[str, Any], crd_errors: CrdErrors
) -> None:
    manifest = copy.deepcopy(mnist_kubedl)
    manifest["kind"] = "TFJob"
    manifest["metadata"]["uid"] = "x"
    errors = crd_errors(Dialect.KUBEDL, Framework.PYTORCH, manifest)
    assert len(errors) == 2
