"""The async registry has every public method of the sync one, with the same signature."""

from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

from kubedl_prefect.registry.mlflow_registry import AsyncModelRegistry, ModelRegistry


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def test_every_sync_method_has_an_async_twin_with_the_same_signature() -> None:
    sync = public_methods(ModelRegistry)
    twins = public_methods(AsyncModelRegistry)
    assert set(twins) == set(sync)
    for name, signature in sync.items():
        assert twins[name] == signature, name
        assert inspect.iscoroutinefunction(getattr(AsyncModelRegistry, name)), name


@pytest.mark.parametrize(
    "module",
    [
        "kubedl_prefect.spec.handoff",
        "kubedl_prefect.registry",
        "kubedl_prefect.registry.compat",
        "kubedl_prefect.registry.gate",
        "kubedl_prefect.registry.lineage",
        "kubedl_prefect.registry.mlflow_registry",
        "kubedl_prefect.registry.uris",
    ],
)
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0
    assert result.failed == 0
