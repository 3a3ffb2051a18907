"""gymnasium backend: CartPole chunk semantics, seeds, MuJoCo continuous control, video."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlinf.embodied.envs import EnvConfig, VectorEnv, make_env

os.environ.setdefault("MUJOCO_GL", "egl")


def cartpole(**kw: object) -> VectorEnv:
    cfg = EnvConfig(**{"env_type": "gym", "env_id": "CartPole-v1", "num_envs": 4, **kw})  # type: ignore[arg-type]
    return make_env(cfg)


def test_cartpole_spec_and_reset() -> None:
    with cartpole() as env:
        assert env.spec.discrete and env.spec.num_actions == 2 and env.spec.action_dim == 1
        assert env.spec.state_dim == 4 and env.spec.max_episode_steps == 500
        out = env.reset()
        assert out.obs["states"].shape == (4, 4) and out.obs["states"].dtype == torch.float32
        assert out.rewards is None and out.final_obs is None and not out.dones.any()


def test_cartpole_episode_ends_mid_chunk_then_auto_resets() -> None:
    c = 4
    with cartpole(num_envs=2, auto_reset=True) as env:
        seeds = env.reset_seeds
        start = env.reset()
        # Always pushing left drops the pole within ~10 steps, mostly mid-chunk.
        push = torch.zeros(2, c, 1)
        rows_rewards: list[torch.Tensor] = []
        metrics: dict[str, torch.Tensor] = {}
        out = start
        for _ in range(10):
            out, metrics = env.chunk_step(push)
            assert out.rewards is not None
            rows_rewards.append(out.rewards)
            if metrics["return"].numel():
                break
        assert out.final_obs is not None
        done = out.dones[:, -1]
        assert done.any() and not out.dones[:, :-1].any()  # flags only in the last column
        lengths = metrics["episode_len"]
        assert torch.equal(metrics["return"], lengths)  # CartPole pays 1 per step
        assert set(metrics) == {"return", "episode_len", "reward"}  # CartPole has no success
        rewards = torch.cat(rows_rewards, dim=1)
        for env_id in np.flatnonzero(done.numpy()):
            length = int(rewards[env_id].sum())
            assert length in lengths.tolist()
            assert rewards[env_id, :length].eq(1).all() and rewards[env_id, length:].eq(0).all()
            assert env.last_alive_mask[env_id].sum() == length - (len(rows_rewards) - 1) * c
            # final_obs is the true terminal obs: replay the episode with plain gymnasium.
            ref = gym.make("CartPole-v1")
            ref.reset(seed=int(seeds[env_id]))
            for _ in range(length):
                terminal, _, terminated, _, _ = ref.step(0)
            assert terminated
            np.testing.assert_allclose(out.final_obs["states"][env_id].numpy(), terminal)
            assert not torch.equal(out.final_obs["states"][env_id], out.obs["states"][env_id])
            assert abs(float(out.obs["states"][env_id].abs().max())) <= 0.05  # a fresh start
        undone = ~done
        assert torch.equal(out.final_obs["states"][undone], out.obs["states"][undone])
        assert any(length % c != 0 for length in lengths.int().tolist()) or c == 1


def test_cartpole_ignore_terminations_truncates_at_the_horizon() -> None:
    with cartpole(ignore_terminations=True, auto_reset=True, max_episode_steps=20) as env:
        env.reset()
        out, metrics = env.chunk_step(torch.zeros(4, 10, 1))
        assert metrics["return"].numel() == 0 and not out.dones.any()
        out, metrics = env.chunk_step(torch.zeros(4, 10, 1))
        assert not out.terminations.any() and out.truncations[:, -1].all()
        assert metrics["episode_len"].tolist() == [20.0] * 4
        assert (metrics["return"] < 20).all()  # the pole fell; the env was held until 20
        assert out.final_obs is not None


def test_group_seeds_shared_and_eval_deterministic() -> None:
    with cartpole(num_envs=4, group_size=2, auto_reset=True) as env:
        first = env.reset().obs["states"]
        assert torch.equal(first[0], first[1]) and torch.equal(first[2], first[3])
        assert not torch.equal(first[0], first[2])
        assert torch.equal(env.reset().obs["states"], first)
        assert torch.equal(env.reset(seed=7).obs["states"], env.reset(seed=7).obs["states"])
        assert torch.equal(env.reset(seed=0).obs["states"], first)
        env.update_reset_seeds()
        assert not torch.equal(env.reset().obs["states"], first)
        # Same actions within a group: the group's later episodes also start equal.
        rng = torch.Generator().manual_seed(0)
        for _ in range(8):
            group_actions = torch.randint(0, 2, (2, 8, 1), generator=rng).float()
            out, _ = env.chunk_step(group_actions.repeat_interleave(2, dim=0))
            states = out.obs["states"]
            assert torch.equal(states[0], states[1]) and torch.equal(states[2], states[3])


def test_mujoco_continuous_step_clips_actions() -> None:
    cfg = EnvConfig(env_type="gym", env_id="InvertedPendulum-v5", num_envs=2, auto_reset=True)
    with make_env(cfg) as env:
        assert not env.spec.discrete and env.spec.action_dim == 1
        assert env.spec.action_low == (-3.0,) and env.spec.action_high == (3.0,)
        env.reset(seed=1)
        out, _ = env.chunk_step(torch.full((2, 5, 1), 100.0))  # clipped to 3
        assert out.rewards is not None and out.rewards.shape == (2, 5)
        env.reset(seed=1)
        clipped, _ = env.chunk_step(torch.full((2, 5, 1), 3.0))
        assert torch.equal(out.obs["states"], clipped.obs["states"])
    cfg = EnvConfig(env_type="gym", env_id="HalfCheetah-v5", num_envs=2, max_episode_steps=8)
    with make_env(cfg) as env:
        assert env.spec.state_dim == 17 and env.spec.action_dim == 6
        env.reset()
        out, metrics = env.chunk_step(torch.rand(2, 8, 6) * 2 - 1)
        assert out.truncations[:, -1].all() and metrics["episode_len"].tolist() == [8.0, 8.0]
        assert torch.allclose(
            metrics["return"], out.rewards.sum(1) if out.rewards is not None else 0
        )


def test_rgb_observations_from_mujoco_rendering() -> None:
    cfg = EnvConfig(
        env_type="gym",
        env_id="InvertedPendulum-v5",
        num_envs=2,
        obs_mode="rgb",
        image_size=(32, 48),
    )
    with make_env(cfg) as env:
        assert env.spec.image_shape == (32, 48, 3) and env.spec.state_dim == 4
        out = env.reset()
        assert out.obs["main_images"].shape == (2, 32, 48, 3)
        assert out.obs["main_images"].dtype == torch.uint8 and out.obs["main_images"].any()
        assert torch.equal(out.obs["main_images"], env.reset().obs["main_images"])
        out, _ = env.chunk_step(torch.ones(2, 2, 1))
        assert out.obs["main_images"].shape == (2, 32, 48, 3)


def test_discrete_actions_must_be_valid_indices() -> None:
    with cartpole(num_envs=2) as env:
        env.reset()
        with pytest.raises(ValueError, match=r"indices in \[0, 2\)"):
            env.chunk_step(torch.full((2, 1, 1), 2.0))
        out, _ = env.chunk_step(torch.full((2, 1, 1), 0.9))  # rounds to 1
        assert out.rewards is not None and out.rewards.tolist() == [[1.0], [1.0]]


def _check_video(env: VectorEnv, action: torch.Tensor) -> None:
    env.reset()
    for _ in range(4):
        env.chunk_step(action)
    env.close()
    files = env.video_files
    assert len(files) >= 2, files  # one per finished episode of env 0
    assert all(Path(f).stat().st_size > 0 for f in files)
    assert Path(files[0]).suffix in {".mp4", ".gif"}


def test_video_written_for_mujoco(tmp_path: Path) -> None:
    video = {"enabled": True, "dir": str(tmp_path)}
    cfg = EnvConfig(
        env_type="gym",
        env_id="InvertedPendulum-v5",
        num_envs=2,
        auto_reset=True,
        max_episode_steps=6,
        video=video,  # type: ignore[arg-type]
    )
    _check_video(make_env(cfg), torch.zeros(2, 4, 1))


def test_video_written_for_cartpole(tmp_path: Path) -> None:
    pytest.importorskip(
        "pygame",
        reason="CartPole renders with pygame, which the dev environment lacks "
        "(uv pip install 'gymnasium[classic-control]')",
    )
    video = {"enabled": True, "dir": str(tmp_path)}
    with cartpole(num_envs=2, auto_reset=True, video=video, max_episode_steps=6) as env:
        _check_video(env, torch.ones(2, 4, 1))


def test_rendering_without_pygame_fails_early(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pygame", None)
    with pytest.raises(ImportError, match=r"gymnasium\[classic-control\]"):
        cartpole(num_envs=1, obs_mode="rgb")


def test_unknown_gym_id_and_gpu_backend() -> None:
    with pytest.raises(ValueError, match="not a gymnasium id"):
        make_env(EnvConfig(env_type="gym", env_id="NoSuchEnv-v0"))
    with pytest.raises(ValueError, match="sim_backend='gpu'"):
        make_env(EnvConfig(env_type="gym", env_id="CartPole-v1", sim_backend="gpu"))
