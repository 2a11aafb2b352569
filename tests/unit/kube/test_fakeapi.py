"""The in-memory API server answers as the real one does, through our unchanged client.

What the lifecycle's fast tests rely on is checked here: CRUD with the real error answers,
resourceVersions, selectors, paging, merge and JSON patches on objects and ``/status``, deletion
with propagation and finalizers, token authentication, injected failures, and the test controls.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from kubedl_prefect.errors import (
    ConflictError,
    ForbiddenError,
    InvalidObjectError,
    KubeConnectionError,
    NotFoundError,
    ServerError,
    UnauthenticatedError,
)
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.credentials import BearerToken, connect
from kubedl_prefect.kube.resources import NAMESPACES, PODS, KubeObject, ResourceKind
from kubedl_prefect.kube.runtime import KubeRuntime
from tests.support.fakeapi import FakeKubeAPI

CONFIGMAPS = ResourceKind("", "v1", "ConfigMap", "configmaps")
JOBS = ResourceKind("training.kubedl.io", "v1alpha1", "PyTorchJob", "pytorchjobs")


def configmap(name: str, namespace: str = "ns", **labels: str) -> KubeObject:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": {"k": "v"},
    }


def job(name: str, namespace: str = "ns") -> KubeObject:
    return {
        "apiVersion": "training.kubedl.io/v1alpha1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}},
    }


def pod_of(owner: KubeObject, name: str) -> KubeObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": owner["metadata"]["namespace"],
            "ownerReferences": [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": [{"name": "main"}]},
    }


async def raw(
    server: FakeKubeAPI,
    method: str,
    path: str,
    *,
    token: str | None = "",
    **kwargs: Any,
) -> tuple[int, Any]:
    """A request without our client: status and JSON body (``token=None`` sends no header)."""
    headers = {} if token is None else {"Authorization": f"Bearer {token or server.token}"}
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, server.url + path, headers=headers, **kwargs) as response,
    ):
        return response.status, await response.json(content_type=None)


async def until(condition: Callable[[], bool], limit_s: float = 5.0) -> None:
    """Poll ``condition`` (the server's state) until it holds."""
    async with asyncio.timeout(limit_s):
        while not condition():  # noqa: ASYNC110 - nothing to wait on but the state itself
            await asyncio.sleep(0.01)


async def next_events(events: AsyncIterator[KubeObject], count: int) -> list[tuple[str, str]]:
    seen = []
    async with asyncio.timeout(5):
        async for event in events:
            if event["type"] == "BOOKMARK":
                continue
            seen.append((event["type"], event["object"]["metadata"]["name"]))
            if len(seen) == count:
                break
    return seen


# -- CRUD ----------------------------------------------------------------------------------------


async def test_create_fills_server_fields_and_get_list_return_the_stored_object(
    fake_client: KubeClient,
) -> None:
    created = await fake_client.create(JOBS, "ns", {**job("a"), "status": {"phase": "Done"}})
    metadata = created["metadata"]
    assert metadata["uid"]
    assert metadata["creationTimestamp"].endswith("Z")
    assert metadata["generation"] == 1
    assert int(metadata["resourceVersion"]) > 0
    assert "status" not in created, "create drops the status, as for any status subresource"
    assert await fake_client.get(JOBS, "ns", "a") == created

    second = await fake_client.create(JOBS, "ns", job("b"))
    assert int(second["metadata"]["resourceVersion"]) > int(metadata["resourceVersion"])
    listing = await fake_client.list(JOBS, "ns")
    assert [o["metadata"]["name"] for o in listing.items] == ["a", "b"]
    assert listing.resource_version == second["metadata"]["resourceVersion"]
    assert (await fake_client.list(JOBS, "other")).items == []
    everywhere = await fake_client.list(JOBS, None)
    assert len(everywhere.items) == 2


async def test_duplicates_missing_objects_and_bad_names_get_the_real_status_answers(
    fake_api: FakeKubeAPI, fake_client: KubeClient
) -> None:
    await fake_client.create(JOBS, "ns", job("a"))
    with pytest.raises(ConflictError) as conflict:
        await fake_client.create(JOBS, "ns", job("a"))
    assert conflict.value.status == 409
    assert conflict.value.reason == "AlreadyExists"
    assert 'pytorchjobs.training.kubedl.io "a" already exists' in conflict.value.message

    with pytest.raises(NotFoundError) as missing:
        await fake_client.get(JOBS, "ns", "nope")
    assert missing.value.reason == "NotFound"
    assert 'pytorchjobs.training.kubedl.io "nope" not found' in missing.value.message
    with pytest.raises(InvalidObjectError):
        await fake_client.create(JOBS, "ns", job("Not_A_Name"))
    assert await fake_client.delete(JOBS, "ns", "nope") is None

    status, body = await raw(fake_api, "GET", "/api/v1/namespaces/ns/pods/nope")
    assert status == 404
    assert body["kind"] == "Status"
    assert body["code"] == 404
    assert body["details"] == {"name": "nope", "group": "", "kind": "pods"}


async def test_dry_run_validates_without_storing(
    fake_api: FakeKubeAPI, fake_client: KubeClient
) -> None:
    before = fake_api.store.resource_version
    answer = await fake_client.create(JOBS, "ns", job("a"), dry_run=True)
    assert answer["metadata"]["name"] == "a"
    assert (await fake_client.list(JOBS, "ns")).items == []
    assert fake_api.store.resource_version == before


async def test_generate_name_and_cluster_scoped_objects(fake_client: KubeClient) -> None:
    made = await fake_client.create(
        CONFIGMAPS, "ns", {"metadata": {"generateName": "cm-"}, "data": {}}
    )
    assert made["metadata"]["name"].startswith("cm-")
    assert len(made["metadata"]["name"]) > len("cm-")
    assert made["kind"] == "ConfigMap"
    assert made["apiVersion"] == "v1"

    namespace = await fake_client.create(NAMESPACES, None, {"metadata": {"name": "team"}})
    assert "namespace" not in namespace["metadata"]
    assert namespace["status"] == {"phase": "Active"}
    assert (await fake_client.get(NAMESPACES, None, "team"))["metadata"]["uid"]


async def test_label_and_field_selectors(fake_client: KubeClient) -> None:
    await fake_client.create(CONFIGMAPS, "ns", configmap("a", app="x", tier="web"))
    await fake_client.create(CONFIGMAPS, "ns", configmap("b", app="x"))
    await fake_client.create(CONFIGMAPS, "ns", configmap("c", app="y"))

    async def names(**kwargs: str) -> list[str]:
        listing = await fake_client.list(CONFIGMAPS, "ns", **kwargs)
        return [o["metadata"]["name"] for o in listing.items]

    assert await names(label_selector="app=x") == ["a", "b"]
    assert await names(label_selector="app==x,tier=web") == ["a"]
    assert await names(label_selector="app!=x") == ["c"]
    assert await names(label_selector="tier") == ["a"]
    assert await names(label_selector="!tier") == ["b", "c"]
    assert await names(label_selector="app in (y, z)") == ["c"]
    assert await names(label_selector="app notin (y),tier") == ["a"]
    assert await names(field_selector="metadata.name=b") == ["b"]
    assert await names(field_selector="metadata.name!=b,metadata.namespace=ns") == ["a", "c"]


async def test_lists_page_with_limit_and_continue(fake_api: FakeKubeAPI) -> None:
    for name in ("a", "b", "c"):
        fake_api.store.apply(configmap(name))
    path = "/api/v1/namespaces/ns/configmaps"
    status, first = await raw(fake_api, "GET", path, params={"limit": "2"})
    assert status == 200
    assert [o["metadata"]["name"] for o in first["items"]] == ["a", "b"]
    assert first["metadata"]["remainingItemCount"] == 1
    token = first["metadata"]["continue"]
    _, rest = await raw(fake_api, "GET", path, params={"limit": "2", "continue": token})
    assert [o["metadata"]["name"] for o in rest["items"]] == ["c"]
    assert "continue" not in rest["metadata"]
    assert rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]

    fake_api.store.apply(configmap("d"))
    fake_api.compact()
    status, gone = await raw(fake_api, "GET", path, params={"limit": "2", "continue": token})
    assert status == 410
    assert gone["reason"] == "Expired"


