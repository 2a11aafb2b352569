"""The process node's Node object and where its state lives (pure, but for reading the machine).

A process node advertises this machine's CPUs and memory, no GPUs, and carries a label and a
``NoSchedule`` taint, so that only pods that ask for it run there (kwok's GPU nodes stay for
admission and scale tests). Its kubelet endpoint is kwok's server, which serves container logs
from the files the agent writes (see :mod:`kubedl_prefect.testbed.podlogs`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from kubedl_prefect.testbed.components import LOOPBACK, Layout

#: Label and taint key of process nodes; a pod opts in with a nodeSelector and a toleration.
PROCESS_NODE_LABEL = "testbed.kubedl-prefect.io/process-node"
#: Name of the (one) process node.
PROCESS_NODE_NAME = "process-node-0"
#: Lease namespace of nodes.
LEASE_NAMESPACE = "kube-node-lease"


@dataclass(frozen=True)
class AgentPaths:
    """Where a process node keeps its pods' state: ``<test bed>/process-nodes/<node>/``.

    Attributes:
        layout: The test bed.
        node: The node's name.
    """

    layout: Layout
    node: str = PROCESS_NODE_NAME

    @property
    def root(self) -> Path:
        """Every process node's state of this test bed (removed by ``down``)."""
        return self.layout.root / "process-nodes"

    @property
    def node_dir(self) -> Path:
        """This node's state."""
        return self.root / self.node

    def pod_dir(self, uid: str) -> Path:
        """One pod's folder: volumes, ``etc`` files, container scratch folders."""
        return self.node_dir / "pods" / uid


def machine_capacity() -> dict[str, str]:
    """This machine's CPUs and memory, as a Node's capacity (no GPUs)."""
    return {
        "cpu": str(os.cpu_count() or 1),
        "memory": f"{psutil.virtual_memory().total // 1024}Ki",
        "pods": "110",
        "ephemeral-storage": "100Gi",
    }


def node_manifest(name: str, capacity: dict[str, str]) -> dict[str, Any]:
    """The process node: labelled and tainted ``testbed.kubedl-prefect.io/process-node``.

    Example:
        >>> node = node_manifest("process-node-0", {"cpu": "2"})
        >>> node["spec"]["taints"][0]["effect"], node["metadata"]["labels"]["type"]
        ('NoSchedule', 'process')
    """
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                PROCESS_NODE_LABEL: "true",
                "type": "process",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.present": "false",
            },
        },
        "spec": {"taints": [{"key": PROCESS_NODE_LABEL, "value": "true", "effect": "NoSchedule"}]},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def node_status(
    name: str, capacity: dict[str, str], *, kubelet_port: int, now: str
) -> dict[str, Any]:
    """The status the agent writes: Ready, its address, kwok's server as its kubelet."""
    conditions = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ("Ready", "True", "KubeletReady"),
    ]
    return {
        "capacity": capacity,
        "allocatable": dict(capacity),
        "conditions": [
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": "kubedl-prefect process node agent",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            for kind, status, reason in conditions
        ],
        "addresses": [
            {"type": "InternalIP", "address": LOOPBACK},
            {"type": "Hostname", "address": name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "architecture": "amd64",
            "operatingSystem": "linux",
            "kubeletVersion": "kubedl-prefect-process-node",
            "kubeProxyVersion": "",
            "containerRuntimeVersion": "process://",
            "kernelVersion": os.uname().release,
            "osImage": "this machine",
            "bootID": "",
            "machineID": "",
            "systemUUID": "",
        },
    }
