"""Every request of the lifecycle is one deploy/rbac.yaml's Role allows: checked in seconds.

The in-memory API server records each request (verb and path). The lifecycle runs against it —
submit, adopt, wait to Succeeded with logs, records, history, re-attach, clean-up's search,
cancel — with the operator played through the server's store (no HTTP), so every recorded
request is the backend's. Each must match a rule of the Role, read from the file. The same
holds on the real test bed, with RBAC enforced, in tests/integration/test_rbac.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedl_prefect.kube.resources import PODS, ResourceKind
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.kube.session import SessionPool
from kubedl_prefect.lifecycle.backend import JobRef, LogLine
from kubedl_prefect.lifecycle.kubernetes import LABEL_KEY_HASH, KubernetesBackend
from kubedl_prefect.lifecycle.run import areattach
from kubedl_prefect.spec import key_hash, parse_spec
from tests.support.fakeapi import FakeKubeAPI, RequestRecord

RBAC = Path(__file__).parents[3] / "deploy" / "rbac.yaml"
PYTORCHJOBS = ResourceKind("training.kubedl.io", "v1alpha1", "PyTorchJob", "pytorchjobs")


def role_rules() -> list[dict[str, Any]]:
    documents = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    rules: list[dict[str, Any]] = next(d for d in documents if d["kind"] == "Role")["rules"]
    return rules


def rbac_request(record: RequestRecord) -> tuple[str, str, str]:
    """``(API group, resource[/subresource], verb)`` of a resource request, as RBAC sees it."""
    parts = [p for p in record.path.split("/") if p]
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource = "/".join([rest[0], *rest[2:3]])
    verb = "get" if record.verb == "log" else record.verb
    return group, resource, verb


def allowed(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]
        for rule in rules
    )


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def start_pods(api: FakeKubeAPI, ref: JobRef) -> None:
    """Play the operator and the kubelets: pods that run and log."""
    for role, count in (("master", 1), ("worker", 1)):
        for index in range(count):
            pod = f"{ref.name}-{role}-{index}"
            api.store.create(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": pod,
                        "namespace": ref.namespace,
                        "labels": {"group-name": "training.kubedl.io", "job-name": ref.name},
                        "ownerReferences": [
                            {"kind": ref.kind, "name": ref.name, "uid": ref.uid, "controller": True}
                        ],
                    },
                    "spec": {"nodeName": "n0", "containers": [{"name": "pytorch", "image": "i"}]},
                    "status": {
                        "phase": "Running",
                        "conditions": [{"type": "PodScheduled", "status": "True"}],
                        "containerStatuses": [
                            {"name": "pytorch", "state": {"running": {"startedAt": now()}}}
                        ],
                    },
                },
                PODS,
            )
            api.append_log(ref.namespace, pod, "pytorch", f"{role}-{index} hello")
            api.close_log(ref.namespace, pod, "pytorch")


def finish_job(api: FakeKubeAPI, ref: JobRef) -> None:
    """Play the operator: the job's success."""
    conditions = [
        {"type": type_, "status": "True", "reason": f"Job{type_}", "lastTransitionTime": now()}
        for type_ in ("Running", "Succeeded")
    ]
    api.store.merge(
        PYTORCHJOBS,
        ref.namespace,
        ref.name,
        {"status": {"conditions": conditions, "startTime": now()}},
    )


@pytest.fixture
async def pool() -> AsyncIterator[SessionPool]:
    made = SessionPool()
    yield made
    await KubeRuntime.get().run(made.close())


async def test_every_request_of_the_lifecycle_is_allowed_by_the_role(
    fake_api: FakeKubeAPI, pool: SessionPool
) -> None:
    spec = parse_spec(
        {
            "name": "mnist",
            "image": "ghcr.io/example/mnist:1.0",
            "replicas": {"master": 1, "worker": 1},
        }
    )
    backend = KubernetesBackend(namespace="ml", credentials=fake_api.credentials, pool=pool)
    lines: list[LogLine] = []
    ref = await backend.submit(spec, key="role")
    assert (await backend.submit(spec, key="role")).uid == ref.uid
    both_logged = threading.Event()  # log callbacks run on a thread of their own

    def on_line(line: LogLine) -> None:
        lines.append(line)
        if len(lines) >= 2:
            both_logged.set()

    following = asyncio.ensure_future(backend.follow_logs(ref, on_line))
    waiting = asyncio.ensure_future(backend.wait_completed(ref))
    await asyncio.sleep(0.2)
    start_pods(fake_api, ref)
    # Pods run before their job ends, as with a real operator: the pod and job watches are two
    # streams, so a job that ended in the same instant could be seen before its pods.
    await asyncio.to_thread(both_logged.wait, 10)
    finish_job(fake_api, ref)
    assert (await asyncio.wait_for(waiting, 10)).succeeded
    await asyncio.wait_for(following, 10)
    assert {line.text for line in lines} == {"master-0 hello", "worker-0 hello"}
    await backend.close()
    record = await backend.history(spec, key="role")
    assert record is not None
    assert record.latest is not None
    assert record.latest.phase == "Succeeded"
    run = await areattach(ref.to_json(), backend=backend)
    assert (await run.wait_completed()).succeeded
    assert [f.uid for f in await backend.find_jobs({LABEL_KEY_HASH: key_hash("role")})] == [ref.uid]
    await backend.cancel(ref, timeout_s=5)
    await backend.close()

    rules = role_rules()
    requests = {rbac_request(r) for r in fake_api.request_log if r.verb}
    assert {verb for _, _, verb in requests} >= {"create", "get", "list", "watch", "patch"}
    refused = sorted(r for r in requests if not allowed(rules, *r))
    assert refused == [], f"requests deploy/rbac.yaml's Role does not allow: {refused}"
