"""Old public names that still work for one release, with a ``DeprecationWarning``.

A module that renamed public names keeps a table ``{old: new}`` and answers the old names from
its module ``__getattr__`` with :func:`renamed`; the warning names the replacement. A bare name
that changed face (it was a coroutine function and is now the blocking twin, as
``run_to_completion``) asks :func:`called_in_a_loop` and, when the caller runs an event loop,
warns with :func:`warn_face_changed` and hands back its async twin's coroutine, so an old
``await name(...)`` keeps working for the release.
"""

from __future__ import annotations

import asyncio
import importlib
import warnings
from collections.abc import Mapping
from typing import Any


def renamed(module: str, name: str, table: Mapping[str, str]) -> Any:
    """The object an old name ``name`` of ``module`` now has, after warning that it moved.

    Raises:
        AttributeError: ``name`` is no old name of the module.
    """
    new = table.get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(
        f"{module}.{name} is deprecated and goes in the next release; use {module}.{new}",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(importlib.import_module(module), new)


def called_in_a_loop() -> bool:
    """Whether the calling thread runs an event loop (so a blocking call is likely a mistake)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def warn_face_changed(old: str, new: str) -> None:
    """Warn that ``old`` is now the blocking twin and awaiting it is deprecated for ``new``."""
    warnings.warn(
        f"{old} is now blocking; awaiting it from async code is deprecated and goes in the next "
        f"release; await {new} instead",
        DeprecationWarning,
        stacklevel=3,
    )
