"""A stable fingerprint of a spec, to tell whether an existing job was made from it."""

from __future__ import annotations

import hashlib
import json

from kubedl_prefect.spec.model import TrainingJobSpec


def spec_hash(spec: TrainingJobSpec) -> str:
    """The SHA-256 (hex) of the spec's canonical JSON.

    Canonical: camelCase keys sorted, no whitespace, fields that are unset (``None``) left out,
    so adding an optional field to the model in a later version does not change the hash of
    specs that do not use it. Two specs that are equal as models have equal hashes.

    Example:
        >>> from kubedl_prefect.spec import parse_spec
        >>> a = parse_spec({"name": "m", "image": "i", "replicas": {"master": 1}})
        >>> b = parse_spec({"name": "m", "image": "i", "replicas": {"master": {"count": 1}}})
        >>> spec_hash(a) == spec_hash(b)
        True
    """
    data = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
