"""Field paths in messages: ``replicas.worker.env.LR``, ``volumes[0].name``, ``labels['a/b']``.

One spelling for every layer that names a place in a spec or manifest (validation, the reader's
limits, the Pod Security checks), and its inverse for finding the line a path is on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

_PLAIN_KEY: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_PATH_PART: Final = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)|\[(\d+)\]|\['((?:[^'\\]|\\.)*)'\]")


def format_path(loc: Iterable[str | int]) -> str:
    """A dotted field path: ``replicas.worker.resources.requests['nvidia.com/gpu']``.

    Example:
        >>> format_path(["volumes", 0, "hostPath"]), format_path(["labels", "a/b"])
        ('volumes[0].hostPath', "labels['a/b']")
    """
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part == "[key]":
            continue
        elif _PLAIN_KEY.fullmatch(part):
            text += f".{part}" if text else part
        else:
            text += f"[{part!r}]"
    return text or "(document)"


def parse_path(path: str) -> tuple[str | int, ...]:
    """The inverse of :func:`format_path`: ``volumes[0].name`` to ``("volumes", 0, "name")``."""
    return tuple(
        int(index) if index else (quoted if quoted else plain)
        for plain, index, quoted in _PATH_PART.findall(path)
    )
