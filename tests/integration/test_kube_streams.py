"""The Kubernetes layer against the real test bed: big watch events and log lines, credentials.

Streams: an object of about 1 MiB reaches an informer whole (created and modified through our
client), and a 1 MiB log line written by a kwok pod arrives whole through the API server's log
proxy. Credentials: the administrator's kubeconfig passed as content, and a ServiceAccount's
token with the cluster's CA passed as :class:`BearerToken` (as PEM text and as a file), each
listing something, and the token refused what its Role does not allow.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedl_prefect.errors import ForbiddenError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.credentials import (
    BearerToken,
    KubeconfigContent,
    KubeconfigFile,
    connect,
)
from kubedl_prefect.kube.resources import PODS, KubeObject, ResourceKind
from kubedl_prefect.kube.watch import Informer, WatchSettings
from kubedl_prefect.testbed import content
from kubedl_prefect.testbed.podlogs import PodLog

pytestmark = pytest.mark.integration

CONFIGMAPS = ResourceKind("", "v1", "ConfigMap", "configmaps")
MIB = 1024 * 1024
# A ConfigMap's keys and values may hold at most 1 MiB in all.
NEARLY_MIB = MIB - 1024


@pytest.fixture
async def admin(admin_kubeconfig: Path) -> AsyncIterator[KubeClient]:
    client = await connect(KubeconfigFile(str(admin_kubeconfig)))
    yield client
    await client.close()


def configmap(name: str, value: str) -> KubeObject:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"blob": value},
    }


async def test_an_object_of_about_one_mebibyte_reaches_the_informer_whole(
    admin: KubeClient, namespace: str
) -> None:
    informer = Informer(admin, CONFIGMAPS, namespace, WatchSettings())
    subscription = informer.subscribe(lambda o: o["metadata"]["name"] == "big")
    informer.start()
    try:
        await asyncio.wait_for(informer.wait_synced(), 30)
        first = "a" * NEARLY_MIB
        await admin.create(CONFIGMAPS, namespace, configmap("big", first))
        added = await asyncio.wait_for(subscription.next(), 30)
        assert added.type == "ADDED"
        assert added.object["data"]["blob"] == first
        second = "b" * NEARLY_MIB
        await admin.patch(CONFIGMAPS, namespace, "big", {"data": {"blob": second}})
        modified = await asyncio.wait_for(subscription.next(), 30)
        assert modified.type == "MODIFIED"
        assert modified.object["data"]["blob"] == second
        assert informer.stats.reconnects == 0
        assert informer.stats.lists == 1
    finally:
        await informer.stop()


async def running_pod(client: KubeClient, namespace: str, name: str) -> KubeObject:
    """A kwok pod running for five minutes (its container never prints by itself)."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {content.RUN_DURATION: "300s"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "registry.example/main:1"}],
        },
    }
    await client.create(PODS, namespace, manifest)
    async with asyncio.timeout(60):
        while True:
            pod = await client.get(PODS, namespace, name)
            if (pod.get("status") or {}).get("phase") == "Running":
                return pod
            await asyncio.sleep(0.2)


async def test_a_one_mebibyte_log_line_arrives_whole(
    admin: KubeClient, namespace: str, pod_log: Callable[..., PodLog]
) -> None:
    log = pod_log(namespace, "talker")
    long_line = "epoch 1 " + "x" * MIB
    log.write("before", long_line, "after")
    await running_pod(admin, namespace, "talker")
    received: list[str] = []
    stream = admin.follow_log(namespace, "talker", "main")
    try:
        async with asyncio.timeout(60):
            async for line in stream:
                received.append(line.partition(" ")[2])
                if len(received) == 3:
                    break
    finally:
        await stream.aclose()
    assert received == ["before", long_line, "after"]
    assert (await admin.read_log(namespace, "talker", "main", tail_lines=1)) == ["after"]


# -- credentials -------------------------------------------------------------------------------


async def test_the_admin_kubeconfig_passed_as_content(
    admin_kubeconfig: Path, namespace: str
) -> None:
    credentials = KubeconfigContent(await asyncio.to_thread(admin_kubeconfig.read_text))
    async with await connect(credentials) as client:
        assert client.server.startswith("https://127.0.0.1:")
        assert client.cluster_id == credentials.session_key()
        await client.create(CONFIGMAPS, namespace, configmap("seen", "x"))
        names = [o["metadata"]["name"] for o in (await client.list(CONFIGMAPS, namespace)).items]
        assert "seen" in names


def token_and_ca(kubeconfig: Path) -> tuple[str, str, str]:
    """The server, token and CA (PEM) of a ServiceAccount kubeconfig of the test bed."""
    document: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
    cluster = document["clusters"][0]["cluster"]
    token = document["users"][0]["user"]["token"]
    ca_pem = base64.b64decode(cluster["certificate-authority-data"]).decode()
    return cluster["server"], token, ca_pem


async def test_a_service_account_token_and_the_ca_as_bearer_token_credentials(
    namespace: str,
    service_account_kubeconfig: Callable[..., Path],
    admin: KubeClient,
    tmp_path: Path,
) -> None:
    rules = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]
    server, token, ca_pem = token_and_ca(service_account_kubeconfig(namespace, rules))
    await admin.create(CONFIGMAPS, namespace, configmap("visible", "x"))
    ca_file = tmp_path / "ca.crt"
    ca_file.write_text(ca_pem)
    for credentials in (
        BearerToken(server=server, token=token, ca_cert=ca_pem),
        BearerToken(server=server, token=token, ca_file=str(ca_file)),
    ):
        assert token not in repr(credentials)
        assert token not in credentials.session_key()
        async with await connect(credentials) as client:
            assert client.server == server
            listing = await client.list(CONFIGMAPS, namespace)
            assert "visible" in [o["metadata"]["name"] for o in listing.items]
            with pytest.raises(ForbiddenError) as refused:
                await client.list(PODS, namespace)
            assert refused.value.status == 403
            assert token not in str(refused.value)
