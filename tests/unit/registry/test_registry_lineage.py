from __future__ import annotations

from kubedl_prefect.lifecycle.backend import JobRef
from kubedl_prefect.registry.lineage import (
    TAG_ATTEMPT,
    TAG_FLOW_RUN,
    TAG_IMAGE,
    TAG_JOB_NAME,
    TAG_JOB_UID,
    TAG_NAMESPACE,
    TAG_SPEC_HASH,
    Lineage,
    lineage_tags,
    recorded_metrics,
)
from kubedl_prefect.spec import parse_spec

REF = JobRef(
    backend="kubernetes",
    cluster="https://127.0.0.1:6443",
    dialect="kubedl",
    namespace="ml",
    name="mnist-x7k2m9q4ab3c-a2",
    uid="0f1e",
    api_version="training.kubedl.io/v1alpha1",
    kind="PyTorchJob",
    key="nightly",
    attempt=2,
    spec_hash="ab12",
)


def test_lineage_of_a_job_names_its_attempt_and_images() -> None:
    spec = parse_spec(
        {
            "name": "mnist",
            "image": "ghcr.io/x/mnist:1",
            "replicas": {"master": 1, "worker": {"count": 2, "image": "ghcr.io/x/worker:1"}},
        }
    )
    tags = lineage_tags(Lineage.of(REF, spec, flow_run_id="f-1"), {"accuracy": 0.9, "loss": 0.1})
    assert tags[TAG_NAMESPACE] == "ml"
    assert tags[TAG_JOB_NAME] == "mnist-x7k2m9q4ab3c-a2"
    assert tags[TAG_JOB_UID] == "0f1e"
    assert tags[TAG_ATTEMPT] == "2"
    assert tags[TAG_IMAGE] == "ghcr.io/x/mnist:1,ghcr.io/x/worker:1"
    assert tags[TAG_SPEC_HASH] == "ab12"
    assert tags[TAG_FLOW_RUN] == "f-1"
    assert recorded_metrics(tags) == {"accuracy": 0.9, "loss": 0.1}


def test_unset_optional_fields_are_left_out() -> None:
    lineage = Lineage("ml", "j", "u", 1, "img", "h")
    assert TAG_FLOW_RUN not in lineage_tags(lineage)
