"""The client never sends a request whose path was built from a segment no Kubernetes name can be.

A name of ``..`` once turned ``PATCH .../configmaps/..`` into ``PATCH /api/v1/namespaces/ml/``
(the URL library resolves dot segments). Whatever the caller passes, the client refuses it before
anything is sent; the in-memory API server records every request that arrives.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from kubedl_prefect.errors import KubeAPIError
from kubedl_prefect.kube.client import KubeClient, request_path
from kubedl_prefect.kube.resources import (
    CLUSTER_ROLES,
    CONFIG_MAPS,
    NAMESPACES,
    PODS,
    ResourceKind,
)
from tests.support.fakeapi import FakeKubeAPI

BAD_NAMES = ["", ".", "..", "../secrets", "a/b", "a%2Fb", "a\nb", "a b", "a\x00", "x" * 254]
BAD_NAMESPACES = [*BAD_NAMES, "ML", "ml.team", "-ml", "n" * 64]

CALLS: dict[str, Callable[[KubeClient, str, str], Awaitable[Any]]] = {
    "get": lambda kube, ns, name: kube.get(CONFIG_MAPS, ns, name),
    "patch": lambda kube, ns, name: kube.patch(CONFIG_MAPS, ns, name, {"data": {"a": "b"}}),
    "delete": lambda kube, ns, name: kube.delete(CONFIG_MAPS, ns, name),
    "apply": lambda kube, ns, name: kube.apply(
        CONFIG_MAPS, ns, {"metadata": {"name": name}}, field_manager="t"
    ),
    "create": lambda kube, ns, name: kube.create(CONFIG_MAPS, ns, {"metadata": {"name": name}}),
    "read_log": lambda kube, ns, name: kube.read_log(ns, name, "main"),
}


@pytest.mark.parametrize("name", BAD_NAMES)
@pytest.mark.parametrize("call", ["get", "patch", "delete", "apply", "read_log"])
async def test_a_name_that_is_no_kubernetes_name_is_refused_before_anything_is_sent(
    fake_client: KubeClient, fake_api: FakeKubeAPI, call: str, name: str
) -> None:
    with pytest.raises(KubeAPIError, match="not sent") as caught:
        await CALLS[call](fake_client, "ml", name)
    assert caught.value.hint
    assert fake_api.request_log == []


@pytest.mark.parametrize("namespace", BAD_NAMESPACES)
@pytest.mark.parametrize("call", sorted(CALLS))
async def test_a_namespace_that_is_no_dns_label_is_refused_before_anything_is_sent(
    fake_client: KubeClient, fake_api: FakeKubeAPI, call: str, namespace: str
) -> None:
    with pytest.raises(KubeAPIError, match="namespace"):
        await CALLS[call](fake_client, namespace, "fine")
    assert fake_api.request_log == []


async def test_list_and_watch_check_the_namespace_too(
    fake_client: KubeClient, fake_api: FakeKubeAPI
) -> None:
    with pytest.raises(KubeAPIError, match="namespace"):
        await fake_client.list(PODS, "..")
    with pytest.raises(KubeAPIError, match="namespace"):
        async for _ in fake_client.watch(PODS, "a/b", resource_version="0"):
            pass
    with pytest.raises(KubeAPIError, match="not sent"):
        async for _ in fake_client.follow_log("ml", "..", "main"):
            pass
    with pytest.raises(KubeAPIError, match="not sent"):
        await fake_client.get_text("/apis/../api/v1/namespaces/ml/secrets")
    assert fake_api.request_log == []


@pytest.mark.parametrize(
    "kind",
    [
        ResourceKind("..", "v1", "X", "xs"),
        ResourceKind("training.kubedl.io", "..", "X", "xs"),
        ResourceKind("training.kubedl.io", "v1", "X", ".."),
        ResourceKind("training.kubedl.io/../..", "v1", "X", "xs"),
        ResourceKind("", "v1", "TokenRequest", "serviceaccounts/../token"),
        ResourceKind("", "v1", "TokenRequest", "serviceaccounts//token"),
        ResourceKind("", "v1", "TokenRequest", "/serviceaccounts"),
    ],
)
def test_a_kind_whose_group_version_or_plural_is_no_name_is_refused(kind: ResourceKind) -> None:
    with pytest.raises(KubeAPIError, match="not sent"):
        request_path(kind, "ml", "x")


def test_names_kubernetes_allows_are_kept_and_quoted() -> None:
    assert request_path(CONFIG_MAPS, "ml", "mnist.v2-abc") == (
        "/api/v1/namespaces/ml/configmaps/mnist.v2-abc"
    )
    # RBAC names are path segments, not DNS names: a colon is allowed, and quoted.
    assert request_path(CLUSTER_ROLES, None, "system:auth-delegator") == (
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/system%3Aauth-delegator"
    )
    assert request_path(NAMESPACES, None, "ml") == "/api/v1/namespaces/ml"
    assert request_path(PODS, "ml", "p", "log") == "/api/v1/namespaces/ml/pods/p/log"
    assert request_path(PODS, None) == "/api/v1/pods"
    tokens = ResourceKind("", "v1", "TokenRequest", "serviceaccounts/reader/token")
    assert request_path(tokens, "ml") == "/api/v1/namespaces/ml/serviceaccounts/reader/token"
    with pytest.raises(KubeAPIError, match="not sent"):
        request_path(PODS, "ml", "p", "../exec")


async def test_a_good_name_still_reaches_the_server(
    fake_client: KubeClient, fake_api: FakeKubeAPI
) -> None:
    await fake_client.create(
        CONFIG_MAPS, "ml", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c.d"}}
    )
    assert (await fake_client.get(CONFIG_MAPS, "ml", "c.d"))["metadata"]["name"] == "c.d"
    assert [r.path for r in fake_api.request_log] == [
        "/api/v1/namespaces/ml/configmaps",
        "/api/v1/namespaces/ml/configmaps/c.d",
    ]
