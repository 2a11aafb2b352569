"""The kubedl-prefect command line: output, messages on stderr, and exit codes."""

from __future__ import annotations

import json
import os
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
        ["validate", str(MNIST), "-o", "yaml"],
        ["import", str(MNIST), "-d", "tf"],
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
# stands on, Prefect, MLflow, the layers above the spec, the importer, and asyncio (60 ms).
HEAVY = (
    "kubedl_prefect.testbed",
    "kubedl_prefect.lifecycle",
    "kubedl_prefect.kube",
    "kubedl_prefect.prefect",
    "kubedl_prefect.spec.porting",
    "kubernetes_asyncio",
    "aiohttp",
    "prefect",
    "mlflow",
    "asyncio",
)

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


def _loaded_by(
    *args: str, heavy: tuple[str, ...] = HEAVY
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run the command line in a fresh interpreter; return it and the heavy modules it loaded.

    Pydantic's plugins are left to the console script (which turns them off by default).
    """
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    done = subprocess.run(
        [sys.executable, "-c", _RUN_AND_LIST_MODULES, ",".join(heavy), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
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


@pytest.mark.parametrize(
    "args",
    [
        ["render", "examples/pytorch-mnist.yaml", "-d", "kubedl"],
        ["validate", "examples/pytorch-mnist.yaml", "-o", "json"],
        ["--version"],
    ],
)
def test_the_start_up_path_stays_light(args: list[str]) -> None:
    done, loaded = _loaded_by(*args)
    assert done.returncode == ExitCode.OK, done.stderr
    assert loaded == []


# What the console script's quick path (plain validate and render) does not load either: typer
# and its app, what pydantic's plugin finder imports to find no plugin, and the models of
# affinity and autoscaling metrics when the spec holds neither.
QUICK_HEAVY = (
    *HEAVY,
    "typer",
    "kubedl_prefect.cli.commands",
    "importlib.metadata",
    "kubedl_prefect.spec.affinity",
    "kubedl_prefect.spec.metrics",
)


@pytest.mark.parametrize(
    "args",
    [
        ["validate", "examples/pytorch-mnist.yaml"],
        ["validate", "tests/unit/spec/invalid/misspelt-field.yaml", "-o", "json"],
        ["render", "examples/pytorch-mnist.yaml", "-d", "trainer", "--name-key", "k"],
    ],
)
def test_plain_validate_and_render_load_neither_typer_nor_the_app(args: list[str]) -> None:
    done, loaded = _loaded_by(*args, heavy=QUICK_HEAVY)
    assert done.returncode in (ExitCode.OK, ExitCode.INVALID_SPEC), done.stderr
    assert loaded == []


# Each render imports the renderer of its own dialect only (the Trainer one is the largest); a
# validate without a dialect imports none.
RENDERERS = ("kubedl_prefect.spec.renderers", "kubedl_prefect.spec.kueue")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["validate", "examples/pytorch-mnist.yaml"], []),
        (
            ["render", "examples/pytorch-mnist.yaml", "-d", "kubedl"],
            ["common", "kubedl"],
        ),
        (
            ["validate", "examples/pytorch-mnist.yaml", "-d", "kubeflow"],
            ["common", "kubeflow", "kueue"],
        ),
    ],
)
def test_a_dialect_loads_only_its_own_renderer(args: list[str], expected: list[str]) -> None:
    done, loaded = _loaded_by(*args, heavy=RENDERERS)
    assert done.returncode == ExitCode.OK, done.stderr
    modules = [name.rsplit(".", 1)[-1] for name in loaded if name != RENDERERS[0]]
    assert sorted(modules) == expected


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


# --- Pod Security Standards ---------------------------------------------------------------------

ROOT_SPEC = """\
name: mnist
image: busybox:1.36
replicas:
  master: 1
  worker:
    count: 2
    podTemplate:
      spec:
        securityContext: {runAsUser: 0}
"""


def test_validate_warns_about_what_breaks_restricted(tmp_path: Path) -> None:
    spec = tmp_path / "root.yaml"
    spec.write_text(ROOT_SPEC)
    result = runner.invoke(app, ["validate", str(spec), "--dialect", "kubedl"])
    assert result.exit_code == ExitCode.OK, result.stderr
    assert result.stdout.startswith(f"OK: {spec}: pytorch job 'mnist' is valid")
    assert result.stderr == (
        f"warning: {spec}: replicas.worker.podTemplate.spec.securityContext.runAsUser: "
        "runAsUser: 0 runs the containers as root, which the Restricted Pod Security level "
        "forbids (line 9) (fix: run as a user other than root, e.g. runAsUser: 1000 with "
        "runAsNonRoot: true, in an image that allows it)\n"
    )


def test_validate_and_render_refuse_what_breaks_baseline_without_the_opt_in(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "privileged.yaml"
    spec.write_text(ROOT_SPEC.replace("{runAsUser: 0}", "{runAsUser: 0}\n        hostPID: true"))
    for args in (["validate", str(spec)], ["render", str(spec), "-d", "kubeflow"]):
        result = runner.invoke(app, args)
        assert result.exit_code == ExitCode.INVALID_SPEC
        assert result.stdout == ""
        assert "replicas.worker.podTemplate.spec.hostPID: hostPID: true" in result.stderr
        assert "which the Baseline Pod Security level forbids (line 10)" in result.stderr
        assert "set `podSecurity: privileged`" in result.stderr
    spec.write_text("podSecurity: privileged\n" + spec.read_text())
    result = runner.invoke(app, ["validate", str(spec)])
    assert result.exit_code == ExitCode.OK, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 2
    assert "hostPID" in lines[0]
    assert "podSecurity: privileged allows it" in lines[0]
    assert "runAsUser" in lines[1]
    assert "Restricted" in lines[1]


PRIVILEGED_MANIFEST = """\
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: debug, namespace: ml}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:
          hostPID: true
          containers:
            - name: pytorch
              image: pytorch:2.3
              securityContext:
                privileged: true
                runAsUser: 0
