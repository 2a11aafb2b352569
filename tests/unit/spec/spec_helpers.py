"""Shared paths and builders of the spec tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubedl_prefect.errors import SpecError

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
INVALID = Path(__file__).resolve().parent / "invalid"
GOLDEN = REPO / "tests" / "golden"


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
