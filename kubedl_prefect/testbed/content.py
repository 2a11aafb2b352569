"""What the test bed's cluster holds besides its components: CRDs, simulated nodes, kwok stages.

Pure functions that build manifests and find files; :mod:`.cluster` applies them.
CRDs come from the very module versions pinned in :mod:`.upstream` (downloaded into the Go module
cache), never from copies in this repository.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kubedl_prefect.errors import TestbedError
from kubedl_prefect.testbed.upstream import (
    JOBSET,
    KSERVE,
    KUBEDL,
    KUBEFLOW_TRAINING,
    KUEUE,
    KWOK,
    TRAINER,
    VOLCANO,
    GoModule,
    module_dir,
)

#: Folder of our kwok Stage files (node and pod lifecycles).
STAGES_DIR = Path(__file__).resolve().parent / "stages"

#: Annotations the kwok stages read (see ``stages/pod.yaml`` and docs/testbed.md).
ANNOTATION_PREFIX = "testbed.kubedl-prefect.io/"
RUN_DURATION = ANNOTATION_PREFIX + "run-duration"
START_DELAY = ANNOTATION_PREFIX + "start-delay"
EXIT_CODE = ANNOTATION_PREFIX + "exit-code"
FAIL_REASON = ANNOTATION_PREFIX + "fail-reason"
EVICT = ANNOTATION_PREFIX + "evict"
EVICT_ON_ATTEMPT = ANNOTATION_PREFIX + "evict-on-attempt"
WAITING_REASON = ANNOTATION_PREFIX + "waiting-reason"
WAITING_MESSAGE = ANNOTATION_PREFIX + "waiting-message"

#: Pod label ``evict-on-attempt`` compares with (set by the lifecycle on every pod it makes).
ATTEMPT_LABEL = "kubedl-prefect.io/attempt"

#: Label on every node the test bed creates.
NODE_LABEL = "testbed.kubedl-prefect.io/node"
#: Prefix of the simulated nodes' names (``kwok-node-0``...).
NODE_PREFIX = "kwok-node-"
#: Extended resource the nodes offer.
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class CrdSource:
    """CRD files inside an upstream module.

    Attributes:
        module: The pinned module.
        folder: Folder inside the module.
        pattern: Glob of the files in ``folder``.
        versions: Serve only these versions of each CRD (all when empty).
    """

    module: GoModule
    folder: str
    pattern: str = "*.yaml"
    versions: tuple[str, ...] = ()

    def files(self) -> list[Path]:
        """The matching files (downloads the module on first use).

        Raises:
            TestbedError: The module has no such files (a changed layout upstream).
        """
        folder = module_dir(self.module) / self.folder
        found = sorted(p for p in folder.glob(self.pattern) if p.name != "kustomization.yaml")
        if not found:
            raise TestbedError(
                f"no CRD files {self.folder}/{self.pattern} in "
                f"{self.module.path}@{self.module.version}"
            )
        return found


#: Every CRD the test bed installs. KubeDL's manager registers all of its API groups at start, so
#: all of its CRDs are installed; Volcano's batch/bus groups (vcjob) are not used by the scheduler.
CRD_SOURCES: tuple[CrdSource, ...] = (
    CrdSource(KUBEDL, "config/crd/bases"),
    CrdSource(KUBEFLOW_TRAINING, "manifests/base/crds", "kubeflow.org_*.yaml"),
    CrdSource(VOLCANO, "config/crd/volcano/bases", "scheduling.volcano.sh_*.yaml"),
    CrdSource(VOLCANO, "config/crd/volcano/bases", "topology.volcano.sh_*.yaml"),
    CrdSource(VOLCANO, "config/crd/volcano/bases", "nodeinfo.volcano.sh_*.yaml"),
    CrdSource(VOLCANO, "config/crd/volcano/bases", "shard.volcano.sh_*.yaml"),
    # Every CRD the KServe controller watches or lists (it exits without the ones it always
    # watches), full schemas: see .kserve.
    CrdSource(KSERVE, "config/crd/full", "serving.kserve.io_*.yaml"),
    CrdSource(KSERVE, "config/crd/full/clusterstoragecontainer", "serving.kserve.io_*.yaml"),
    # Kubeflow Trainer v2 (TrainJob, runtimes) and the JobSets it runs as: see .trainer. JobSet has
    # one served version, so the conversion webhook its kustomization adds is left out.
    CrdSource(TRAINER, "manifests/base/crds", "trainer.kubeflow.org_*.yaml"),
    CrdSource(JOBSET, "config/components/crd/bases", "jobset.x-k8s.io_*.yaml"),
    # Kueue (see .kueue): v1beta2 only, its storage version; v1beta1 needs its conversion webhook.
    CrdSource(KUEUE, "config/components/crd/bases", "kueue.x-k8s.io_*.yaml", ("v1beta2",)),
    # kwok's per-pod log configuration (see .podlogs), watched by the kwok controller.
    CrdSource(KWOK, "kustomize/crd/bases", "kwok.x-k8s.io_logs.yaml"),
)


# The CRDs are ~10 MB of YAML: libyaml parses them in about 2 s, pure Python in about 15 s.
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_documents(path: Path) -> list[dict[str, Any]]:
    """The non-empty YAML documents of a file."""
    with path.open() as handle:
        return [doc for doc in yaml.load_all(handle, Loader=_Loader) if isinstance(doc, dict)]


def crd_files(sources: tuple[CrdSource, ...] = CRD_SOURCES) -> list[Path]:
    """The files of ``sources``, in a stable order."""
    return [path for source in sources for path in source.files()]


def crd_manifests(sources: tuple[CrdSource, ...] = CRD_SOURCES) -> list[dict[str, Any]]:
    """The CustomResourceDefinition documents of ``sources``, in a stable order."""
    return [
        _served(doc, source.versions)
        for source in sources
        for path in source.files()
        for doc in load_documents(path)
        if doc.get("kind") == "CustomResourceDefinition"
    ]


def _served(crd: dict[str, Any], versions: tuple[str, ...]) -> dict[str, Any]:
    """``crd`` with only ``versions`` left (all of them when empty)."""
    if versions:
        kept = [v for v in crd["spec"]["versions"] if v.get("name") in versions]
        if not kept:
            raise TestbedError(f"CRD {crd['metadata']['name']} has none of {', '.join(versions)}")
        crd["spec"]["versions"] = kept
    return crd


def crd_names(sources: tuple[CrdSource, ...] = CRD_SOURCES) -> list[str]:
    """Names (``<plural>.<group>``) of the CRDs of ``sources``, without parsing the files.

    CRD file names follow kubebuilder's ``<group>_<plural>.yaml``; files named otherwise are
    parsed.
    """
    names: list[str] = []
    for path in crd_files(sources):
        group, sep, plural = path.stem.partition("_")
        if sep and "." in group and plural:
            names.append(f"{plural}.{group}")
        else:
            names += [
                str(doc["metadata"]["name"])
                for doc in load_documents(path)
                if doc.get("kind") == "CustomResourceDefinition"
            ]
    return names


def stage_files() -> list[Path]:
    """Our kwok Stage files."""
    return sorted(STAGES_DIR.glob("*.yaml"))


def node_name(index: int) -> str:
    """Name of the ``index``-th simulated node."""
    return f"{NODE_PREFIX}{index}"


def node_manifest(
    index: int, *, gpus: int, cpu: str = "64", memory: str = "512Gi"
) -> dict[str, Any]:
    """A kwok-managed Node with ``gpus`` ``nvidia.com/gpu`` next to cpu, memory and pods.

    No taints: ordinary pods schedule onto it without tolerations, as onto a real GPU node.
    """
    name = node_name(index)
    capacity = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "1Ti"}
    if gpus:
        capacity[GPU_RESOURCE] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {
                "kwok.x-k8s.io/node": "fake",
                "node.alpha.kubernetes.io/ttl": "0",
            },
            "labels": {
                NODE_LABEL: "true",
                "type": "kwok",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.present": "true" if gpus else "false",
            },
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def kwok_configuration(
    *, node_port: int, cidr: str = "10.244.0.0/16", node_ip: str = "127.0.0.1"
) -> dict[str, Any]:
    """The kwok controller's own configuration document.

    kwok applies no defaults to a configuration read from a file: every option it needs is set.
    Its server is every node's kubelet: the nodes' ``InternalIP`` is ``node_ip`` (loopback, where
    kwok listens) and their kubelet port ``node_port`` (the node stage writes both), so the API
    server reaches it for container logs; the debugging handlers serve them.

    Args:
        node_port: The port kwok's server listens on (``Ports.kwok``).
        cidr: Pod IPs.
        node_ip: The nodes' address.
    """
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "cidr": cidr,
            "nodeIP": node_ip,
            "nodePort": node_port,
            "manageAllNodes": False,
            "manageNodesWithAnnotationSelector": "kwok.x-k8s.io/node=fake",
            "enableDebuggingHandlers": True,
            "enableContentionProfiling": False,
            "enableProfilingHandler": False,
            "podPlayStageParallelism": 8,
            "nodePlayStageParallelism": 2,
            "nodeLeaseDurationSeconds": 40,
            "nodeLeaseParallelism": 2,
            "podsOnNodeSyncParallelism": 2,
            "enablePodsOnNodeSyncListPager": True,
            "enablePodsOnNodeSyncStreamWatch": False,
        },
    }
