"""The exception tree survives pickling (Prefect states, process boundaries), whole.

The classes are discovered, not listed: every subclass of ``KubeDLPrefectError`` defined anywhere
in the package (all its modules are imported first) is built from its constructor's type hints
and round-tripped, so a new error is covered the day it is added.
"""

from __future__ import annotations

import copy
import doctest
import importlib
import inspect
import json
import pickle
import pkgutil
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kubedl_prefect
import kubedl_prefect.errors
from kubedl_prefect.errors import (
    RETRYABLE_CATEGORIES,
    Diagnosis,
    FailureCategory,
    JobFailedError,
    KubeDLPrefectError,
    SpecError,
    SpecIssue,
    UnpicklableCause,
    WaitTimeoutError,
)


def import_every_module() -> dict[str, str]:
    """Import all modules of the package; return the ones that failed, with the error."""
    failed: dict[str, str] = {}
    infos = pkgutil.walk_packages(
        kubedl_prefect.__path__, "kubedl_prefect.", onerror=lambda name: failed.setdefault(name, "")
    )
    for info in infos:
        if info.name.endswith(".__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            failed[info.name] = f"{type(exc).__name__}: {exc}"
    return failed


IMPORT_FAILURES = import_every_module()


def error_classes(root: type[KubeDLPrefectError]) -> list[type[KubeDLPrefectError]]:
    """``root`` and all its subclasses, recursively, in a stable order."""
    found: dict[str, type[KubeDLPrefectError]] = {}
    stack = [root]
    while stack:
        cls = stack.pop()
        found[f"{cls.__module__}.{cls.__qualname__}"] = cls
        stack.extend(cls.__subclasses__())
    return [found[name] for name in sorted(found)]


CLASSES = error_classes(KubeDLPrefectError)


def argument_strategy(hint: Any) -> st.SearchStrategy[Any]:
    if hint is float:
        return st.floats(allow_nan=False)
    return st.from_type(hint)


def builds_error(cls: type[KubeDLPrefectError]) -> st.SearchStrategy[KubeDLPrefectError]:
    """Instances of ``cls`` with every constructor argument drawn from its type hint."""
    init = cls.__init__
    hints = typing.get_type_hints(init)
    arguments: dict[str, st.SearchStrategy[Any]] = {}
    for name, parameter in inspect.signature(init).parameters.items():
        if name == "self" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        assert name in hints, f"{cls.__qualname__}.__init__ has no type hint for {name!r}"
        strategy = argument_strategy(hints[name])
        if parameter.default is not parameter.empty:
            strategy = st.just(parameter.default) | strategy
        arguments[name] = strategy
    return st.builds(cls, **arguments)


class KeywordOnlyCause(Exception):
    """A foreign error that pickles but cannot be unpickled (as many libraries' errors)."""

    def __init__(self, *, detail: str) -> None:
        super().__init__(f"detail: {detail}")


def unpicklable_cause(text: str) -> Exception:
    class LocalError(Exception):  # a local class cannot be found by pickle
        pass

    return LocalError(text)


causes: st.SearchStrategy[BaseException | None] = st.one_of(
    st.none(),
    st.builds(ValueError, st.text()),
    st.builds(OSError, st.integers(0, 200), st.text()),
    st.builds(lambda d: KeywordOnlyCause(detail=d), st.text()),
    st.builds(unpicklable_cause, st.text()),
    st.sampled_from(CLASSES).flatmap(builds_error),
)


def assert_same_error(restored: BaseException, original: BaseException) -> None:
    assert type(restored) is type(original)
    assert str(restored) == str(original)
    assert restored.args == original.args
    if isinstance(original, KubeDLPrefectError):
        assert isinstance(restored, KubeDLPrefectError)
        assert restored.message == original.message
        assert restored.hint == original.hint
        assert restored.retryable is original.retryable
    # Every field a subclass adds (issues, status, timeout_s, diagnosis, attempts...).
    assert vars(restored) == vars(original)


def test_every_module_could_be_searched_for_errors() -> None:
    assert IMPORT_FAILURES == {}


def test_discovery_finds_the_whole_tree() -> None:
    names = {cls.__name__ for cls in CLASSES}
    assert {"KubeDLPrefectError", "SpecError", "AdoptionRefusedError", "WaitTimeoutError"} <= names
    assert {"AdmissionTimeoutError", "CompletionTimeoutError", "JobFailedError"} <= names
    declared = {
        obj
        for obj in vars(kubedl_prefect.errors).values()
        if isinstance(obj, type) and issubclass(obj, KubeDLPrefectError)
    }
    assert declared <= set(CLASSES)


@pytest.mark.parametrize("cls", CLASSES, ids=[cls.__qualname__ for cls in CLASSES])
@settings(max_examples=30, deadline=None)
@given(data=st.data(), protocol=st.integers(0, pickle.HIGHEST_PROTOCOL))
def test_every_error_round_trips_pickle(
    cls: type[KubeDLPrefectError], data: st.DataObject, protocol: int
) -> None:
    error = data.draw(builds_error(cls), label="error")
    cause = data.draw(causes, label="cause")
    if cause is not None:
        error.__cause__ = cause
    restored = pickle.loads(pickle.dumps(error, protocol=protocol))
    assert_same_error(restored, error)
    assert copy.deepcopy(error).args == error.args
    if cause is None:
        assert restored.__cause__ is None
    elif isinstance(cause, KeywordOnlyCause) or type(cause).__name__ == "LocalError":
        assert isinstance(restored.__cause__, UnpicklableCause)
        kind = type(cause)
        assert str(restored.__cause__) == f"{kind.__module__}.{kind.__qualname__}: {cause}"
    else:
        assert restored.__cause__ is not None
        assert_same_error(restored.__cause__, cause)
    assert restored.__suppress_context__ is (cause is not None)


def test_wait_timeout_error_with_keyword_only_fields_unpickles() -> None:
    error = WaitTimeoutError("gave up", timeout_s=30.0, last_reason="Unschedulable", hint="wait")
    error.add_note("attempt 2")
    restored = pickle.loads(pickle.dumps(error))
    assert (restored.timeout_s, restored.last_reason, restored.phase) == (
        30.0,
        "Unschedulable",
        "wait",
    )
    assert restored.__notes__ == ["attempt 2"]


def test_spec_error_keeps_its_issues_and_source() -> None:
    error = SpecError([SpecIssue("name", "too long", "shorten it")], source="x.yaml")
    restored = pickle.loads(pickle.dumps(error))
    assert restored.issues == error.issues
    assert restored.source == "x.yaml"
    assert str(restored).startswith("1 problem in the training-job spec in x.yaml:")


def test_a_raised_and_chained_error_keeps_its_cause() -> None:
    try:
        try:
            raise ConnectionResetError(104, "reset by peer")
        except ConnectionResetError as inner:
            raise JobFailedError("lost", retryable=True, attempts=2) from inner
    except JobFailedError as outer:
        restored = pickle.loads(pickle.dumps(outer))
    assert isinstance(restored.__cause__, ConnectionResetError)
    assert restored.__cause__.errno == 104
    assert restored.retryable is True
    assert restored.attempts == 2


diagnoses = st.builds(
    Diagnosis,
    category=st.sampled_from(FailureCategory),
    retryable=st.booleans(),
    replica=st.none() | st.text(),
    exit_code=st.none() | st.integers(-(2**31), 2**31 - 1),
    message=st.text(),
    hint=st.text(),
)


@given(diagnoses)
def test_diagnosis_to_dict_is_plain_json_and_reads_back(diagnosis: Diagnosis) -> None:
    data = diagnosis.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert Diagnosis.from_dict(json.loads(json.dumps(data))) == diagnosis


@given(diagnoses)
def test_job_failed_error_carries_a_typed_diagnosis(diagnosis: Diagnosis) -> None:
    error = JobFailedError("failed", retryable=diagnosis.retryable, diagnosis=diagnosis)
    restored = pickle.loads(pickle.dumps(error))
    assert restored.diagnosis == diagnosis
    assert restored.diagnosis is not None
    assert restored.diagnosis.category is diagnosis.category


def test_an_unknown_category_reads_as_unknown() -> None:
    data = Diagnosis(FailureCategory.KILLED, True, "worker-0", 137, "killed", "resume").to_dict()
    data["category"] = "FutureCategory"  # written by a version that knows more categories
    diagnosis = Diagnosis.from_dict(data)
    assert diagnosis.category is FailureCategory.UNKNOWN
    assert diagnosis.retryable is True
    assert diagnosis.exit_code == 137


@pytest.mark.parametrize(
    "change",
    [
        {"category": None},
        {"retryable": "yes"},
        {"exitCode": "137"},
        {"exitCode": True},
        {"replica": 3},
        {"message": None},
    ],
)
def test_a_malformed_record_is_refused(change: dict[str, Any]) -> None:
    data = Diagnosis(FailureCategory.EVICTED, True, None, None, "evicted", "resume").to_dict()
    data.update(change)
    with pytest.raises(ValueError, match="not a recorded diagnosis"):
        Diagnosis.from_dict(data)


@pytest.mark.parametrize("missing", ["category", "retryable", "message", "hint"])
def test_a_record_without_a_required_field_is_refused(missing: str) -> None:
    data = Diagnosis(FailureCategory.EVICTED, True, None, None, "evicted", "resume").to_dict()
    del data[missing]
    with pytest.raises(ValueError, match=missing):
        Diagnosis.from_dict(data)


def test_the_lifecycle_re_exports_the_same_types() -> None:
    from kubedl_prefect.lifecycle import diagnosis

    assert diagnosis.Diagnosis is Diagnosis
    assert diagnosis.FailureCategory is FailureCategory
    assert diagnosis.RETRYABLE_CATEGORIES is RETRYABLE_CATEGORIES
    verdict = diagnosis.diagnose({"status": {}}, pods=[])
    assert isinstance(verdict, Diagnosis)
    assert verdict.retryable is (verdict.category in RETRYABLE_CATEGORIES)


def test_docstring_examples() -> None:
    result = doctest.testmod(kubedl_prefect.errors, raise_on_error=False)
    assert result.attempted > 0
    assert result.failed == 0
