"""Demonstrations: the .npz format, the scripted-expert collector, mini-batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rlinf.embodied.demos import Demonstrations, collect_expert_demos
from rlinf.embodied.envs import EnvConfig, make_env
from rlinf.embodied.envs.lang_reach import LangReachEnv


def _lang_reach(n: int = 8) -> LangReachEnv:
    env = make_env(
        EnvConfig(
            env_type="lang_reach", env_id="fixed", num_envs=n, obs_mode="rgb", auto_reset=True
        )
    )
    assert isinstance(env, LangReachEnv)
    return env


def test_expert_chunk_plans_ahead_without_moving_the_agent() -> None:
    env = _lang_reach()
    env.reset(seed=2)
    before = env._agent.clone()
    chunk = env.expert_chunk(4)
    assert chunk.shape == (8, 4, 2) and torch.equal(env._agent, before)
    assert torch.equal(chunk[:, 0], env.expert_actions())
    for c in range(4):  # executing the plan step by step gives the same actions
        assert torch.allclose(env.expert_actions(), chunk[:, c], atol=1e-6)
        env._agent = (env._agent + chunk[:, c] * 0.15).clamp(-1, 1)


def test_collect_save_load_round_trip(tmp_path: Path) -> None:
    demos = collect_expert_demos(_lang_reach(), num_samples=40, num_action_chunks=4, seed=3)
    assert len(demos) == 40  # 5 chunk steps of 8 envs
    assert demos.actions.shape == (40, 4, 2)
    assert set(demos.obs) == {"main_images", "states", "task_ids"}
    assert demos.obs["main_images"].dtype == torch.uint8
    assert demos.instructions is not None and len(demos.instructions) == 9
    loaded = Demonstrations.load(demos.save(tmp_path / "demos.npz"))
    assert loaded.instructions == demos.instructions
    assert torch.equal(loaded.actions, demos.actions)
    assert all(torch.equal(loaded.obs[k], demos.obs[k]) for k in demos.obs)
    # The noise spreads the recorded states beyond the expert's own path.
    again = collect_expert_demos(
        _lang_reach(), num_samples=40, num_action_chunks=4, seed=3, noise_std=0.0
    )
    assert not torch.equal(again.obs["states"][8:], demos.obs["states"][8:])


def test_a_file_written_with_plain_numpy_loads(tmp_path: Path) -> None:
    path = tmp_path / "mine.npz"
    np.savez(
        path,
        **{"obs/states": np.zeros((6, 3), np.float32), "obs/task_ids": np.zeros(6, np.int64)},
        actions=np.ones((6, 2, 1), np.float64),
        instructions=np.array(["do it"]),
    )
    demos = Demonstrations.load(path)
    assert demos.actions.dtype == torch.float32 and demos.instructions == ("do it",)
    obs, actions = next(demos.batches(4, torch.Generator().manual_seed(0)))
    assert obs["states"].shape == (4, 3) and actions.shape == (4, 2, 1)


def test_bad_demonstrations_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"obs\['states'\] has 5 rows but actions have 6"):
        Demonstrations(obs={"states": torch.zeros(5, 2)}, actions=torch.zeros(6, 1, 2))
    with pytest.raises(ValueError, match="need their instructions"):
        Demonstrations(obs={"task_ids": torch.zeros(6)}, actions=torch.zeros(6, 1, 2))
    np.savez(tmp_path / "empty.npz", states=np.zeros(3))
    with pytest.raises(ValueError, match="no 'actions' array"):
        Demonstrations.load(tmp_path / "empty.npz")
    with pytest.raises(TypeError, match="no scripted expert"):
        gym = make_env(EnvConfig(env_type="gym", env_id="CartPole-v1", auto_reset=True))
        collect_expert_demos(gym, 4, 1)
