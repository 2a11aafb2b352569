"""Job names and the length budget that keeps pod and service names valid."""

from __future__ import annotations

import base64
import hashlib
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from spec_helpers import REPO

from kubedl_prefect.errors import SpecError
from kubedl_prefect.spec import ATTEMPT_SUFFIX_MAX_LENGTH, MAX_ATTEMPT, Role, job_name, key_hash
from kubedl_prefect.spec.naming import (
    KEY_HASH_ALPHABET,
    KEY_HASH_BITS,
    KEY_HASH_LENGTH,
    LONGEST_ATTEMPT_SUFFIX,
    is_dns1035_label,
    max_job_name_length,
    max_spec_name_length,
    replica_suffix,
)


def test_job_name_shape() -> None:
    digest = hashlib.sha256(b"flow-run-1/train").digest()
    expected_hash = base64.b32encode(digest).decode().lower()[:12]
    assert key_hash("flow-run-1/train") == expected_hash
    assert job_name("mnist", "flow-run-1/train", 3) == f"mnist-{expected_hash}-a3"


@given(st.text(max_size=40))
def test_key_hash_is_fixed_length_base32(key: str) -> None:
    digest = key_hash(key)
    assert len(digest) == KEY_HASH_LENGTH
    assert set(digest) <= set(KEY_HASH_ALPHABET)
    assert is_dns1035_label(f"j-{digest}-a1")


def test_a_million_keys_per_spec_name_collide_with_probability_below_one_in_a_million() -> None:
    # Birthday bound: n keys drawn from N hashes collide with probability
    # 1 - exp(-n (n - 1) / 2N) <= n (n - 1) / 2N.
    hashes = len(KEY_HASH_ALPHABET) ** KEY_HASH_LENGTH
    assert hashes == 2**KEY_HASH_BITS
    keys = 1_000_000
    pairs = keys * (keys - 1) / 2
    probability = -math.expm1(-pairs / hashes)
    assert probability < 1e-6
    assert probability <= pairs / hashes
    # The alphabet is exactly what the encoding can produce: 32 distinct DNS-label characters.
    assert len(set(KEY_HASH_ALPHABET)) == len(KEY_HASH_ALPHABET) == 32
    assert is_dns1035_label("a" + KEY_HASH_ALPHABET)


def test_hash_keeps_the_leading_bits_of_the_sha256() -> None:
    key = "flow-run-7/train"
    value = int.from_bytes(hashlib.sha256(key.encode()).digest(), "big") >> (256 - KEY_HASH_BITS)
    decoded = 0
    for char in key_hash(key):
        decoded = decoded * len(KEY_HASH_ALPHABET) + KEY_HASH_ALPHABET.index(char)
    assert decoded == value


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
    assert LONGEST_ATTEMPT_SUFFIX == "-xxxxxxxxxxxx-a99"
    assert len(f"-{key_hash('any')}-a{MAX_ATTEMPT}") == ATTEMPT_SUFFIX_MAX_LENGTH == 17
    replicas = [(Role.MASTER, 1), (Role.WORKER, 16)]
    assert replica_suffix(Role.WORKER, 16) == "-worker-15"
    limit = max_spec_name_length(replicas)
    longest = job_name("a" * limit, "key", MAX_ATTEMPT) + replica_suffix(Role.WORKER, 16)
    assert len(longest) == 63
    assert is_dns1035_label(longest)
    assert max_job_name_length(replicas) == 63 - len("-worker-15")


def test_the_spec_reference_states_the_budget() -> None:
    text = " ".join((REPO / "docs" / "spec.md").read_text(encoding="utf-8").split())
    ten = max_spec_name_length([(Role.MASTER, 1), (Role.WORKER, 10)])
    hundred = max_spec_name_length([(Role.MASTER, 1), (Role.WORKER, 100)])
    assert f"`63 - {ATTEMPT_SUFFIX_MAX_LENGTH} - len(" in text
    assert f"`{LONGEST_ATTEMPT_SUFFIX}`" in text
    assert f"{ten} for a master and up to 10 workers, {hundred} with 11 to 100 workers" in text
    assert f"{KEY_HASH_LENGTH} characters of lower-case base32" in text
    assert f"{KEY_HASH_BITS} bits" in text
    assert f"`{job_name('mnist', 'run-42', 1)}`" in text


@pytest.mark.parametrize(
    ("name", "ok"),
    [("a", True), ("a-1", True), ("1a", False), ("a-", False), ("A", False), ("a" * 64, False)],
)
def test_dns1035(name: str, ok: bool) -> None:
    assert is_dns1035_label(name) is ok
