"""Kueue preempts a real DDP job on the process node; the same job resumes from its checkpoint.

Issue 19's "Done when" on real pods: the real Kueue v0.19.2 admits, from a ClusterQueue with a
cpu quota on a ResourceFlavor of the test bed's process node (made by the test, deleted after),
a low-priority DDP job (``examples/train/pytorch-ddp-cpu.yaml``, 2 replicas, checkpointing to a
PersistentVolumeClaim after every epoch). Once its first checkpoint is on the claim, a
high-priority job that does not fit beside it arrives: Kueue preempts the low one (suspends it;
the operator deletes its pods, whose processes are killed), runs the high one, then admits the
*same* low job again. Its rank 0 says it resumed at the epoch after the one saved before the
preemption, the lifecycle reported ``requeued: Preempted...`` on attempt 1 (no second
submission: one job object, the one first created), and it ends Succeeded. For a Kubeflow v1
PyTorchJob and a Trainer v2 TrainJob (``torchrun``); no controller restarted meanwhile.

Each case takes 3-5 minutes here (two starts of two Python processes importing torch on the
shared 2-core machine, its load average near 20): Kubeflow 174 s (preempted after epoch 2,
resumed at 3), TrainJob 313 s (after epoch 1, at 2); hence ``long``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import (
    KUEUE_CLUSTER_QUEUES,
    KUEUE_LOCAL_QUEUES,
    PERSISTENT_VOLUME_CLAIMS,
    PODS,
    ResourceKind,
)
from kubedl_prefect.lifecycle.backend import JobRef, PhaseUpdate, WaitTimeouts
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.lifecycle.kubernetes.dialects import JobObjects
from kubedl_prefect.lifecycle.status import Phase
from kubedl_prefect.spec import Dialect, parse_spec
from kubedl_prefect.testbed import kueue
from kubedl_prefect.testbed.nodeagent.node import PROCESS_NODE_LABEL
from kubedl_prefect.testbed.nodeagent.provisioner import PERSISTENT_VOLUMES
from kubedl_prefect.testbed.testbed import Testbed
from tests.integration.process_node.conftest import NewClaim
from tests.support.polling import until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.long,
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("unchanged_operators"),
]

EXAMPLE = Path(__file__).parents[3] / "examples" / "train" / "pytorch-ddp-cpu.yaml"
PROGRAM = "kubedl_prefect_examples.ddp_train"
LOCAL_QUEUE = "process"
CLAIM = "ddp-checkpoints"
#: Epochs of the low-priority job; a pause after each leaves the high one time to come.
EPOCHS = 6
EPOCH_PAUSE_S = 4
#: The ClusterQueue's cpu quota: the low job (2 x 400m) and the high one (500m) do not fit
#: together, so Kueue preempts the low one.
CPU_QUOTA = "1"
RESUMING = re.compile(r"rank 0: resuming from (?P<path>\S+) at epoch (?P<epoch>\d+)")
WITHIN = WaitTimeouts(admission_s=600, startup_s=600, completion_s=900)
RESOURCE_FLAVORS = ResourceKind(
    "kueue.x-k8s.io", "v1beta2", "ResourceFlavor", "resourceflavors", namespaced=False
)

Obj = dict[str, Any]


def on_process_node(raw: Obj) -> Obj:
    raw["nodeSelector"] = {PROCESS_NODE_LABEL: "true"}
    raw["tolerations"] = [{"key": PROCESS_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}]
    return raw


def low_spec(dialect: Dialect) -> Obj:
    """The shipped DDP example, 2 replicas, in the LocalQueue at low priority."""
    raw: Obj = yaml.safe_load(EXAMPLE.read_text())
    raw["replicas"] = {"master": 1, "worker": 1}
    args = ["--epochs", str(EPOCHS), "--samples", "1200", "--epoch-pause-s", str(EPOCH_PAUSE_S)]
    raw["args"] = args
    if dialect is Dialect.TRAINER:
        raw["command"] = ["torchrun", "-m", PROGRAM]
    raw["resources"] = {"cpu": "400m", "memory": "768Mi"}
    raw["kueue"] = {"queue": LOCAL_QUEUE, "priorityClass": "low"}
    return on_process_node(raw)


def high_spec() -> Obj:
    """A short job of one replica at high priority that does not fit beside the low one."""
    return on_process_node(
        {
            "name": "urgent",
            "framework": "pytorch",
            "image": "ghcr.io/kubedl-prefect/ddp-train:0.1.0",
            "command": [
                "python",
                "-c",
                "import time; print('high-priority job ran', flush=True); time.sleep(2)",
            ],
            "replicas": {"master": 1},
            "resources": {"cpu": "500m", "memory": "256Mi"},
            "kueue": {"queue": LOCAL_QUEUE, "priorityClass": "high"},
        }
    )


@pytest.fixture
async def process_queue(kube: KubeClient, namespace: str) -> AsyncIterator[str]:
    """A flavor of the process node, a ClusterQueue with a cpu quota there, LocalQueue ``process``.

    All cluster-scoped objects are named after the namespace and deleted afterwards.
    """
    flavor = f"pn-{namespace}"[:63]
    name = f"cq-{namespace}"[:63]
    await kueue.write(kube, [kueue.process_flavor(flavor, PROCESS_NODE_LABEL)])
    queue = kueue.cluster_queue(
        name, namespace=namespace, gpus=0, cpu=CPU_QUOTA, memory="8Gi", flavor=flavor
    )
    await kueue.write(kube, [queue, kueue.local_queue(namespace, LOCAL_QUEUE, name)])
    yield name
    await kube.delete(KUEUE_LOCAL_QUEUES, namespace, LOCAL_QUEUE)
    await kube.delete(KUEUE_CLUSTER_QUEUES, None, name)
    await kube.delete(RESOURCE_FLAVORS, None, flavor)


async def checkpoint_folder(kube: KubeClient, namespace: str) -> Path | None:
    """The host folder of the claim's volume, once it is bound."""
    with contextlib.suppress(Exception):
        claim = await kube.get(PERSISTENT_VOLUME_CLAIMS, namespace, CLAIM)
        volume_name = (claim.get("spec") or {}).get("volumeName")
        if volume_name:
            volume = await kube.get(PERSISTENT_VOLUMES, None, volume_name)
            return Path(volume["spec"]["hostPath"]["path"])
    return None


