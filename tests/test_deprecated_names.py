"""Old spellings keep working, with a DeprecationWarning that names the new one.

One name each: ``algorithm.update_epoch`` (epoch count), ``update_rollout_weights``
(weight push, both runners), ``close`` (lifecycle of runners, ``Cluster`` and
``WorkerGroup``).
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from rlinf.reasoning.config import AlgorithmConfig
from rlinf.reasoning.runner import ReasoningRunner
from rlinf.sched import Cluster, WorkerGroup


class _Recorder:
    """Stands in for ``self``: records which method the deprecated alias called."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> str:
            self.calls.append((name, args, kwargs))
            return f"{name} result"

        return record


def test_update_epochs_is_read_as_update_epoch() -> None:
    with pytest.warns(DeprecationWarning, match=r"algorithm\.update_epochs.*update_epoch"):
        alg = AlgorithmConfig(update_epochs=3)
    assert alg.update_epoch == 3


def test_update_epoch_does_not_warn() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert AlgorithmConfig(update_epoch=2).update_epoch == 2


def test_setting_both_epoch_keys_is_refused() -> None:
    with pytest.raises(ValidationError, match="set only update_epoch"):
        AlgorithmConfig(update_epochs=3, update_epoch=2)


def test_sync_weights_pushes_through_update_rollout_weights() -> None:
    runner = _Recorder()
    with pytest.warns(DeprecationWarning, match="use update_rollout_weights"):
        out = ReasoningRunner.sync_weights(runner, 7)  # type: ignore[arg-type]
    assert out == "update_rollout_weights result"
    assert runner.calls == [("update_rollout_weights", (7,), {})]


@pytest.mark.parametrize("groups", [True, False])
def test_reasoning_runner_shutdown_closes(groups: bool) -> None:
    runner = _Recorder()
    with pytest.warns(DeprecationWarning, match=r"use close\(groups=True\)"):
        ReasoningRunner.shutdown(runner, groups=groups)  # type: ignore[arg-type]
    assert runner.calls == [("close", (), {"groups": groups})]


def test_reasoning_runner_shutdown_closes_the_groups_by_default() -> None:
    runner = _Recorder()
    with pytest.warns(DeprecationWarning):
        ReasoningRunner.shutdown(runner)  # type: ignore[arg-type]
    assert runner.calls == [("close", (), {"groups": True})]


def test_cluster_shutdown_closes() -> None:
    cluster = _Recorder()
    with pytest.warns(DeprecationWarning, match="use Cluster.close"):
        Cluster.shutdown(cluster)  # type: ignore[arg-type]
    assert cluster.calls == [("close", (), {})]


def test_worker_group_shutdown_closes() -> None:
    group = _Recorder()
    with pytest.warns(DeprecationWarning, match="use WorkerGroup.close"):
        WorkerGroup.shutdown(group, 3.0)  # type: ignore[arg-type]
    assert group.calls == [("close", (3.0,), {})]
