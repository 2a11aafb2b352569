r"""The Kubernetes demo (``make demo TARGET=testbed``): the main job on the test bed, real pods.

``python flows/demo_testbed.py`` (what ``scripts/demo --testbed`` runs) does what ``make demo``
does, with a :class:`~kubedl_prefect.prefect.blocks.KubernetesCluster` block instead of the local
one:

1. brings up the test bed ``$KUBEDL_PREFECT_TESTBED`` (default ``default``; port base
   ``$KUBEDL_PREFECT_TESTBED_PORT_BASE``) with its process node, or reuses it when it runs;
2. starts a local Prefect server (127.0.0.1) and a local MLflow server on the test bed's pod
   gateway (the host's address on the pod network, where pods reach it; never routed off this
   machine), state under ``.demo/testbed/``;
3. makes the demo's namespace and its checkpoint claim (``ddp-checkpoints``, StorageClass
   ``testbed-local``);
4. runs the same ``train-and-serve`` flow: the example's DDP training as a Kubeflow Trainer v2
   ``TrainJob`` of three nodes (1 master + 2 workers, ``torchrun``) on the process node, trained by
   the real Trainer and JobSet controllers' pods, checkpointing to the claim and logging to MLflow
   through the handoff; registration, the gate; then the InferenceService applied to the real
   KServe controller, its predictor pod (storage initializer + MLServer) on the process node;
5. sends one V2 prediction to the predictor's Service (through the process node's forwarder) and
   prints the same summary as the local demo, with the pod that answered.

Without ``--keep-servers`` everything the demo started is stopped at the end: its servers, its
namespace (the TrainJob, the predictor, the claim), and the test bed when the demo brought it up.
``--stop`` does the same for what a ``--keep-servers`` run left.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows import demo  # the local demo's servers and summary
from flows.demo import REPO, say, step

STATE = demo.STATE / "testbed"
NAMESPACE = "kubedl-prefect-demo"
BLOCK = "demo-testbed"
CLAIM = "ddp-checkpoints"
REPLICAS = {"master": 1, "worker": 2}
PROGRAM = "kubedl_prefect_examples.ddp_train"
PROCESS_NODE_TOLERATION = {
    "key": "testbed.kubedl-prefect.io/process-node",
    "operator": "Exists",
    "effect": "NoSchedule",
}
"""The process node's taint, tolerated by the training pods and the predictor."""
READY_TIMEOUT_S = 420.0
"""How long the predictor may take to be Ready (MLServer imports MLflow and torch: minutes on a
loaded 2-core machine)."""


def testbed_spec(epochs: int) -> dict[str, Any]:
    """The example's spec as a job of 1 master + 2 workers on the process node, under torchrun.

    Under Trainer v2 the three replicas are the TrainJob's three nodes; ``torchrun`` turns
    Trainer's ``PET_*`` variables into the ranks the program reads. Small CPU requests: the
    process node advertises this machine's CPUs, and three replicas must fit.
    """
    from kubedl_prefect.spec import load_spec, spec_to_data
    from kubedl_prefect.testbed.nodeagent.node import PROCESS_NODE_LABEL

    data = spec_to_data(load_spec(demo.EXAMPLE))
    data["replicas"] = dict(REPLICAS)
    data["command"] = ["torchrun", "-m", PROGRAM]
    data["args"] = ["--epochs", str(epochs)]
    data["resources"] = {"cpu": "200m", "memory": "768Mi"}
    data["nodeSelector"] = {PROCESS_NODE_LABEL: "true"}
    data["tolerations"] = [PROCESS_NODE_TOLERATION]
    return data


# -- the test bed -----------------------------------------------------------------------------


@dataclass
class Bed:
    """The test bed the demo runs on, and whether the demo started it."""

    name: str
    started_here: bool

    def testbed(self) -> Any:
        """The :class:`~kubedl_prefect.testbed.testbed.Testbed` (imported on use)."""
        from kubedl_prefect.testbed.testbed import Testbed

        return Testbed(self.name)


