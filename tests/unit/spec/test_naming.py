"""Job names and the length budget that keeps pod and service names valid."""

from __future__ import annotations

import hashlib

import pytest

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import ATTEMPT_SUFFIX_MAX_LENGTH, MAX_ATTEMPT, Role, job_name, key_hash
from kubedl_prefect.spec.naming import (
    is_dns1035_label,
    max_job_name_length,
    max_spec_name_length,
    replica_suffix,
)


def test_job_name_shape() -> None:
    expected_hash = hashlib.sha256(b"flow-run-1/train").hexdigest()[:6]
    assert key_hash("flow-run-1/train") == expected_hash
    assert job_name("mnist", "flow-run-1/train", 3) == f"mnist-{expected_hash}-a3"


def test_job_name_is_deterministic_and_key_sensitive() -> None:
    assert job_name("m", "k", 1) == job_name("m", "k", 1)
    assert job_name("m", "k", 1) != job_name("m", "k2", 1)
    assert job_name("m", "k", 1) != job_name("m", "k", 2)


@pytest.mark.parametrize("attempt", [0, MAX_ATTEMPT + 1, -5])
def test_attempt_out_of_range(attempt: int) -> None:
    with pytest.raises(SpecError) as info:
        job_name("m", "k", attempt)
    assert info.value.issues[0].path == "attempt"


def test_suffix_budget_is_exact() -> None:
    assert len("-abcdef-a99") == ATTEMPT_SUFFIX_MAX_LENGTH
    replicas = [(Role.MASTER, 1), (Role.WORKER, 16)]
    assert replica_suffix(Role.WORKER, 16) == "-worker-15"
    limit = max_spec_name_length(replicas)
    longest = job_name("a" * limit, "key", MAX_ATTEMPT) + replica_suffix(Role.WORKER, 16)
    assert len(longest) == 63
    assert is_dns1035_label(longest)
    assert max_job_name_length(replicas) == 63 - len("-worker-15")


@pytest.mark.parametrize(
    ("name", "ok"),
    [("a", True), ("a-1", True), ("1a", False), ("a-", False), ("A", False), ("a" * 64, False)],
)
def test_dns1035(name: str, ok: bool) -> None:
    assert is_dns1035_label(name) is ok
