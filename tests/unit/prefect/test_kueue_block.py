"""The training-job block carries the Kueue queue: in its spec, refused for KubeDL at once."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kubedl_prefect.prefect.blocks import TrainingJob

SPEC = {
    "name": "mnist",
    "image": "ghcr.io/example/mnist:1.0",
    "replicas": {"master": 1, "worker": 2},
    "kueue": {"queue": "team-a", "priorityClass": "high"},
}


def test_the_block_carries_the_local_queue_and_the_priority_class() -> None:
    block = TrainingJob(spec=SPEC, dialect="kubeflow")
    kueue = block.training_spec().kueue
    assert kueue is not None
    assert (kueue.queue, kueue.priority_class) == ("team-a", "high")


def test_a_kubedl_block_with_a_kueue_queue_is_refused_with_the_reason() -> None:
    with pytest.raises(ValidationError, match="Kueue does not manage KubeDL"):
        TrainingJob(spec=SPEC, dialect="kubedl")