"""


def test_import_keeps_what_breaks_baseline_with_the_opt_in_and_says_so(tmp_path: Path) -> None:
    manifest = tmp_path / "debug.yaml"
    manifest.write_text(PRIVILEGED_MANIFEST)
    result = runner.invoke(app, ["import", str(manifest)])
    assert result.exit_code == ExitCode.OK, result.stderr
    assert "\npodSecurity: privileged\n" in result.stdout
    assert "# The manifest's pods break the Baseline Pod Security level (" in result.stdout
    warnings = result.stderr.splitlines()
    assert [line.split(": ")[3] for line in warnings] == [
        "podTemplate.spec.hostPID",
        "podTemplate.spec.containers[0].securityContext.privileged",
        "podTemplate.spec.containers[0].securityContext.runAsUser",
    ]
    assert all(line.startswith(f"warning: {manifest}: PyTorchJob 'debug': ") for line in warnings)
    assert "Baseline" in warnings[0]
    assert "Restricted" in warnings[2]
    spec = tmp_path / "spec.yaml"
    spec.write_text(result.stdout.removeprefix("---\n"))
    rendered = runner.invoke(app, ["render", str(spec), "-d", "kubeflow", "-n", "ml"])
    assert rendered.exit_code == ExitCode.OK, rendered.stderr
    pod = yaml.safe_load(rendered.stdout)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    assert pod["spec"]["hostPID"] is True
    assert pod["spec"]["containers"][0]["securityContext"] == {"privileged": True, "runAsUser": 0}


# --- what a newcomer expects: --version, -, several files, --output json, clean choices ---------


def test_version() -> None:
    from kubedl_prefect import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == ExitCode.OK
    assert result.stdout == f"kubedl-prefect {__version__}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["render", str(MNIST)],
            "Missing option '--dialect' / '-d'. Choose from kubedl, kubeflow, trainer.",
        ),
        (
            ["render", str(MNIST), "-d", "kubeflw"],
            "Invalid value for '--dialect' / '-d': 'kubeflw' is not one of kubedl, kubeflow, "
            "trainer (did you mean kubeflow?)",
        ),
        (
            ["import", str(MNIST), "-d", "volcano"],
            "'volcano' is not one of auto, kubedl, kubeflow, trainer",
        ),
        (["validate", str(MNIST), "-o", "xml"], "'xml' is not one of text, json"),
    ],
)
def test_a_missing_or_wrong_choice_is_one_clean_line(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == ExitCode.USAGE
    assert message in result.stderr
    assert "\t" not in result.stderr
    assert "Value error" not in result.stderr
    assert "pydantic" not in result.stderr


def test_a_choice_is_case_insensitive() -> None:
    result = runner.invoke(app, ["validate", str(MNIST), "-d", "KubeDL"])
    assert result.exit_code == ExitCode.OK, result.stderr
    assert result.stdout.endswith("is valid for kubedl\n")


def test_standard_input_is_read_for_a_dash() -> None:
    text = MNIST.read_text()
    result = runner.invoke(app, ["validate", "-"], input=text)
    assert result.exit_code == ExitCode.OK, result.stderr
    assert result.stdout.startswith("OK: <stdin>: pytorch job 'pytorch-mnist' is valid")
    rendered = runner.invoke(app, ["render", "-", "-d", "kubedl"], input=text)
    assert rendered.stdout == (REPO / "tests" / "golden" / "kubedl" / MNIST.name).read_text()
    broken = runner.invoke(app, ["validate", "-"], input="name: [x\n")
    assert broken.exit_code == ExitCode.INVALID_SPEC
    assert "in <stdin>" in broken.stderr
    twice = runner.invoke(app, ["validate", "-", "-"], input=text)
    assert twice.exit_code == ExitCode.USAGE
    assert "standard input (-) can be read only once" in twice.stderr


def test_standard_input_over_the_limit_is_refused_as_too_large() -> None:
    from kubedl_prefect.spec.reader import SPEC_LIMITS

    result = runner.invoke(
        app, ["validate", "-"], input=b"#" + "é".encode() * SPEC_LIMITS.max_bytes
    )
    assert result.exit_code == ExitCode.INVALID_SPEC
    assert "at most" in result.stderr
    assert "UTF-8" not in result.stderr


def test_several_specs_each_get_their_verdict_and_the_worst_exit_code(tmp_path: Path) -> None:
    invalid = INVALID / "misspelt-field.yaml"
    result = runner.invoke(app, ["validate", str(MNIST), str(invalid)])
    assert result.exit_code == ExitCode.INVALID_SPEC
    assert result.stdout.startswith(f"OK: {MNIST}: pytorch job")
    assert f"in {invalid}:" in result.stderr
    missing = tmp_path / "missing.yaml"
    result = runner.invoke(app, ["validate", str(invalid), str(missing), str(MNIST)])
    assert result.exit_code == ExitCode.USAGE
    assert result.stdout.count("OK: ") == 1
    assert f"error: cannot read {missing}" in result.stderr


def test_render_of_several_specs_prints_all_or_nothing() -> None:
    elastic = REPO / "examples" / "pytorch-elastic.yaml"
    both = runner.invoke(app, ["render", str(MNIST), str(elastic), "-d", "kubeflow"])
    assert both.exit_code == ExitCode.OK, both.stderr
    documents = list(yaml.safe_load_all(both.stdout))
    assert [d["metadata"]["name"] for d in documents] == ["pytorch-mnist", "pytorch-elastic"]
    refused = runner.invoke(app, ["render", str(MNIST), str(elastic), "-d", "kubedl"])
    assert refused.exit_code == ExitCode.INVALID_SPEC
    assert refused.stdout == ""
    assert f"in {elastic} (for kubedl)" in refused.stderr


def test_render_as_json_is_the_object_or_a_list() -> None:
    one = runner.invoke(app, ["render", str(MNIST), "-d", "kubedl", "-o", "json"])
    assert one.exit_code == ExitCode.OK, one.stderr
    golden = yaml.safe_load((REPO / "tests" / "golden" / "kubedl" / MNIST.name).read_text())
    assert json.loads(one.stdout) == golden
    two = runner.invoke(app, ["render", str(MNIST), "-", "-d", "kubedl", "-o", "json"], input="")
    assert two.exit_code == ExitCode.INVALID_SPEC  # an empty document is no spec
    two = runner.invoke(
        app, ["render", str(MNIST), "-", "-d", "kubedl", "-o", "JSON"], input=MNIST.read_text()
    )
    listed = json.loads(two.stdout)
    assert (listed["apiVersion"], listed["kind"]) == ("v1", "List")
    assert listed["items"] == [golden, golden]


OUT_OF_ORDER = """\
replicas:
  master: 1
  worker:
    count: -1
