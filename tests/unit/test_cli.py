"""The kubedl-prefect command line: output, messages on stderr, and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kubedl_prefect.cli import TESTBED_HELP, ExitCode, app, render_file, validate_file
from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import Dialect, Role, job_name, max_spec_name_length

REPO = Path(__file__).resolve().parents[2]
MNIST = REPO / "examples" / "pytorch-mnist.yaml"
INVALID = REPO / "tests" / "unit" / "spec" / "invalid"
# name-too-long.yaml has a master and two workers.
NAME_LIMIT = max_spec_name_length([(Role.MASTER, 1), (Role.WORKER, 2)])

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
        ("name-too-long.yaml", "name:", f"at most {NAME_LIMIT} are allowed"),
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


# Modules `validate` and `render` must not load: the test bed, the Kubernetes client and what it
# stands on, Prefect.
HEAVY = ("kubedl_prefect.testbed", "kubernetes_asyncio", "aiohttp", "prefect")

_RUN_AND_LIST_MODULES = """
import atexit, json, sys
heavy = tuple(sys.argv[1].split(","))
atexit.register(
    lambda: print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy
        or m.startswith(heavy))), file=sys.stderr)
)
sys.argv = ["kubedl-prefect", *sys.argv[2:]]
from kubedl_prefect.cli import main
main()
"""


def _loaded_by(*args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run the command line in a fresh interpreter; return it and the heavy modules it loaded."""
    done = subprocess.run(
        [sys.executable, "-c", _RUN_AND_LIST_MODULES, ",".join(HEAVY), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    loaded: list[str] = json.loads(done.stderr.strip().splitlines()[-1])
    return done, loaded


def test_validate_loads_neither_the_test_bed_nor_the_kubernetes_client() -> None:
    done, loaded = _loaded_by("validate", "examples/pytorch-mnist.yaml")
    assert done.returncode == ExitCode.OK, done.stderr
    assert done.stdout.startswith("OK: examples/pytorch-mnist.yaml: pytorch job")
    assert loaded == []
    done, loaded = _loaded_by("--help")
    assert done.returncode == ExitCode.OK
    assert "testbed" in done.stdout
    assert loaded == []


def test_testbed_commands_load_the_test_bed_when_used() -> None:
    done, loaded = _loaded_by("testbed", "--help")
    assert done.returncode == ExitCode.OK, done.stderr
    assert "kubedl_prefect.testbed.cli" in loaded
    assert "Usage: kubedl-prefect testbed [OPTIONS] COMMAND [ARGS]..." in done.stdout
    for command in ("up", "build", "down", "restart", "status"):
        assert f"  {command} " in done.stdout


def test_testbed_group_behaves_as_the_test_bed_app(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kubedl_prefect.testbed.cli import app as testbed_app

    assert testbed_app.info.help == TESTBED_HELP
    monkeypatch.setenv("KUBEDL_PREFECT_CACHE", str(tmp_path))
    status = runner.invoke(app, ["testbed", "status", "--name", "nothing", "--port-base", "29400"])
    assert status.exit_code == 1
    assert "test bed nothing: stopped" in status.stdout
    typo = runner.invoke(app, ["testbed", "stauts"])
    assert typo.exit_code == ExitCode.USAGE
    assert "No such command 'stauts'. Did you mean 'status'" in typo.stderr
    bare = runner.invoke(app, ["testbed"])
    assert "Commands:" in bare.output
    assert "restart" in bare.output


def test_a_file_that_is_not_utf8_is_refused_with_its_line_column_and_fix(tmp_path: Path) -> None:
    spec = tmp_path / "latin1.yaml"
    spec.write_bytes("name: café\nimage: busybox\nreplicas: {master: 1}\n".encode("latin-1"))
    result = runner.invoke(app, ["validate", str(spec)])
    assert result.exit_code == ExitCode.INVALID_SPEC
    assert "line 1, column 10" in result.output
    assert "UTF-8" in result.output
