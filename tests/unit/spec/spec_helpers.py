"""Shared paths and builders of the spec tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubedl_prefect.errors import SpecError

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
INVALID = Path(__file__).resolve().parent / "invalid"
GOLDEN = REPO / "tests" / "golden"
V1_DIALECTS = ("kubedl", "kubeflow")
"""The dialects of the v1 operators (a replica spec per role), whose tests loop over both."""

TRAINER_SPECS = Path(__file__).resolve().parent / "trainer"
"""Specs written for the ``trainer`` dialect (runtimes, gang queues, MPI as Trainer runs it)."""

TRAINER_REFUSED = frozenset(
    {"pytorch-elastic.yaml", "pytorch-mnist.yaml", "mpi-horovod.yaml", "tensorflow-mnist.yaml"}
)
"""The examples Trainer v2 cannot run (elastic, TensorFlow, backoffLimit, host network...)."""


def refused(example: Path, dialect: str) -> bool:
    """Whether ``dialect``'s operator refuses the example at ``example`` (by design)."""
    if dialect == "kubedl":
        return example.name == "pytorch-elastic.yaml"
    return dialect == "trainer" and example.name in TRAINER_REFUSED


def minimal(**fields: Any) -> dict[str, Any]:
    """The data of a small valid PyTorch spec, with ``fields`` replacing its own."""
    data: dict[str, Any] = {
        "name": "mnist",
        "image": "busybox:1.36",
        "replicas": {"master": 1, "worker": {"count": 2}},
    }
    data.update(fields)
    return data


def paths(error: SpecError) -> list[str]:
    """The field paths of an error's issues."""
    return [issue.path for issue in error.issues]
