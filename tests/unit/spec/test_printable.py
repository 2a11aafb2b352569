"""PyYAML's import takes the spec layer's check of printable characters: the same characters."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from kubedl_prefect.spec.printable import NON_PRINTABLE, PYYAML_NON_PRINTABLE


def test_it_matches_what_pyyamls_own_pattern_matches() -> None:
    # Compiled afresh (re.UNICODE, a str pattern's default, makes another cache key).
    theirs = re.compile(PYYAML_NON_PRINTABLE, re.UNICODE)
    every = "".join(map(chr, range(sys.maxunicode + 1)))
    ours = [match.start() for match in NON_PRINTABLE.finditer(every)]
    assert ours == [match.start() for match in theirs.finditer(every)]
    assert len(ours) == 2111  # C0 but tab and line breaks, DEL, C1 but NEL, surrogates, FFFE/F


def test_pyyaml_gets_it_when_the_spec_layer_comes_first() -> None:
    # A fresh interpreter, as the command line starts: PyYAML's reader holds our pattern, so
    # PyYAML 6 still writes its pattern as PYYAML_NON_PRINTABLE (else it compiles its own).
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import kubedl_prefect.spec.reader, yaml\n"
            "from kubedl_prefect.spec.printable import NON_PRINTABLE\n"
            "print(yaml.reader.Reader.NON_PRINTABLE is NON_PRINTABLE)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == "True", done.stderr


@pytest.mark.parametrize("text", ["a: \x07\n", "a: b\ufffe\n", "a: \x85\x9f\n"])
def test_pyyamls_own_reader_still_refuses_them(text: str) -> None:
    with pytest.raises(yaml.reader.ReaderError, match="unacceptable character"):
        yaml.load(text, Loader=yaml.SafeLoader)  # the pure-Python reader, not libyaml


def test_pyyamls_own_reader_still_takes_printable_text() -> None:
    text = 'a: "\t\u00e9\u2603\U0001f600\ud7ff\ue000\ufffd"\n'
    assert yaml.load(text, Loader=yaml.SafeLoader) == {"a": text[4:-2]}
