"""Pods on the test bed's process node run as real processes of this machine (issue 20).

The session's test bed gets its process node (``process-node-0``) if it has none. Each pod here
opts into it (nodeSelector and toleration), runs in its own network namespace with a link-local
address, and prints through the test bed's log path. The last test kills the node's agent and
checks that what ``down`` removes leaves nothing behind, then starts the node again.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import CONFIG_MAPS, EVENTS, PODS, SECRETS, SERVICES
from kubedl_prefect.testbed.nodeagent import component
from kubedl_prefect.testbed.nodeagent.node import PROCESS_NODE_LABEL
from kubedl_prefect.testbed.testbed import Testbed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Obj = dict[str, Any]
LINK_LOCAL = ipaddress.IPv4Network("169.254.0.0/16")


def pod(
    name: str,
    containers: list[Obj],
    *,
    restart_policy: str = "Never",
    init: list[Obj] | None = None,
    volumes: list[Obj] | None = None,
    labels: dict[str, str] | None = None,
    grace_s: int | None = None,
    **spec: Any,
) -> Obj:
    """A pod for the process node."""
    body: Obj = {
        "restartPolicy": restart_policy,
        "nodeSelector": {PROCESS_NODE_LABEL: "true"},
        "tolerations": [{"key": PROCESS_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": containers,
        **spec,
    }
    if init:
        body["initContainers"] = init
    if volumes:
        body["volumes"] = volumes
    if grace_s is not None:
        body["terminationGracePeriodSeconds"] = grace_s
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": body,
    }


async def wait_pod(
    kube: KubeClient, namespace: str, name: str, check: Callable[[Obj], bool], within_s: float = 40
) -> Obj:
    """The pod once ``check`` holds for it (watched, not polled)."""
    selector = f"metadata.name={name}"
    last: Obj = {}
    try:
        async with asyncio.timeout(within_s):
            while True:
                listed = await kube.list(PODS, namespace, field_selector=selector)
                for item in listed.items:
                    last = item
                    if check(item):
                        return item
                async for event in kube.watch(
                    PODS,
                    namespace,
                    resource_version=listed.resource_version,
                    field_selector=selector,
                    timeout_seconds=30,
                ):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        last = event["object"]
                        if check(last):
                            return last
    except TimeoutError:
        raise AssertionError(f"pod {name}: {json.dumps(last.get('status'))}") from None


def phase_is(*phases: str) -> Callable[[Obj], bool]:
    return lambda p: (p.get("status") or {}).get("phase") in phases


def status_of(p: Obj, container: str) -> Obj:
    statuses = (p.get("status") or {}).get("containerStatuses") or []
    return next(s for s in statuses if s["name"] == container)


async def log_of(kube: KubeClient, namespace: str, name: str, container: str) -> list[str]:
    return await kube.read_log(namespace, name, container, tail_lines=200)


async def test_a_plain_pod_runs_as_a_process_and_its_log_is_served(
    kube: KubeClient, namespace: str
) -> None:
    script = "echo hello from $(hostname) in $(pwd); echo to stderr >&2; exit 0"
    await kube.create(
        PODS,
        namespace,
        pod(
            "plain",
            [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "command": ["sh", "-c", script],
                    "workingDir": "/scratch/work",
                }
            ],
        ),
    )
    done = await wait_pod(kube, namespace, "plain", phase_is("Succeeded", "Failed"))

    assert done["status"]["phase"] == "Succeeded"
    assert done["spec"]["nodeName"] == "process-node-0"
    assert ipaddress.IPv4Address(done["status"]["podIP"]) in LINK_LOCAL
    terminated = status_of(done, "main")["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    lines = await log_of(kube, namespace, "plain", "main")
    assert lines == ["hello from plain in /scratch/work", "to stderr"]
    assert not await asyncio.to_thread(os.path.exists, "/scratch/work")  # in its own root


async def test_env_from_a_secret_a_config_map_and_the_downward_api_arrive(
    kube: KubeClient, namespace: str
) -> None:
    await kube.create(
        SECRETS,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds"},
            "data": {"password": base64.b64encode(b"hunter2").decode()},
        },
    )
    await kube.create(
        CONFIG_MAPS,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings"},
            "data": {"lr": "0.01", "conf.yaml": "epochs: 3\n"},
        },
    )
    program = (
        "import json, os; names = ['PASSWORD', 'LR', 'POD', 'NS', 'IP', 'ROLE', 'GREETING'];"
        "print(json.dumps({n: os.environ.get(n) for n in names}));"
        "print(json.dumps({"
        "'conf': open('/etc/settings/conf.yaml').read(),"
        "'secret': open('/var/run/creds/password').read(),"
        "'namespace': open('/var/run/secrets/kubernetes.io/serviceaccount/namespace').read(),"
        "'token': len(open('/var/run/secrets/kubernetes.io/serviceaccount/token').read()) > 100,"
        "}))"
    )
    env = [
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
        {"name": "LR", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "lr"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['role']"}}},
        {"name": "GREETING", "value": "hi $(POD)"},
    ]
    await kube.create(
        PODS,
        namespace,
        pod(
            "env",
            [
                {
                    "name": "main",
                    "image": "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
                    "command": ["python", "-c", program],
                    "env": env,
                    "volumeMounts": [
                        {"name": "settings", "mountPath": "/etc/settings"},
                        {"name": "creds", "mountPath": "/var/run/creds"},
                    ],
                }
            ],
            labels={"role": "worker"},
            volumes=[
                {"name": "settings", "configMap": {"name": "settings"}},
                {"name": "creds", "secret": {"secretName": "creds"}},
            ],
        ),
    )
    done = await wait_pod(kube, namespace, "env", phase_is("Succeeded", "Failed"))

    lines = await log_of(kube, namespace, "env", "main")
    assert done["status"]["phase"] == "Succeeded", lines
    assert json.loads(lines[0]) == {
        "PASSWORD": "hunter2",
        "LR": "0.01",
        "POD": "env",
        "NS": namespace,
        "IP": done["status"]["podIP"],
        "ROLE": "worker",
        "GREETING": "hi env",
    }
    assert json.loads(lines[1]) == {
        "conf": "epochs: 3\n",
        "secret": "hunter2",
        "namespace": namespace,
        "token": True,
    }
    # /var/run links to /run: the link is followed inside the container's root, not here
    assert not await asyncio.to_thread(os.path.exists, "/run/secrets/kubernetes.io")


async def test_an_unmapped_image_waits_like_an_unpullable_one(
    kube: KubeClient, namespace: str
) -> None:
    image = "nvcr.io/nvidia/pytorch:24.01-py3"
    await kube.create(
        PODS, namespace, pod("unmapped", [{"name": "main", "image": image, "command": ["true"]}])
    )

    def backing_off(p: Obj) -> bool:
        statuses = (p.get("status") or {}).get("containerStatuses") or []
        waiting = statuses[0]["state"].get("waiting", {}) if statuses else {}
        return bool(waiting.get("reason") == "ImagePullBackOff")

    waiting = await wait_pod(kube, namespace, "unmapped", backing_off)

    assert waiting["status"]["phase"] == "Pending"
    ready = {c["type"]: c["status"] for c in waiting["status"]["conditions"]}
    assert ready["Ready"] == "False"
    events = await kube.list(EVENTS, namespace)
    failed = [e for e in events.items if e.get("reason") == "Failed"]
    assert failed
    assert f'Failed to pull image "{image}"' in failed[0]["message"]


PEER = """
import socket, sys, threading, time
me, peer = socket.gethostname(), sys.argv[1]
server = socket.create_server(("0.0.0.0", 8080))
def serve():
    while True:
        conn, _ = server.accept()
        conn.sendall(me.encode()); conn.close()
