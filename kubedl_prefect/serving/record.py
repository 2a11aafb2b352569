"""Where a deployment keeps what a rollback restores: a ConfigMap beside its InferenceService.

A rollback must work from any process (a flow that crashed mid-deployment, a later run), so the
deployer writes down the spec it applied and the one that served before it. Not on the
InferenceService: KServe copies every annotation of an InferenceService into its predictors'
pod templates (all but a fixed list, cluster-wide), so a record there changed the stable
predictor's template whenever a canary came or went, and its pods were replaced mid-canary.

The record is the ConfigMap ``<service>-serving-record`` in the service's namespace, labelled
``kubedl-prefect.io/serving-record=true`` and owned by the InferenceService (an
``ownerReference`` with its uid: the garbage collector deletes the record with the service, so
the deployer never deletes one), with two data keys:
``applied`` (the labels, annotations and spec applied last, as JSON) and ``previous`` (the one
that served before it, when there is one). A ConfigMap of that name without the label is
someone else's: it is neither read nor written, and the deployment is refused before anything
is applied. A record owned by another uid (a service deleted and created again before the
garbage collector removed its record) is not read.

Services deployed by earlier releases kept the record in the annotations
``kubedl-prefect.io/applied-spec`` and ``kubedl-prefect.io/previous-spec``: they are read when
there is no record, and the next apply (which no longer carries them) removes them.

Example:
    >>> record_name("fraud")
    'fraud-serving-record'
    >>> ServingRecord.of({"metadata": {"annotations": {LEGACY_ANNOTATION_APPLIED: "{}"}}}, None)
    ServingRecord(applied='{}', previous=None)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Final

from kubedl_prefect.errors import (
    ConflictError,
    ForbiddenError,
    InvalidObjectError,
    NotFoundError,
    ServingError,
)
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.labels import LABEL_MANAGED_BY, MANAGED_BY
from kubedl_prefect.kube.resources import CONFIG_MAPS, INFERENCE_SERVICES, KubeObject
from kubedl_prefect.serving.render import ANY, RENDERED_SHAPE

logger = logging.getLogger(__name__)

LABEL_SERVING_RECORD: Final = "kubedl-prefect.io/serving-record"
"""The label that makes a ConfigMap a serving record of kubedl-prefect (value ``true``)."""
LABEL_INFERENCE_SERVICE: Final = "kubedl-prefect.io/inference-service"
"""The record's label naming its InferenceService."""
KEY_APPLIED: Final = "applied"
KEY_PREVIOUS: Final = "previous"
LEGACY_ANNOTATION_APPLIED: Final = "kubedl-prefect.io/applied-spec"
"""Where releases before the record kept the applied spec (read, never written)."""
LEGACY_ANNOTATION_PREVIOUS: Final = "kubedl-prefect.io/previous-spec"
"""Where releases before the record kept the previous spec (read, never written)."""

_LABEL_POINTER: Final = "/metadata/labels/kubedl-prefect.io~1serving-record"
"""The record label as a JSON pointer (RFC 6901: ``/`` written ``~1``)."""
_WRITE_TRIES: Final = 4
"""Rounds of patch-then-create while another deployer creates the same record."""


def record_name(service: str) -> str:
    """The name of the ConfigMap that holds ``service``'s record."""
    return f"{service}-serving-record"


@dataclass(frozen=True)
class ServingRecord:
    """What the record of a service says: the applied spec and the one before it (JSON views)."""

    applied: str | None
    previous: str | None

    @classmethod
    def of(cls, service: KubeObject | None, config_map: KubeObject | None) -> ServingRecord:
        """The record of the live ``service`` from its ConfigMap (else its legacy annotations).

        A ConfigMap owned by another uid than the service's is not its record.
        """
        if service is None:
            return cls(None, None)
        uid = service["metadata"].get("uid")
        if config_map is not None and _owner_uids(config_map) == [uid]:
            data = config_map.get("data") or {}
            return cls(data.get(KEY_APPLIED), data.get(KEY_PREVIOUS))
        annotations = service["metadata"].get("annotations") or {}
        return cls(
            annotations.get(LEGACY_ANNOTATION_APPLIED),
            annotations.get(LEGACY_ANNOTATION_PREVIOUS),
        )


