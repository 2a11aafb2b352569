"""The evaluation gate: is a candidate version better than the champion? Pure.

A :class:`GatePolicy` names the metric, its direction, the smallest improvement worth a
promotion, the alias that marks the champion, and what to do when there is no champion yet.
:func:`judge` compares two values under it; the registry
(:meth:`~kubedl_prefect.registry.ModelRegistry.evaluate`) reads the values, moves the alias only
when the verdict says so, and records the :class:`GateDecision` on the candidate as tags, so the
decision and both values stay readable in the MLflow UI and a retried gate finds its own decision
instead of comparing the new champion with itself.

Example:
    >>> policy = GatePolicy(metric="accuracy", min_improvement=0.01)
    >>> judge(policy, candidate=0.93, champion=0.90).promote
    True
    >>> judge(policy, candidate=0.905, champion=0.90).reason
    'accuracy 0.905 improves on the champion (0.9) by 0.005, less than the 0.01 required'
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from kubedl_prefect.errors import RegistryError
from kubedl_prefect.registry.lineage import TAG_PREFIX

DEFAULT_ALIAS: Final = "champion"
"""The alias that marks the version being served."""

TAG_DECISION: Final = f"{TAG_PREFIX}gate.decision"
TAG_METRIC: Final = f"{TAG_PREFIX}gate.metric"
TAG_CANDIDATE_VALUE: Final = f"{TAG_PREFIX}gate.candidate-value"
TAG_CHAMPION_VALUE: Final = f"{TAG_PREFIX}gate.champion-value"
TAG_CHAMPION_VERSION: Final = f"{TAG_PREFIX}gate.champion-version"
TAG_ALIAS: Final = f"{TAG_PREFIX}gate.alias"
TAG_REASON: Final = f"{TAG_PREFIX}gate.reason"
TAG_ROLLED_BACK: Final = f"{TAG_PREFIX}gate.rolled-back"


class NoChampion(StrEnum):
    """What the gate does when no version holds the alias yet."""

    PROMOTE = "promote"
    """The first candidate becomes the champion."""
    REJECT = "reject"
    """Nothing is promoted until someone sets the alias by hand."""


@dataclass(frozen=True)
class GatePolicy:
    """How a candidate must compare with the champion to replace it.

    Args:
        metric: The metric compared (a run metric; its latest value).
        higher_is_better: ``True`` for accuracy-like metrics, ``False`` for losses and errors.
        min_improvement: The least improvement (in the metric's units) that promotes.
        alias: The alias that marks the champion.
        no_champion: What to do when no version holds the alias.
    """

    metric: str
    higher_is_better: bool = True
    min_improvement: float = 0.0
    alias: str = DEFAULT_ALIAS
    no_champion: NoChampion = NoChampion.PROMOTE

    def __post_init__(self) -> None:
        if not self.metric:
            raise RegistryError("the gate needs a metric", hint="GatePolicy(metric='accuracy')")
        if not math.isfinite(self.min_improvement) or self.min_improvement < 0:
            raise RegistryError(
                f"min_improvement must be a finite number >= 0, not {self.min_improvement}",
                hint="give the improvement in the metric's units; the direction is "
                "higher_is_better",
            )


@dataclass(frozen=True)
class Verdict:
    """The outcome of comparing a candidate with the champion.

    Attributes:
        promote: Whether the candidate replaces the champion.
        reason: Why, in one line.
        improvement: How much better the candidate is (negative: worse), when both are known.
    """

    promote: bool
    reason: str
    improvement: float | None = None


def judge(policy: GatePolicy, *, candidate: float, champion: float | None) -> Verdict:
    """Compare ``candidate`` with ``champion`` (``None``: there is no champion) under ``policy``.

    Example:
        >>> judge(GatePolicy("loss", higher_is_better=False), candidate=0.2, champion=0.3).promote
        True
        >>> judge(GatePolicy("loss", no_champion=NoChampion.REJECT), candidate=0.2,
        ...       champion=None).reason
        'no version holds the alias champion, and the policy promotes none by itself'
    """
    metric = policy.metric
    if not math.isfinite(candidate):
        return Verdict(False, f"the candidate's {metric} is {candidate}, not a number to compare")
    if champion is None:
        if policy.no_champion is NoChampion.PROMOTE:
            return Verdict(
                True, f"no version holds the alias {policy.alias}: the first is promoted"
            )
        return Verdict(
            False,
            f"no version holds the alias {policy.alias}, and the policy promotes none by itself",
        )
    improvement = candidate - champion if policy.higher_is_better else champion - candidate
    shown = f"{metric} {candidate:g}"
    if improvement <= 0:
        worse = "equals" if improvement == 0 else "is worse than"
        return Verdict(False, f"{shown} {worse} the champion's ({champion:g})", improvement)
    if improvement < policy.min_improvement:
        return Verdict(
            False,
            f"{shown} improves on the champion ({champion:g}) by {improvement:g}, less than the "
            f"{policy.min_improvement:g} required",
            improvement,
        )
    return Verdict(
        True, f"{shown} improves on the champion ({champion:g}) by {improvement:g}", improvement
    )


@dataclass(frozen=True)
class GateDecision:
    """What the gate decided for one candidate, with both values: recorded on it as tags.

    Args:
        model_name: The registered model.
        alias: The champion alias.
        candidate_version: The version judged.
        champion_version: The version that held the alias before (``None``: none did).
        metric: The metric compared.
        candidate_value: The candidate's value.
        champion_value: The champion's value (``None`` without a champion).
        promoted: Whether the alias was moved to the candidate.
        reason: Why, in one line.
    """

    model_name: str
    alias: str
    candidate_version: str
    champion_version: str | None
    metric: str
    candidate_value: float
    champion_value: float | None
    promoted: bool
    reason: str

    @property
    def model_uri(self) -> str:
        """``models:/name/<candidate version>``."""
        return f"models:/{self.model_name}/{self.candidate_version}"

    def tags(self) -> dict[str, str]:
        """The tags recording the decision on the candidate version."""
        tags = {
            TAG_DECISION: "promoted" if self.promoted else "rejected",
            TAG_ALIAS: self.alias,
            TAG_METRIC: self.metric,
            TAG_CANDIDATE_VALUE: repr(self.candidate_value),
            TAG_REASON: self.reason[:5000],
        }
        if self.champion_version is not None:
            tags[TAG_CHAMPION_VERSION] = self.champion_version
        if self.champion_value is not None:
            tags[TAG_CHAMPION_VALUE] = repr(self.champion_value)
        return tags

    @classmethod
    def from_tags(
        cls, model_name: str, version: str, tags: Mapping[str, str]
    ) -> GateDecision | None:
        """The decision recorded on a version by :meth:`tags`, or ``None`` if there is none.

        Example:
            >>> d = GateDecision("m", "champion", "3", "2", "acc", 0.9, 0.8, True, "better")
            >>> GateDecision.from_tags("m", "3", d.tags()) == d
            True
        """
        decision = tags.get(TAG_DECISION)
        if decision not in ("promoted", "rejected"):
            return None
        try:
            champion_value = tags.get(TAG_CHAMPION_VALUE)
            return cls(
                model_name=model_name,
                alias=tags.get(TAG_ALIAS, DEFAULT_ALIAS),
                candidate_version=version,
                champion_version=tags.get(TAG_CHAMPION_VERSION),
                metric=tags.get(TAG_METRIC, ""),
                candidate_value=float(tags.get(TAG_CANDIDATE_VALUE, "nan")),
                champion_value=float(champion_value) if champion_value is not None else None,
                promoted=decision == "promoted",
                reason=tags.get(TAG_REASON, ""),
            )
        except ValueError:
            return None
