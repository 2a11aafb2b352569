"""Record the blocker fixtures of this folder from a running test bed (a developer's tool).

Each scenario submits one job that cannot start (CPU only: no GPU of the shared test bed is
held), waits for the operators and schedulers to say what they say, and saves what a wait sees —
the job, its pods, PodGroups and events — with the cluster objects the diagnosis reads
(``facts``), then deletes everything it made. ``tests/unit/lifecycle/test_blocker_fixtures.py``
decides on the saved files.

Usage (the test bed must be up)::

    uv run python tests/unit/lifecycle/blockers/record.py [SCENARIO...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from kubedl_prefect.lifecycle.kubernetes import KubernetesBackend
from kubedl_prefect.lifecycle.kubernetes.blockers import fact_request
from kubedl_prefect.lifecycle.kubernetes.dialects import JobObjects
from kubedl_prefect.spec import Dialect, loads_spec

HERE = Path(__file__).parent
KUBECONFIG = Path("~/.cache/kubedl-prefect/testbed/default/kubeconfig").expanduser()

BASE = """
framework: pytorch
image: registry.example/mnist:1.0
command: [python, train.py]
resources: {cpu: 1}
annotations: {"testbed.kubedl-prefect.io/run-duration": "300s"}
replicas:
  master: 1
  worker: 2
