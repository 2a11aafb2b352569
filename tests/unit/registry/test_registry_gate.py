from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubedl_prefect.errors import RegistryError
from kubedl_prefect.registry.gate import (
    TAG_DECISION,
    GateDecision,
    GatePolicy,
    NoChampion,
    judge,
)


def test_a_better_candidate_is_promoted_with_the_margin_in_the_reason() -> None:
    verdict = judge(GatePolicy("accuracy"), candidate=0.93, champion=0.90)
    assert verdict.promote
    assert verdict.improvement == pytest.approx(0.03)
    assert verdict.reason == "accuracy 0.93 improves on the champion (0.9) by 0.03"


def test_a_worse_or_equal_candidate_is_not_promoted() -> None:
    worse = judge(GatePolicy("accuracy"), candidate=0.85, champion=0.90)
    equal = judge(GatePolicy("accuracy"), candidate=0.90, champion=0.90)
    assert not worse.promote
    assert worse.reason == "accuracy 0.85 is worse than the champion's (0.9)"
    assert not equal.promote
    assert equal.reason == "accuracy 0.9 equals the champion's (0.9)"


def test_lower_is_better_for_losses() -> None:
    policy = GatePolicy("loss", higher_is_better=False)
    assert judge(policy, candidate=0.2, champion=0.3).promote
    assert not judge(policy, candidate=0.4, champion=0.3).promote


def test_the_minimum_improvement_is_required() -> None:
    policy = GatePolicy("accuracy", min_improvement=0.01)
    small = judge(policy, candidate=0.905, champion=0.90)
    assert not small.promote
    assert "less than the 0.01 required" in small.reason
    assert judge(policy, candidate=0.92, champion=0.90).promote


def test_without_a_champion_the_policy_decides() -> None:
    assert judge(GatePolicy("acc"), candidate=0.1, champion=None).promote
    refused = judge(GatePolicy("acc", no_champion=NoChampion.REJECT), candidate=0.1, champion=None)
    assert not refused.promote
    assert "promotes none by itself" in refused.reason


def test_a_candidate_that_is_not_a_number_is_never_promoted() -> None:
    assert not judge(GatePolicy("acc"), candidate=math.nan, champion=0.5).promote
    assert not judge(GatePolicy("acc"), candidate=math.nan, champion=None).promote


def test_bad_policies_are_refused() -> None:
    with pytest.raises(RegistryError, match="needs a metric"):
        GatePolicy("")
    with pytest.raises(RegistryError, match="min_improvement"):
        GatePolicy("acc", min_improvement=-1)


finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)


@given(candidate=finite, champion=finite, margin=st.floats(0, 10), higher=st.booleans())
def test_promotion_is_exactly_a_large_enough_strict_improvement(
    candidate: float, champion: float, margin: float, higher: bool
) -> None:
    policy = GatePolicy("m", higher_is_better=higher, min_improvement=margin)
    gain = candidate - champion if higher else champion - candidate
    assert judge(policy, candidate=candidate, champion=champion).promote == (
        gain > 0 and gain >= margin
    )


def test_decisions_round_trip_through_tags() -> None:
    promoted = GateDecision("fraud", "champion", "4", "3", "auc", 0.91, 0.88, True, "better")
    first = GateDecision("fraud", "champion", "1", None, "auc", 0.7, None, True, "first")
    for decision in (promoted, first):
        assert (
            GateDecision.from_tags(decision.model_name, decision.candidate_version, decision.tags())
            == decision
        )
    assert promoted.tags()[TAG_DECISION] == "promoted"
    assert GateDecision.from_tags("fraud", "4", {}) is None
    assert GateDecision.from_tags("fraud", "4", {TAG_DECISION: "maybe"}) is None
