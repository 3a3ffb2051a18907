"""The reasoning workers implement the role protocols the ReasoningRunner is written against."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from rlinf.core.protocols import (
    ReasoningActorWorker,
    ReasoningRewardWorker,
    ReasoningRolloutWorker,
    Runner,
    check_implements,
)
from rlinf.reasoning.runner import ReasoningRunner
from rlinf.reasoning.workers import FSDPActor, RewardWorker, RolloutWorker


@pytest.mark.parametrize(
    ("cls", "protocol"),
    [
        (FSDPActor, ReasoningActorWorker),
        (RolloutWorker, ReasoningRolloutWorker),
        (RewardWorker, ReasoningRewardWorker),
    ],
)
def test_worker_implements_role(cls: type, protocol: type) -> None:
    check_implements(cls, protocol)


def test_custom_reward_subclass_conforms() -> None:
    """The documented way to add a reward: subclass RewardWorker and override score."""

    class LengthPenaltyReward(RewardWorker):
        def score(
            self, responses: Sequence[str], references: Sequence[Sequence[str]]
        ) -> list[float]:
            return [-len(r) / 100 for r in responses]

    check_implements(LengthPenaltyReward, ReasoningRewardWorker)


def test_custom_reward_that_breaks_the_contract_fails_at_launch() -> None:
    """launch_reasoning_groups checks reward_cls before placing anything."""
    from rlinf.reasoning.runner import launch_reasoning_groups

    class WrongEvaluate(RewardWorker):
        def evaluate(self):  # type: ignore[no-untyped-def, override]  # drops the results
            return []

    with pytest.raises(
        TypeError, match=r"WrongEvaluate does not implement ReasoningRewardWorker.*evaluate"
    ):
        launch_reasoning_groups(cfg=None, cluster=None, reward_cls=WrongEvaluate)  # type: ignore[arg-type]


def test_runner_offers_the_shared_lifecycle() -> None:
    check_implements(ReasoningRunner, Runner)
    assert (
        ReasoningRunner.__enter__ is not Runner.__enter__
        and ReasoningRunner.__exit__ is not Runner.__exit__
    )