"""
GANG = "gang: {scheduler: volcano}\n"

TAINTED_NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "rec-tainted-node",
        "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        "labels": {"rec-pool": "tainted", "type": "kwok", "kubernetes.io/os": "linux"},
    },
    "spec": {"taints": [{"key": "dedicated", "value": "rec", "effect": "NoSchedule"}]},
    "status": {
        "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
    },
}


def queue(name: str, state: str = "Open", capability: dict[str, str] | None = None) -> Any:
    spec: dict[str, Any] = {"weight": 1, "reclaimable": True}
    if capability:
        spec["capability"] = capability
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": spec,
        "status": {"state": state},
    }


def claim(name: str) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "team-quota"},
    "spec": {"hard": {"requests.cpu": "2"}},
}
LIMIT_RANGE = {
    "apiVersion": "v1",
    "kind": "LimitRange",
    "metadata": {"name": "max-cpu"},
    "spec": {"limits": [{"type": "Container", "max": {"cpu": "500m"}}]},
}

# name: (dialects, spec additions, cluster objects, namespaced objects, seconds to wait)
SCENARIOS: dict[str, tuple[tuple[str, ...], str, list[Any], list[Any], float]] = {
    "queue-missing": (
        ("kubedl", "kubeflow"),
        "gang: {scheduler: volcano, queue: rec-nosuch}\n",
        [],
        [],
        6,
    ),
    "queue-closed": (
        ("kubedl", "kubeflow"),
        "gang: {scheduler: volcano, queue: rec-closed}\n",
        [queue("rec-closed", "Closed")],
        [],
        6,
    ),
    "queue-capability": (
        ("kubedl",),
        "gang: {scheduler: volcano, queue: rec-small}\n",
        [queue("rec-small", capability={"cpu": "2"})],
        [],
        6,
    ),
    "priority-gang": (
        ("kubedl",),
        "gang: {scheduler: volcano, priorityClass: rec-nosuch}\n",
        [],
        [],
        0.3,
    ),
    "priority-pod": (
        ("kubedl", "kubeflow"),
        GANG + "podTemplate: {spec: {priorityClassName: rec-nosuch}}\n",
        [],
        [],
        6,
    ),
    "node-selector": (("kubedl", "kubeflow"), GANG + "nodeSelector: {disktype: ssd}\n", [], [], 6),
    "taint": (
        ("kubedl", "kubeflow"),
        GANG + "nodeSelector: {rec-pool: tainted}\n",
        [TAINTED_NODE],
        [],
        6,
    ),
    "pvc-missing": (
        ("kubedl",),
        GANG + "volumes: [{name: data, mountPath: /data, pvc: rec-nosuch}]\n",
        [],
        [],
        6,
    ),
    "pvc-unbound": (
        ("kubedl", "kubeflow"),
        GANG + "volumes: [{name: data, mountPath: /data, pvc: rec-pending}]\n",
        [],
        [claim("rec-pending")],
        6,
    ),
    "quota": (("kubedl", "kubeflow"), GANG, [], [QUOTA], 6),
    "limit-range": (("kubedl",), GANG, [], [LIMIT_RANGE], 6),
    "invalid-template": (
        ("kubedl", "kubeflow"),
        GANG + "podTemplate: {spec: {containers: [{name: pytorch, volumeMounts: "
        "[{name: nosuch, mountPath: /x}]}]}}\n",
        [],
        [],
        6,
    ),
    "gpu-short": (("kubedl",), GANG + "resources: {gpus: 9}\n", [], [], 6),
}


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> str:
    env = {**os.environ, "KUBECONFIG": str(KUBECONFIG)}
    done = subprocess.run(
        ["kubectl", *args], input=stdin, capture_output=True, text=True, env=env, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr}")
    return done.stdout


def apply(objects: list[Any], namespace: str | None = None) -> None:
    for obj in objects:
        body = json.dumps({k: v for k, v in obj.items() if k != "status"})
        kubectl(*(["-n", namespace] if namespace else []), "apply", "-f", "-", stdin=body)
        if "status" in obj and obj["kind"] == "Queue":
            kubectl(
                "patch",
                "queue",
                obj["metadata"]["name"],
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps({"status": obj["status"]}),
            )


def clean(obj: Any) -> Any:
    metadata = obj.get("metadata") or {}
    metadata.pop("managedFields", None)
    (metadata.get("annotations") or {}).pop(
        "kubectl.kubernetes.io/last-applied-configuration", None
    )
    return obj


def get_all(kind: str, namespace: str | None) -> list[Any]:
    where = ["-n", namespace] if namespace else []
    return [clean(o) for o in json.loads(kubectl(*where, "get", kind, "-o", "json"))["items"]]


def get_one(kind: str, name: str, namespace: str | None = None) -> Any | None:
    where = ["-n", namespace] if namespace else []
    out = kubectl(*where, "get", kind, name, "-o", "json", "--ignore-not-found", check=False)
    return clean(json.loads(out)) if out.strip() else None


def record(name: str, dialect: str) -> Path:
    _, extra, cluster, namespaced, settle = SCENARIOS[name]
    namespace = f"rec-{name}-{dialect}-{uuid.uuid4().hex[:4]}"
    kubectl("create", "namespace", namespace)
    try:
        apply(cluster)
        apply(namespaced, namespace)
        base = BASE if "resources:" not in extra else BASE.replace("resources: {cpu: 1}\n", "")
        spec = loads_spec(f"name: {name.replace('-', '')}\n{base}{extra}")
        backend = KubernetesBackend(
            namespace=namespace, dialect=dialect, kubeconfig=str(KUBECONFIG)
        )
        manifest = backend.manifest(spec, key="rec")
        kubectl("-n", namespace, "create", "-f", "-", stdin=json.dumps(manifest))
        time.sleep(settle)
        job_name = manifest["metadata"]["name"]
        select = JobObjects(Dialect(dialect), job_name)
        kind = f"{manifest['kind'].lower()}s.{manifest['apiVersion'].split('/')[0]}"
        job = get_one(kind, job_name, namespace)
        pods = [p for p in get_all("pods", namespace) if select.is_pod(p)]
        podgroups = [
            p
            for p in get_all("podgroups.scheduling.volcano.sh", namespace)
            if select.is_podgroup(p)
        ]
        events = [e for e in get_all("events", namespace) if select.is_event(e)]
        wanted = fact_request(job, pods=pods, podgroups=podgroups, events=events)
        facts = {
            "queues": {q: get_one("queues.scheduling.volcano.sh", q) for q in wanted.queues},
            "priorityClasses": {
                c: get_one("priorityclasses.scheduling.k8s.io", c) for c in wanted.priority_classes
            },
            "claims": {c: get_one("pvc", c, namespace) for c in wanted.claims},
            "nodes": get_all("nodes", None) if wanted.nodes else None,
            "quotas": get_all("resourcequotas", namespace) if wanted.quotas else None,
            "limitRanges": get_all("limitranges", namespace) if wanted.limit_ranges else None,
        }
        path = HERE / f"{name}-{dialect}.json"
        document = {
            "scenario": name,
            "dialect": dialect,
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "job": job,
            "pods": pods,
            "podgroups": podgroups,
            "events": events,
            "facts": facts,
        }
        path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
        return path
    finally:
        # The test bed runs no pvc-protection controller: its finalizer would keep the claim
        # (and the namespace) for ever.
        for obj in namespaced:
            if obj["kind"] == "PersistentVolumeClaim":
                kubectl(
                    "-n",
                    namespace,
                    "patch",
                    "pvc",
                    obj["metadata"]["name"],
                    "--type=merge",
                    "-p",
                    '{"metadata":{"finalizers":null}}',
                    check=False,
                )
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        for obj in cluster:
            plural = {"Queue": "queues.scheduling.volcano.sh", "Node": "nodes"}[obj["kind"]]
            kubectl("delete", plural, obj["metadata"]["name"], "--ignore-not-found", check=False)


def main(names: list[str]) -> None:
    for name in names or list(SCENARIOS):
        for dialect in SCENARIOS[name][0]:
            print(record(name, dialect))


if __name__ == "__main__":
    main(sys.argv[1:])
