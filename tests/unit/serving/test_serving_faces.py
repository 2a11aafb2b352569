"""The sync deployer has every public method of the async one, with the same signature."""

from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

from kubedl_prefect.serving.deploy import InferenceServiceDeployer, SyncInferenceServiceDeployer


def test_every_async_method_has_a_sync_twin_with_the_same_signature() -> None:
    coroutines = {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(
            InferenceServiceDeployer, inspect.iscoroutinefunction
        )
        if not name.startswith("_")
    }
    assert set(coroutines) == {"close", "delete", "deploy", "get", "status"}
    for name, signature in coroutines.items():
        twin = getattr(SyncInferenceServiceDeployer, name)
        assert not inspect.iscoroutinefunction(twin)
        assert inspect.signature(twin) == signature, name


@pytest.mark.parametrize(
    "module",
    [
        "kubedl_prefect.serving",
        "kubedl_prefect.serving.spec",
        "kubedl_prefect.serving.render",
        "kubedl_prefect.serving.readiness",
        "kubedl_prefect.serving.deploy",
        "kubedl_prefect.serving.release",
    ],
)
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0
    assert result.failed == 0