image: busybox:1.36
name: Not_A_Name
"""


def test_problems_come_in_the_order_of_the_lines(tmp_path: Path) -> None:
    spec = tmp_path / "two.yaml"
    spec.write_text(OUT_OF_ORDER)
    result = runner.invoke(app, ["validate", str(spec)])
    assert result.exit_code == ExitCode.INVALID_SPEC
    problems = [line for line in result.stderr.splitlines() if line.startswith("  - ")]
    assert [p.split(":")[0] for p in problems] == ["  - replicas.worker.count", "  - name"]
    as_json = runner.invoke(app, ["validate", str(spec), "-o", "json"])
    assert as_json.exit_code == ExitCode.INVALID_SPEC
    report = json.loads(as_json.stdout)
    assert report["valid"] is False
    (only,) = report["results"]
    assert [(p["path"], p["line"]) for p in only["problems"]] == [
        ("replicas.worker.count", 4),
        ("name", 6),
    ]
    assert as_json.stderr == ""


def test_validate_as_json_reports_every_file(tmp_path: Path) -> None:
    horovod = REPO / "examples" / "mpi-horovod.yaml"
    missing = tmp_path / "missing.yaml"
    result = runner.invoke(
        app, ["validate", str(MNIST), str(horovod), str(missing), "-o", "json", "-d", "kubeflow"]
    )
    assert result.exit_code == ExitCode.USAGE
    report = json.loads(result.stdout)
    mnist, mpi, gone = report["results"]
    assert mnist == {
        "file": str(MNIST),
        "valid": True,
        "dialect": "kubeflow",
        "framework": "pytorch",
        "name": "pytorch-mnist",
        "warnings": [],
        "problems": [],
        "error": None,
    }
    assert mpi["valid"] is True
    assert [(w["path"], w["level"], w["line"]) for w in mpi["warnings"]] == [
        ("network.hostNetwork", "Baseline", 24)
    ]
    assert gone["valid"] is False
    assert gone["error"].startswith(f"cannot read {missing}")


def test_import_from_standard_input_and_as_json(tmp_path: Path) -> None:
    manifest = runner.invoke(app, ["render", str(MNIST), "-d", "kubeflow", "-n", "ml"]).stdout
    result = runner.invoke(app, ["import", "-", "-o", "json"], input=manifest)
    assert result.exit_code == ExitCode.OK, result.stderr
    (item,) = json.loads(result.stdout)
    assert (item["kind"], item["name"], item["namespace"], item["dialect"]) == (
        "PyTorchJob",
        "pytorch-mnist",
        "ml",
        "kubeflow",
    )
    assert item["spec"]["name"] == "pytorch-mnist"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(item["spec"]))
    again = runner.invoke(app, ["render", str(spec), "-d", "kubeflow", "-n", "ml"])
    assert again.stdout == manifest
    several = runner.invoke(app, ["import", str(tmp_path / "m.yaml"), "-"], input=manifest)
    assert several.exit_code == ExitCode.USAGE
    assert several.stdout == ""


def test_the_console_script_turns_pydantic_plugins_off_unless_told(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kubedl_prefect.cli import main

    monkeypatch.setattr(sys, "argv", ["kubedl-prefect", "--version"])
    for preset, expected in ((None, "__all__"), ("logfire", "logfire")):
        if preset is None:
            monkeypatch.delenv("PYDANTIC_DISABLE_PLUGINS", raising=False)
        else:
            monkeypatch.setenv("PYDANTIC_DISABLE_PLUGINS", preset)
        with pytest.raises(SystemExit) as done:
            main()
        assert done.value.code == ExitCode.OK
        assert os.environ["PYDANTIC_DISABLE_PLUGINS"] == expected
    assert capsys.readouterr().out.startswith("kubedl-prefect ")