@contextlib.contextmanager
def testbed_progress() -> Iterator[None]:
    """The test bed's own progress lines (building, starting) while it comes up."""
    logger = logging.getLogger("kubedl_prefect.testbed")
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("    %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def bring_up(name: str) -> Bed:
    """Start the test bed ``name`` with its process node, or reuse it; wait for the node."""
    from kubedl_prefect.testbed.testbed import Testbed

    bed = Testbed(name, process_node=True)
    was_up = bed.status().up
    with testbed_progress():
        bed.up()
        bed.start_process_node()
    return Bed(name, started_here=not was_up)


def gateway(bed: Bed) -> str:
    """This machine's address on the test bed's pod network (where pods reach its servers)."""
    from kubedl_prefect.testbed.nodeagent.component import bed_network

    return str(bed_network(bed.testbed().layout).gateway)


async def _prepare_namespace(kubeconfig: Path, namespace: str) -> None:
    from kubedl_prefect.kube.client import KubeClient
    from kubedl_prefect.kube.resources import NAMESPACES, PERSISTENT_VOLUME_CLAIMS
    from kubedl_prefect.testbed.cluster import wait_default_service_account
    from kubedl_prefect.testbed.nodeagent.provisioner import STORAGE_CLASS

    async with await KubeClient.from_kubeconfig(str(kubeconfig)) as kube:
        # A namespace a previous run deleted may still be terminating: wait until it is gone.
        deadline = time.monotonic() + 180
        while True:
            found = await kube.list(NAMESPACES, None, field_selector=f"metadata.name={namespace}")
            phase = found.items[0].get("status", {}).get("phase") if found.items else None
            if phase != "Terminating":
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"namespace {namespace} is still being deleted after 180 s")
            await asyncio.sleep(1.0)
        manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        await kube.apply(NAMESPACES, None, manifest, field_manager="kubedl-prefect-demo")
        await wait_default_service_account(kube, namespace)
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": CLAIM},
            "spec": {
                # Rank 0 writes, every rank reads at start-up.
                "storageClassName": STORAGE_CLASS,
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": "256Mi"}},
            },
        }
        await kube.apply(
            PERSISTENT_VOLUME_CLAIMS, namespace, claim, field_manager="kubedl-prefect-demo"
        )


def prepare_namespace(bed: Bed, namespace: str) -> None:
    """The demo's namespace and its checkpoint claim (kept when they exist)."""
    asyncio.run(_prepare_namespace(bed.testbed().kubeconfig, namespace))


def delete_namespace(bed: Bed, namespace: str, *, timeout_s: float = 120.0) -> None:
    """Delete the demo's namespace and wait until it is gone (its pods' processes end with it)."""
    from kubedl_prefect.kube.client import KubeClient
    from kubedl_prefect.kube.resources import NAMESPACES

    testbed = bed.testbed()
    if not testbed.status().up:
        return

    async def remove() -> None:
        async with await KubeClient.from_kubeconfig(str(testbed.kubeconfig)) as kube:
            testbed.delete_namespace(namespace)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                found = await kube.list(
                    NAMESPACES, None, field_selector=f"metadata.name={namespace}"
                )
                if not found.items:
                    return
                await asyncio.sleep(1.0)
            say(f"namespace {namespace} is still being deleted after {timeout_s:.0f} s")

    asyncio.run(remove())


# -- the chain --------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What the flow run did, what served, and the training job it ran."""

    summary: demo.Summary
    served: Served | str
    job: str


@dataclass
class Served:
    """Where the prediction came from: the predictor pod KServe created, and its answer."""

    model_uri: str
    namespace: str
    pod: str
    node: str
    address: str
    infer_url: str
    prediction: list[list[float]]


def save_blocks(bed: Bed, tracking: str, artifact_destination: str, namespace: str) -> None:
    """The cluster, registry and serving blocks the flow loads by name."""
    from kubedl_prefect.prefect import KServeServing, KubernetesCluster, MlflowRegistry
    from kubedl_prefect.testbed.nodeagent.node import PROCESS_NODE_LABEL

    cluster = KubernetesCluster(kubeconfig_path=str(bed.testbed().kubeconfig), namespace=namespace)
    cluster.save(BLOCK, overwrite=True)
    # The server proxies artifacts: the registry block maps mlflow-artifacts:/ to the folder,
    # which the storage initializer of the predictor pod (a process of this machine) copies.
    MlflowRegistry(
        tracking_uri=tracking, artifact_destination=artifact_destination, experiment=BLOCK
    ).save(BLOCK, overwrite=True)
    # The predictor on the process node, where the storage initializer and MLServer really run.
    KServeServing(
        cluster=cluster,
        namespace=namespace,
        cpu="500m",
        memory="1Gi",
        node_selector={PROCESS_NODE_LABEL: "true"},
        tolerations=[PROCESS_NODE_TOLERATION],
        ready_timeout_s=READY_TIMEOUT_S,
        rollback_timeout_s=READY_TIMEOUT_S,
    ).save(BLOCK, overwrite=True)


