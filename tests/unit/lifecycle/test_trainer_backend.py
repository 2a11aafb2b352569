"""The Kubernetes backend runs a ``trainer`` job: submit, wait, logs, find, cancel.

The in-memory API server plays Kubeflow Trainer v2.3.0 and JobSet v0.12.0 through its store: a
JobSet owned by the TrainJob, pods labelled ``jobset.sigs.k8s.io/jobset-name``, a Volcano
PodGroup named like the TrainJob that Trainer leaves without an owner (as it does for a failed
job, kubeflow/trainer#4033), and the TrainJob's ``Complete`` condition.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubedl_prefect.kube.resources import PODS, VOLCANO_PODGROUPS, VOLCANO_QUEUES, ResourceKind
from kubedl_prefect.kube.runtime import KubeRuntime
from kubedl_prefect.kube.session import SessionPool
from kubedl_prefect.lifecycle.backend import JobRef, LogLine
from kubedl_prefect.lifecycle.kubernetes import LABEL_KEY_HASH, KubernetesBackend
from kubedl_prefect.lifecycle.kubernetes.dialects import JOBSETS
from kubedl_prefect.lifecycle.status import Phase
from kubedl_prefect.spec import key_hash, parse_spec
from tests.support.fakeapi import FakeKubeAPI

TRAINJOBS = ResourceKind("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs")


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def play_trainer(api: FakeKubeAPI, ref: JobRef, nodes: int, *, owned_podgroup: bool) -> None:
    """What Trainer and JobSet make of the TrainJob: a JobSet, a PodGroup, running pods."""
    owner = {"kind": "TrainJob", "name": ref.name, "uid": ref.uid, "controller": True}
    jobset = api.store.create(
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": ref.name, "namespace": ref.namespace, "ownerReferences": [owner]},
            "spec": {},
        },
        JOBSETS,
    )
    podgroup: dict[str, Any] = {"name": ref.name, "namespace": ref.namespace}
    if owned_podgroup:
        podgroup["ownerReferences"] = [owner]
    api.store.create(
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": podgroup,
            "spec": {"minMember": nodes},
            "status": {"phase": "Running"},
        },
        VOLCANO_PODGROUPS,
    )
    for index in range(nodes):
        pod = f"{ref.name}-node-0-{index}-abcde"
        api.store.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod,
                    "namespace": ref.namespace,
                    "labels": {
                        "jobset.sigs.k8s.io/jobset-name": ref.name,
                        "jobset.sigs.k8s.io/replicatedjob-name": "node",
                        "batch.kubernetes.io/job-completion-index": str(index),
                    },
                    "annotations": {"scheduling.k8s.io/group-name": ref.name},
                    "ownerReferences": [
                        {"kind": "JobSet", "name": ref.name, "uid": jobset["metadata"]["uid"]}
                    ],
                },
                "spec": {"nodeName": "n0", "containers": [{"name": "node", "image": "i"}]},
                "status": {
                    "phase": "Running",
                    "conditions": [{"type": "PodScheduled", "status": "True"}],
                    "containerStatuses": [
                        {"name": "node", "state": {"running": {"startedAt": now()}}}
                    ],
                },
            },
            PODS,
        )
        api.append_log(ref.namespace, pod, "node", f"node {index} hello")
        api.close_log(ref.namespace, pod, "node")
    api.store.merge(
        TRAINJOBS,
        ref.namespace,
        ref.name,
        {"status": {"jobsStatus": [{"name": "node", "active": 1, "ready": 1}]}},
    )


def complete(api: FakeKubeAPI, ref: JobRef) -> None:
    condition = {
        "type": "Complete",
        "status": "True",
        "reason": "AllJobsCompleted",
        "message": "jobset completed successfully",
        "lastTransitionTime": now(),
    }
    api.store.merge(
        TRAINJOBS,
        ref.namespace,
        ref.name,
        {"status": {"conditions": [condition], "jobsStatus": [{"name": "node", "succeeded": 1}]}},
    )


def open_queue(api: FakeKubeAPI) -> None:
    """The Volcano queue the spec names (a missing one refuses the job for good)."""
    api.store.create(
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "Queue",
            "metadata": {"name": "research"},
            "spec": {"weight": 1},
            "status": {"state": "Open"},
        },
        VOLCANO_QUEUES,
    )


@pytest.fixture
async def pool() -> AsyncIterator[SessionPool]:
    made = SessionPool()
    yield made
    await KubeRuntime.get().run(made.close())


SPEC = {
    "name": "ddp",
    "image": "ghcr.io/example/ddp:1.0",
    "command": ["torchrun", "train.py"],
    "replicas": {"worker": 2},
    "gang": {"queue": "research"},
}


async def test_a_trainjob_runs_to_success_with_every_nodes_logs(
    fake_api: FakeKubeAPI, pool: SessionPool
) -> None:
    backend = KubernetesBackend(
        namespace="ml", dialect="trainer", credentials=fake_api.credentials, pool=pool
    )
    open_queue(fake_api)
    spec = parse_spec(SPEC)
    ref = await backend.submit(spec, key="trainer")
    assert (ref.dialect, ref.kind, ref.api_version) == (
        "trainer",
        "TrainJob",
        "trainer.kubeflow.org/v1alpha1",
    )
    assert (await backend.submit(spec, key="trainer")).uid == ref.uid  # adopted
    lines: list[LogLine] = []
    both = threading.Event()

    def on_line(line: LogLine) -> None:
        lines.append(line)
        if len(lines) >= 2:
            both.set()

    following = asyncio.ensure_future(backend.follow_logs(ref, on_line))
    waiting = asyncio.ensure_future(backend.wait_completed(ref))
    await asyncio.sleep(0.2)
    play_trainer(fake_api, ref, 2, owned_podgroup=True)
    await asyncio.to_thread(both.wait, 10)
    complete(fake_api, ref)
    outcome = await asyncio.wait_for(waiting, 10)
    assert outcome.succeeded
    assert outcome.status.phase is Phase.SUCCEEDED
    assert outcome.status.reason == "AllJobsCompleted"
    await asyncio.wait_for(following, 10)
    assert {(line.replica, line.text) for line in lines} == {
        ("node-0", "node 0 hello"),
        ("node-1", "node 1 hello"),
    }
    found = await backend.find_jobs({LABEL_KEY_HASH: key_hash("trainer")})
    assert [f.uid for f in found] == [ref.uid]  # one TrainJob, not one per framework
    await backend.close()


async def test_cancel_leaves_no_jobset_pod_or_podgroup(
    fake_api: FakeKubeAPI, pool: SessionPool
) -> None:
    backend = KubernetesBackend(
        namespace="ml", dialect="trainer", credentials=fake_api.credentials, pool=pool
    )
    open_queue(fake_api)
    ref = await backend.submit(parse_spec(SPEC), key="cancel")
    # The PodGroup Trainer leaves behind (kubeflow/trainer#4033): no owner to collect it.
    play_trainer(fake_api, ref, 2, owned_podgroup=False)
    # Another job's PodGroup of another name stays.
    fake_api.store.create(
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "someone-else", "namespace": "ml"},
            "spec": {"minMember": 1},
        },
        VOLCANO_PODGROUPS,
    )
    await backend.cancel(ref, timeout_s=10)
    assert fake_api.store.list(TRAINJOBS, "ml") == []
    assert fake_api.store.list(JOBSETS, "ml") == []
    assert fake_api.store.list(PODS, "ml") == []
    assert [pg["metadata"]["name"] for pg in fake_api.store.list(VOLCANO_PODGROUPS, "ml")] == [
        "someone-else"
    ]
    await backend.cancel(ref, timeout_s=5)  # idempotent
    await backend.close()
