"""The label contract: how a job on a cluster says whose it is, for which key, from which spec.

Every job the backend creates carries the managed-by label (:mod:`kubedl_prefect.kube.labels`),
the key's hash and the attempt as labels (selectable), and the key and the spec hash as
annotations (exact). Adoption reads them back: a job of the wanted name is ours to follow only when
it was made by kubedl-prefect, for this key, from this spec. Pure: no I/O.

Example:
    >>> labels = owner_labels("nightly@2026-12-03", attempt=2)
    >>> labels[LABEL_ATTEMPT]
    '2'
    >>> job = {"kind": "PyTorchJob", "metadata": {"name": "mnist", "labels": labels,
    ...        "annotations": owner_annotations("nightly@2026-12-03", "abc")}}
    >>> adoption_problem(job, owner_annotations("nightly@2026-12-03", "abc"), "ml") is None
    True
    >>> adoption_problem(job, owner_annotations("nightly@2026-12-03", "def"), "ml").reason
    'AlreadyExists'
"""

from __future__ import annotations

from collections.abc import Mapping

from kubedl_prefect.errors import AdoptionRefusedError
from kubedl_prefect.kube.labels import LABEL_MANAGED_BY, MANAGED_BY
from kubedl_prefect.kube.resources import KubeObject
from kubedl_prefect.spec import key_hash

LABEL_KEY_HASH = "kubedl-prefect.io/key-hash"
"""Label: the hash of the caller's key (keys may hold characters labels cannot)."""
LABEL_ATTEMPT = "kubedl-prefect.io/attempt"
"""Label: the attempt number of a job (1 for the first)."""
LABEL_RECORD = "kubedl-prefect.io/run-record"
"""Label: ``true`` on the ConfigMaps that hold run records (:mod:`.record_store`)."""
ANNOTATION_KEY = "kubedl-prefect.io/key"
"""Annotation: the caller's key, exactly."""
ANNOTATION_SPEC_HASH = "kubedl-prefect.io/spec-hash"
"""Annotation: the hash of the spec a job or record was made from."""
ANNOTATION_SPEC_NAME = "kubedl-prefect.io/spec-name"
"""Annotation (records): the spec's name."""


def owner_labels(key: str, *, attempt: int | None = None) -> dict[str, str]:
    """The labels that mark an object as ours, for ``key`` (and ``attempt`` on jobs)."""
    labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_KEY_HASH: key_hash(key)}
    if attempt is not None:
        labels[LABEL_ATTEMPT] = str(attempt)
    return labels


def owner_annotations(key: str, spec_hash: str) -> dict[str, str]:
    """The annotations that name the key and the spec an object was made for."""
    return {ANNOTATION_KEY: key, ANNOTATION_SPEC_HASH: spec_hash}


def adoption_problem(
    existing: KubeObject, wanted_annotations: Mapping[str, str], namespace: str
) -> AdoptionRefusedError | None:
    """Why ``existing`` may not be adopted for the wanted key and spec; ``None`` when it may.

    Args:
        existing: The object of the wanted name that is already on the cluster.
        wanted_annotations: :func:`owner_annotations` of the submission.
        namespace: Where it is (for the message).
    """
    name = existing["metadata"]["name"]
    labels = existing["metadata"].get("labels") or {}
    annotations = existing["metadata"].get("annotations") or {}
    if (
        labels.get(LABEL_MANAGED_BY) != MANAGED_BY
        or annotations.get(ANNOTATION_KEY) != wanted_annotations[ANNOTATION_KEY]
    ):
        return AdoptionRefusedError(
            f"{existing['kind']} {namespace}/{name} already exists and was not created "
            "by kubedl-prefect for this key",
            status=409,
            reason="AlreadyExists",
            hint="delete it, or submit with another key or spec name",
        )
    if annotations.get(ANNOTATION_SPEC_HASH) != wanted_annotations[ANNOTATION_SPEC_HASH]:
        return AdoptionRefusedError(
            f"{existing['kind']} {namespace}/{name} exists for this key but was made "
            f"from another spec (spec hash {annotations.get(ANNOTATION_SPEC_HASH)}, now "
            f"{wanted_annotations[ANNOTATION_SPEC_HASH]})",
            status=409,
            reason="AlreadyExists",
            hint="a changed spec needs a new key (or cancel the old job first)",
        )
    return None


def key_of(obj: KubeObject) -> str:
    """The caller's key an object of ours was made for (``""`` when it names none)."""
    return str((obj["metadata"].get("annotations") or {}).get(ANNOTATION_KEY, ""))


def attempt_of(obj: KubeObject) -> int:
    """The attempt a job of ours is (1 when it does not say)."""
    return int((obj["metadata"].get("labels") or {}).get(LABEL_ATTEMPT, 1))


def spec_hash_of(obj: KubeObject) -> str:
    """The spec hash an object of ours was made from (``""`` when it names none)."""
    return str((obj["metadata"].get("annotations") or {}).get(ANNOTATION_SPEC_HASH, ""))
