"""The test bed's local volume provisioner: PersistentVolumeClaims backed by folders.

A claim of the StorageClass :data:`STORAGE_CLASS` (provisioner :data:`PROVISIONER`) gets a
``hostPath`` PersistentVolume of its own, whose folder lies under the test bed's state folder
(``<test bed>/process-nodes/volumes/<volume>``, removed by ``down``), made with a ``claimRef``
to the claim, as an external provisioner makes one: kube-controller-manager's PersistentVolume
binder then binds the two (``Bound``). When the claim is deleted the binder marks the volume
``Released``; the provisioner then removes its folder and deletes it (reclaim policy
``Delete``). The process node's agent runs the provisioner beside its pods, and mounts a bound
claim's folder at the container's ``mountPath`` (:func:`claim_folder`).

The deciders (:func:`storage_class`, :func:`volume_for_claim`, :func:`reclaimable`,
:func:`claim_folder`) are pure; :func:`run_provisioner` does the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubedl_prefect.errors import ConflictError, KubeAPIError, NotFoundError
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import PERSISTENT_VOLUME_CLAIMS, ResourceKind

logger = logging.getLogger(__name__)

KubeObject = dict[str, Any]

#: The test bed's StorageClass of folder-backed volumes.
STORAGE_CLASS = "testbed-local"
#: Its provisioner's name (``pv.kubernetes.io/provisioned-by`` of the volumes it makes).
PROVISIONER = "testbed.kubedl-prefect.io/local-path"
#: Size of a volume whose claim requests none.
DEFAULT_SIZE = "1Gi"

PERSISTENT_VOLUMES = ResourceKind(
    "", "v1", "PersistentVolume", "persistentvolumes", namespaced=False
)
STORAGE_CLASSES = ResourceKind(
    "storage.k8s.io", "v1", "StorageClass", "storageclasses", namespaced=False
)

_SAFE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def storage_class() -> KubeObject:
    """The StorageClass of the test bed's folder-backed volumes.

    Example:
        >>> storage_class()["provisioner"]
        'testbed.kubedl-prefect.io/local-path'
    """
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def volume_name(claim: Mapping[str, Any]) -> str:
    """The name of the volume made for ``claim``: ``pvc-<claim uid>``, as provisioners name it."""
    return f"pvc-{(claim.get('metadata') or {}).get('uid', '')}"


def volume_for_claim(claim: Mapping[str, Any], volumes_dir: Path) -> KubeObject | None:
    """The PersistentVolume to make for ``claim``, or ``None`` when it needs none from us.

    A claim needs one when it names :data:`STORAGE_CLASS`, is not bound (no ``volumeName``)
    and is not being deleted. The volume is a ``hostPath`` folder under ``volumes_dir``, the
    claim's access modes and requested size, reclaim policy ``Delete``, bound in advance to
    the claim by ``claimRef`` (the binder completes the binding).

    Example:
        >>> claim = {"metadata": {"name": "ckpt", "namespace": "a", "uid": "u1"},
        ...          "spec": {"storageClassName": "testbed-local",
        ...                   "accessModes": ["ReadWriteMany"],
        ...                   "resources": {"requests": {"storage": "2Gi"}}}}
        >>> pv = volume_for_claim(claim, Path("/bed/volumes"))
        >>> pv["metadata"]["name"], pv["spec"]["hostPath"]["path"], pv["spec"]["capacity"]
        ('pvc-u1', '/bed/volumes/pvc-u1', {'storage': '2Gi'})
        >>> volume_for_claim({**claim, "spec": {"storageClassName": "other"}}, Path("/v")) is None
        True
    """
    metadata = claim.get("metadata") or {}
    spec = claim.get("spec") or {}
    if spec.get("storageClassName") != STORAGE_CLASS or spec.get("volumeName"):
        return None
    if metadata.get("deletionTimestamp") or not metadata.get("uid"):
        return None
    name = volume_name(claim)
    size = ((spec.get("resources") or {}).get("requests") or {}).get("storage") or DEFAULT_SIZE
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": str(size)},
            "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
            "volumeMode": "Filesystem",
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": STORAGE_CLASS,
            "hostPath": {"path": str(volumes_dir / name), "type": "DirectoryOrCreate"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": str(metadata.get("namespace", "")),
                "name": str(metadata.get("name", "")),
                "uid": str(metadata["uid"]),
            },
        },
    }


def _ours(volume: Mapping[str, Any], volumes_dir: Path) -> Path | None:
    """The folder of ``volume`` when this provisioner made it (under ``volumes_dir``)."""
    annotations = (volume.get("metadata") or {}).get("annotations") or {}
    if annotations.get("pv.kubernetes.io/provisioned-by") != PROVISIONER:
        return None
    path = Path(str(((volume.get("spec") or {}).get("hostPath") or {}).get("path", "")))
    name = str((volume.get("metadata") or {}).get("name", ""))
    if not _SAFE_NAME.match(name) or path != volumes_dir / name:
        return None  # never remove a folder we did not make
    return path


def reclaimable(volume: Mapping[str, Any], volumes_dir: Path) -> Path | None:
    """The folder to remove when ``volume`` is one of ours whose claim is gone, else ``None``.

    Example:
        >>> pv = {"metadata": {"name": "pvc-u1",
        ...                    "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
        ...       "spec": {"hostPath": {"path": "/bed/volumes/pvc-u1"},
        ...                "persistentVolumeReclaimPolicy": "Delete"},
        ...       "status": {"phase": "Released"}}
        >>> reclaimable(pv, Path("/bed/volumes"))
        PosixPath('/bed/volumes/pvc-u1')
        >>> reclaimable({**pv, "status": {"phase": "Bound"}}, Path("/bed/volumes")) is None
        True
    """
    folder = _ours(volume, volumes_dir)
    spec = volume.get("spec") or {}
    phase = (volume.get("status") or {}).get("phase")
    if folder is None or spec.get("persistentVolumeReclaimPolicy") != "Delete":
        return None
    return folder if phase in ("Released", "Failed") else None


def claim_folder(
    claim: Mapping[str, Any] | None, volume: Mapping[str, Any] | None, claim_name: str
) -> Path | str:
    """The host folder a pod mounts for the claim ``claim_name``, or why it cannot (a message).

    The claim must be bound to a ``hostPath`` or ``local`` volume (the process node mounts
    folders of this machine only).

    Example:
        >>> claim = {"spec": {"volumeName": "pvc-u1"}, "status": {"phase": "Bound"}}
        >>> pv = {"metadata": {"name": "pvc-u1"}, "spec": {"hostPath": {"path": "/bed/v/pvc-u1"}}}
        >>> claim_folder(claim, pv, "ckpt")
        PosixPath('/bed/v/pvc-u1')
        >>> claim_folder(None, None, "ckpt")
        'persistentvolumeclaim "ckpt" not found'
    """
    if claim is None:
        return f'persistentvolumeclaim "{claim_name}" not found'
    bound_to = (claim.get("spec") or {}).get("volumeName")
    if (claim.get("status") or {}).get("phase") != "Bound" or not bound_to:
        return f'persistentvolumeclaim "{claim_name}" is not bound'
    if volume is None:
        return f'persistentvolume "{bound_to}" of claim "{claim_name}" not found'
    spec = volume.get("spec") or {}
    source = spec.get("hostPath") or spec.get("local")
    if not source or not source.get("path"):
        kinds = sorted(set(spec) & {"nfs", "csi", "iscsi", "rbd", "cephfs", "gcePersistentDisk"})
        return (
            f'persistentvolume "{bound_to}" of claim "{claim_name}" is not a folder of this '
            f"machine ({', '.join(kinds) or 'no hostPath or local path'}): a process node "
            f"mounts hostPath and local volumes only (use StorageClass {STORAGE_CLASS})"
        )
    return Path(str(source["path"]))


async def claim_mount(
    kube: KubeClient, namespace: str, volume: Mapping[str, Any]
) -> tuple[Path, bool] | str:
    """The host folder and read-only flag of a pod's ``persistentVolumeClaim`` volume.

    Returns why it cannot be mounted instead (a ``FailedMount`` message): the claim is missing
    or unbound, or its volume is not a folder of this machine (:func:`claim_folder`). The
    folder is made when missing (``DirectoryOrCreate``).
    """
    source = volume.get("persistentVolumeClaim") or {}
    name = str(source.get("claimName", ""))
    claim: KubeObject | None = None
    pv: KubeObject | None = None
    with contextlib.suppress(NotFoundError):
        claim = await kube.get(PERSISTENT_VOLUME_CLAIMS, namespace, name)
    bound_to = ((claim or {}).get("spec") or {}).get("volumeName")
    if bound_to:
        with contextlib.suppress(NotFoundError):
            pv = await kube.get(PERSISTENT_VOLUMES, None, str(bound_to))
    folder = claim_folder(claim, pv, name)
    if isinstance(folder, str):
        return folder
    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    return folder, bool(source.get("readOnly", False))


async def provision(kube: KubeClient, claim: KubeObject, volumes_dir: Path) -> None:
    """Make the volume ``claim`` needs, if it needs one (a volume already made is kept)."""
    volume = volume_for_claim(claim, volumes_dir)
    if volume is None:
        return
    folder = Path(volume["spec"]["hostPath"]["path"])
    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    with contextlib.suppress(ConflictError):
        await kube.create(PERSISTENT_VOLUMES, None, volume)
        meta = claim["metadata"]
        logger.info(
            "provisioned %s for claim %s/%s", volume_name(claim), meta["namespace"], meta["name"]
        )


async def reclaim(kube: KubeClient, volume: KubeObject, volumes_dir: Path) -> None:
    """Remove the folder and delete ``volume`` when its claim is gone (reclaim policy Delete)."""
    folder = reclaimable(volume, volumes_dir)
    if folder is None:
        return
    await asyncio.to_thread(shutil.rmtree, folder, ignore_errors=True)
    name = str(volume["metadata"]["name"])
    with contextlib.suppress(NotFoundError):
        await kube.delete(PERSISTENT_VOLUMES, None, name)
        logger.info("deleted %s and its folder (its claim is gone)", name)


async def run_provisioner(kube: KubeClient, volumes_dir: Path) -> None:
    """Install the StorageClass, then provision and reclaim volumes for ever."""
    from kubedl_prefect.testbed import cluster
    from kubedl_prefect.testbed.nodeagent.agent import list_and_watch

    await asyncio.to_thread(volumes_dir.mkdir, parents=True, exist_ok=True)
    while True:
        try:
            await cluster.create_or_update(kube, STORAGE_CLASSES, storage_class())
            break
        except KubeAPIError as exc:
            logger.warning("StorageClass %s not written yet: %s", STORAGE_CLASS, exc)
            await asyncio.sleep(2.0)

    async def claims_listed(items: list[KubeObject]) -> None:
        for claim in items:
            await claim_changed("ADDED", claim)

    async def claim_changed(kind: str, claim: KubeObject) -> None:
        if kind == "DELETED":
            return
        try:
            await provision(kube, claim, volumes_dir)
        except KubeAPIError as exc:
            logger.warning("no volume for claim %s yet: %s", claim["metadata"].get("name"), exc)

    async def volumes_listed(items: list[KubeObject]) -> None:
        for volume in items:
            await volume_changed("ADDED", volume)

    async def volume_changed(kind: str, volume: KubeObject) -> None:
        if kind == "DELETED":
            return
        try:
            await reclaim(kube, volume, volumes_dir)
        except KubeAPIError as exc:
            logger.warning("volume %s not reclaimed yet: %s", volume["metadata"].get("name"), exc)

    await asyncio.gather(
        list_and_watch(
            kube,
            PERSISTENT_VOLUME_CLAIMS,
            field_selector=None,
            on_list=claims_listed,
            on_event=claim_changed,
        ),
        list_and_watch(
            kube,
            PERSISTENT_VOLUMES,
            field_selector=None,
            on_list=volumes_listed,
            on_event=volume_changed,
        ),
    )
