"""The ``alpine`` image of a process node: the machine's shell with an ``/etc/hosts`` nslookup."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kubedl_prefect.testbed.nodeagent.images import SHIMS, resolve_image


def test_kubeflows_init_container_image_runs_with_the_nslookup_shim_first() -> None:
    environment = resolve_image("alpine:3.10", Path("/venv"))
    assert environment is not None
    assert environment.name == "shell"
    assert environment.path[0] == str(SHIMS)
    assert "/bin" in environment.path


def test_the_nslookup_shim_answers_from_the_hosts_file_and_fails_on_unknown_names() -> None:
    found = subprocess.run(
        [str(SHIMS / "nslookup"), "localhost"], capture_output=True, text=True, check=False
    )
    assert found.returncode == 0, found.stderr
    assert any(line.startswith("Address: ") for line in found.stdout.splitlines())
    missing = subprocess.run(
        [str(SHIMS / "nslookup"), "no-such-name.invalid"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 1
    assert "NXDOMAIN" in missing.stderr
