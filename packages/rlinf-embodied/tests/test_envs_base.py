"""VectorEnv semantics on a tiny pure-Python env, plus config and registry errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from rlinf.core.protocols.embodied import EnvOutput, EnvSpec
from rlinf.embodied.envs import (
    EnvConfig,
    StepResult,
    VectorEnv,
    available_envs,
    make_env,
    register_env,
)
from rlinf.embodied.envs.base import Obs


class _Toy(VectorEnv):
    """States [seed, t]; reward 1 per step; action > 0.5 terminates (and succeeds)."""

    def _setup(self) -> EnvSpec:
        self.t = np.zeros(self.num_envs, dtype=np.int64)
        self.seed = np.zeros(self.num_envs, dtype=np.int64)
        self.steps_taken = np.zeros(self.num_envs, dtype=np.int64)
        self.stepped_after_end = np.zeros(self.num_envs, dtype=np.int64)
        self.ended = np.zeros(self.num_envs, dtype=bool)
        return EnvSpec(
            state_dim=2,
            image_shape=None,
            action_dim=1,
            action_low=(-1.0,),
            action_high=(1.0,),
            max_episode_steps=self.cfg.max_episode_steps or 6,
        )

    def _obs(self) -> Obs:
        return {"states": torch.tensor(np.stack([self.seed, self.t], 1), dtype=torch.float32)}

    def _reset_envs(self, env_ids: np.ndarray, seeds: np.ndarray) -> Obs:
        self.t[env_ids] = 0
        self.seed[env_ids] = seeds
        self.ended[env_ids] = False
        return {k: v[torch.from_numpy(env_ids)] for k, v in self._obs().items()}

    def _step_envs(self, actions: torch.Tensor, active: np.ndarray) -> StepResult:
        self.stepped_after_end += active & self.ended
        self.t[active] += 1
        self.steps_taken[active] += 1
        term = actions[:, 0].numpy() > 0.5
        self.ended |= term & active
        return StepResult(
            obs=self._obs(),
            rewards=np.ones(self.num_envs),
            terminated=term,
            truncated=np.zeros(self.num_envs, dtype=bool),
            success=term.copy(),
        )

    def _close(self) -> None:
        pass


@register_env("toy_test_frozen")
class _ToyFrozen(_Toy):
    can_continue_after_termination = False


register_env("toy_test")(_Toy)


def toy(**kw: object) -> _Toy:
    cfg = EnvConfig(**{"env_type": "toy_test", "env_id": "toy", "num_envs": 3, **kw})  # type: ignore[arg-type]
    env = make_env(cfg)
    assert isinstance(env, _Toy)
    return env


def actions(n: int, c: int, end_at: dict[int, int]) -> torch.Tensor:
    a = torch.zeros(n, c, 1)
    for env, k in end_at.items():
        a[env, k, 0] = 1.0
    return a


def test_mid_chunk_end_is_held_and_flagged_in_last_column() -> None:
    env = toy(auto_reset=True, max_episode_steps=100)
    first = env.reset()
    assert first.rewards is None and first.terminations.shape == (3, 1)
    out, metrics = env.chunk_step(actions(3, 4, {0: 1, 2: 3}))
    # env 0 ended at sub-step 1: no reward afterwards, not stepped again.
    assert out.rewards is not None
    assert out.rewards.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]
    assert env.stepped_after_end.tolist() == [0, 0, 0]
    assert env.last_alive_mask.tolist() == [
        [True, True, False, False],
        [True, True, True, True],
        [True, True, True, True],
    ]
    assert out.terminations.tolist() == [
        [False, False, False, True],
        [False, False, False, False],
        [False, False, False, True],
    ]
    assert not out.truncations.any()
    # Metrics: one row per finished episode, in the order they finished.
    assert metrics["return"].tolist() == [2.0, 4.0]
    assert metrics["episode_len"].tolist() == [2.0, 4.0]
    assert metrics["success_once"].tolist() == [1.0, 1.0]
    assert metrics["success_at_end"].tolist() == [1.0, 1.0]
    # Auto-reset: final obs holds the last obs (t = 2 and 4); obs restarts at t = 0.
    assert out.final_obs is not None
    assert out.final_obs["states"][:, 1].tolist() == [2.0, 4.0, 4.0]
    assert out.obs["states"][:, 1].tolist() == [0.0, 4.0, 0.0]
    # The next episode of env 0 has a different (but deterministic) seed.
    assert out.obs["states"][0, 0] != first.obs["states"][0, 0]
    out2, metrics2 = env.chunk_step(actions(3, 2, {}))
    assert out2.final_obs is None and metrics2["return"].numel() == 0
    assert out2.obs["states"][:, 1].tolist() == [2.0, 6.0, 2.0]


def test_outputs_handed_out_are_never_written_again() -> None:
    """Later chunks (partial steps, resets, a chunk that steps nobody) leave earlier outputs be."""
    outs: list[EnvOutput] = []
    snapshots: list[list[torch.Tensor]] = []

    def tensors(out: EnvOutput) -> list[torch.Tensor]:
        return [*out.obs.values(), *(out.final_obs or {}).values()]

    def keep(out: EnvOutput) -> None:
        outs.append(out)
        snapshots.append([t.clone() for t in tensors(out)])

    env = toy(auto_reset=True, max_episode_steps=100)
    keep(env.reset())
    for end_at in ({0: 1}, {}, {1: 0, 2: 1}, {}):
        keep(env.chunk_step(actions(3, 2, end_at))[0])
    held = toy(auto_reset=False, max_episode_steps=100)
    keep(held.reset())
    keep(held.chunk_step(actions(3, 1, {0: 0}))[0])  # env 0 ends and is held
    keep(held.chunk_step(actions(3, 1, {1: 0}))[0])  # the others step (a partial step)
    keep(held.chunk_step(actions(3, 1, {2: 0}))[0])
    keep(held.chunk_step(actions(3, 1, {}))[0])  # nobody steps: the same values
    for end_at in ({0: 0}, {}, {1: 1}):
        env.chunk_step(actions(3, 2, end_at))
    held.reset()
    held.chunk_step(actions(3, 1, {}))
    for i, (out, snapshot) in enumerate(zip(outs, snapshots, strict=True)):
        assert all(map(torch.equal, tensors(out), snapshot)), f"output {i} was written"
    assert torch.equal(outs[-1].obs["states"], outs[-2].obs["states"])


def test_truncation_and_no_auto_reset_hold_until_reset() -> None:
    env = toy(auto_reset=False, max_episode_steps=5)
    env.reset()
    out, metrics = env.chunk_step(actions(3, 4, {1: 0}))
    assert out.terminations[:, -1].tolist() == [False, True, False]
    assert metrics["episode_len"].tolist() == [1.0]
    out, metrics = env.chunk_step(actions(3, 4, {}))
    # envs 0 and 2 hit the limit (5) at sub-step 0; env 1 stays done and reports again.
    assert out.truncations[:, -1].tolist() == [True, False, True]
    assert out.terminations[:, -1].tolist() == [False, True, False]
    assert out.final_obs is None
    assert out.rewards is not None and out.rewards.sum().item() == 2.0
    assert metrics["episode_len"].tolist() == [5.0, 5.0]  # env 1 is not reported twice
    out, metrics = env.chunk_step(actions(3, 2, {}))
    assert out.rewards is not None and out.rewards.sum().item() == 0.0
    assert metrics["return"].numel() == 0
    assert env.running_metrics()["episode_len"].tolist() == [5.0, 1.0, 5.0]
    assert env.reset().obs["states"][:, 1].tolist() == [0.0, 0.0, 0.0]


def test_ignore_terminations_runs_to_the_horizon() -> None:
    env = toy(auto_reset=True, ignore_terminations=True, max_episode_steps=4)
    env.reset()
    out, metrics = env.chunk_step(actions(3, 4, {0: 1}))
    assert not out.terminations.any()
    assert out.truncations[:, -1].all()
    # ManiSkill-like: the sim goes on after success; success_at_end reads the last step.
    assert metrics["episode_len"].tolist() == [4.0, 4.0, 4.0]
    assert metrics["return"].tolist() == [4.0, 4.0, 4.0]
    assert metrics["success_once"].tolist() == [1.0, 0.0, 0.0]
    assert metrics["success_at_end"].tolist() == [0.0, 0.0, 0.0]


def test_ignore_terminations_holds_envs_that_cannot_continue() -> None:
    cfg = EnvConfig(
        env_type="toy_test_frozen",
        env_id="toy",
        num_envs=2,
        ignore_terminations=True,
        max_episode_steps=4,
    )
    env = make_env(cfg)
    assert isinstance(env, _ToyFrozen)
    env.reset()
    out, metrics = env.chunk_step(actions(2, 4, {0: 1}))
    assert env.stepped_after_end.tolist() == [0, 0]
    assert not out.terminations.any() and out.truncations[:, -1].all()
    assert metrics["return"].tolist() == [2.0, 4.0]
    assert metrics["episode_len"].tolist() == [4.0, 4.0]


def test_seeds_groups_epochs_offsets_and_reward_scale() -> None:
    env = toy(num_envs=6, group_size=3, reward_scale=0.5)
    seeds = env.reset().obs["states"][:, 0]
    assert seeds[0] == seeds[1] == seeds[2] and seeds[3] == seeds[4] == seeds[5]
    assert seeds[0] != seeds[3]
    assert torch.equal(env.reset().obs["states"][:, 0], seeds)  # replay without update
    assert env.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    env.update_reset_seeds()
    new = env.reset().obs["states"][:, 0]
    assert not torch.equal(new, seeds)
    assert torch.equal(env.reset(seed=0).obs["states"][:, 0], seeds)  # cfg.seed == 0
    other = make_env(env.cfg, seed_offset=1).reset().obs["states"][:, 0]
    assert not torch.equal(other, seeds)
    out, _ = env.chunk_step(actions(6, 2, {}))
    assert out.rewards is not None and torch.all(out.rewards == 0.5)


def test_action_checks() -> None:
    env = toy()
    with pytest.raises(RuntimeError, match="reset"):
        env.chunk_step(actions(3, 1, {}))
    env.reset()
    with pytest.raises(ValueError, match=r"actions must be \[num_envs=3, C, action_dim=1\]"):
        env.chunk_step(torch.zeros(3, 1))
    with pytest.raises(ValueError, match="NaN"):
        env.chunk_step(torch.full((3, 1, 1), float("nan")))
    # One reduction checks them all: any inf (alone, or +inf with -inf), in any dtype.
    for bad in ([0.0, float("inf"), 0.0], [float("inf"), float("-inf"), 0.0], [0, 0, -1e309]):
        for dtype in (torch.float32, torch.float64):
            with pytest.raises(ValueError, match="NaN or inf"):
                env.chunk_step(torch.tensor(bad, dtype=dtype).view(3, 1, 1))
    # Large finite actions are not mistaken for inf (their float32 sum would overflow).
    big = torch.full((3, 1, 1), torch.finfo(torch.float32).max)
    out, _ = env.chunk_step(big)
    assert out.rewards is not None
    env.close()
    env.close()
    with pytest.raises(RuntimeError, match="closed"):
        env.reset()


def test_config_errors_name_the_field_value_and_fix() -> None:
    with pytest.raises(ValidationError) as err:
        EnvConfig(env_type="gym", env_id="CartPole-v1", num_envs=6, group_size=4)
    msg = str(err.value)
    assert "num_envs=6" in msg and "group_size=4" in msg and "num_envs=4 or num_envs=8" in msg
    with pytest.raises(ValidationError, match="obs_mode"):
        EnvConfig(env_type="gym", env_id="x", obs_mode="depth")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="unknwon"):
        EnvConfig(env_type="gym", env_id="x", unknwon=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="image_size"):
        EnvConfig(env_type="gym", env_id="x", image_size=0)
    with pytest.raises(ValidationError, match="reward_scale"):
        EnvConfig(env_type="gym", env_id="x", reward_scale=float("inf"))
    with pytest.raises(ValidationError, match="fps"):
        EnvConfig(env_type="gym", env_id="x", video={"enabled": True, "fps": 0})  # type: ignore[arg-type]
    cfg = EnvConfig(env_type="gym", env_id="x", image_size=64, num_envs=4, group_size=2)
    assert cfg.image_size == (64, 64) and cfg.num_groups == 2
    with pytest.raises(ValueError, match="num_envs=3 must be a positive multiple"):
        make_env(cfg, num_envs=3)


def test_registry_unknown_type_and_duplicate_names() -> None:
    assert {"gym", "maniskill", "robosuite"} <= set(available_envs())
    cfg = EnvConfig(env_type="nosuch", env_id="x")
    with pytest.raises(ValueError, match=r"unknown env_type 'nosuch'; available: .*gym.*maniskill"):
        make_env(cfg)
    with pytest.raises(ValueError, match="already registered"):
        register_env("toy_test")(_ToyFrozen)


@pytest.mark.parametrize(
    ("env_type", "blocked", "extra"),
    [("maniskill", "mani_skill", "maniskill"), ("robosuite", "robosuite", "robosuite")],
)
def test_missing_simulator_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, env_type: str, blocked: str, extra: str
) -> None:
    for name in list(sys.modules):
        if name == blocked or name.startswith(blocked + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, blocked, None)
    monkeypatch.setitem(sys.modules, blocked + ".envs", None)
    cfg = EnvConfig(env_type=env_type, env_id="Lift", sim_backend="cpu")
    with pytest.raises(ImportError, match=rf"uv pip install 'rlinf-embodied\[{extra}\]'"):
        make_env(cfg)
