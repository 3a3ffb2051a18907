"""Asynchronous GRPO (``algorithm.max_staleness`` > 0) with real Ray workers.

One module-wide cluster (2 CPU slots: actor on slot 0, rollout and reward on
slot 1) and a tiny untrained model (:func:`make_smoke_task`):

* an async run of a few steps logs the staleness and throughput metrics,
  evaluates, checkpoints, and trains every requested prompt exactly once;
* with a rollout that loads each weight sync late (a slow transfer) and holds
  some groups back (as reordering ranks would; the test hooks below), the
  late loads make no group too old (the runner requests new prompts only
  once the weights are loaded) and the held-back groups, older than
  ``max_staleness`` versions when they reach the actor, are dropped and
  counted, never trained on, and generated again and trained;
* a resume from a checkpoint of the async run continues at its step and
  requests the prompts that were in flight at the save again;
* the configuration errors name their keys.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from rlinf.core.config import ConfigError, validate_config
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.data.sampler import ResumableSampler
from rlinf.reasoning.runner import ReasoningRunner, launch_reasoning_groups
from rlinf.reasoning.toy_task import make_smoke_task
from rlinf.reasoning.workers import RolloutWorker
from rlinf.sched import Cluster, WorkerGroup

pytestmark = pytest.mark.timeout(900)

BATCH = 4
PROMPTS = 40
K = 1
PLACEMENT = {"actor": 0, "rollout": 1, "reward": 1}


class LaggingRollout(RolloutWorker):
    """A rollout with two test hooks: late weight loads and held-back groups.

    * Weight syncs (after the first) start ``lag_s`` late, as with a slow
      weight transfer; generation goes on meanwhile with the older weights.
      The runner requests new prompts only once a sync is loaded, so this
      alone makes no group too old.
    * With ``hold_step`` >= 0 the groups of that step's first chunk are held
      back and put out only after a chunk of step ``hold_step + 2`` or later,
      as when several rollout ranks reorder groups: the actor meets them at
      step ``hold_step + 2`` or later, more than ``max_staleness`` = 1
      versions after the weights that generated them.
    """

    lag_s = 0.0
    hold_step = -1
    num_held = 0

    def set_lag(self, seconds: float, hold_step: int = -1) -> None:
        """Sets the delay of every later sync and the step whose first chunk is held."""
        self.lag_s = seconds
        self.hold_step = hold_step
        self.num_held = 0
        self._held: list[Any] = []

    def held_groups(self) -> int:
        """How many groups were held back."""
        return self.num_held

    def sync_model_from_actor(self, actor_group: str) -> dict[str, Any]:
        """Waits ``lag_s``, then receives and loads the sync."""
        if self.num_syncs > 0:
            time.sleep(self.lag_s)
        return super().sync_model_from_actor(actor_group)

    def _generate(self, requests: list[Any], sampling: Any, seed: int | None) -> list[Any]:
        out: list[Any] = super()._generate(requests, sampling, seed)
        h = self.hold_step
        if h < 0:
            return out
        if self.num_held == 0 and any(r.step == h for r in out):
            self._held = [r for r in out if r.step == h]
            self.num_held = len(self._held)
            return [r for r in out if r.step != h]
        if self._held and any(r.step >= h + 2 for r in out):
            out, self._held = out + self._held, []
        return out


def _config(toy: Path, logs: Path, name: str, **runner: Any) -> dict[str, Any]:
    return {
        "cluster": {"cpu_slots_per_node": 2, "component_placement": PLACEMENT},
        "runner": {
            "max_steps": 4,
            "max_epochs": 100,
            "val_check_interval": -1,
            "val_before_train": False,
            "save_interval": -1,
            "step_timeout_s": 300,
            "channel_timeout_s": 120,
            "logger": {
                "log_path": str(logs),
                "experiment_name": name,
                "logger_backends": ["tensorboard"],
            },
            **runner,
        },
        "data": {
            "train_files": [str(toy / "train.jsonl")],
            "val_files": [str(toy / "train.jsonl")],
            "prompt_key": "problem",
            "answer_key": "answer",
            "max_prompt_length": 16,
            "seed": 5,
        },
        "algorithm": {
            "group_size": 4,
            "rollout_batch_size": BATCH,
            "n_minibatches": 2,  # the second minibatch needs proximal logprobs
            "max_staleness": K,
            "sampling_params": {"temperature": 1.0, "max_new_tokens": 4},
        },
        "rollout": {"groups_per_chunk": 2},
        "actor": {"model_path": str(toy / "model"), "micro_batch_size": 8},
        "reward": {"num_workers": 1},
    }


def _cfg(toy: Path, logs: Path, name: str, **runner: Any) -> ReasoningConfig:
    return validate_config(_config(toy, logs, name, **runner), ReasoningConfig)


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_smoke_task(tmp_path_factory.mktemp("toy"), num_prompts=PROMPTS)


@pytest.fixture(scope="module")
def groups(toy: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerGroup]]:
    assert not ray.is_initialized()
    cfg = _cfg(toy, tmp_path_factory.mktemp("launch"), "launch")
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 2}, num_cpus=2) as cluster:
        _, actor, rollout, reward = launch_reasoning_groups(
            cfg, cluster, "async-", timeout=300, rollout_cls=LaggingRollout
        )
        try:
            yield [actor, rollout, reward]
        finally:
            for group in (actor, rollout, reward):
                group.close()


def _run(
    cfg: ReasoningConfig, groups: list[WorkerGroup], lag_s: float = 0.0, hold_step: int = -1
) -> ReasoningRunner:
    actor, rollout, reward = groups
    rollout.set_lag(lag_s, hold_step).wait()
    runner = ReasoningRunner(cfg, actor, rollout, reward)
    try:
        runner.init_workers()
        runner.run()
    finally:
        runner.close()
    return runner


def _issued(cfg: ReasoningConfig, first: int, steps: int) -> Counter[int]:
    """The prompts of steps ``first .. first + steps - 1`` in the seeded sampler order."""
    order = iter(ResumableSampler(PROMPTS, shuffle=cfg.data.shuffle, seed=cfg.data.seed))
    prompts = [next(order) for _ in range((first + steps) * BATCH)]
    return Counter(prompts[first * BATCH :])


@pytest.fixture(scope="module")
def async_run(
    toy: Path, groups: list[WorkerGroup], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    logs = tmp_path_factory.mktemp("logs")
    cfg = _cfg(toy, logs, "async", val_check_interval=2, val_max_prompts=8, save_interval=2)
    runner = _run(cfg, groups)
    return {"cfg": cfg, "runner": runner, "logs": logs}


def test_async_run_logs_staleness_and_trains_each_prompt_once(async_run: dict[str, Any]) -> None:
    runner: ReasoningRunner = async_run["runner"]
    cfg: ReasoningConfig = async_run["cfg"]
    history = runner.metrics_history
    assert [int(m["step"]) for m in history] == [1, 2, 3, 4]
    for m in history:
        for key in (
            "rollout/staleness_mean",
            "rollout/staleness_max",
            "rollout/dropped_stale_groups",
            "train/samples_per_s",
            "train/tokens_per_s",
            "actor/is_weight_mean",  # truncated IS is on by default in async mode
        ):
            assert key in m, key
        hist = [m[f"rollout/staleness_hist_{s}"] for s in range(K + 1)]
        assert sum(hist) == BATCH  # every trained group has a staleness within 0..K
        assert m["rollout/staleness_max"] <= K
        assert m["train/samples_per_s"] > 0
    assert "eval/accuracy" in history[1] and "eval/accuracy" in history[3]
    # Steps after the first train on groups requested ahead of them (staleness > 0).
    assert sum(m["rollout/staleness_hist_1"] for m in history) > 0
    # Their proximal logprobs came from the rollout, scored right after each load.
    assert cfg.scores_proximal_on_rollout
    assert sum(m["actor/proximal_from_rollout"] for m in history[1:]) > 0
    trained = Counter(i for step in runner.data_history for i in step)
    assert trained == _issued(cfg, 0, 4)
    checkpoints = runner.checkpoint_root
    assert (checkpoints / "global_step_2").is_dir() and (checkpoints / "global_step_4").is_dir()


def test_stale_groups_are_dropped_counted_and_regenerated(
    toy: Path, groups: list[WorkerGroup], tmp_path: Path
) -> None:
    """Held-back groups are dropped (exactly those); late weight loads drop nothing.

    Each sync loads 1 s late. The runner requests the next batch only once the
    step's weights are loaded, so no group is generated with weights more than
    ``max_staleness`` versions older than the step that trains it: before
    that rule, the rollout took the newly requested prompts before the late
    load and the actor dropped a whole batch per step. The only drops are the
    groups the rollout held back (step 1's first chunk, put out after step 3's).
    """
    cfg = _cfg(toy, tmp_path, "lagging", max_steps=5)
    runner = _run(cfg, groups, lag_s=1.0, hold_step=1)
    held = groups[1].held_groups().wait()[0]
    history = runner.metrics_history
    assert len(history) == 5
    for step, m in enumerate(history):
        # the actor (version = step) trained only on versions step-K .. step
        assert m["rollout/staleness_max"] <= K
        assert sum(m[f"rollout/staleness_hist_{s}"] for s in range(K + 1)) == BATCH
        assert m["train/weight_version"] == step
    dropped = sum(m["rollout/dropped_stale_groups"] for m in history)
    print(
        f"\nheld back {held}; per step (staleness histogram 0..K, dropped):",
        [
            (
                [int(m[f"rollout/staleness_hist_{s}"]) for s in range(K + 1)],
                int(m["rollout/dropped_stale_groups"]),
            )
            for m in history
        ],
    )
    assert held > 0
    assert dropped == held
    # Dropped prompts were generated again and trained: each prompt exactly once.
    trained = Counter(i for step in runner.data_history for i in step)
    assert trained == _issued(cfg, 0, 5)
    generated = sum(r["groups"] for r in runner._async.stream_reports if "chunks" in r)
    assert generated >= 5 * BATCH + dropped


def test_async_resume_continues_and_requests_in_flight_prompts_again(
    toy: Path, groups: list[WorkerGroup], async_run: dict[str, Any], tmp_path: Path
) -> None:
    checkpoint = async_run["runner"].checkpoint_root / "global_step_2"
    cfg = _cfg(toy, tmp_path, "resumed", resume_dir=str(checkpoint))
    runner = _run(cfg, groups)
    assert [int(m["step"]) for m in runner.metrics_history] == [3, 4]
    assert runner.global_step == 4
    # The prompts of steps 2 and 3 were in flight at the save; they are requested again.
    trained = Counter(i for step in runner.data_history for i in step)
    assert trained == _issued(cfg, 2, 2)
    first = async_run["runner"].data_history
    assert trained == Counter(i for step in first[2:] for i in step)


# ------------------------------------------------------------------- config errors


def test_async_config_errors_name_the_keys(toy: Path, tmp_path: Path) -> None:
    data = _config(toy, tmp_path, "bad")
    data["algorithm"]["max_staleness"] = -1
    with pytest.raises(ConfigError, match="max_staleness"):
        validate_config(data, ReasoningConfig)
    data["algorithm"]["max_staleness"] = 2
    data["actor"]["recompute_logprobs"] = False
    with pytest.raises(ConfigError, match=r"max_staleness=2.*importance_sampling_fix"):
        validate_config(data, ReasoningConfig)
    data["algorithm"]["importance_sampling_fix"] = False  # explicitly off: fine
    cfg = validate_config(data, ReasoningConfig)
    assert cfg.algorithm.is_async and not cfg.algorithm.use_importance_sampling_fix
    data["actor"]["recompute_logprobs"] = True
    data["algorithm"].pop("importance_sampling_fix")
    assert validate_config(data, ReasoningConfig).algorithm.use_importance_sampling_fix
    data["algorithm"]["max_staleness"] = 0
    assert not validate_config(data, ReasoningConfig).algorithm.use_importance_sampling_fix
    # The rollout scores proximal logprobs only in async mode (null: where it can).
    assert not validate_config(data, ReasoningConfig).scores_proximal_on_rollout
    data["algorithm"]["proximal_on_rollout"] = True
    with pytest.raises(ConfigError, match=r"proximal_on_rollout=true.*max_staleness=0"):
        validate_config(data, ReasoningConfig)
    data["algorithm"]["max_staleness"] = 1
    assert validate_config(data, ReasoningConfig).scores_proximal_on_rollout
    data["algorithm"]["proximal_on_rollout"] = False
    assert not validate_config(data, ReasoningConfig).scores_proximal_on_rollout


def test_async_refuses_collocated_placement(toy: Path, tmp_path: Path) -> None:
    from rlinf.reasoning.workers import FSDPActor, RewardWorker

    data = _config(toy, tmp_path, "coll")
    data["cluster"]["component_placement"] = {"actor": 0, "rollout": 0, "reward": 0}
    cfg = validate_config(data, ReasoningConfig)

    class _Unlaunched:
        def __init__(self, cls: type) -> None:
            self.worker_cls = cls

    groups = [_Unlaunched(FSDPActor), _Unlaunched(RolloutWorker), _Unlaunched(RewardWorker)]
    with pytest.raises(ValueError, match=r"max_staleness=1.*cluster.component_placement"):
        ReasoningRunner(cfg, *groups, collocated=True)  # type: ignore[arg-type]


def test_staleness_metrics_count_each_value() -> None:
    from rlinf.reasoning.async_grpo import staleness_metrics

    out = staleness_metrics([0, 1, 1, 2], dropped=3, max_staleness=2)
    assert out["rollout/staleness_mean"] == 1.0
    assert out["rollout/staleness_max"] == 2.0
    assert out["rollout/dropped_stale_groups"] == 3.0
    assert [out[f"rollout/staleness_hist_{s}"] for s in range(3)] == [1.0, 2.0, 1.0]
    empty = staleness_metrics([], dropped=0, max_staleness=1)
    assert empty["rollout/staleness_mean"] == 0.0 and empty["rollout/staleness_hist_1"] == 0.0
