"""One naming rule for sync and async twins (docs/architecture.md, "Sync and async").

Functions: the bare name is sync; a coroutine function is ``a`` + its sync twin's name, with the
same signature. Classes: the class that does the work has the bare name; a facade giving it the
other face is ``Sync`` + name (blocking over an async class) or ``Async`` + name (awaitable over
a sync one). Old names answer for one release with a DeprecationWarning naming the new one.
"""

from __future__ import annotations

import importlib
import inspect
import re
import warnings
from typing import Any

import pytest

FACADES = [
    "kubedl_prefect",
    "kubedl_prefect.prefect",
    "kubedl_prefect.serving",
    "kubedl_prefect.registry",
    "kubedl_prefect.spec",
    "kubedl_prefect.lifecycle.kubernetes",
    "kubedl_prefect.lifecycle.local",
    "kubedl_prefect.testbed",
    "kubedl_prefect.prefect.collection",
    "kubedl_prefect.registry.mlflow_registry",
    "kubedl_prefect.serving.local",
]
FORBIDDEN = re.compile(r"_sync$|^await_|_async$|^async_|^run_sync$")


def public(module_name: str) -> dict[str, Any]:
    module = importlib.import_module(module_name)
    return {name: getattr(module, name) for name in module.__all__}


def function_of(value: Any) -> Any:
    """The plain function behind a Prefect task, or the value itself."""
    return getattr(value, "fn", value)


def is_async(value: Any) -> bool:
    fn = function_of(value)
    return inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)


@pytest.mark.parametrize("module_name", FACADES)
def test_public_names_follow_the_twin_rule(module_name: str) -> None:
    names = public(module_name)
    for name, value in names.items():
        assert not FORBIDDEN.search(name), f"{module_name}.{name}"
        if inspect.isclass(value):
            for prefix in ("Sync", "Async"):
                if re.match(rf"{prefix}[A-Z]", name):
                    primary = name.removeprefix(prefix)
                    assert primary in names, f"{module_name}.{name} faces no {primary}"
            continue
        if not callable(value):
            continue
        if is_async(value):
            assert name.startswith("a"), f"{module_name}.{name} is async: name it a<sync name>"
            twin = names.get(name[1:])
            if twin is not None:
                assert not is_async(twin), f"{module_name}.{name[1:]}"
                assert inspect.signature(function_of(twin)) == inspect.signature(
                    function_of(value)
                ), name
        elif f"a{name}" in names:
            assert is_async(names[f"a{name}"]), f"{module_name}.a{name}"


def test_the_facades_export_both_faces_of_each_twin() -> None:
    top = public("kubedl_prefect")
    assert not is_async(top["run_to_completion"])
    assert is_async(top["arun_to_completion"])
    assert inspect.signature(top["run_to_completion"]) == inspect.signature(
        top["arun_to_completion"]
    )


RENAMED = [
    ("kubedl_prefect", "SyncBackend", "SyncTrainingBackend"),
    ("kubedl_prefect.lifecycle.backend", "SyncBackend", "SyncTrainingBackend"),
    ("kubedl_prefect", "run_to_completion_sync", "run_to_completion"),
    ("kubedl_prefect", "attach", "areattach"),
    ("kubedl_prefect.lifecycle.retry", "run_to_completion_sync", "run_to_completion"),
    ("kubedl_prefect.lifecycle.run", "attach", "areattach"),
    ("kubedl_prefect.prefect", "wait_for_admission", "watch_admission"),
    ("kubedl_prefect.prefect", "await_for_admission", "awatch_admission"),
    ("kubedl_prefect.prefect", "wait_for_completion", "watch_completion"),
    ("kubedl_prefect.prefect", "await_for_completion", "awatch_completion"),
    ("kubedl_prefect.prefect", "delete_flow_run_jobs", "adelete_flow_run_jobs"),
    ("kubedl_prefect.prefect.tasks", "wait_for_admission", "watch_admission"),
    ("kubedl_prefect.prefect.tasks", "await_for_admission", "awatch_admission"),
    ("kubedl_prefect.prefect.tasks", "wait_for_completion", "watch_completion"),
    ("kubedl_prefect.prefect.tasks", "await_for_completion", "awatch_completion"),
    ("kubedl_prefect.prefect.cleanup", "delete_flow_run_jobs", "adelete_flow_run_jobs"),
]


@pytest.mark.parametrize(("module_name", "old", "new"), RENAMED)
def test_an_old_name_warns_and_resolves_to_the_new_object(
    module_name: str, old: str, new: str
) -> None:
    module = importlib.import_module(module_name)
    with pytest.warns(DeprecationWarning, match=rf"use {re.escape(module_name)}\.{new}\b"):
        value = getattr(module, old)
    assert value is getattr(module, new)
    assert old not in getattr(module, "__all__", [])


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    module = importlib.import_module("kubedl_prefect.prefect.tasks")
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018


def test_awaiting_the_old_async_run_to_completion_warns_and_still_works() -> None:
    import asyncio

    from kubedl_prefect.lifecycle import retry

    seen: list[str] = []

    async def fake(*args: Any, **kwargs: Any) -> str:
        seen.append(kwargs["key"])
        return "outcome"

    async def old_caller() -> Any:
        with pytest.warns(DeprecationWarning, match="await arun_to_completion"):
            pending = retry.run_to_completion(None, None, key="k")  # type: ignore[arg-type]
        return await pending

    original = retry.arun_to_completion
    retry.arun_to_completion = fake  # type: ignore[assignment]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert asyncio.run(old_caller()) == "outcome"
    finally:
        retry.arun_to_completion = original  # type: ignore[assignment]
    assert seen == ["k"]
