"""The runner without a cluster: naming, ports, status of stopped or stale test beds, the CLI."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed import Testbed as LazyTestbed
from kubedl_prefect.testbed import process, restarts
from kubedl_prefect.testbed.cli import app
from kubedl_prefect.testbed.cluster import run_blocking_anywhere
from kubedl_prefect.testbed.components import DEFAULT_PORT_BASE, Layout, Ports
from kubedl_prefect.testbed.controlplane import APISERVER, KWOK
from kubedl_prefect.testbed.testbed import Testbed


def test_ports_are_distinct_loopback_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    ports = Ports()
    used = [
        ports.apiserver,
        ports.etcd_client,
        ports.etcd_peer,
        ports.controller_manager,
        ports.scheduler,
        ports.kwok,
    ]
    assert len(set(used)) == len(used)
    assert all(DEFAULT_PORT_BASE <= p < DEFAULT_PORT_BASE + 100 for p in used)
    assert max(used) < 32768  # below the Linux ephemeral range
    monkeypatch.setenv("KUBEDL_PREFECT_TESTBED_PORT_BASE", "29000")
    assert Ports.default().apiserver == 29043
    with pytest.raises(ValueError, match="offset"):
        ports.offset(100)


def test_layout_lives_under_the_cache(cache: Path) -> None:
    layout = Layout("x", Ports(29100))
    assert layout.root == cache / "testbed" / "x"
    assert layout.apiserver_url == "https://127.0.0.1:29143"
    assert layout.kubeconfig("system:kube-scheduler").parent == layout.config_dir


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "../x"}, "alphanumeric"),
        ({"name": ""}, "alphanumeric"),
        ({"nodes": 0}, "at least one node"),
        ({"gpus_per_node": -1}, "negative"),
    ],
)
def test_bad_arguments_are_refused(cache: Path, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(TestbedError, match=message):
        Testbed(**kwargs)  # type: ignore[arg-type]


def test_a_never_started_test_bed_is_stopped(cache: Path) -> None:
    state = Testbed("fresh", ports=Ports(29200)).status()
    assert state.stopped
    assert not state.up
    assert state.rss_bytes == 0
    names = [c.name for c in state.components]
    assert names[:4] == ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
    assert len(names) > 4  # the operators
    no_operators = Testbed("fresh", ports=Ports(29200), operators=False).status()
    assert len(no_operators.components) == 4


def test_dead_pids_in_a_stale_state_folder_read_as_stopped(cache: Path, tmp_path: Path) -> None:
    bed = Testbed("stale", ports=Ports(29300), operators=False)
    record = process.start(
        ["/bin/sh", "-c", "exit 0"],
        log_file=tmp_path / "x.log",
        pid_file=bed.layout.pid_file(APISERVER.name),
    )
    for _ in range(100):
        if not process.is_alive(record):
            break
        time.sleep(0.05)
    assert not process.is_alive(record)
    state = bed.status()
    apiserver = state.components[0]
    assert apiserver.pid == record.pid
    assert not apiserver.running
    assert apiserver.healthy is None
    assert state.stopped
    bed.down()  # cleans the stale pid file
    assert not bed.layout.pid_file(APISERVER.name).exists()


async def test_run_works_inside_a_running_event_loop() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert run_blocking_anywhere(answer()) == 42


def test_package_exports_the_runner_lazily() -> None:
    assert LazyTestbed is Testbed


def test_cli_status_of_a_stopped_test_bed_exits_1(cache: Path) -> None:
    result = CliRunner().invoke(app, ["status", "--name", "nothing", "--port-base", "29400"])
    assert result.exit_code == 1
    assert "test bed nothing: stopped" in result.output
    assert "kube-apiserver" in result.output
    assert "KUBECONFIG=" not in result.output


def test_cli_up_refuses_zero_nodes(cache: Path) -> None:
    result = CliRunner().invoke(app, ["up", "--name", "nothing", "--nodes", "0"])
    assert result.exit_code == 2


def test_cli_down_of_a_stopped_test_bed_is_fine(cache: Path) -> None:
    result = CliRunner().invoke(app, ["down", "--name", "nothing", "--port-base", "29400"])
    assert result.exit_code == 0
    assert "test bed nothing is down" in result.output


def test_up_without_go_says_how_to_get_it(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(TestbedError) as caught:
        Testbed("nogo", ports=Ports(29500)).up()
    assert "no `go` command was found" in str(caught.value)
    assert caught.value.hint is not None
    assert "Go 1.26" in caught.value.hint
    assert not (cache / "testbed" / "nogo" / "etcd").exists()


def test_restart_names_the_components_it_knows(cache: Path) -> None:
    bed = Testbed("restarts", ports=Ports(29600))
    with pytest.raises(TestbedError, match="unknown test-bed component 'etcd'") as caught:
        bed.restart("etcd")
    assert caught.value.hint is not None
    assert "kube-apiserver" in caught.value.hint
    assert "kwok" in caught.value.hint


def test_restart_of_a_stopped_component_says_to_start_the_test_bed(cache: Path) -> None:
    with pytest.raises(TestbedError, match="kwok of test bed stopped is not running") as caught:
        Testbed("stopped", ports=Ports(29700)).restart("kwok")
    assert caught.value.hint is not None
    assert "up" in caught.value.hint


def test_cli_restart_of_an_unknown_component_fails_with_the_known_ones(cache: Path) -> None:
    result = CliRunner().invoke(
        app, ["restart", "etcd", "--name", "nothing", "--port-base", "29400"]
    )
    assert result.exit_code == 1
    assert "unknown test-bed component 'etcd'" in result.output


def test_restart_refuses_a_binary_that_is_gone_and_not_rebuilt(cache: Path) -> None:
    bed = Testbed("rebuilt", ports=Ports(29700))
    record = process.ProcessRecord(pid=1, binary=str(cache / "bin" / "kwok-old"), started_at=0)
    with pytest.raises(TestbedError, match=r"its binary .*kwok-old is gone") as caught:
        restarts.binary_of(KWOK, record, bed.binaries())
    assert caught.value.hint is not None
    assert "down" in caught.value.hint


def test_the_control_plane_is_still_importable_from_the_runner_module() -> None:
    from kubedl_prefect.testbed import controlplane
    from kubedl_prefect.testbed import testbed as runner

    for name in ("APISERVER", "KWOK", "CONTROL_PLANE_AFTER_CRDS", "CONTROL_PLANE_BINARIES"):
        assert getattr(runner, name) is getattr(controlplane, name)
    assert set(runner.__all__) >= {"Testbed", "TestbedStatus", "ComponentStatus"}
    names = [c.name for c in Testbed("rows", ports=Ports(29900)).components()]
    assert names[: len(controlplane.CONTROL_PLANE)] == [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    ]
