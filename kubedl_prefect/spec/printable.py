"""The characters YAML text may hold, and PyYAML imported without compiling its own check of them.

YAML allows only printable characters in a stream (tab, line feed, carriage return, U+0020 to
U+007E, NEL, U+00A0 to U+D7FF, U+E000 to U+FFFD and the planes above). PyYAML's pure-Python
reader checks them with a character class that its module compiles at import
(:data:`PYYAML_NON_PRINTABLE`); Python's regular-expression compiler walks every code point of
that class's ranges below U+FFFF to build it, which is about a sixteenth of all the work a
``kubedl-prefect validate`` does (valgrind counts 52 of its 828 million instructions). The spec
layer parses with libyaml and never uses that reader, but cannot import PyYAML without it.

:data:`NON_PRINTABLE` is the same set written as what it matches (every character outside the
printable ranges: two thousand code points to walk instead of sixty thousand), and
:func:`share_with_pyyaml` puts it in :mod:`re`'s cache under PyYAML's pattern, so that PyYAML's
import finds it compiled. The spec package calls it when it is imported, before any of its
modules imports PyYAML; where PyYAML is already imported it changes nothing.
``tests/unit/spec/test_printable.py`` checks that both match the same characters and that
PyYAML's reader gets this one.
"""

from __future__ import annotations

import re
from typing import Final

NON_PRINTABLE: Final = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]"
)
"""One character YAML text may not hold: a control character, a surrogate, U+FFFE or U+FFFF."""

PYYAML_NON_PRINTABLE: Final = (
    "[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"
)
"""The pattern of PyYAML's ``yaml.reader.Reader.NON_PRINTABLE`` (PyYAML 6), as it writes it."""


def share_with_pyyaml() -> None:
    """Let PyYAML's import take :data:`NON_PRINTABLE` for its own pattern from :mod:`re`'s cache.

    A cache entry only: when PyYAML is imported already, or a later Python keeps its cache
    otherwise, PyYAML compiles its pattern as before.
    """
    cache = getattr(re, "_cache", None)
    if isinstance(cache, dict):
        cache.setdefault((str, PYYAML_NON_PRINTABLE, 0), NON_PRINTABLE)
