"""The process node's local provisioner decides volumes, reclaims and mounts (pure parts)."""

from __future__ import annotations

import doctest
from pathlib import Path
from typing import Any

from kubedl_prefect.testbed.nodeagent import provisioner
from kubedl_prefect.testbed.nodeagent.provisioner import (
    PROVISIONER,
    STORAGE_CLASS,
    claim_folder,
    reclaimable,
    volume_for_claim,
)

VOLUMES = Path("/bed/process-nodes/volumes")


def claim(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "ckpt", "namespace": "team-a", "uid": "0f3c"},
        "spec": {"storageClassName": STORAGE_CLASS, **spec},
    }


def test_docstring_examples() -> None:
    result = doctest.testmod(provisioner)
    assert result.attempted >= 6
    assert result.failed == 0


def test_a_claim_of_the_class_gets_a_folder_volume_bound_to_it_in_advance() -> None:
    volume = volume_for_claim(claim(accessModes=["ReadWriteMany"]), VOLUMES)
    assert volume is not None
    spec = volume["spec"]
    assert spec["hostPath"] == {"path": str(VOLUMES / "pvc-0f3c"), "type": "DirectoryOrCreate"}
    assert spec["claimRef"] == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": "team-a",
        "name": "ckpt",
        "uid": "0f3c",
    }
    assert spec["accessModes"] == ["ReadWriteMany"]
    assert spec["capacity"] == {"storage": provisioner.DEFAULT_SIZE}
    assert spec["persistentVolumeReclaimPolicy"] == "Delete"
    assert volume["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == PROVISIONER


def test_bound_deleted_and_foreign_claims_get_no_volume() -> None:
    assert volume_for_claim(claim(volumeName="pvc-0f3c"), VOLUMES) is None
    deleting = claim()
    deleting["metadata"]["deletionTimestamp"] = "2026-12-03T12:00:00Z"
    assert volume_for_claim(deleting, VOLUMES) is None
    assert volume_for_claim(claim(storageClassName="standard"), VOLUMES) is None
    assert volume_for_claim(claim(storageClassName=""), VOLUMES) is None


def test_only_released_volumes_of_ours_under_the_folder_are_reclaimed() -> None:
    ours = volume_for_claim(claim(), VOLUMES)
    assert ours is not None
    ours["status"] = {"phase": "Released"}
    assert reclaimable(ours, VOLUMES) == VOLUMES / "pvc-0f3c"
    elsewhere = {**ours, "spec": {**ours["spec"], "hostPath": {"path": "/etc"}}}
    assert reclaimable(elsewhere, VOLUMES) is None
    retained = {**ours, "spec": {**ours["spec"], "persistentVolumeReclaimPolicy": "Retain"}}
    assert reclaimable(retained, VOLUMES) is None
    foreign = {**ours, "metadata": {"name": "pvc-0f3c", "annotations": {}}}
    assert reclaimable(foreign, VOLUMES) is None


def test_a_mount_needs_a_bound_claim_on_a_folder_of_this_machine() -> None:
    bound = {"spec": {"volumeName": "pv-1"}, "status": {"phase": "Bound"}}
    local = {"spec": {"local": {"path": "/srv/data"}}}
    assert claim_folder(bound, local, "data") == Path("/srv/data")
    pending = {"spec": {}, "status": {"phase": "Pending"}}
    assert claim_folder(pending, None, "data") == 'persistentvolumeclaim "data" is not bound'
    nfs = {"spec": {"nfs": {"server": "nas", "path": "/x"}}}
    message = claim_folder(bound, nfs, "data")
    assert isinstance(message, str)
    assert "nfs" in message
    assert STORAGE_CLASS in message
    assert "not found" in str(claim_folder(bound, None, "data"))