def foreign_fields(view: str) -> list[str]:
    """The fields of a recorded view (JSON) that the renderer never writes; ``[]`` when none.

    A record is a ConfigMap, which more people may write than InferenceServices: a rollback
    restores only what :func:`~.render.render_inference_service` could have written
    (:data:`~.render.RENDERED_SHAPE`), so a forged record cannot add a container, a volume, an
    exec probe or a secret reference to the service.

    Example:
        >>> foreign_fields('{"labels": {}, "annotations": {}, "spec": {"predictor": {}}}')
        []
        >>> foreign_fields('{"spec": {"predictor": {"containers": [{"image": "x"}]}}}')
        ['spec.predictor.containers']
    """
    try:
        data = json.loads(view)
    except ValueError:
        return ["(not JSON)"]
    found: list[str] = []
    _compare(data, RENDERED_SHAPE, "", found)
    return found


def rendered_fields(view: dict[str, Any]) -> dict[str, Any]:
    """``view`` with only the fields the renderer writes (:data:`~.render.RENDERED_SHAPE`).

    What a rollback restores when there is no record: the live service, less what others added
    to it (KServe's defaulter, a status).

    Example:
        >>> rendered_fields({"spec": {"predictor": {"model": {"storageUri": "s3://b/m",
        ...     "resources": {}, "args": ["x"]}, "timeout": 60}}, "status": {}})
        {'spec': {'predictor': {'model': {'storageUri': 's3://b/m', 'resources': {}}}}}
    """
    projected = _project(view, RENDERED_SHAPE)
    return projected if isinstance(projected, dict) else {}


def _project(value: Any, shape: object) -> Any:
    if shape is ANY:
        return value
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return {}
        return {k: _project(v, shape[k]) for k, v in value.items() if k in shape}
    assert isinstance(shape, list)
    return [_project(item, shape[0]) for item in value] if isinstance(value, list) else []


def _compare(value: object, shape: object, path: str, found: list[str]) -> None:
    if shape is ANY:
        return
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            found.append(path or "(the view)")
            return
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key in shape:
                _compare(item, shape[key], where, found)
            else:
                found.append(where)
        return
    assert isinstance(shape, list)
    if not isinstance(value, list):
        found.append(path)
        return
    for index, item in enumerate(value):
        _compare(item, shape[0], f"{path}[{index}]", found)


def _owner_uids(obj: KubeObject) -> list[object]:
    return [ref.get("uid") for ref in obj["metadata"].get("ownerReferences") or []]


def _is_record(obj: KubeObject) -> bool:
    return bool((obj["metadata"].get("labels") or {}).get(LABEL_SERVING_RECORD) == "true")


def forged(namespace: str, service: str, fields: list[str]) -> ServingError:
    """The error of a record whose spec to restore holds ``fields`` the renderer never writes."""
    shown = ", ".join(fields[:5]) + (f" and {len(fields) - 5} more" if len(fields) > 5 else "")
    return ServingError(
        f"the serving record {namespace}/{record_name(service)} holds a spec to restore with "
        f"fields kubedl-prefect never writes ({shown}); it is not restored, and nothing was "
        f"applied to InferenceService {namespace}/{service}",
        hint="someone changed that ConfigMap: find out who; if it is harmless, delete it (the "
        "next deployment starts a new record, with nothing to roll back to)",
    )


def _refused(namespace: str, service: str) -> ServingError:
    return ServingError(
        f"the ConfigMap {namespace}/{record_name(service)} exists and is not kubedl-prefect's "
        f"serving record (it lacks the label {LABEL_SERVING_RECORD}=true); the deployment of "
        f"InferenceService {namespace}/{service} needs that name to remember what a rollback "
        "restores, and nothing was applied",
        hint="rename or delete that ConfigMap if it is no one's, or deploy under another name",
    )


