"""The embodied workers implement the role protocols the EmbodiedRunner is written against."""

from __future__ import annotations

import pytest

from rlinf.core.protocols import (
    EmbodiedActorWorker,
    EmbodiedEnvWorker,
    EmbodiedPolicyEnvWorker,
    EmbodiedRolloutWorker,
    Runner,
    check_implements,
)
from rlinf.embodied.runner import EmbodiedRunner
from rlinf.embodied.workers import EmbodiedFSDPActor, EnvWorker, MultiStepRolloutWorker


@pytest.mark.parametrize(
    ("cls", "protocol"),
    [
        (EnvWorker, EmbodiedEnvWorker),
        (EnvWorker, EmbodiedPolicyEnvWorker),
        (MultiStepRolloutWorker, EmbodiedRolloutWorker),
        (EmbodiedFSDPActor, EmbodiedActorWorker),
    ],
)
def test_worker_implements_role(cls: type, protocol: type) -> None:
    check_implements(cls, protocol)


def test_swapped_roles_are_rejected() -> None:
    with pytest.raises(TypeError, match="EnvWorker does not implement EmbodiedActorWorker"):
        check_implements(EnvWorker, EmbodiedActorWorker)


def test_runner_offers_the_shared_lifecycle() -> None:
    check_implements(EmbodiedRunner, Runner)
    assert (
        EmbodiedRunner.__enter__ is not Runner.__enter__
        and EmbodiedRunner.__exit__ is not Runner.__exit__
    )
