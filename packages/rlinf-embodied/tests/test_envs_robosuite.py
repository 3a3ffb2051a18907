"""robosuite backend: Lift with a Panda arm, two in-process envs, state observations."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from rlinf.embodied.envs import EnvConfig, VectorEnv, make_env

os.environ.setdefault("MUJOCO_GL", "egl")
pytest.importorskip("robosuite", reason="robosuite is not installed (rlinf-embodied[robosuite])")


def lift(**kw: object) -> VectorEnv:
    cfg = EnvConfig(**{"env_type": "robosuite", "env_id": "Lift", "num_envs": 2, **kw})  # type: ignore[arg-type]
    return make_env(cfg)


def test_lift_state_chunks_groups_and_seeds() -> None:
    with lift(group_size=2, auto_reset=True, max_episode_steps=6) as env:
        assert env.spec.state_dim == 60 and env.spec.action_dim == 7
        assert env.spec.action_low == (-1.0,) * 7 and env.spec.image_shape is None
        out = env.reset()
        states = out.obs["states"]
        assert states.shape == (2, 60) and torch.equal(states[0], states[1])
        assert torch.equal(env.reset(seed=4).obs["states"], env.reset(seed=4).obs["states"])
        assert not torch.equal(env.reset(seed=5).obs["states"], env.reset(seed=4).obs["states"])
        env.reset()
        same = torch.rand(1, 3, 7).repeat(2, 1, 1) * 2 - 1
        out, metrics = env.chunk_step(same)
        assert torch.equal(out.obs["states"][0], out.obs["states"][1])  # same start, same actions
        out, metrics = env.chunk_step(same)
        assert out.truncations[:, -1].all() and out.final_obs is not None
        assert metrics["episode_len"].tolist() == [6.0, 6.0]
        assert set(metrics) >= {"return", "success_once", "success_at_end"}
        assert metrics["success_once"].tolist() == [0.0, 0.0]  # random actions do not lift
        assert env.spec.instructions == ("lift the cube",)  # the task's own, for VLAs
        assert out.obs["task_ids"].tolist() == [0, 0]


@pytest.mark.slow
def test_lift_rgb_camera() -> None:
    with lift(obs_mode="rgb", max_episode_steps=4) as env:
        assert env.spec.image_shape == (84, 84, 3)
        out = env.reset()
        assert out.obs["main_images"].shape == (2, 84, 84, 3)
        assert out.obs["main_images"].float().std() > 0
        out, _ = env.chunk_step(torch.zeros(2, 2, 7))
        assert out.obs["main_images"].dtype == torch.uint8


@pytest.mark.slow
def test_lift_wrist_camera_gives_wrist_images() -> None:
    cameras = {"camera_names": ["agentview", "robot0_eye_in_hand"]}
    with lift(obs_mode="rgb", image_size=32, max_episode_steps=4, env_kwargs=cameras) as env:
        assert env.spec.wrist_image_shape == env.spec.image_shape == (32, 32, 3)
        obs = env.reset().obs
        wrist, main = obs["wrist_images"], obs["main_images"]
        assert wrist.dtype == torch.uint8 and wrist.shape == (2, 32, 32, 3)
        assert wrist.float().std() > 0 and not torch.equal(wrist, main)


def test_more_than_two_cameras_are_refused_by_name() -> None:
    cameras = {"camera_names": ["agentview", "robot0_eye_in_hand", "frontview"]}
    with pytest.raises(ValueError, match="camera_names"):
        lift(obs_mode="rgb", env_kwargs=cameras)


@pytest.mark.slow
def test_lift_video_from_state_obs(tmp_path: Path) -> None:
    video = {"enabled": True, "dir": str(tmp_path)}
    with lift(max_episode_steps=3, auto_reset=True, video=video) as env:
        env.reset()
        env.chunk_step(torch.zeros(2, 3, 7))
        env.chunk_step(torch.zeros(2, 2, 7))
    files = env.video_files
    assert len(files) == 2 and all(Path(f).stat().st_size > 0 for f in files)
