"""Starting one component: waiting on its health check, and telling a slow start from a crash."""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

import pytest

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed import components, process
from kubedl_prefect.testbed.components import (
    Component,
    HealthCheck,
    Layout,
    Ports,
    ephemeral_port_range,
)
from kubedl_prefect.testbed.launch import probe, start_component

SH = shutil.which("sh") or "/bin/sh"


def _free_port() -> int:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port: int = probe_socket.getsockname()[1]
        return port


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!{SH}\n{body}\n")
    path.chmod(0o755)
    return path


def _component(name: str, port: int | None = None) -> Component:
    return Component(
        name=name,
        binary=name,
        args=lambda ctx: [],
        health=(lambda layout: HealthCheck(f"http://127.0.0.1:{port}/")) if port else None,
    )


def test_a_component_that_delays_its_exec_is_waited_for_not_taken_for_dead(
    cache: Path, tmp_path: Path
) -> None:
    # What raced: the first liveness check came before the process had exec'ed its binary.
    # Here it takes half a second to, and answers its health check only after.
    port = _free_port()
    server = f"{sys.executable} -m http.server --bind 127.0.0.1 --directory {tmp_path} {port}"
    script = _script(tmp_path / "slow-server", f"sleep 0.5\nexec {server}")
    layout = Layout("launch", Ports(29800))
    component = _component("slow-server", port)
    record = start_component(layout, component, {component.binary: script}, timeout=30)
    try:
        assert process.is_alive(record)
        assert process.read(layout.pid_file(component.name)) == record
        assert component.health is not None
        assert probe(component.health(layout), layout)
        assert "starting: " in layout.log_file(component.name).read_text()
    finally:
        process.stop(record, timeout=5)


def test_a_component_that_exits_during_start_up_fails_with_its_log(
    cache: Path, tmp_path: Path
) -> None:
    script = _script(tmp_path / "crasher", "echo 'unknown flag: --frobnicate' >&2\nexit 1")
    layout = Layout("launch", Ports(29800))
    component = _component("crasher", _free_port())
    with pytest.raises(TestbedError, match="crasher exited during start-up") as caught:
        start_component(layout, component, {component.binary: script}, timeout=30)
    assert "unknown flag: --frobnicate" in str(caught.value)


def test_a_component_that_never_gets_ready_times_out_and_keeps_running(
    cache: Path, tmp_path: Path
) -> None:
    script = _script(tmp_path / "mute", "exec sleep 30")
    layout = Layout("launch", Ports(29800))
    component = _component("mute", _free_port())
    with pytest.raises(TestbedError, match=r"mute not ready after 1s \(http://127\.0\.0\.1:"):
        start_component(layout, component, {component.binary: script}, timeout=1.0)
    record = process.read(layout.pid_file(component.name))
    assert record is not None
    assert process.is_alive(record)  # the caller stops what it started (Testbed.up does)
    process.stop(record, timeout=5)


def test_a_component_needs_a_known_binary(cache: Path) -> None:
    with pytest.raises(TestbedError, match="needs unknown binary ghost"):
        start_component(Layout("launch", Ports(29800)), _component("ghost"), {})


def test_probe_is_false_when_nothing_listens(cache: Path) -> None:
    layout = Layout("launch", Ports(29800))
    assert not probe(HealthCheck(f"http://127.0.0.1:{_free_port()}/healthz"), layout)


def test_ports_in_the_ephemeral_range_are_named_with_a_base_that_is_not(cache: Path) -> None:
    linux = (32768, 60999)
    clash = Ports(34400).ephemeral_clash(linux)
    assert clash is not None
    assert "ports 34400-34499" in clash
    assert "(32768-60999)" in clash
    assert clash.endswith("take a base such as 28500")
    assert Ports(32700).ephemeral_clash(linux) is not None  # its last ports reach into it
    assert Ports(28400).ephemeral_clash(linux) is None
    assert Ports(61000).ephemeral_clash(linux) is None
    assert Ports(34400).ephemeral_clash(None) is None  # not Linux: nothing to say
    # A machine whose range covers the default base is told a base past its range.
    wide = Ports(28400).ephemeral_clash((10000, 60999))
    assert wide is not None
    assert wide.endswith("take a base such as 61000")


def test_the_ephemeral_range_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    assert ephemeral_port_range(ranges) == (32768, 60999)
    ranges.write_text("garbled\n")
    assert ephemeral_port_range(ranges) is None
    assert ephemeral_port_range(tmp_path / "missing") is None


def test_a_component_that_exits_on_a_port_of_the_ephemeral_range_says_so(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failure this names: on a base in 32768-60999 an operator exited as its webhook server
    # started, most likely because an outgoing connection held the port it was to listen on.
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    monkeypatch.setattr(components, "EPHEMERAL_RANGE_FILE", ranges)
    script = _script(tmp_path / "crasher", "echo 'bind: address already in use' >&2\nexit 1")
    component = _component("crasher", _free_port())
    with pytest.raises(TestbedError, match="crasher exited during start-up") as caught:
        start_component(
            Layout("launch", Ports(34400)), component, {component.binary: script}, timeout=30
        )
    assert caught.value.hint is not None
    assert "ephemeral port range (32768-60999)" in caught.value.hint
    with pytest.raises(TestbedError) as below:
        start_component(
            Layout("launch", Ports(29800)), component, {component.binary: script}, timeout=30
        )
    assert below.value.hint is None
