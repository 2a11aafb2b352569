"""Run records on a cluster: one ConfigMap per logical job, one data key per attempt.

What a record says (:class:`~kubedl_prefect.lifecycle.records.RunRecord`) is backend-neutral;
this module is where the Kubernetes wing keeps it: a ConfigMap named ``<spec name>-<key hash>``,
labelled like the jobs (:mod:`.ownership`) plus ``kubedl-prefect.io/run-record=true``, with the
key, spec hash and spec name as annotations and each attempt as JSON under ``attempt-<n>``.
A ConfigMap of that name without the record label is someone else's: it is never read nor
written as a record.

Example:
    >>> attempt_data_key(3)
    'attempt-3'
    >>> json_pointer_token("kubedl-prefect.io/run-record")
    'kubedl-prefect.io~1run-record'
"""

from __future__ import annotations

import json
import logging

from kubedl_prefect.errors import (
    AdoptionRefusedError,
    ConflictError,
    ForbiddenError,
    InvalidObjectError,
    NotFoundError,
)
from kubedl_prefect.kube.client import KubeClient
from kubedl_prefect.kube.resources import CONFIG_MAPS, KubeObject
from kubedl_prefect.lifecycle.backend import JobRef
from kubedl_prefect.lifecycle.kubernetes.ownership import (
    ANNOTATION_KEY,
    ANNOTATION_SPEC_HASH,
    ANNOTATION_SPEC_NAME,
    LABEL_RECORD,
    owner_annotations,
    owner_labels,
)
from kubedl_prefect.lifecycle.records import AttemptRecord, RunRecord, record_name

logger = logging.getLogger(__name__)

_WRITE_TRIES = 8
"""Rounds of patch-then-create a write makes while other waiters create the same record."""


def attempt_data_key(attempt: int) -> str:
    """The record's data key of one attempt."""
    return f"attempt-{attempt}"


def json_pointer_token(key: str) -> str:
    """``key`` as one token of a JSON pointer (RFC 6901: ``~`` and ``/`` escaped)."""
    return key.replace("~", "~0").replace("/", "~1")


def record_object(name: str, ref: JobRef, spec_name: str, data: dict[str, str]) -> KubeObject:
    """The ConfigMap that holds the record of `ref`'s logical job, with `data` in it."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": ref.namespace,
            "labels": {**owner_labels(ref.key), LABEL_RECORD: "true"},
            "annotations": {
                **owner_annotations(ref.key, ref.spec_hash),
                ANNOTATION_SPEC_NAME: spec_name,
            },
        },
        "data": data,
    }


def parse_record(obj: KubeObject) -> RunRecord:
    """The record a ConfigMap holds: its annotations and one data key per attempt.

    An attempt whose data cannot be read is skipped with a warning (the others still count).
    """
    metadata = obj["metadata"]
    annotations = metadata.get("annotations") or {}
    attempts = []
    for data_key, text in sorted((obj.get("data") or {}).items()):
        if not data_key.startswith("attempt-"):
            continue
        try:
            attempts.append(AttemptRecord.from_dict(json.loads(text)))
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring %s of the run record %s: %s", data_key, metadata["name"], exc)
    return RunRecord(
        spec_name=str(annotations.get(ANNOTATION_SPEC_NAME) or ""),
        key=str(annotations.get(ANNOTATION_KEY) or ""),
        spec_hash=str(annotations.get(ANNOTATION_SPEC_HASH) or ""),
        attempts=tuple(sorted(attempts, key=lambda a: a.attempt)),
    )


async def read_record(client: KubeClient, namespace: str, name: str) -> RunRecord | None:
    """The record in the ConfigMap ``namespace/name``; ``None`` when there is none.

    Raises:
        AdoptionRefusedError: A ConfigMap of that name exists without our record label: it is
            not read (nor ever written) as a record.
    """
    try:
        obj = await client.get(CONFIG_MAPS, namespace, name)
    except NotFoundError:
        return None
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if labels.get(LABEL_RECORD) != "true":
        raise AdoptionRefusedError(
            f"the ConfigMap {namespace}/{name} is not a run record of kubedl-prefect (it lacks "
            f"the label {LABEL_RECORD}=true): it is neither read nor written as one",
            status=409,
            reason="AlreadyExists",
            hint="rename or delete that ConfigMap if it is no one's, or run the job under "
            "another key (or spec name)",
        )
    return parse_record(obj)


async def write_record(
    client: KubeClient, ref: JobRef, spec_name: str, entry: AttemptRecord
) -> None:
    """Write ``entry`` into the record of ``ref``'s logical job: one request.

    Each attempt has a data key of its own (``attempt-<n>``), so a JSON patch adds or
    replaces it without reading the record first and without conflicts between waiters;
    the record is created on first use. The patch first tests that the ConfigMap carries
    our record label (one atomic request): a ConfigMap of that name that is not a record of
    ours is never written (the server answers 422). A record that cannot be written (RBAC
    without ConfigMaps, a foreign ConfigMap in the way) is logged, not raised: the job runs
    on, only a replay after clean-up will not know about it.
    """
    name = record_name(spec_name, ref.key)
    data_key = attempt_data_key(entry.attempt)
    data = {data_key: json.dumps(entry.to_dict())}
    patch = [
        {
            "op": "test",
            "path": f"/metadata/labels/{json_pointer_token(LABEL_RECORD)}",
            "value": "true",
        },
        {"op": "add", "path": f"/data/{json_pointer_token(data_key)}", "value": data[data_key]},
    ]
    try:
        for _ in range(_WRITE_TRIES):
            try:
                await client.patch(CONFIG_MAPS, ref.namespace, name, patch, patch_type="json")
                return
            except NotFoundError:
                pass
            except InvalidObjectError as exc:
                logger.warning(
                    "not writing the run record %s/%s: that ConfigMap is not a run record of "
                    "kubedl-prefect (it lacks the label %s=true, or its data) and is left as "
                    "it is (%s); a replay after the jobs are cleaned up will not know how "
                    "attempt %d ended. Rename that ConfigMap, or use another key.",
                    ref.namespace,
                    name,
                    LABEL_RECORD,
                    exc.message,
                    ref.attempt,
                )
                return
            try:
                await client.create(
                    CONFIG_MAPS, ref.namespace, record_object(name, ref, spec_name, data)
                )
                return
            except ConflictError:
                continue  # created meanwhile by another waiter: patch it
        logger.warning("could not write the run record %s/%s", ref.namespace, name)
    except ForbiddenError as exc:
        logger.warning(
            "cannot write the run record %s/%s (%s); a replay after the jobs are cleaned up "
            "will not know how attempt %d ended. Grant configmaps get/create/patch "
            "(deploy/rbac.yaml).",
            ref.namespace,
            name,
            exc.message,
            ref.attempt,
        )