def run_chain(
    bed: Bed,
    tracking: str,
    artifact_destination: str,
    epochs: int,
    *,
    namespace: str = NAMESPACE,
    state: Path = STATE,
) -> Outcome:
    """Run the flow on the test bed: the summary, what served (or why nothing did), the job."""
    save_blocks(bed, tracking, artifact_destination, namespace)
    train_and_serve = demo.chain_flow()
    ended = train_and_serve(
        spec=testbed_spec(epochs),
        cluster=f"kubedl-kubernetes-cluster/{BLOCK}",
        dialect="trainer",
        model_name=demo.MODEL_NAME,
        registry=BLOCK,
        metric="val_accuracy",
        serving=BLOCK,
        name=demo.SERVICE_NAME,
        serve="kserve",
        return_state=True,
    )
    flow_run_id = str(ended.state_details.flow_run_id)
    if not ended.is_completed():
        raise SystemExit(f"the flow run {flow_run_id} ended {ended.name}: {ended.message}")
    result = ended.result()
    manifest = state / "inferenceservice.yaml"
    import yaml

    manifest.write_text(yaml.safe_dump(result.manifest, sort_keys=False))
    verdict = "promoted" if result.decision.promoted else "kept out"
    model_uri = result.version.model_uri
    if result.serving is None:  # kept out by the gate: the champion is served instead
        say(f"{model_uri} was kept out by the gate; serving the champion")
        model_uri = serve_champion()
    served: Served | str
    try:
        served = predict(bed, namespace, demo.SERVICE_NAME, model_uri)
    except ServingMissing as missing:
        served = str(missing)
    ref = result.training.job_ref
    summary = demo.Summary(
        flow_run_id=flow_run_id,
        phase=result.training.phase,
        attempts=len(result.training.attempts),
        model_uri=result.version.model_uri,
        run_id=result.version.run_id or "",
        experiment_id=demo.experiment_of(tracking, result.version.run_id),
        decision=f"{verdict}: {result.decision.reason}",
        served_uri=served.model_uri if isinstance(served, Served) else "",
        infer_url=served.infer_url if isinstance(served, Served) else "",
        prediction=served.prediction if isinstance(served, Served) else [],
        manifest_path=manifest,
        applied=f"applied to namespace {namespace}",
    )
    return Outcome(summary, served, f"TrainJob {ref.namespace}/{ref.name}")


def serve_champion() -> str:
    """Apply the champion's InferenceService (the candidate was kept out); its version's URI.

    The deploy runs in a flow run of its own (``serve-champion``), so that it shows in the Prefect
    UI beside the chain's and its task logs reach the API.
    """
    from prefect import flow

    from kubedl_prefect.prefect import KServeServing, MlflowRegistry, deploy_inference_service

    @flow(name="serve-champion")
    def serve() -> str:
        registry = MlflowRegistry.load(BLOCK)
        serving = KServeServing.load(BLOCK)
        assert isinstance(registry, MlflowRegistry)
        assert isinstance(serving, KServeServing)
        champion = registry.registry().resolve(f"models:/{demo.MODEL_NAME}@champion")
        service = serving.service(demo.SERVICE_NAME, champion.storage_uri)
        deploy_inference_service(service, serving)
        return f"models:/{demo.MODEL_NAME}/{champion.version}"

    return serve()


class ServingMissing(Exception):
    """No KServe-created pod of the process node answered: what is missing, in words."""


