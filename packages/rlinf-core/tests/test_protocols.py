"""check_implements: a worker class is checked against a role protocol by method and parameter."""

from __future__ import annotations

from typing import Any

import pytest

from rlinf.core.protocols import (
    CheckpointableWorker,
    ReasoningActorWorker,
    ReasoningRewardWorker,
    check_implements,
)


class GoodReward:
    def init_worker(self) -> dict[str, Any]:
        return {}

    def compute_rewards(self, inputs: Any, outputs: Any, extra: int = 0) -> dict[str, Any]:
        return {}

    def evaluate(self, results: list[Any]) -> list[Any]:
        return []


class RenamedArgReward(GoodReward):
    def compute_rewards(self, src: Any, dst: Any) -> dict[str, Any]:  # type: ignore[override]
        return {}


class ExtraRequiredArgReward(GoodReward):
    def evaluate(self, results: list[Any], strict: bool) -> list[Any]:  # type: ignore[override]
        return []


class VarArgsReward(GoodReward):
    def compute_rewards(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}


class StaticAndClassReward(GoodReward):
    @staticmethod
    def init_worker() -> dict[str, Any]:  # type: ignore[override]
        return {}

    @classmethod
    def evaluate(cls, results: list[Any]) -> list[Any]:  # type: ignore[override]
        return []


class KeywordOnlyReward(GoodReward):
    def evaluate(self, *, results: list[Any]) -> list[Any]:  # type: ignore[override]
        return []


class PropertyReward(GoodReward):
    @property
    def init_worker(self) -> dict[str, Any]:  # type: ignore[override]
        return {}


def test_conforming_classes_pass() -> None:
    """Runners call positionally: names may differ, *args and static/class methods are fine."""
    for cls in (GoodReward, VarArgsReward, RenamedArgReward, StaticAndClassReward):
        check_implements(cls, ReasoningRewardWorker)


def test_missing_method_is_named() -> None:
    class NoEvaluate:
        def init_worker(self) -> dict[str, Any]:
            return {}

        def compute_rewards(self, inputs: Any, outputs: Any) -> dict[str, Any]:
            return {}

    with pytest.raises(TypeError, match=r"NoEvaluate does not implement ReasoningRewardWorker"):
        check_implements(NoEvaluate, ReasoningRewardWorker)
    with pytest.raises(TypeError, match=r"missing method evaluate\(self, results"):
        check_implements(NoEvaluate, ReasoningRewardWorker)


def test_extra_required_parameter_is_named() -> None:
    with pytest.raises(TypeError, match=r"evaluate\(self, results.*strict.*missing a required"):
        check_implements(ExtraRequiredArgReward, ReasoningRewardWorker)


def test_keyword_only_parameter_is_rejected() -> None:
    with pytest.raises(TypeError, match=r"evaluate\(self, \*, results.*cannot be called"):
        check_implements(KeywordOnlyReward, ReasoningRewardWorker)


def test_property_is_not_a_method() -> None:
    with pytest.raises(TypeError, match=r"init_worker is a property, not a method"):
        check_implements(PropertyReward, ReasoningRewardWorker)


def test_inherited_protocol_methods_are_checked() -> None:
    """ReasoningActorWorker includes offload/onload and save/load_checkpoint from its bases."""

    class ActorWithoutCheckpoints:
        def init_worker(self, total_steps: int) -> dict[str, Any]:
            return {}

        def sync_model_to_rollout(
            self, rollout_group: str, rollout_world_size: int, version: int
        ) -> dict[str, Any]:
            return {}

        def run_training(self, channel: Any, step: int) -> dict[str, Any]:
            return {}

        def offload(self) -> None: ...

        def onload(self) -> None: ...

    with pytest.raises(TypeError) as info:
        check_implements(ActorWithoutCheckpoints, ReasoningActorWorker)
    assert "missing method save_checkpoint" in str(info.value)
    assert "missing method load_checkpoint" in str(info.value)
    assert "offload" not in str(info.value)


def test_runtime_checkable_isinstance_still_works() -> None:
    class Saver:
        def save_checkpoint(self, path: str, step: int) -> None: ...

        def load_checkpoint(self, path: str) -> int:
            return 0

    assert isinstance(Saver(), CheckpointableWorker)
    assert not isinstance(GoodReward(), CheckpointableWorker)
