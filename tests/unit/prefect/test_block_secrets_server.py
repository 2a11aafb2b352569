"""Every block's secrets stay secret through a real Prefect server's API.

Each block is saved to a Prefect test server (``prefect_test_harness``, ``PREFECT_HOME`` in a
temporary directory) and read back as anyone who may read blocks reads it: through the client
without secrets and through the raw filter endpoint. No secret value may appear in either; loading
the block (with secrets, as a flow does) still gives every value back.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator

import pytest
from prefect.blocks.core import Block
from prefect.client.orchestration import get_client
from pydantic import SecretStr

from kubedl_prefect.lifecycle.local import LocalBackend
from kubedl_prefect.prefect import (
    KServeServing,
    KubernetesCluster,
    LocalCluster,
    MlflowRegistry,
    TrainingJob,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning",
    "ignore:unclosed <socket.socket:ResourceWarning",
)

SPEC = {"name": "mnist", "image": "busybox", "replicas": {"master": 1, "worker": 2}}


@pytest.fixture(autouse=True)
def collect_prefects_leaked_connections() -> Iterator[None]:
    yield
    gc.collect()


def blocks_with_secrets() -> list[tuple[str, Block, list[str]]]:
    """(name, block, its secret values): every block type, every secret field, nested too."""
    kubeconfig = (
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://k:6443'}}]\n"
        "users: [{name: u, user: {token: kubeconfig-secret-1}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    return [
        (
            "local-env",
            LocalCluster(env={"API_SECRET": "local-secret-1", "B": SecretStr("local-secret-2")}),
            ["local-secret-1", "local-secret-2"],
        ),
        (
            "kube-kubeconfig",
            KubernetesCluster(kubeconfig=SecretStr(kubeconfig)),
            ["kubeconfig-secret-1"],
        ),
        (
            "kube-token",
            KubernetesCluster(server="https://k:6443", token=SecretStr("kube-token-secret-1")),
            ["kube-token-secret-1"],
        ),
        (
            "job-on-local",
            TrainingJob(spec=SPEC, cluster=LocalCluster(env={"API_SECRET": "job-secret-1"})),
            ["job-secret-1"],
        ),
        (
            "job-on-kube",
            TrainingJob(
                spec=SPEC,
                cluster=KubernetesCluster(server="https://k", token=SecretStr("job-secret-2")),
            ),
            ["job-secret-2"],
        ),
        (
            "mlflow-basic",
            MlflowRegistry(
                tracking_uri="https://mlflow:5000", username="ci", password=SecretStr("ml-pw-1")
            ),
            ["ml-pw-1"],
        ),
        (
            "mlflow-token",
            MlflowRegistry(tracking_uri="https://mlflow:5000", token=SecretStr("ml-token-1")),
            ["ml-token-1"],
        ),
        (
            "serving",
            KServeServing(
                cluster=KubernetesCluster(server="https://k", token=SecretStr("serve-secret-1"))
            ),
            ["serve-secret-1"],
        ),
    ]


async def test_no_secret_is_readable_through_the_api_without_secrets(
    prefect_server: dict[str, str],
) -> None:
    saved = blocks_with_secrets()
    for name, block, _ in saved:
        await block.asave(name, overwrite=True)
    leaked: list[tuple[str, str, str]] = []
    async with get_client() as client:
        raw = await client._client.post("/block_documents/filter", json={"limit": 200})
        raw.raise_for_status()
        for name, block, secrets in saved:
            document = await client.read_block_document_by_name(
                name, block.get_block_type_slug(), include_secrets=False
            )
            shown = json.dumps(document.model_dump(mode="json"))
            leaked += [("client", name, secret) for secret in secrets if secret in shown]
            leaked += [("filter", name, secret) for secret in secrets if secret in raw.text]
    assert {name for name, _, _ in saved} <= {d["name"] for d in raw.json()}
    assert not leaked, f"secrets readable without include_secrets: {leaked}"


async def test_loading_a_saved_block_still_gives_its_secrets(
    prefect_server: dict[str, str],
) -> None:
    local = LocalCluster(env={"API_SECRET": "round-trip-1"})
    await local.asave("round-trip", overwrite=True)
    backend = (await LocalCluster.aload("round-trip")).backend()
    assert isinstance(backend, LocalBackend)
    assert backend.env == {"API_SECRET": "round-trip-1"}
    job = TrainingJob(spec=SPEC, cluster=LocalCluster(env={"API_SECRET": "round-trip-2"}))
    await job.asave("round-trip-job", overwrite=True)
    again = await TrainingJob.aload("round-trip-job")
    assert isinstance(again.cluster, LocalCluster)
    nested = again.cluster.backend()
    assert isinstance(nested, LocalBackend)
    assert nested.env == {"API_SECRET": "round-trip-2"}
