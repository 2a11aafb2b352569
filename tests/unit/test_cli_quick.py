"""The console script's quick path: the same output and exit codes as the typer app, or none."""

from __future__ import annotations

import doctest
import io
import sys
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from kubedl_prefect.cli import ExitCode, app, quick, specs
from kubedl_prefect.cli.quick import CommandLine, parse, run_quickly

REPO = Path(__file__).resolve().parents[2]
MNIST = "examples/pytorch-mnist.yaml"
INVALID = "tests/unit/spec/invalid"

ROOT_SPEC = """\
name: mnist
image: ghcr.io/example/mnist:1.0
replicas:
  master: 1
  worker:
    count: 2
    podTemplate:
      spec:
        securityContext: {runAsUser: 0}
"""


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The repository as the working directory, and a few specs of our own under tmp_path."""
    monkeypatch.chdir(REPO)
    (tmp_path / "root.yaml").write_text(ROOT_SPEC)
    return tmp_path


# Command lines the quick path runs; {tmp} is the workspace's folder.
QUICK_LINES = [
    ["validate", MNIST],
    ["validate", MNIST, "-d", "KubeDL"],
    ["validate", f"{INVALID}/misspelt-field.yaml", MNIST],
    ["validate", f"{INVALID}/name-too-long.yaml", "--dialect=kubeflow", "-o", "json"],
    ["validate", "{tmp}/root.yaml", "{tmp}/missing.yaml", "--output", "json"],
    ["validate", "{tmp}/missing.yaml"],
    ["validate", "{tmp}/\x1b[31mred.yaml"],
    ["validate", "-"],
    ["render", MNIST, "-d", "kubedl"],
    ["render", "--dialect", "trainer", MNIST, "examples/xgboost-iris.yaml"],
    ["render", MNIST, "-d", "kubeflow", "--name-key", "nightly", "--attempt", "07", "-n", "ml"],
    ["render", MNIST, "{tmp}/root.yaml", "-d", "kubeflow", "-o", "json"],
    ["render", f"{INVALID}/misspelt-field.yaml", MNIST, "-d", "kubedl"],
    ["render", "-", "-d", "kubedl", "--output=JSON"],
]


def _lines(args: list[str], tmp: Path) -> list[str]:
    return [arg.replace("{tmp}", str(tmp)) for arg in args]


@pytest.mark.parametrize("args", QUICK_LINES, ids=lambda args: " ".join(args))
def test_the_quick_path_prints_what_the_typer_app_prints(
    args: list[str],
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = _lines(args, workspace)
    stdin = (REPO / MNIST).read_bytes()
    expected = CliRunner().invoke(app, argv, input=stdin)
    assert expected.exception is None or isinstance(expected.exception, SystemExit)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = run_quickly(argv)
    out, err = capsys.readouterr()
    assert (code, out, err) == (expected.exit_code, expected.stdout, expected.stderr)


def test_the_quick_path_strips_colour_sequences_off_a_terminal(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_quickly(["validate", str(workspace / "\x1b[31mred.yaml")]) == ExitCode.USAGE
    assert (
        capsys.readouterr().err
        == f"error: cannot read {workspace}/red.yaml: No such file or directory\n"
    )


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--version"],
        ["--help"],
        ["import", MNIST],
        ["validate"],
        ["validate", "--help"],
        ["validate", MNIST, "--bogus"],
        ["validate", MNIST, "-d"],
        ["validate", MNIST, "-d", "kubdl"],
        ["validate", MNIST, "-d", "kubedl", "-d", "kubeflow"],
        ["validate", MNIST, "-dkubedl"],
        ["validate", MNIST, "-d=kubedl"],
        ["validate", MNIST, "--dialect="],
        ["validate", MNIST, "-o", "yaml"],
        ["validate", "--", MNIST],
        ["validate", "-", "-"],
        ["validate", ""],
        ["render", MNIST],
        ["render", MNIST, "-d", "kubedl", "--attempt", "2"],
        ["render", MNIST, "-d", "kubedl", "--name-key", "k", "--attempt", "0"],
        ["render", MNIST, "-d", "kubedl", "--name-key", "k", "--attempt", "100"],
        ["render", MNIST, "-d", "kubedl", "--name-key", "k", "--attempt", "+2"],
        ["render", MNIST, "-d", "kubedl", "-n", "-x"],
        ["render", MNIST, "-d", "kubedl", "-o", "text"],
    ],
    ids=lambda args: " ".join(args) or "(nothing)",
)
def test_the_quick_path_leaves_the_rest_to_typer(args: list[str]) -> None:
    assert parse(args) is None
    assert run_quickly(args) is None


def test_what_the_quick_path_reads() -> None:
    assert parse(
        ["render", "a.yaml", "-", "--dialect", " Trainer ", "--attempt", "3", "--name-key=k"]
    ) == (
        CommandLine(
            "render",
            [Path("a.yaml"), Path("-")],
            {"dialect": "trainer", "attempt": "3", "name_key": "k"},
        )
    )
    assert parse(["validate", "x=y.yaml"]) == CommandLine("validate", [Path("x=y.yaml")], {})


def test_shell_completion_goes_to_typer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("_KUBEDL_PREFECT_COMPLETE", "bash_complete")
    assert run_quickly(["validate", MNIST]) is None


def test_the_plugin_finder_stand_in_answers_as_pydantic_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic.plugin import _loader

    monkeypatch.setenv("PYDANTIC_DISABLE_PLUGINS", "__all__")
    stand_in = quick._NoPlugins()
    assert tuple(stand_in.get_plugins()) == tuple(_loader.get_plugins()) == ()
    # Anything else comes from the real module, loaded on demand.
    assert stand_in.PYDANTIC_ENTRY_POINT_GROUP == _loader.PYDANTIC_ENTRY_POINT_GROUP
    with pytest.raises(AttributeError):
        stand_in.__path__  # noqa: B018


def test_the_stand_in_is_gone_after_the_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PYDANTIC_DISABLE_PLUGINS", "__all__")
    real = sys.modules.pop(quick._PLUGIN_LOADER)
    try:
        with quick._without_plugin_discovery():
            assert isinstance(sys.modules[quick._PLUGIN_LOADER], quick._NoPlugins)
        assert quick._PLUGIN_LOADER not in sys.modules
        monkeypatch.setenv("PYDANTIC_DISABLE_PLUGINS", "logfire")  # some plugins wanted
        with quick._without_plugin_discovery():
            assert quick._PLUGIN_LOADER not in sys.modules
    finally:
        sys.modules[quick._PLUGIN_LOADER] = real
    assert run_quickly(["validate", MNIST]) == ExitCode.OK
    assert sys.modules[quick._PLUGIN_LOADER] is real
    assert capsys.readouterr().out.startswith(f"OK: {MNIST}:")


def test_a_closed_pipe_ends_as_typer_ends_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)

    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert run_quickly(["render", MNIST, "-d", "kubedl"]) == 1
    assert isinstance(sys.stdout, quick._QuietFlush)
    sys.stdout.flush()  # no error at exit


@pytest.mark.parametrize("module", [quick, specs], ids=lambda module: module.__name__)
def test_the_docstring_examples_hold(module: ModuleType) -> None:
    result = doctest.testmod(module, raise_on_error=False)
    assert result.attempted > 0
    assert result.failed == 0
