"""The Kubernetes demo's command and spec (``make demo TARGET=testbed``), without a test bed.

The demo itself runs in tests/integration/process_node/test_demo_on_testbed.py (long).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kubedl_prefect.spec import Dialect, parse_spec, render
from kubedl_prefect.testbed.nodeagent.node import PROCESS_NODE_LABEL

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from flows import demo_testbed  # noqa: E402  (flows/ is not a package of the wheel)


def make_dry_run(*variables: str) -> subprocess.CompletedProcess[str]:
    make = shutil.which("make")
    assert make is not None, "make is not installed"
    return subprocess.run(
        [make, "-n", "demo", *variables],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_make_demo_target_testbed_runs_the_kubernetes_demo_and_local_stays_the_default() -> None:
    testbed = make_dry_run("TARGET=testbed", "EPOCHS=2", "KEEP=1")
    assert testbed.returncode == 0, testbed.stderr
    assert "scripts/demo --testbed --keep-servers --epochs 2" in " ".join(testbed.stdout.split())
    for local in (make_dry_run(), make_dry_run("TARGET=local")):
        assert local.returncode == 0, local.stderr
        commands = [line.split() for line in local.stdout.splitlines() if "scripts/demo" in line]
        assert commands == [["scripts/demo"]]


def test_make_demo_refuses_an_unknown_target() -> None:
    done = make_dry_run("TARGET=kind")
    assert done.returncode != 0
    assert "TARGET is local (the default) or testbed, not 'kind'" in done.stderr


def test_scripts_demo_hands_testbed_to_the_kubernetes_demo() -> None:
    script = (REPO / "scripts" / "demo").read_text()
    assert 'exec uv run --frozen --all-extras python flows/demo_testbed.py "$@"' in script


@pytest.mark.parametrize("epochs", [1, 6])
def test_the_demo_trains_a_trainjob_of_three_nodes_on_the_process_node(epochs: int) -> None:
    spec = parse_spec(demo_testbed.testbed_spec(epochs))
    assert spec.name == "ddp-spirals"
    manifest = render(spec, Dialect.TRAINER)
    assert manifest["kind"] == "TrainJob"
    trainer = manifest["spec"]["trainer"]
    assert trainer["numNodes"] == 3  # 1 master + 2 workers
    assert trainer["command"] == ["torchrun", "-m", "kubedl_prefect_examples.ddp_train"]
    assert trainer["args"] == ["--epochs", str(epochs)]
    (patch,) = manifest["spec"]["runtimePatches"]
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = job["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {PROCESS_NODE_LABEL: "true"}
    assert pod["tolerations"] == [
        {"key": PROCESS_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}
    ]
    # The checkpoint claim the demo makes, mounted where the example writes.
    assert pod["volumes"] == [
        {
            "name": "kubedl-prefect-checkpoint",
            "persistentVolumeClaim": {"claimName": demo_testbed.CLAIM},
        }
    ]
    assert {"name": "KUBEDL_PREFECT_CHECKPOINT_DIR", "value": "/checkpoints"} in trainer["env"]
