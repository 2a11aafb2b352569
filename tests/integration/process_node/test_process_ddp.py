"""The shipped DDP example trains for real through the operators on process pods (issue 20, item 4).

``examples/train/pytorch-ddp-cpu.yaml`` (the program ``make demo`` trains) runs as 1 master + 2
workers under the real KubeDL operator and the real Kubeflow training operator v1, on the test
bed's process node: three processes of this machine, each in its own network namespace, which
rendezvous through what the operator injected (``MASTER_ADDR`` naming the master's headless
Service, resolved by the pods' ``/etc/hosts``), checkpoint to a PersistentVolumeClaim of the test
bed's local provisioner, and log parameters, metrics and the model to a real MLflow server through
the handoff contract (tracking URI, run, credentials from a Secret). The MLflow server listens on
the host's side of the test bed's bridge (its link-local gateway address): the pods reach it
there, and nothing leaves the machine.

Mid-training the master's training process is killed (SIGKILL, exit 137): under its ``ExitCode``
restart policy the operator deletes and recreates the master pod, the workers' collective fails
and they are restarted in place (``OnFailure``), every rank resumes from the checkpoint on the
claim, and the job ends Succeeded, one job object. Each test takes 1-3 minutes here (starting three
Python processes that import torch, twice, on the shared 2-core machine), hence ``long``: KubeDL
165 s, Kubeflow 145 s, and the MLflow server's start about a minute once per module.

Under Kubeflow Trainer v2 the example runs as a TrainJob of three nodes started by ``torchrun``
(Trainer's ``PET_*`` variables, node 0's host name ``<job>-node-0-0.<job>`` resolved by the pods'
``/etc/hosts``), 114 s here; no replica is killed there: a TrainJob has no restart policy of its
own (a failed node fails the JobSet unless its runtime sets a failure policy), not tried yet.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import (
    PERSISTENT_VOLUME_CLAIMS,
    PODS,
    SECRETS,
    ResourceKind,
)
from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.spec import Dialect, Framework, job_resource, parse_spec
from kubedl_prefect.spec.handoff import Handoff, TrackingCredentials, with_handoff
from kubedl_prefect.testbed.nodeagent.component import bed_network
from kubedl_prefect.testbed.nodeagent.node import PROCESS_NODE_LABEL
from kubedl_prefect.testbed.nodeagent.provisioner import PERSISTENT_VOLUMES
from kubedl_prefect.testbed.testbed import Testbed
from tests.integration.process_node.conftest import NewClaim
from tests.support.mlflow_server import MlflowServer
from tests.support.polling import until

pytestmark = [pytest.mark.integration, pytest.mark.long, pytest.mark.timeout(900)]

EXAMPLE = Path(__file__).parents[3] / "examples" / "train" / "pytorch-ddp-cpu.yaml"
EPOCHS = 4
PROGRAM = "kubedl_prefect_examples.ddp_train"

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def pod_mlflow(
    process_node: Testbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MlflowServer]:
    """A tracking server on the host's address on the test bed's bridge, where pods reach it."""
    gateway = bed_network(process_node.layout).gateway
    server = MlflowServer.start(tmp_path_factory.mktemp("pod-mlflow"), host=gateway)
    try:
        yield server
    finally:
        server.stop()


def example_spec() -> Obj:
    """The shipped example as 1 master + 2 workers on the process node, small and slow enough.

    Three small replicas fit the node's CPUs; a pause after each epoch leaves time to kill one.
    """
    raw: Obj = yaml.safe_load(EXAMPLE.read_text())
    raw["replicas"] = {"master": 1, "worker": 2}
    raw["args"] = ["--epochs", str(EPOCHS), "--samples", "1200", "--epoch-pause-s", "3"]
    raw["resources"] = {"cpu": "200m", "memory": "768Mi"}
    raw["nodeSelector"] = {PROCESS_NODE_LABEL: "true"}
    raw["tolerations"] = [{"key": PROCESS_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}]
    return raw


def training_process(run_id: str, rank: str) -> psutil.Process | None:
    """The process of this machine training ``rank`` of the job logging into ``run_id``."""
    for proc in psutil.process_iter(["cmdline"]):
        if PROGRAM not in (proc.info.get("cmdline") or []):
            continue
        with contextlib.suppress(psutil.Error):
            env = proc.environ()
            if env.get("MLFLOW_RUN_ID") == run_id and env.get("RANK") == rank:
                return proc
    return None


async def master_log(kube: KubeClient, namespace: str, pod: Obj) -> list[str]:
    container = pod["spec"]["containers"][0]["name"]
    name = pod["metadata"]["name"]
    return await kube.read_log(namespace, name, container, tail_lines=400)


@pytest.mark.parametrize("dialect", [Dialect.KUBEDL, Dialect.KUBEFLOW], ids=lambda d: d.value)
async def test_the_ddp_example_trains_resumes_after_a_kill_and_logs_to_mlflow(
    dialect: Dialect,
    kube: KubeClient,
    namespace: str,
    process_node: Testbed,
    pod_mlflow: MlflowServer,
    admin_kubeconfig: Path,
    new_claim: NewClaim,
) -> None:
    from mlflow.tracking import MlflowClient

    started = time.monotonic()
    await new_claim("ddp-checkpoints")
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "mlflow-auth"},
        "data": {
            "user": base64.b64encode(b"trainer").decode(),
            "password": base64.b64encode(b"not-checked-by-this-server").decode(),
        },
    }
    await kube.create(SECRETS, namespace, secret)

    client = MlflowClient(pod_mlflow.url)
    experiment_id = client.create_experiment(f"ddp-{dialect.value}-{namespace}")
    run = client.create_run(experiment_id, run_name=f"ddp-{dialect.value}")
    run_id = run.info.run_id
    handoff = Handoff(
        tracking_uri=pod_mlflow.url,
        experiment_id=experiment_id,
        experiment_name=f"ddp-{dialect.value}-{namespace}",
        run_id=run_id,
        credentials=TrackingCredentials(
            "mlflow-auth", username_key="user", password_key="password"
        ),
    )
    spec = with_handoff(parse_spec(example_spec()), handoff)

    backend = KubernetesBackend(
        namespace=namespace, dialect=dialect, kubeconfig=str(admin_kubeconfig)
    )
    try:
        ref = await backend.submit(spec, key=f"ddp-{dialect.value}", attempt=1)
        master = f"{ref.name}-master-0"

        async def checkpointed() -> Obj | None:
            with contextlib.suppress(Exception):
                pod = await kube.get(PODS, namespace, master)
                if any("epoch 0 done" in line for line in await master_log(kube, namespace, pod)):
                    return pod
            return None

        first = await until("the first checkpoint", checkpointed, within_s=420, every_s=1.0)
        first_uid = first["metadata"]["uid"]
        victim = await asyncio.to_thread(training_process, run_id, "0")
        assert victim is not None, "the master's training process is not running"
        # The tracking credentials reached the process from the Secret (secretKeyRef).
        environ = await asyncio.to_thread(victim.environ)
        assert environ["MLFLOW_TRACKING_USERNAME"] == "trainer"
        assert environ["MLFLOW_TRACKING_PASSWORD"] == "not-checked-by-this-server"
        assert environ["MLFLOW_TRACKING_URI"] == pod_mlflow.url
        victim.send_signal(signal.SIGKILL)
        killed_at = time.monotonic() - started

        async def recreated() -> Obj | None:
            with contextlib.suppress(Exception):
                pod = await kube.get(PODS, namespace, master)
                if pod["metadata"]["uid"] != first_uid:
                    return pod
            return None

        second = await until("the operator's new master pod", recreated, within_s=180, every_s=1.0)
        outcome = await backend.wait_completed(ref)
        resource = job_resource(dialect, Framework.PYTORCH)
        kind = ResourceKind(resource.group, resource.version, resource.kind, resource.plural)
        jobs = await kube.list(kind, namespace)
    finally:
        await backend.close()
    assert outcome.succeeded, outcome
    assert [j["metadata"]["name"] for j in jobs.items] == [ref.name]

    # The new master went on from the checkpoint instead of starting over.
    lines = await master_log(kube, namespace, second)
    resumed = [line for line in lines if "rank 0: resuming from" in line]
    assert resumed, lines[-40:]
    assert resumed[0].startswith("rank 0: resuming from /checkpoints/")
    assert int(resumed[0].rsplit(" ", 1)[-1]) >= 1  # at the epoch after the checkpoint
    assert f"epoch {EPOCHS - 1} done" in "\n".join(lines)

    # The checkpoint lies in the claim's folder (a volume of the local provisioner), under the
    # logical job's own folder (KUBEDL_PREFECT_CHECKPOINT_DIR).
    bound = await kube.get(PERSISTENT_VOLUME_CLAIMS, namespace, "ddp-checkpoints")
    volume = await kube.get(PERSISTENT_VOLUMES, None, bound["spec"]["volumeName"])
    folder = Path(volume["spec"]["hostPath"]["path"])
    saved = await asyncio.to_thread(lambda: sorted(folder.rglob("checkpoint.pt")))
    assert len(saved) == 1, saved  # one logical job, one checkpoint folder on the claim

    # Parameters, one metric point per epoch and the model reached MLflow from inside the pods.
    finished = client.get_run(run_id)
    assert finished.data.params["epochs"] == str(EPOCHS)
    history = client.get_metric_history(run_id, "val_accuracy")
    assert sorted(point.step for point in history) == list(range(EPOCHS))
    assert history[-1].value > 0.5
    models = client.search_logged_models(experiment_ids=[experiment_id])
    assert [m.source_run_id for m in models] == [run_id]
    print(
        f"{dialect.value}: killed the master at {killed_at:.0f}s, "
        f"succeeded at {time.monotonic() - started:.0f}s"
    )


async def test_the_ddp_example_trains_under_trainer_v2_with_torchrun(
    kube: KubeClient,
    namespace: str,
    process_node: Testbed,
    pod_mlflow: MlflowServer,
    admin_kubeconfig: Path,
    new_claim: NewClaim,
) -> None:
    """The same example as a TrainJob of three nodes: Trainer's PET_* variables, torchrun."""
    from mlflow.tracking import MlflowClient

    await new_claim("ddp-checkpoints")
    client = MlflowClient(pod_mlflow.url)
    experiment_id = client.create_experiment(f"ddp-trainer-{namespace}")
    run_id = client.create_run(experiment_id, run_name="ddp-trainer").info.run_id
    handoff = Handoff(
        tracking_uri=pod_mlflow.url,
        experiment_id=experiment_id,
        experiment_name=f"ddp-trainer-{namespace}",
        run_id=run_id,
    )
    raw = example_spec()
    raw["command"] = ["torchrun", "-m", PROGRAM]
    raw["args"] = ["--epochs", "2", "--samples", "1200"]
    spec = with_handoff(parse_spec(raw), handoff)
    backend = KubernetesBackend(
        namespace=namespace, dialect=Dialect.TRAINER, kubeconfig=str(admin_kubeconfig)
    )
    try:
        ref = await backend.submit(spec, key="ddp-trainer", attempt=1)
        outcome = await backend.wait_completed(ref)
    finally:
        await backend.close()
    assert outcome.succeeded, outcome
    history = client.get_metric_history(run_id, "val_accuracy")
    assert sorted(point.step for point in history) == [0, 1]
    models = client.search_logged_models(experiment_ids=[experiment_id])
    assert [m.source_run_id for m in models] == [run_id]