def saved_epoch(folder: Path) -> int | None:
    """The epoch of the one ``checkpoint.pt`` under ``folder`` (``None`` before the first)."""
    import torch

    saved = sorted(folder.rglob("checkpoint.pt"))
    if not saved:
        return None
    assert len(saved) == 1, saved  # one logical job, one checkpoint folder on the claim
    data = torch.load(saved[0], map_location="cpu", weights_only=True)
    return int(data["epoch"])


async def rank_zero_log(kube: KubeClient, ref: JobRef) -> list[str]:
    """The log of the job's pod that trains rank 0 (it says so), as its node keeps it."""
    key, value = JobObjects(Dialect(ref.dialect), ref.name).pod_label
    pods = await kube.list(PODS, ref.namespace, label_selector=f"{key}={value}")
    for pod in pods.items:
        for container in pod["spec"]["containers"]:
            with contextlib.suppress(Exception):
                lines = await kube.read_log(
                    ref.namespace, pod["metadata"]["name"], container["name"], tail_lines=2000
                )
                if any(line.startswith("rank 0: ") for line in lines):
                    return lines
    return []


@pytest.mark.parametrize("dialect", [Dialect.KUBEFLOW, Dialect.TRAINER], ids=lambda d: d.value)
async def test_a_preempted_ddp_job_is_requeued_and_resumes_from_its_checkpoint(
    dialect: Dialect,
    kube: KubeClient,
    namespace: str,
    process_node: Testbed,
    process_queue: str,
    admin_kubeconfig: Path,
    new_claim: NewClaim,
) -> None:
    started = time.monotonic()
    await new_claim(CLAIM)
    backend = KubernetesBackend(
        namespace=namespace, dialect=dialect, kubeconfig=str(admin_kubeconfig)
    )
    try:
        low = await backend.submit(parse_spec(low_spec(dialect)), key="ddp-low", attempt=1)
        low_seen: list[PhaseUpdate] = []
        low_done = asyncio.ensure_future(
            backend.wait_completed(low, timeouts=WITHIN, on_phase=low_seen.append)
        )
        folder = await until(
            "the claim bound", lambda: checkpoint_folder(kube, namespace), within_s=120
        )

        async def first_checkpoint() -> bool:
            assert not low_done.done(), low_done  # neither failed nor over before preempted
            return await asyncio.to_thread(saved_epoch, folder) is not None

        await until("the low job's first checkpoint", first_checkpoint, within_s=420)
        high = await backend.submit(parse_spec(high_spec()), key="urgent", attempt=1)
        high_seen: list[PhaseUpdate] = []
        high_done = asyncio.ensure_future(
            backend.wait_completed(high, timeouts=WITHIN, on_phase=high_seen.append)
        )

        async def high_running() -> bool:
            assert not high_done.done() or high_done.result().succeeded, high_done
            return any(u.phase in (Phase.RUNNING, Phase.SUCCEEDED) for u in high_seen)

        await until("the high-priority job running", high_running, within_s=240)
        # Kueue admitted it only once the low job's pods had stopped: its checkpoint is final.
        before = await asyncio.to_thread(saved_epoch, folder)
        assert before is not None
        assert before < EPOCHS - 1, f"the low job was over (epoch {before}) before preempted"
        high_outcome = await high_done
        outcome = await low_done
        resource = ResourceKind.of({"apiVersion": low.api_version, "kind": low.kind})
        jobs = {j["metadata"]["name"]: j for j in (await kube.list(resource, namespace)).items}
        lines = await rank_zero_log(kube, low)
    finally:
        await backend.close()
    assert high_outcome.succeeded, high_outcome
    assert outcome.succeeded, outcome
    assert outcome.ref.attempt == 1

    # The lifecycle said "requeued", never failed, on the same attempt.
    requeued = [u for u in low_seen if u.status.reason == "Requeued"]
    assert requeued, [(u.phase, u.status.reason) for u in low_seen]
    assert requeued[0].phase is Phase.QUEUING
    assert requeued[0].status.message.startswith("requeued: Preempted"), requeued[0].status
    phases = [u.phase for u in low_seen]
    assert Phase.FAILED not in phases
    assert phases.index(Phase.RUNNING) < phases.index(Phase.QUEUING, phases.index(Phase.RUNNING))
    assert phases[-1] is Phase.SUCCEEDED

    # One job object per key, the one first submitted (Kueue suspended and resumed it).
    assert set(jobs) == {low.name, high.name}
    assert jobs[low.name]["metadata"]["uid"] == low.uid

    # The resumed run went on at the epoch after the checkpoint saved before the preemption.
    # (The node may keep the log of the pod's run before the preemption above it.)
    at = next((i for i, line in enumerate(lines) if RESUMING.search(line)), None)
    assert at is not None, lines[-40:]
    resumed = RESUMING.search(lines[at])
    assert resumed is not None
    assert int(resumed.group("epoch")) == before + 1, (before, resumed.group(0))
    assert resumed.group("path").startswith("/checkpoints/")
    assert f"epoch {EPOCHS - 1} done" in "\n".join(lines[at:])
    assert not any("starting from scratch" in line for line in lines[at:]), lines[at:]
    assert await asyncio.to_thread(saved_epoch, folder) == EPOCHS - 1
    print(
        f"{dialect.value}: preempted after epoch {before}, resumed at {before + 1}, "
        f"succeeded at {time.monotonic() - started:.0f}s"
    )
