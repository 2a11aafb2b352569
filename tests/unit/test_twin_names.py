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


def makes_tasks(value: Any) -> bool:
    """Whether ``value`` is a task decorator (``distributed_task``): its face is its tasks'."""
    if not inspect.isfunction(value):
        return False
    return "Task[" in str(inspect.signature(value).return_annotation)


def decorated(decorator: Any) -> Any:
    """What ``decorator`` makes of a plain function."""

    def step(epochs: int) -> int:
        return epochs

    return decorator(step)


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
        if makes_tasks(value):
            # A decorator's face is its tasks': a coroutine task from the ``a`` one.
            assert is_async(decorated(value)) is name.startswith("a"), f"{module_name}.{name}"
            twin = names.get(name[1:]) if name.startswith("a") else None
            if twin is not None:
                assert makes_tasks(twin), name[1:]
                assert not is_async(decorated(twin)), name[1:]
                assert list(inspect.signature(twin).parameters.values()) == list(
                    inspect.signature(value).parameters.values()
                ), name
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


def test_a_task_decorator_and_its_twin_make_the_same_task_with_each_face() -> None:
    """``distributed_task``/``adistributed_task``: same options, same task, sync vs coroutine."""
    prefect_names = public("kubedl_prefect.prefect")
    sync_task = decorated(prefect_names["distributed_task"])
    async_task = decorated(prefect_names["adistributed_task"])
    assert not is_async(sync_task)
    assert is_async(async_task)
    assert sync_task.name == async_task.name == "step"
    assert inspect.signature(sync_task.fn) == inspect.signature(async_task.fn)
    for option in ("retries", "retry_delay_seconds", "retry_condition_fn", "cache_policy"):
        assert getattr(sync_task, option) == getattr(async_task, option), option


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


def _methods(cls: type) -> dict[str, Any]:
    return {
        name: member
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_")
        and inspect.isfunction(member)
        # Old names kept for one release (they warn; see RENAMED) are not part of the rule.
        and not (member.__doc__ or "").startswith("Deprecated")
    }


def _parameters(function: Any) -> list[inspect.Parameter]:
    return list(inspect.signature(function).parameters.values())


def _public_classes() -> dict[str, type]:
    classes: dict[str, type] = {}
    for module_name in FACADES:
        for value in public(module_name).values():
            if inspect.isclass(value) and value.__module__.startswith("kubedl_prefect"):
                classes[f"{value.__module__}.{value.__qualname__}"] = value
    return classes


@pytest.mark.parametrize("qualname", sorted(_public_classes()))
def test_twin_methods_of_a_class_share_signatures(qualname: str) -> None:
    """``X``/``aX`` methods of one class (``TrainingJob.start``/``astart``): same signature."""
    methods = _methods(_public_classes()[qualname])
    for name, method in methods.items():
        assert not FORBIDDEN.search(name), f"{qualname}.{name}"
        twin = methods.get(f"a{name}")
        if twin is None or not is_async(twin) or is_async(method):
            continue
        # Parameters alike; the results may be each other's faces (SyncTrainingJobRun, ...).
        assert _parameters(method) == _parameters(twin), f"{qualname}.{name}"


@pytest.mark.parametrize(
    "qualname",
    sorted(q for q, c in _public_classes().items() if re.match(r"(Sync|Async)[A-Z]", c.__name__)),
)
def test_a_facade_gives_its_class_the_other_face_with_the_same_signatures(qualname: str) -> None:
    facade = _public_classes()[qualname]
    primary_name = re.sub(r"^(Sync|Async)", "", facade.__name__)
    primaries = [c for c in _public_classes().values() if c.__name__ == primary_name]
    assert primaries, f"{qualname} faces no {primary_name}"
    wants_async = facade.__name__.startswith("Async")
    faced = _methods(primaries[0])
    shared = sorted(set(_methods(facade)) & set(faced))
    assert shared, f"{qualname} shares no method with {primary_name}"
    for name in shared:
        method = _methods(facade)[name]
        if is_async(faced[name]) == is_async(method):
            continue  # a method both faces run the same way (a pure helper)
        assert is_async(method) is wants_async, f"{qualname}.{name}"
        assert _parameters(method) == _parameters(faced[name]), f"{qualname}.{name}"
