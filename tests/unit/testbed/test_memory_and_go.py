"""The test bed remembers its port base, and starts from built binaries without Go on PATH.

No cluster is started: state, binaries and the module cache are fakes in a private cache.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed import build
from kubedl_prefect.testbed.cli import app
from kubedl_prefect.testbed.components import DEFAULT_PORT_BASE, Ports
from kubedl_prefect.testbed.controlplane import CONTROL_PLANE_BINARIES
from kubedl_prefect.testbed.testbed import (
    ComponentStatus,
    Testbed,
    TestbedStatus,
    recorded_port_base,
)
from kubedl_prefect.testbed.upstream import GoModule, module_dir

runner = CliRunner()


def record_start(cache: Path, name: str, base: int) -> None:
    """What ``up`` writes before its first component starts."""
    root = cache / "testbed" / name
    root.mkdir(parents=True, exist_ok=True)
    (root / "state.json").write_text(json.dumps({"ports_base": base, "operators": False}))


@pytest.fixture
def no_go(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A PATH without ``go`` (but with what a shell has), and no Go version remembered."""
    empty = tmp_path / "path-without-go"
    empty.mkdir()
    monkeypatch.setenv("PATH", f"{empty}{os.pathsep}/usr/bin{os.pathsep}/bin")
    assert shutil.which("go") is None
    build.go_version.cache_clear()
    yield
    build.go_version.cache_clear()


def test_status_down_and_restart_find_the_port_base_by_name(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBEDL_PREFECT_TESTBED_PORT_BASE", raising=False)
    assert Testbed("faults").layout.ports.base == DEFAULT_PORT_BASE
    record_start(cache, "faults", 28700)
    assert recorded_port_base("faults") == 28700
    assert Testbed("faults").layout.ports.base == 28700
    monkeypatch.setenv("KUBEDL_PREFECT_TESTBED_PORT_BASE", "28900")
    assert Testbed("faults").layout.ports.base == 28700  # the running one wins over the default
    assert Testbed("faults", ports=Ports(28800)).layout.ports.base == 28800
    assert Testbed("other").layout.ports.base == 28900

    seen: list[int] = []
    original = Testbed.status

    def status(self: Testbed) -> TestbedStatus:
        seen.append(self.layout.ports.base)
        return original(self)

    monkeypatch.setattr(Testbed, "status", status)
    result = runner.invoke(app, ["status", "--name", "faults"])
    assert "test bed faults: stopped" in result.stdout
    assert seen == [28700]

    down = runner.invoke(app, ["down", "--name", "faults"])
    assert down.exit_code == 0, down.output
    assert recorded_port_base("faults") is None  # down forgets it with the rest of the state
    assert Testbed("faults").layout.ports.base == 28900


@pytest.mark.parametrize("state", ["{", '{"ports_base": "28700"}', '{"ports_base": 80}', "[]"])
def test_a_broken_state_file_is_no_port_base(cache: Path, state: str) -> None:
    root = cache / "testbed" / "broken"
    root.mkdir(parents=True)
    (root / "state.json").write_text(state)
    assert recorded_port_base("broken") is None


def test_up_on_other_ports_than_the_running_test_bed_is_refused(cache: Path) -> None:
    record_start(cache, "faults", 28700)
    bed = Testbed("faults", ports=Ports(28800), operators=False)
    running = TestbedStatus(
        name="faults",
        kubeconfig=bed.kubeconfig,
        api_url="https://127.0.0.1:28743",
        components=(ComponentStatus("kube-apiserver", 1, True, True, 0, Path("x.log")),),
        nodes=2,
        gpus_per_node=8,
        operators=False,
    )
    with pytest.raises(TestbedError, match="runs on port base 28700, not 28800") as caught:
        bed._check_same_ports(running)
    assert "leave --port-base out" in str(caught.value)
    stopped = TestbedStatus(
        name="faults",
        kubeconfig=bed.kubeconfig,
        api_url="",
        components=(ComponentStatus("kube-apiserver", None, False, None, 0, Path("x.log")),),
        nodes=0,
        gpus_per_node=0,
        operators=False,
    )
    bed._check_same_ports(stopped)  # a stopped one may start anywhere
    Testbed("faults", operators=False)._check_same_ports(running)  # its own ports


def fake_build(binary: build.GoBinary, suffix: str, *, record: bool) -> Path:
    folder = build.bin_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{binary.name}-{suffix}"
    path.write_text("#!/bin/sh\n")
    if record:
        times = folder / "build-times.json"
        data = json.loads(times.read_text()) if times.is_file() else {}
        data[binary.name] = {"seconds": 1.0, "binary": path.name}
        times.write_text(json.dumps(data))
    return path


@pytest.mark.usefixtures("no_go")
def test_built_binaries_are_used_without_go_on_path(cache: Path) -> None:
    bed = Testbed("nogo", operators=False)
    with pytest.raises(TestbedError, match="no `go` command was found on PATH") as caught:
        bed._check_go_or_built()
    assert "kube-apiserver-etcd" in str(caught.value)
    paths = {}
    for n, binary in enumerate(CONTROL_PLANE_BINARIES):
        # Recorded in build-times.json, or the only build of its name.
        paths[binary.name] = fake_build(binary, f"{n:012x}", record=n % 2 == 0)
    bed._check_go_or_built()  # --no-operators: the operators' binaries are not needed
    assert bed.build() == paths  # what `up` starts from, without running go
    assert all(build.is_built(b) for b in CONTROL_PLANE_BINARIES)
    with pytest.raises(TestbedError, match="are not built"):
        Testbed("nogo", operators=True)._check_go_or_built()


@pytest.mark.usefixtures("no_go")
def test_two_unrecorded_builds_of_a_name_are_not_guessed(cache: Path) -> None:
    binary = CONTROL_PLANE_BINARIES[0]
    fake_build(binary, "0" * 12, record=False)
    fake_build(binary, "1" * 12, record=False)
    assert build.last_built(binary) is None
    with pytest.raises(TestbedError, match="no `go` command was found"):
        build.binary_path(binary)


@pytest.mark.usefixtures("no_go")
def test_an_extracted_module_is_found_without_go(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    modules = tmp_path / "mod"
    monkeypatch.setenv("GOMODCACHE", str(modules))
    done = GoModule("github.com/Example/Operator", "v1.2.3")
    extracted = modules / "github.com" / "!example" / "!operator@v1.2.3"
    extracted.mkdir(parents=True)
    assert module_dir(done) == extracted
    partial = GoModule("github.com/example/half", "v0.1.0")
    half = modules / "github.com" / "example" / "half@v0.1.0"
    half.mkdir(parents=True)
    (modules / "github.com" / "example" / "half@v0.1.0.partial").touch()
    with pytest.raises(TestbedError, match="no `go` command was found"):
        module_dir(partial)  # incomplete: it would be downloaded, which needs go
