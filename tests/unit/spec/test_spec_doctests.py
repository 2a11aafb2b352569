"""The examples in the spec package's docstrings run and hold."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import kubedl_prefect.spec

MODULES = [
    "kubedl_prefect.spec",
    *(
        info.name
        for info in pkgutil.walk_packages(kubedl_prefect.spec.__path__, "kubedl_prefect.spec.")
    ),
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), raise_on_error=False)
    assert result.failed == 0
