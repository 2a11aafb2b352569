"""Names of the jobs we create, and the length budget that keeps every derived name valid.

A job submitted by the lifecycle is named ``<spec name>-<key hash>-a<attempt>``
(:func:`job_name`): deterministic, so a retried submission finds the job it already created,
and distinct per attempt. The operators then name pods and services
``<job>-<role>-<index>`` (``mnist-1a2b3c-a1-worker-15``), which must still be a DNS-1035 label of
at most 63 characters: :func:`max_spec_name_length` is the budget left for the spec's own name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Final

from kubedl_prefect.errors import SpecError, SpecIssue
from kubedl_prefect.spec.types import Role

DNS1035_MAX: Final = 63
"""Maximum length of a DNS-1035 label (pod, service and job names)."""

DNS1035_PATTERN: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
"""A DNS-1035 label: lower-case letters, digits and ``-``; starts with a letter."""

KEY_HASH_LENGTH: Final = 6
"""Hex characters of the key's SHA-256 in a job name."""

MAX_ATTEMPT: Final = 99
"""Highest attempt number a job name can carry."""

ATTEMPT_SUFFIX_MAX_LENGTH: Final = len(f"-{'0' * KEY_HASH_LENGTH}-a{MAX_ATTEMPT}")
"""Longest suffix :func:`job_name` appends to a spec's name (``-1a2b3c-a99``: 11 characters)."""


def is_dns1035_label(name: str) -> bool:
    """Whether ``name`` is a DNS-1035 label of at most 63 characters."""
    return len(name) <= DNS1035_MAX and DNS1035_PATTERN.match(name) is not None


def key_hash(key: str) -> str:
    """The first 6 lower-case hex characters of the SHA-256 of ``key``."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:KEY_HASH_LENGTH]


def job_name(spec_name: str, key: str, attempt: int) -> str:
    """The cluster name of one attempt of a job: ``f"{spec_name}-{key_hash(key)}-a{attempt}"``.

    Args:
        spec_name: The spec's ``name`` (already validated).
        key: The caller's idempotency key (e.g. a flow-run id and task name); only its hash is used.
        attempt: 1 for the first submission, up to :data:`MAX_ATTEMPT`.

    Raises:
        SpecError: If ``attempt`` is out of range.

    Example:
        >>> job_name("mnist", "run-42", 1)
        'mnist-92234f-a1'
    """
    if not 1 <= attempt <= MAX_ATTEMPT:
        raise SpecError(
            [
                SpecIssue(
                    "attempt",
                    f"attempt {attempt} is out of range",
                    f"use an attempt number from 1 to {MAX_ATTEMPT}",
                )
            ]
        )
    return f"{spec_name}-{key_hash(key)}-a{attempt}"


def replica_suffix(role: Role, replicas: int) -> str:
    """The longest suffix the operators add for ``replicas`` pods of ``role``: ``-worker-15``."""
    return f"-{role.replica_type.lower()}-{max(replicas, 1) - 1}"


def max_replica_suffix_length(replicas: Iterable[tuple[Role, int]]) -> int:
    """Length of the longest pod/service suffix over ``(role, replica count)`` pairs."""
    return max((len(replica_suffix(role, count)) for role, count in replicas), default=0)


def max_spec_name_length(replicas: Iterable[tuple[Role, int]]) -> int:
    """The longest spec name whose job, pod and service names all stay within 63 characters.

    Reserves :data:`ATTEMPT_SUFFIX_MAX_LENGTH` for :func:`job_name` and the longest
    ``-<role>-<index>`` suffix the operators add for these replicas.
    """
    return DNS1035_MAX - ATTEMPT_SUFFIX_MAX_LENGTH - max_replica_suffix_length(replicas)


def max_job_name_length(replicas: Iterable[tuple[Role, int]]) -> int:
    """The longest cluster job name whose pod and service names stay within 63 characters."""
    return DNS1035_MAX - max_replica_suffix_length(replicas)
