"""Names of the jobs we create, and the length budget that keeps every derived name valid.

A job submitted by the lifecycle is named ``<spec name>-<key hash>-a<attempt>``
(:func:`job_name`): deterministic, so a retried submission finds the job it already created,
and distinct per attempt. The operators then name pods and services
``<job>-<role>-<index>`` (``mnist-siru7c5qacsk-a1-worker-15``), which must still be a DNS-1035
label of at most 63 characters: :func:`max_spec_name_length` is the budget left for the spec's own
name.

The key hash is 12 characters of lower-case base32 (``a-z``, ``2-7``): 60 bits, so that even a
million keys under one spec name collide with a probability below one in a million (birthday
bound ``n**2 / 2**61``, about 4e-7), in 3 characters fewer than hex would need.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections.abc import Iterable
from typing import Final

from kubedl_prefect.errors import SpecError, SpecIssue
from kubedl_prefect.spec.types import Role

DNS1035_MAX: Final = 63
"""Maximum length of a DNS-1035 label (pod, service and job names)."""

DNS1035_PATTERN: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?\Z")
"""A DNS-1035 label: lower-case letters, digits and ``-``; starts with a letter."""

KEY_HASH_ALPHABET: Final = "abcdefghijklmnopqrstuvwxyz234567"
"""The characters of a key hash: RFC 4648 base32, lower-cased (valid in DNS labels)."""

KEY_HASH_LENGTH: Final = 12
"""Base32 characters of the key's SHA-256 in a job name."""

KEY_HASH_BITS: Final = KEY_HASH_LENGTH * int(math.log2(len(KEY_HASH_ALPHABET)))
"""Bits of the key's SHA-256 a job name keeps: 60."""

MAX_ATTEMPT: Final = 99
"""Highest attempt number a job name can carry."""

LONGEST_ATTEMPT_SUFFIX: Final = f"-{'x' * KEY_HASH_LENGTH}-a{MAX_ATTEMPT}"
"""The shape of the longest suffix :func:`job_name` appends: ``-xxxxxxxxxxxx-a99``."""

ATTEMPT_SUFFIX_MAX_LENGTH: Final = len(LONGEST_ATTEMPT_SUFFIX)
"""Length of the longest suffix :func:`job_name` appends to a spec's name: 17 characters."""


def is_dns1035_label(name: str) -> bool:
    """Whether ``name`` is a DNS-1035 label of at most 63 characters."""
    return len(name) <= DNS1035_MAX and DNS1035_PATTERN.match(name) is not None


def key_hash(key: str) -> str:
    """The first 12 characters of the lower-case base32 SHA-256 of ``key`` (60 bits).

    Example:
        >>> key_hash("run-42")
        'siru7c5qacsk'
    """
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return base64.b32encode(digest).decode("ascii").lower()[:KEY_HASH_LENGTH]


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
        'mnist-siru7c5qacsk-a1'
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
