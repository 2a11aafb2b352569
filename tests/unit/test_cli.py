"""The kubedl-prefect command line: output, messages on stderr, and exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kubedl_prefect.cli import ExitCode, app, render_file, validate_file
from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import Dialect, job_name

REPO = Path(__file__).resolve().parents[2]
MNIST = REPO / "examples" / "pytorch-mnist.yaml"
INVALID = REPO / "tests" / "unit" / "spec" / "invalid"

runner = CliRunner()


@pytest.mark.parametrize("dialect", ["kubedl", "kubeflow"])
def test_render_prints_the_golden_manifest(dialect: str) -> None:
    result = runner.invoke(app, ["render", str(MNIST), "--dialect", dialect])
    assert result.exit_code == ExitCode.OK, result.stderr
    assert result.stdout == (REPO / "tests" / "golden" / dialect / MNIST.name).read_text()
    assert result.stderr == ""


def test_render_with_the_lifecycle_name_and_namespace() -> None:
    result = runner.invoke(
        app,
        [
            "render",
            str(MNIST),
            "-d",
            "kubeflow",
            "--name-key",
            "run-7",
            "--attempt",
            "3",
            "-n",
            "ml",
        ],
    )
    assert result.exit_code == ExitCode.OK, result.stderr
    metadata = yaml.safe_load(result.stdout)["metadata"]
    assert metadata["name"] == job_name("pytorch-mnist", "run-7", 3)
    assert metadata["namespace"] == "ml"


@pytest.mark.parametrize(
    "args",
    [
        ["render", str(MNIST)],
        ["render", str(MNIST), "-d", "volcano"],
        ["render", str(MNIST), "-d", "kubedl", "--attempt", "2"],
        ["render", str(MNIST), "-d", "kubedl", "--name-key", "k", "--attempt", "100"],
        ["validate"],
        ["frobnicate"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == ExitCode.USAGE
    assert "Error" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("path", ["missing.yaml", "."])
def test_unreadable_spec_exits_2(path: str, tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(tmp_path / path)])
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr.startswith("error: cannot read ")


def test_validate_ok_line() -> None:
    result = runner.invoke(app, ["validate", str(MNIST), "--dialect", "kubedl"])
    assert result.exit_code == ExitCode.OK
    assert result.stdout == (f"OK: {MNIST}: pytorch job 'pytorch-mnist' is valid for kubedl\n")
    plain = runner.invoke(app, ["validate", str(MNIST)])
    assert plain.exit_code == ExitCode.OK
    assert "add --dialect" in plain.stdout


@pytest.mark.parametrize(
    ("example", "field", "words"),
    [
        ("gpus-only-in-requests.yaml", "replicas.worker.resources.requests", "gpus: 1"),
        ("name-too-long.yaml", "name:", "at most 43"),
        ("misspelt-field.yaml", "imagePullPolicyy", "did you mean `imagePullPolicy`?"),
    ],
)
def test_validate_invalid_specs_names_the_field(example: str, field: str, words: str) -> None:
    for extra in ([], ["--dialect", "kubedl"], ["--dialect", "kubeflow"]):
        result = runner.invoke(app, ["validate", str(INVALID / example), *extra])
        assert result.exit_code == ExitCode.INVALID_SPEC
        assert result.stdout == ""
        assert field in result.stderr
        assert words in result.stderr
        assert "(line " in result.stderr


def test_render_invalid_spec_exits_1() -> None:
    result = runner.invoke(app, ["render", str(INVALID / "misspelt-field.yaml"), "-d", "kubedl"])
    assert result.exit_code == ExitCode.INVALID_SPEC
    assert result.stdout == ""
    assert "imagePullPolicyy" in result.stderr


def test_dialect_rules_exit_1(tmp_path: Path) -> None:
    elastic = REPO / "examples" / "pytorch-elastic.yaml"
    result = runner.invoke(app, ["render", str(elastic), "--dialect", "kubedl"])
    assert result.exit_code == ExitCode.INVALID_SPEC
    assert "- elastic:" in result.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [x\n")
    result = runner.invoke(app, ["validate", str(broken)])
    assert result.exit_code == ExitCode.INVALID_SPEC
    assert "(yaml)" in result.stderr


def test_library_functions_behind_the_commands() -> None:
    assert validate_file(MNIST, Dialect.KUBEFLOW).name == "pytorch-mnist"
    text = render_file(MNIST, "kubedl", name_key="k", attempt=2)
    assert yaml.safe_load(text)["metadata"]["name"] == job_name("pytorch-mnist", "k", 2)
    with pytest.raises(SpecError):
        validate_file(INVALID / "name-too-long.yaml")


def test_console_script_entry_point() -> None:
    script = Path(sys.executable).with_name("kubedl-prefect")
    done = subprocess.run(
        [str(script), "validate", str(INVALID / "misspelt-field.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == ExitCode.INVALID_SPEC
    assert "imagePullPolicyy" in done.stderr