async def read_record(client: KubeClient, namespace: str, service: str) -> KubeObject | None:
    """The record ConfigMap of ``service``; ``None`` when there is none, or it may not be read.

    Without ``get`` on ConfigMaps (a serving Role written before the record existed) the
    deployment goes on with what the service's annotations of an earlier release say, and a
    warning: its own rollback works from memory, only a rollback by another process would not
    know what served before.

    Raises:
        ServingError: A ConfigMap of that name is not a serving record (it is left alone).
    """
    try:
        obj = await client.get(CONFIG_MAPS, namespace, record_name(service))
    except NotFoundError:
        return None
    except ForbiddenError as exc:
        logger.warning(
            "cannot read the serving record %s/%s (%s): a rollback from another process will "
            "not know what served before. Grant configmaps get/create/patch "
            "(docs/serving.md, Permissions).",
            namespace,
            record_name(service),
            exc.message,
        )
        return None
    if not _is_record(obj):
        raise _refused(namespace, service)
    return obj


def record_object(owner: KubeObject, record: ServingRecord) -> KubeObject:
    """The ConfigMap holding ``record``, owned by the InferenceService ``owner`` (pure)."""
    metadata = owner["metadata"]
    data = {KEY_APPLIED: record.applied or ""}
    if record.previous is not None:
        data[KEY_PREVIOUS] = record.previous
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": record_name(metadata["name"]),
            "namespace": metadata["namespace"],
            "labels": {
                LABEL_MANAGED_BY: MANAGED_BY,
                LABEL_SERVING_RECORD: "true",
                LABEL_INFERENCE_SERVICE: metadata["name"],
            },
            "ownerReferences": [
                {
                    "apiVersion": INFERENCE_SERVICES.api_version,
                    "kind": INFERENCE_SERVICES.kind,
                    "name": metadata["name"],
                    "uid": metadata["uid"],
                }
            ],
        },
        "data": data,
    }


async def write_record(client: KubeClient, owner: KubeObject, record: ServingRecord) -> None:
    """Replace the record of the InferenceService ``owner`` with ``record``: one request.

    A JSON patch that first tests the record label (so a ConfigMap of that name that is not a
    record is never written: the server answers 422), then replaces the data and the owner;
    the record is created when there is none. A record that cannot be written (no RBAC for
    ConfigMaps, a foreign ConfigMap created since it was read) is logged, not raised: this
    deployment rolls back from what it holds in memory, only another process would not know
    what to restore.
    """
    body = record_object(owner, record)
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    owners = body["metadata"]["ownerReferences"]
    patch = [
        {"op": "test", "path": _LABEL_POINTER, "value": "true"},
        {"op": "add", "path": "/metadata/ownerReferences", "value": owners},
        {"op": "add", "path": "/data", "value": body["data"]},
    ]
    try:
        for _ in range(_WRITE_TRIES):
            try:
                await client.patch(CONFIG_MAPS, namespace, name, patch, patch_type="json")
                return
            except NotFoundError:
                pass
            except InvalidObjectError as exc:  # the label test failed: not a record of ours
                logger.warning(
                    "not writing the serving record %s/%s: that ConfigMap is not one (%s)",
                    namespace,
                    name,
                    exc.message,
                )
                return
            try:
                await client.create(CONFIG_MAPS, namespace, body)
                return
            except ConflictError:
                continue  # created meanwhile: patch it
        logger.warning("could not write the serving record %s/%s", namespace, name)
    except ForbiddenError as exc:
        logger.warning(
            "cannot write the serving record %s/%s (%s): a rollback from another process will "
            "not know what served before. Grant configmaps get/create/patch "
            "(docs/serving.md, Permissions).",
            namespace,
            name,
            exc.message,
        )
