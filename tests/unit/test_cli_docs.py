"""The console examples of docs/cli.md, run: what the page shows is what the command prints.

Each ``$ kubedl-prefect ...`` line of a ``console`` block whose command works on files alone
(``render``, ``validate``, ``import``, ``--version``; no pipe) is run in the repository root,
with ``< FILE`` as its standard input, and its output (stdout and stderr, in order) must match
the lines under it. In those lines ``...`` stands for any text, a line of its own ``...`` for
any lines, and ``<word>`` for one word (``<hash>``). Examples of ``status``, ``logs`` and
``cancel`` need a job: tests/unit/test_cli_runs.py runs those commands.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kubedl_prefect.cli import app

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "cli.md"
RUN = ("render", "validate", "import", "--version")


@dataclass(frozen=True)
class Example:
    line: int
    command: str
    output: list[str]


def examples() -> list[Example]:
    found: list[Example] = []
    lines = PAGE.read_text().splitlines()
    in_console = False
    current: Example | None = None
    for number, line in enumerate(lines, start=1):
        if line.startswith("```"):
            in_console = line == "```console" and not in_console
            current = None
            continue
        if not in_console:
            continue
        if line.startswith("$ "):
            current = Example(number, line[2:], [])
            words = shlex.split(current.command)
            if words[0] == "kubedl-prefect" and words[1] in RUN and "|" not in words:
                found.append(current)
        elif current is not None:
            current.output.append(line)
    return found


def pattern(expected: list[str]) -> re.Pattern[str]:
    parts = []
    for line in expected:
        if line == "...":
            parts.append(r"(?:.*\n)*")
            continue
        text = re.escape(line).replace(r"\.\.\.", ".*")
        parts.append(re.sub(r"<[a-z-]+>", r"\\S+", text) + r"\n")
    return re.compile("".join(parts))


EXAMPLES = examples()


def test_the_page_has_examples_to_run() -> None:
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"cli.md:{e.line}" for e in EXAMPLES])
def test_console_example(example: Example, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    words = shlex.split(example.command)[1:]
    given = None
    if "<" in words:
        at = words.index("<")
        given = (REPO / words[at + 1]).read_text()
        words = words[:at] + words[at + 2 :]
    result = CliRunner().invoke(app, words, input=given, prog_name="kubedl-prefect")
    assert pattern(example.output).fullmatch(result.output), (
        f"{example.command}\n--- printed:\n{result.output}--- the page shows:\n"
        + "\n".join(example.output)
    )
