"""The Kubernetes demo (``make demo TARGET=testbed``) runs end to end on the session's test bed.

``scripts/demo --testbed`` is run as a user runs it, on the session's test bed (reused: the demo
leaves it running), with its state in a temporary folder and a namespace of its own: the
``train-and-serve`` flow trains the example as a Trainer v2 TrainJob of three nodes on the
process node (the real Trainer and JobSet controllers' pods, checkpoints on a ``testbed-local``
claim, MLflow on the pod gateway), registers and gates the model, and serves it through the real
KServe controller; the prediction comes from the predictor pod KServe created on the process
node, through its Service's forwarder. The test checks the summary, then that nothing of the
demo is left: its namespace, its servers, its pods' processes.

Long: a few minutes (three processes importing torch, then MLServer importing MLflow).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest

from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import NAMESPACES
from kubedl_prefect.testbed.nodeagent.node import PROCESS_NODE_NAME
from kubedl_prefect.testbed.testbed import Testbed

pytestmark = [pytest.mark.integration, pytest.mark.long, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[3]


def demo_processes(state: Path) -> list[psutil.Process]:
    """Processes whose command line or working directory is in the demo's state folder."""
    found = []
    for process in psutil.process_iter(["cmdline", "cwd"]):
        text = " ".join(process.info.get("cmdline") or []) + " " + (process.info.get("cwd") or "")
        if str(state) in text:
            found.append(process)
    return found


def test_the_kubernetes_demo_serves_a_prediction_from_a_kserve_pod_after_real_ddp(
    process_node: Testbed, tmp_path: Path
) -> None:
    uv = shutil.which("uv")
    assert uv is not None, "uv is not on PATH: run `make install` (scripts/install)"
    state = tmp_path / "demo"
    namespace = f"t-demo-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    done = subprocess.run(
        [
            str(REPO / "scripts" / "demo"),
            "--testbed",
            "--epochs",
            "2",
            "--state",
            str(state),
            "--namespace",
            namespace,
        ],
        cwd=REPO / "tests",  # the script finds the repository itself
        env={
            **os.environ,
            "UV_NO_SYNC": "1",  # the environment under test, as it is
            "KUBEDL_PREFECT_TESTBED": process_node.name,
        },
        capture_output=True,
        text=True,
        timeout=1400,
        check=False,
    )
    elapsed = time.monotonic() - started
    out = done.stdout
    assert done.returncode == 0, out[-6000:] + done.stderr[-4000:]

    # The summary: the local demo's lines, with the pod that answered.
    assert re.search(r"^demo done in \d+ s$", out, re.M), out[-3000:]
    assert (
        "  training        Succeeded after 1 attempt(s) "
        "(TrainJob of 3 nodes on the process node, DDP)" in out
    )
    assert re.search(
        r"^  Prefect run     http://127\.0\.0\.1:\d+/runs/flow-run/[0-9a-f-]{36}$", out, re.M
    )
    assert re.search(
        r"^  MLflow run      http://169\.254\.\d+\.1:\d+/#/experiments/\d+/runs/\w+$", out, re.M
    )
    version = re.search(
        r"^  model version   http://\S+/#/models/ddp-spirals/versions/(\d+)$", out, re.M
    )
    assert version, out[-3000:]
    assert re.search(r"^  gate            promoted: ", out, re.M)
    served = re.search(
        r"^  served          (models:/ddp-spirals/\d+) at "
        r"http://127\.0\.0\.1:\d+/v2/models/ddp-spirals/infer$",
        out,
        re.M,
    )
    assert served, out[-3000:]
    assert served.group(1) == f"models:/ddp-spirals/{version.group(1)}"
    pod = re.search(
        rf"^  predictor pod   {namespace}/(ddp-spirals-predictor-\S+) on (\S+)$", out, re.M
    )
    assert pod, out[-3000:]
    assert pod.group(2) == PROCESS_NODE_NAME
    prediction = re.search(
        r"^  prediction      \[\[0\.0, 0\.1\], \[0\.5, -0\.5\], \[-0\.3, 0\.2\]\] "
        r"-> classes \[(\d), (\d), (\d)\]$",
        out,
        re.M,
    )
    assert prediction, out[-3000:]
    logits = re.search(r"^                  logits (\[\[.*\]\])$", out, re.M)
    assert logits, out[-3000:]
    rows = json.loads(logits.group(1))  # the printed list of lists of floats is JSON
    assert [len(row) for row in rows] == [3, 3, 3]  # three spirals' logits per point
    assert [max(range(3), key=row.__getitem__) for row in rows] == [
        int(c) for c in prediction.groups()
    ]
    assert re.search(rf"^  training job    TrainJob {namespace}/\S+ ", out, re.M)
    assert "NOT SERVED" not in out

    # Nothing of the demo is left: its namespace (TrainJob, predictor, claim), its servers.
    async def namespace_gone() -> bool:
        async with await KubeClient.from_kubeconfig(str(process_node.kubeconfig)) as kube:
            found = await kube.list(NAMESPACES, None, field_selector=f"metadata.name={namespace}")
        return not found.items

    assert asyncio.run(namespace_gone()), f"namespace {namespace} is left"
    assert not (state / "servers.json").exists()
    left = demo_processes(state)
    assert not left, f"processes of the demo left running: {left}"
    assert process_node.status().up  # the demo reused it and left it running
    print(f"the Kubernetes demo took {elapsed:.0f} s")