threading.Thread(target=serve, daemon=True).start()
deadline = time.time() + 30
while True:
    try:
        with socket.create_connection((peer, 8080), timeout=2) as conn:
            print(f"{me} reached {peer}: {conn.recv(100).decode()}", flush=True)
            break
    except OSError as exc:
        if time.time() > deadline:
            print(f"{me} could not reach {peer}: {exc}", flush=True); sys.exit(1)
        time.sleep(0.2)
time.sleep(300)
"""


async def test_two_pods_behind_a_headless_service_reach_each_other_by_name(
    kube: KubeClient, namespace: str
) -> None:
    await kube.create(
        SERVICES,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "peers"},
            "spec": {
                "clusterIP": "None",
                "selector": {"app": "peers"},
                "ports": [{"port": 8080}],
            },
        },
    )
    targets = {"a": "b.peers", "b": f"a.peers.{namespace}.svc.cluster.local"}
    for name, target in targets.items():
        await kube.create(
            PODS,
            namespace,
            pod(
                name,
                [
                    {
                        "name": "main",
                        "image": "python:3.11",
                        "command": ["python", "-c", PEER, target],
                    }
                ],
                labels={"app": "peers"},
                hostname=name,
                subdomain="peers",
                grace_s=1,
            ),
        )
    running = {
        name: await wait_pod(kube, namespace, name, phase_is("Running", "Failed", "Succeeded"))
        for name in targets
    }

    for name, target in targets.items():
        deadline = time.monotonic() + 40
        while not (lines := await log_of(kube, namespace, name, "main")):
            assert time.monotonic() < deadline, f"{name} printed nothing"
            await asyncio.sleep(0.2)
        assert lines == [f"{name} reached {target}: {'b' if name == 'a' else 'a'}"]
    for name, item in running.items():  # from this machine too: same port, two addresses
        with socket.create_connection((item["status"]["podIP"], 8080), timeout=5) as conn:
            assert conn.recv(100).decode() == name


def processes_with(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if marker in " ".join(proc.info.get("cmdline") or []):
            found.append(proc)
    return found


async def test_deleting_a_pod_kills_its_whole_process_tree(
    kube: KubeClient, namespace: str
) -> None:
    marker = "424242"  # sleep 424242: the tree's processes, found on this machine
    script = f"trap '' TERM; sleep {marker} & sleep {marker} & wait; wait"
    await kube.create(
        PODS,
        namespace,
        pod(
            "tree",
            [{"name": "main", "image": "busybox", "command": ["sh", "-c", script]}],
            grace_s=2,
        ),
    )
    await wait_pod(kube, namespace, "tree", phase_is("Running"))
    deadline = time.monotonic() + 10
    while len(processes_with(f"sleep {marker}")) < 2:
        assert time.monotonic() < deadline, "the pod's processes did not appear"
        await asyncio.sleep(0.1)

    started = time.monotonic()
    await kube.delete(PODS, namespace, "tree", propagation="Background")
    deadline = time.monotonic() + 20
    while (await kube.list(PODS, namespace, field_selector="metadata.name=tree")).items:
        assert time.monotonic() < deadline, "the pod was not removed"
        await asyncio.sleep(0.1)

    assert time.monotonic() - started >= 1.5  # SIGTERM was ignored: the grace period ran out
    assert processes_with(f"sleep {marker}") == []


async def test_restart_policy_on_failure_restarts_the_container(
    kube: KubeClient, namespace: str
) -> None:
    script = (
        "n=$(cat /state/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /state/n; "
        'echo attempt $n; [ "$n" -ge 3 ]'
    )
    await kube.create(
        PODS,
        namespace,
        pod(
            "flaky",
            [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sh", "-c", script],
                    "volumeMounts": [{"name": "state", "mountPath": "/state"}],
                }
            ],
            restart_policy="OnFailure",
            volumes=[{"name": "state", "emptyDir": {}}],
        ),
    )
    done = await wait_pod(kube, namespace, "flaky", phase_is("Succeeded", "Failed"))

    status = status_of(done, "main")
    assert done["status"]["phase"] == "Succeeded"
    assert status["restartCount"] == 2
    assert status["lastState"]["terminated"]["exitCode"] == 1
    assert await log_of(kube, namespace, "flaky", "main") == ["attempt 3"]


@pytest.mark.exclusive  # kills the process node's agent
async def test_nothing_is_left_after_what_down_removes_even_when_the_agent_was_killed(
    kube: KubeClient, namespace: str, process_node: Testbed
) -> None:
    await kube.create(
        PODS,
        namespace,
        pod("sleeper", [{"name": "main", "image": "busybox", "command": ["sleep", "434343"]}]),
    )
    await wait_pod(kube, namespace, "sleeper", phase_is("Running"))
    assert any(item.startswith("netns") for item in component.leftovers(process_node.layout))

    process_node.stop_process_node(crash=True)  # it cannot clean up: down's teardown does
    try:
        assert component.leftovers(process_node.layout) == []
        assert processes_with("sleep 434343") == []
    finally:
        process_node.start_process_node()