async def _predictor(kubeconfig: Path, namespace: str, name: str) -> tuple[str, str, str]:
    """The Ready predictor pod of ``name``: its name, its node and the version it serves."""
    from kubedl_prefect.kube.client import KubeClient
    from kubedl_prefect.kube.resources import INFERENCE_SERVICES, PODS
    from kubedl_prefect.serving.render import ISVC_POD_LABEL

    async with await KubeClient.from_kubeconfig(str(kubeconfig)) as kube:
        service = await kube.get(INFERENCE_SERVICES, namespace, name)
        pods = await kube.list(PODS, namespace, label_selector=f"{ISVC_POD_LABEL}={name}")
    version = service["metadata"].get("labels", {}).get("kubedl-prefect.io/model-version", "")
    ready = [
        pod
        for pod in pods.items
        if pod.get("metadata", {}).get("deletionTimestamp") is None
        and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in pod.get("status", {}).get("conditions", [])
        )
    ]
    if not ready:
        names = ", ".join(p["metadata"]["name"] for p in pods.items) or "none"
        raise ServingMissing(
            f"InferenceService {namespace}/{name} has no Ready predictor pod (pods: {names})"
        )
    pod = ready[0]
    return pod["metadata"]["name"], str(pod["spec"].get("nodeName", "")), version


def predict(bed: Bed, namespace: str, name: str, model_uri: str, timeout_s: float = 60.0) -> Served:
    """One V2 prediction from the predictor pod KServe created, through its Service.

    ``model_uri`` is the version deployed; the service's own version label wins when it has one.

    Raises:
        ServingMissing: The predictor runs on a simulated node (nothing there answers), or no
            forwarder reaches it: what is missing, said plainly.
    """
    from kubedl_prefect.errors import TestbedError
    from kubedl_prefect.serving.local import v2_request
    from kubedl_prefect.serving.spec import PREDICTOR_SUFFIX
    from kubedl_prefect.testbed.nodeagent.forwarder import service_address
    from kubedl_prefect.testbed.nodeagent.node import PROCESS_NODE_NAME

    testbed = bed.testbed()
    pod, node, version = asyncio.run(_predictor(testbed.kubeconfig, namespace, name))
    if node != PROCESS_NODE_NAME:
        raise ServingMissing(
            f"the predictor pod {namespace}/{pod} was placed on {node or 'no node'}, not on the "
            f"process node {PROCESS_NODE_NAME}: a kwok node runs no process (kwok only marks "
            "the pod Ready), so no prediction; check the serving block's node_selector and "
            "tolerations"
        )
    service = f"{name}{PREDICTOR_SUFFIX}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            address = service_address(testbed.layout, namespace, service)
            break
        except TestbedError as exc:
            if time.monotonic() > deadline:
                raise ServingMissing(f"{exc.message} ({exc.hint})") from exc
            time.sleep(1.0)
    infer_url = f"http://{address}/v2/models/{name}/infer"
    answer = httpx.post(infer_url, json=v2_request(demo.POINTS), timeout=120.0)
    if answer.status_code != 200:
        raise ServingMissing(
            f"the predictor pod {namespace}/{pod} answered {answer.status_code}: {answer.text}"
        )
    (output,) = answer.json()["outputs"]
    width = output["shape"][1]
    rows = [output["data"][i : i + width] for i in range(0, len(output["data"]), width)]
    if version:
        model_uri = f"models:/{demo.MODEL_NAME}/{version}"
    return Served(model_uri, namespace, pod, node, address, infer_url, rows)


def shown(path: Path) -> str:
    """``path`` relative to the checkout when it is inside it (``.demo/...``), else as it is."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def print_summary(
    outcome: Outcome, servers: dict[str, demo.Server], bed: Bed, elapsed_s: float
) -> None:
    """The local demo's summary, with where training ran and which pod answered."""
    summary, served = outcome.summary, outcome.served
    replicas = f"TrainJob of {sum(REPLICAS.values())} nodes on the process node, DDP"
    lines = demo.summary_lines(summary, servers, elapsed_s, replicas=replicas)
    if isinstance(served, Served):
        lines.insert(-2, f"  predictor pod   {served.namespace}/{served.pod} on {served.node}")
    else:
        lines = [line for line in lines if not line.startswith(("  served", "  prediction"))]
        lines = [line for line in lines if not line.startswith("                  logits")]
        lines.append(f"  served          NOT SERVED: {served}")
    lines += [
        f"  training job    {outcome.job} (checkpoints on the claim {CLAIM})",
        f"  InferenceService {shown(summary.manifest_path)} "
        f"(test bed {bed.name!r}, {summary.applied})",
    ]
    print("\n".join(lines), flush=True)