# -- patches -------------------------------------------------------------------------------------


async def test_merge_patch_bumps_generation_only_for_spec_changes(fake_client: KubeClient) -> None:
    created = await fake_client.create(JOBS, "ns", job("a"))
    labelled = await fake_client.patch(JOBS, "ns", "a", {"metadata": {"labels": {"k": "v"}}})
    assert labelled["metadata"]["labels"] == {"k": "v"}
    assert labelled["metadata"]["generation"] == 1
    assert int(labelled["metadata"]["resourceVersion"]) > int(
        created["metadata"]["resourceVersion"]
    )
    scaled = await fake_client.patch(
        JOBS, "ns", "a", {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 4}}}}
    )
    assert scaled["metadata"]["generation"] == 2
    assert scaled["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4
    removed = await fake_client.patch(JOBS, "ns", "a", {"metadata": {"labels": {"k": None}}})
    assert removed["metadata"]["labels"] == {}
    same = await fake_client.patch(JOBS, "ns", "a", {"metadata": {"labels": {}}})
    assert same["metadata"]["resourceVersion"] == removed["metadata"]["resourceVersion"]


async def test_status_is_written_only_through_the_status_subresource(
    fake_client: KubeClient,
) -> None:
    await fake_client.create(JOBS, "ns", job("a"))
    ignored = await fake_client.patch(JOBS, "ns", "a", {"status": {"phase": "Running"}})
    assert "status" not in ignored
    running = await fake_client.patch(
        JOBS,
        "ns",
        "a",
        {"status": {"conditions": [{"type": "Running"}]}, "spec": {"x": 1}},
        subresource="status",
    )
    assert running["status"] == {"conditions": [{"type": "Running"}]}
    assert "x" not in running["spec"], "a status write changes nothing else"
    assert running["metadata"]["generation"] == 1
    kept = await fake_client.patch(JOBS, "ns", "a", {"spec": {"x": 1}})
    assert kept["status"] == running["status"]
    assert (await fake_client.get(JOBS, "ns", "a"))["status"] == running["status"]


async def test_a_stale_resource_version_in_a_patch_conflicts(fake_client: KubeClient) -> None:
    created = await fake_client.create(JOBS, "ns", job("a"))
    stale = created["metadata"]["resourceVersion"]
    await fake_client.patch(JOBS, "ns", "a", {"spec": {"x": 1}})
    with pytest.raises(ConflictError) as conflict:
        await fake_client.patch(
            JOBS, "ns", "a", {"metadata": {"resourceVersion": stale}, "spec": {"x": 2}}
        )
    assert conflict.value.reason == "Conflict"
    assert "the object has been modified" in conflict.value.message


async def test_json_patch(fake_client: KubeClient) -> None:
    await fake_client.create(CONFIGMAPS, "ns", configmap("a"))
    patched = await fake_client.patch(
        CONFIGMAPS,
        "ns",
        "a",
        [
            {"op": "test", "path": "/data/k", "value": "v"},
            {"op": "add", "path": "/data/new", "value": "1"},
            {"op": "remove", "path": "/data/k"},
        ],
        patch_type="json",
    )
    assert patched["data"] == {"new": "1"}
    with pytest.raises(InvalidObjectError):
        await fake_client.patch(
            CONFIGMAPS,
            "ns",
            "a",
            [{"op": "test", "path": "/data/new", "value": "2"}],
            patch_type="json",
        )


# -- deletion ------------------------------------------------------------------------------------


async def test_foreground_delete_removes_dependents_first_and_watchers_see_it(
    fake_client: KubeClient,
) -> None:
    owner = await fake_client.create(JOBS, "ns", job("a"))
    for name in ("a-worker-0", "a-worker-1"):
        await fake_client.create(PODS, "ns", pod_of(owner, name))
    await fake_client.create(PODS, "ns", {**pod_of(owner, "unrelated"), "metadata": {"name": "u"}})
    since = (await fake_client.list(JOBS, "ns")).resource_version
    pods = fake_client.watch(PODS, "ns", resource_version=since)
    jobs = fake_client.watch(JOBS, "ns", resource_version=since)

    answer = await fake_client.delete(JOBS, "ns", "a", propagation="Foreground")
    assert answer is not None
    assert answer["metadata"]["uid"] == owner["metadata"]["uid"]
    assert [p["metadata"]["name"] for p in (await fake_client.list(PODS, "ns")).items] == ["u"]
    assert await next_events(jobs, 2) == [("MODIFIED", "a"), ("DELETED", "a")]
    assert await next_events(pods, 2) == [("DELETED", "a-worker-0"), ("DELETED", "a-worker-1")]
    await pods.aclose()
    await jobs.aclose()


async def test_background_and_orphan_propagation(fake_api: FakeKubeAPI) -> None:
    owner = fake_api.store.apply(job("a"), JOBS)
    fake_api.store.apply(pod_of(owner, "a-0"), PODS)
    fake_api.store.delete(JOBS, "ns", "a", propagation="Background")
    assert fake_api.store.list(PODS, "ns") == []

    owner = fake_api.store.apply(job("b"), JOBS)
    fake_api.store.apply(pod_of(owner, "b-0"), PODS)
    fake_api.store.delete(JOBS, "ns", "b", propagation="Orphan")
    orphan = fake_api.store.get(PODS, "ns", "b-0")
    assert orphan is not None
    assert "ownerReferences" not in orphan["metadata"]


async def test_finalizers_hold_a_deletion_until_removed(fake_client: KubeClient) -> None:
    held = job("a")
    held["metadata"]["finalizers"] = ["example.com/cleanup"]
    await fake_client.create(JOBS, "ns", held)
    answer = await fake_client.delete(JOBS, "ns", "a")
    assert answer is not None
    assert answer["metadata"]["deletionTimestamp"]
    still = await fake_client.get(JOBS, "ns", "a")
    assert still["metadata"]["deletionTimestamp"] == answer["metadata"]["deletionTimestamp"]
    await fake_client.patch(JOBS, "ns", "a", {"metadata": {"finalizers": None}})
    with pytest.raises(NotFoundError):
        await fake_client.get(JOBS, "ns", "a")


async def test_deleting_a_namespace_deletes_what_is_in_it(fake_client: KubeClient) -> None:
    await fake_client.create(NAMESPACES, None, {"metadata": {"name": "team"}})
    await fake_client.create(CONFIGMAPS, "team", configmap("a", namespace="team"))
    await fake_client.create(CONFIGMAPS, "other", configmap("b", namespace="other"))
    await fake_client.delete(NAMESPACES, None, "team")
    assert (await fake_client.list(CONFIGMAPS, "team")).items == []
    assert len((await fake_client.list(CONFIGMAPS, "other")).items) == 1
    assert (await fake_client.list(NAMESPACES, None)).items == []


# -- authentication, failures, counters ----------------------------------------------------------


async def test_requests_without_the_token_are_unauthorized(fake_api: FakeKubeAPI) -> None:
    status, body = await raw(fake_api, "GET", "/api/v1/namespaces/ns/pods", token=None)
    assert status == 401
    assert body["reason"] == "Unauthorized"
    stranger = await connect(BearerToken(server=fake_api.url, token="not-the-token"))
    try:
        with pytest.raises(UnauthenticatedError) as refused:
            await stranger.list(PODS, "ns")
        assert refused.value.status == 401
    finally:
        await stranger.close()
    fake_api.add_token("second-identity")
    second = await connect(BearerToken(server=fake_api.url, token="second-identity"))
    try:
        assert (await second.list(PODS, "ns")).items == []
    finally:
        await second.close()


async def test_injected_failures_then_normal_answers(
    fake_api: FakeKubeAPI, fake_client: KubeClient
) -> None:
    fake_api.fail_next("list", "/apis/training.kubedl.io", 503, "ServiceUnavailable", times=2)
    for _ in range(2):
        with pytest.raises(ServerError) as failed:
            await fake_client.list(JOBS, "ns")
        assert failed.value.reason == "ServiceUnavailable"
        assert failed.value.retryable
    assert (await fake_client.list(JOBS, "ns")).items == []
    await fake_client.list(PODS, "ns")  # another path: never matched

    fake_api.fail_next("POST", "/api/v1", 403, "Forbidden", times=None)
    for _ in range(3):
        with pytest.raises(ForbiddenError):
            await fake_client.create(PODS, "ns", {"metadata": {"name": "p"}, "spec": {}})
    fake_api.clear_failures()
    assert fake_api.counts["list"] == 4
    assert fake_api.counts["create"] == 3
    assert [r.status for r in fake_api.request_log if r.verb == "list"] == [503, 503, 200, 200]
    assert fake_api.count("list", "/apis/training.kubedl.io") == 3


async def test_metrics_count_open_watches_by_resource_and_scope(
    fake_api: FakeKubeAPI, fake_client: KubeClient
) -> None:
    stream = fake_client.watch(JOBS, "ns", resource_version=fake_api.store.resource_version)
    reader = asyncio.ensure_future(anext(stream))
    await until(lambda: fake_api.open_watches == 1)
    metrics = await fake_client.get_text("/metrics")
    assert (
        'apiserver_longrunning_requests{component="apiserver",group="training.kubedl.io",'
        'resource="pytorchjobs",scope="namespace",subresource="",verb="WATCH"} 1'
    ) in metrics
    assert await fake_client.get_text("/readyz") == "ok"
    fake_api.drop_watches()
    with pytest.raises(KubeConnectionError, match="stream interrupted"):
        await reader
    await stream.aclose()
    await until(lambda: fake_api.open_watches == 0)


def test_a_server_on_its_own_thread_serves_sync_callers() -> None:
    with FakeKubeAPI.serve_in_thread() as server:
        server.store.apply(configmap("from-the-test-thread"))

        async def names() -> list[str]:
            async with await connect(server.credentials) as kube:
                return [o["metadata"]["name"] for o in (await kube.list(CONFIGMAPS, "ns")).items]

        assert KubeRuntime.get().block_on(names()) == ["from-the-test-thread"]
        assert server.drop_watches() == 0
        assert server.counts["list"] == 1


async def test_bookmarks_on_demand_carry_the_latest_resource_version(
    fake_api: FakeKubeAPI, fake_client: KubeClient
) -> None:
    fake_api.bookmark_interval_s = 3600
    fake_api.store.apply(job("a"), JOBS)
    stream = fake_client.watch(JOBS, "ns", resource_version=fake_api.store.resource_version)
    reader = asyncio.ensure_future(anext(stream))
    await until(lambda: fake_api.open_watches == 1)
    fake_api.store.apply(configmap("elsewhere"))  # another resource moves the version on
    fake_api.send_bookmarks()
    bookmark = await asyncio.wait_for(reader, 5)
    await stream.aclose()
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["kind"] == "PyTorchJob"
    assert bookmark["object"]["metadata"]["resourceVersion"] == fake_api.store.resource_version


async def test_send_initial_events_ends_with_a_marked_bookmark(fake_api: FakeKubeAPI) -> None:
    fake_api.store.apply(configmap("a"))
    query = {
        "watch": "true",
        "sendInitialEvents": "true",
        "allowWatchBookmarks": "true",
        "resourceVersionMatch": "NotOlderThan",
        "timeoutSeconds": "1",
    }
    headers = {"Authorization": f"Bearer {fake_api.token}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            fake_api.url + "/api/v1/namespaces/ns/configmaps", params=query, headers=headers
        ) as response,
    ):
        lines = [line async for line in response.content if line.strip()]
    events = [json.loads(line) for line in lines]
    assert events[0]["type"] == "ADDED"
    assert events[0]["object"]["metadata"]["name"] == "a"
    assert events[1]["type"] == "BOOKMARK"
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
