"""ManiSkill 3 backend on the CPU sim: PickCube-v1 (state, rgb) and PushCube-v1 (state).

Skipped with the reason when SAPIEN cannot start (e.g. no Vulkan driver for rgb).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlinf.embodied.envs import EnvConfig, VectorEnv, make_env

pytest.importorskip("mani_skill", reason="ManiSkill is not installed (rlinf-embodied[maniskill])")


def build(**kw: object) -> VectorEnv:
    cfg = EnvConfig(**{"env_type": "maniskill", "sim_backend": "cpu", "num_envs": 2, **kw})  # type: ignore[arg-type]
    try:
        return make_env(cfg)
    except RuntimeError as exc:  # SAPIEN / Vulkan could not start on this machine
        pytest.skip(f"ManiSkill could not create {cfg.env_id} ({cfg.obs_mode}): {exc}")


def random_chunks(
    env: VectorEnv, steps: int, c: int, seed: int = 0
) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    metrics = []
    for _ in range(steps):
        a = torch.rand(env.num_envs, c, env.spec.action_dim, generator=g) * 2 - 1
        out, m = env.chunk_step(a)
        assert out.rewards is not None and out.rewards.shape == (env.num_envs, c)
        # ManiSkill steps under inference_mode, but callers get normal tensors they may
        # write in place.
        assert not any(t.is_inference() for t in (*out.obs.values(), out.rewards))
        assert out.terminations.shape == (env.num_envs, c)
        metrics.append(m)
    return metrics


def test_one_env_steps_as_the_general_path_does() -> None:
    """One CPU env is one batch: its shortcut gives exactly what the general gather gives."""
    envs = [build(env_id="PickCube-v1", num_envs=1, max_episode_steps=5) for _ in range(2)]
    shortcut, general = envs
    general._step_envs = general._step_batches  # type: ignore[attr-defined,method-assign]
    with shortcut, general:
        outs = [env.reset(seed=3) for env in envs]
        assert torch.equal(outs[0].obs["states"], outs[1].obs["states"])
        g = torch.Generator().manual_seed(1)
        for _ in range(7):  # across an episode end and its auto-reset
            a = torch.rand(1, 1, 8, generator=g) * 2 - 1
            (out_s, m_s), (out_g, m_g) = shortcut.chunk_step(a), general.chunk_step(a)
            assert torch.equal(out_s.obs["states"], out_g.obs["states"])
            for name in ("rewards", "terminations", "truncations"):
                assert torch.equal(getattr(out_s, name), getattr(out_g, name)), name
            assert (out_s.final_obs is None) == (out_g.final_obs is None)
            assert m_s.keys() == m_g.keys()
            assert all(torch.equal(m_s[k], m_g[k]) for k in m_s)
        assert shortcut.defines_success


def test_pickcube_state_chunks_auto_reset_and_metrics() -> None:
    env = build(env_id="PickCube-v1", max_episode_steps=8, auto_reset=True, group_size=2)
    with env:
        spec = env.spec
        assert spec.state_dim == 42 and spec.action_dim == 8 and spec.image_shape is None
        assert spec.action_low == (-1.0,) * 8 and spec.max_episode_steps == 8
        out = env.reset()
        states = out.obs["states"]
        assert states.shape == (2, 42) and states.dtype == torch.float32
        assert torch.equal(states[0], states[1])  # one group: shared start
        assert torch.equal(env.reset(seed=5).obs["states"], env.reset(seed=5).obs["states"])
        env.reset()
        metrics = random_chunks(env, 2, 4)
        assert metrics[0]["return"].numel() == 0
        finished = metrics[1]
        assert finished["episode_len"].tolist() == [8.0, 8.0]
        assert set(finished) == {
            "return",
            "episode_len",
            "reward",
            "success_once",
            "success_at_end",
        }


def test_every_call_into_maniskill_runs_under_inference_mode() -> None:
    """Steps, resets and renders skip autograd's bookkeeping (ManiSkill's step is mostly
    small torch ops); its inference tensors then never meet a call outside that mode."""
    env = build(env_id="PickCube-v1", max_episode_steps=4, auto_reset=True)
    seen: list[tuple[str, bool]] = []
    with env:
        for batch in env._batches:  # type: ignore[attr-defined]  # each simulator env
            for name in ("step", "reset", "render"):
                call = getattr(batch.env, name)

                def record(*args: Any, _call: Any = call, _name: str = name, **kwargs: Any) -> Any:
                    seen.append((_name, torch.is_inference_mode_enabled()))
                    return _call(*args, **kwargs)

                setattr(batch.env, name, record)
        env.reset()
        random_chunks(env, 5, 1)  # episode ends: auto-resets
    assert {name for name, _ in seen} >= {"step", "reset"}
    assert all(inference for _, inference in seen), seen
    assert not torch.is_inference_mode_enabled()


def test_seeded_resets_are_reproducible_and_leave_the_global_generator_alone() -> None:
    """Each seed gives its own start, the same one whatever ran in between; the global torch
    generator is left as it was (ManiSkill seeds each reset inside ``fork_rng``)."""
    env = build(env_id="PickCube-v1", num_envs=1, max_episode_steps=4, auto_reset=True)
    with env:
        rng_state = torch.get_rng_state()
        first = [env.reset(seed=s).obs["states"] for s in (5, 6)]
        assert torch.equal(torch.get_rng_state(), rng_state)
        random_chunks(env, 2, 1)
        torch.manual_seed(1234)
        again = [env.reset(seed=s).obs["states"] for s in (6, 5)][::-1]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], first[1])


def test_pickcube_rgb_images_and_states() -> None:
    env = build(env_id="PickCube-v1", obs_mode="rgb", image_size=64, max_episode_steps=4)
    with env:
        assert env.spec.image_shape == (64, 64, 3)
        assert env.spec.state_dim is not None and env.spec.state_dim > 0
        out = env.reset()
        images = out.obs["main_images"]
        assert images.shape == (2, 64, 64, 3) and images.dtype == torch.uint8
        assert images.float().std() > 0  # a rendered scene, not a blank frame
        assert out.obs["states"].shape == (2, env.spec.state_dim)
        out, metrics = env.chunk_step(torch.zeros(2, 4, 8))
        assert out.truncations[:, -1].all() and out.obs["main_images"].shape == (2, 64, 64, 3)
        assert metrics["episode_len"].tolist() == [4.0, 4.0]
        # The task's own instruction, for VLAs: one entry, every env's task_id 0.
        assert env.spec.instructions == ("pick up the cube and move it to the goal",)
        assert out.obs["task_ids"].tolist() == [0, 0]


def test_pickcube_wrist_camera_gives_wrist_images() -> None:
    kwargs = {"robot_uids": "panda_wristcam", "wrist_camera": "hand_camera"}
    env = build(env_id="PickCube-v1", obs_mode="rgb", image_size=32, env_kwargs=kwargs)
    with env:
        assert env.spec.wrist_image_shape == env.spec.image_shape == (32, 32, 3)
        obs = env.reset().obs
        wrist, main = obs["wrist_images"], obs["main_images"]
        assert wrist.shape == (2, 32, 32, 3) and wrist.dtype == torch.uint8
        assert wrist.float().std() > 0 and not torch.equal(wrist, main)
    bad = {"env_id": "PickCube-v1", "obs_mode": "rgb", "env_kwargs": {"wrist_camera": "nope"}}
    with pytest.raises(RuntimeError, match=r"env_kwargs\.wrist_camera"):
        make_env(EnvConfig(**{"env_type": "maniskill", "sim_backend": "cpu", **bad}))  # type: ignore[arg-type]


def test_instruction_from_config_overrides_the_task_default() -> None:
    env = build(env_id="PushCube-v1", instruction="nudge the block onto the target")
    with env:
        assert env.spec.instructions == ("nudge the block onto the target",)
        assert env.reset().obs["task_ids"].tolist() == [0, 0]


def test_pushcube_state() -> None:
    env = build(env_id="PushCube-v1", max_episode_steps=6, auto_reset=True)
    with env:
        assert env.spec.state_dim is not None and env.spec.action_dim == 8
        first = env.reset().obs["states"]
        assert not torch.equal(first[0], first[1])  # group_size 1: different starts
        metrics = random_chunks(env, 2, 3)
        assert metrics[1]["episode_len"].tolist() == [6.0, 6.0]


def test_start_sharing_by_simulator_state() -> None:
    """The batched-GPU path shares group starts by copying states; exercise it on the CPU."""
    env = build(env_id="PickCube-v1", max_episode_steps=5)
    with env:
        seeded = env.reset(seed=3).obs["states"]
        batches = env._batches  # type: ignore[attr-defined]
        for batch in batches:
            batch.share_by_state = True
        first = env.reset(seed=3).obs["states"]  # samples the start, caches its sim state
        again = env.reset(seed=3).obs["states"]  # restores the cached state
        np.testing.assert_allclose(first.numpy(), seeded.numpy(), atol=1e-5)
        np.testing.assert_allclose(again.numpy(), seeded.numpy(), atol=1e-5)


def test_unknown_task_and_gpu_request() -> None:
    with pytest.raises(ValueError, match="not a registered ManiSkill task"):
        make_env(EnvConfig(env_type="maniskill", env_id="NoSuchTask-v0", sim_backend="cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            make_env(EnvConfig(env_type="maniskill", env_id="PickCube-v1", sim_backend="gpu"))


@pytest.mark.slow
def test_pickcube_video_from_state_obs(tmp_path: Path) -> None:
    video = {"enabled": True, "dir": str(tmp_path)}
    env = build(env_id="PickCube-v1", max_episode_steps=4, auto_reset=True, video=video)
    with env:
        env.reset()
        random_chunks(env, 2, 4)
    files = env.video_files
    assert len(files) == 2 and all(Path(f).stat().st_size > 0 for f in files)
