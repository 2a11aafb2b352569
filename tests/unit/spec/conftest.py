"""Fixtures of the spec tests: the strict CRD checker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from crd_schema import CRDSchema

from kubedl_prefect.spec import Dialect, Framework

CrdErrors = Callable[[Dialect, Framework, dict[str, Any]], list[str]]


@pytest.fixture(scope="session")
def crd_errors() -> CrdErrors:
    """``crd_errors(dialect, framework, manifest)``: strict CRD-schema violations."""

    def check(dialect: Dialect, framework: Framework, manifest: dict[str, Any]) -> list[str]:
        return CRDSchema.for_kind(dialect, framework).errors(manifest)

    return check