# -- the command ------------------------------------------------------------------------------


def record(state: Path, bed: Bed) -> None:
    """Remember the test bed (and whether the demo started it) for ``--stop``."""
    (state / "testbed.json").write_text(json.dumps(vars(bed)) + "\n")


def recorded(state: Path) -> Bed | None:
    """The test bed a ``--keep-servers`` run left."""
    path = state / "testbed.json"
    if not path.exists():
        return None
    return Bed(**json.loads(path.read_text()))


def finish(state: Path, servers: dict[str, demo.Server], bed: Bed | None, namespace: str) -> None:
    """Stop what the demo started: the servers, its namespace, the test bed if it started it."""
    for server in servers.values():
        server.stop()
    (state / demo.SERVERS_FILE.name).unlink(missing_ok=True)
    say("servers stopped")
    if bed is None:
        return
    delete_namespace(bed, namespace)
    say(f"namespace {namespace} deleted (the TrainJob, the predictor, the claim)")
    if bed.started_here:
        bed.testbed().down()
        say(f"test bed {bed.name!r} taken down (the demo had started it)")
    (state / "testbed.json").unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the Kubernetes demo; 0 when a KServe-created pod answered the prediction."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--keep-servers", action="store_true", help="leave everything running")
    parser.add_argument("--stop", action="store_true", help="stop what a run kept, and exit")
    parser.add_argument("--epochs", type=int, default=6, help="training epochs (default 6)")
    parser.add_argument("--state", type=Path, default=STATE, help=argparse.SUPPRESS)
    parser.add_argument("--namespace", default=NAMESPACE, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    state: Path = args.state
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    state.mkdir(parents=True, exist_ok=True)
    if args.stop:
        finish(state, demo.load_servers(state), recorded(state), args.namespace)
        return 0
    started = time.monotonic()
    for server in demo.load_servers(state).values():
        server.stop()  # a kept run's servers: the MLflow one listens on its test bed's gateway
    name = os.environ.get("KUBEDL_PREFECT_TESTBED", "default")
    servers: dict[str, demo.Server] = {}
    bed: Bed | None = None
    served: Served | str = "the flow did not run"
    try:
        say(f"starting the Prefect server (SQLite, 127.0.0.1, state in {shown(state)}/) ...")
        servers["prefect"] = demo.start_prefect(state)
        os.environ["PREFECT_API_URL"] = f"{servers['prefect'].url}/api"
        os.environ["PREFECT_HOME"] = str(state / "prefect")
        os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
        with step(f"test bed {name!r} with a process node (started, or reused when it runs)"):
            bed = bring_up(name)
            record(state, bed)
        host = gateway(bed)
        say(f"starting the MLflow server on the pod gateway {host} (where pods reach it) ...")
        servers["mlflow"] = demo.start_mlflow(state, host=host)
        os.environ["MLFLOW_TRACKING_URI"] = servers["mlflow"].url
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        with step("meanwhile: the model server's environment (MLServer), importing the flow"):
            from kubedl_prefect.serving.local import install_server_environment

            install_server_environment()
            demo.chain_flow()
        with step("waiting for the Prefect and MLflow servers to answer"):
            demo.wait_healthy(list(servers.values()))
            demo.save_servers(servers, state)
        prepare_namespace(bed, args.namespace)
        with step(
            f"running the train-and-serve flow on test bed {name!r} ({args.epochs} epochs, "
            f"TrainJob of {sum(REPLICAS.values())} nodes, then KServe)"
        ):
            outcome = run_chain(
                bed,
                servers["mlflow"].url,
                (state / "mlflow" / "artifacts").as_uri(),
                args.epochs,
                namespace=args.namespace,
                state=state,
            )
        served = outcome.served
        print_summary(outcome, servers, bed, time.monotonic() - started)
    finally:
        demo.drain_prefect()
        if args.keep_servers:
            demo.save_servers(servers, state)
            say("kept running; stop it all with `scripts/demo --testbed --stop`")
        else:
            finish(state, servers, bed, args.namespace)
    return 0 if isinstance(served, Served) else 1


if __name__ == "__main__":
    sys.exit(main())
