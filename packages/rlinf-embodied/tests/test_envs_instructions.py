"""Instructions for language-conditioned policies: env.instruction, task defaults, task_ids."""

from __future__ import annotations

import pytest
import torch

from rlinf.embodied.envs import EnvConfig, make_env


def test_configured_instruction_reaches_every_observation() -> None:
    cfg = EnvConfig(
        env_type="gym",
        env_id="CartPole-v1",
        num_envs=3,
        auto_reset=True,
        instruction="keep the pole upright",
    )
    with make_env(cfg) as env:
        assert env.spec.instructions == ("keep the pole upright",)
        out = env.reset()
        assert out.obs["task_ids"].dtype == torch.int64
        assert out.obs["task_ids"].tolist() == [0, 0, 0]
        for _ in range(30):  # through auto-resets and final observations
            out, _ = env.chunk_step(torch.zeros(3, 4, 1))
            assert out.obs["task_ids"].tolist() == [0, 0, 0]
            if out.final_obs is not None:
                assert out.final_obs["task_ids"].tolist() == [0, 0, 0]
        assert env.spec.task_descriptions(out.obs["task_ids"]) == ["keep the pole upright"] * 3


def test_env_without_instruction_has_no_task_ids() -> None:
    with make_env(EnvConfig(env_type="gym", env_id="CartPole-v1", num_envs=2)) as env:
        assert env.spec.instructions is None
        assert "task_ids" not in env.reset().obs
        with pytest.raises(ValueError, match="no instructions"):
            env.spec.task_descriptions(torch.zeros(2, dtype=torch.int64))


def test_env_with_its_own_instructions_rejects_one_from_config() -> None:
    cfg = EnvConfig(env_type="lang_reach", env_id="fixed", instruction="go left")
    with pytest.raises(ValueError, match=r"env.instruction='go left'.*remove the key"):
        make_env(cfg)
