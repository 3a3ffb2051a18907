"""The LIBERO backend in LIBERO's own environment: initial states, cameras, success, bad input.

LIBERO cannot share the main lock (robosuite 1.4.0 vs 1.5.2); these tests run
with LIBERO's interpreter and skip in the main run:

    uv sync --locked --project examples/embodiment/libero
    uv run --locked --project examples/embodiment/libero pytest tests/envs/libero
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

libero = pytest.importorskip(
    "libero.libero",
    reason="LIBERO runs in its own environment: uv run --locked --project "
    "examples/embodiment/libero pytest tests/envs/libero",
)

from rlinf.embodied.envs import EnvConfig, make_env  # noqa: E402
from rlinf.embodied.envs.libero_env import LiberoVectorEnv, quat_to_axis_angle  # noqa: E402


def libero_cfg(suite: str = "libero_spatial", **kwargs: Any) -> EnvConfig:
    env_kwargs = {"task_ids": [0], "init_state_ids": [0], **kwargs.pop("env_kwargs", {})}
    return EnvConfig(env_type="libero", env_id=suite, num_envs=1, env_kwargs=env_kwargs, **kwargs)


def test_spatial_task_0_resets_to_its_first_initial_state_renders_two_cameras_and_steps() -> None:
    cfg = libero_cfg(obs_mode="rgb", image_size=(96, 96), env_kwargs={"settle_steps": 0})
    with make_env(cfg) as env:
        assert isinstance(env, LiberoVectorEnv)
        assert env.spec.instructions == (
            "pick up the black bowl between the plate and the ramekin and place it on the plate",
        )
        assert env.spec.max_episode_steps == 220 and env.spec.action_dim == 7
        out = env.reset()
        suite = libero.benchmark.get_benchmark_dict()["libero_spatial"]()
        first = suite.get_task_init_states(0)[0]
        sim = env._envs[0]
        np.testing.assert_array_equal(sim.get_sim_state(), first)

        main, wrist = out.obs["main_images"], out.obs["wrist_images"]
        assert main.shape == wrist.shape == (1, 96, 96, 3) and main.dtype == torch.uint8
        assert main.float().std() > 10 and wrist.float().std() > 10  # rendered, not blank
        assert not torch.equal(main, wrist)
        # Rotated 180 degrees from robosuite's (upside-down) buffer: the image LIBERO
        # checkpoints saw. Rendering again and flipping both axes gives the same pixels.
        raw = sim.env._get_observations(force_update=True)
        np.testing.assert_array_equal(main[0].numpy(), raw["agentview_image"][::-1, ::-1])

        states = out.obs["states"][0].numpy()
        np.testing.assert_allclose(states[:3], raw["robot0_eef_pos"], atol=1e-6)
        np.testing.assert_allclose(
            states[3:6], quat_to_axis_angle(raw["robot0_eef_quat"]), atol=1e-5
        )
        np.testing.assert_allclose(states[6:], raw["robot0_gripper_qpos"], atol=1e-6)

        up = torch.zeros(1, 3, 7)
        up[..., 2] = 1.0  # move the end effector up
        stepped, metrics = env.chunk_step(up)
        assert stepped.rewards.shape == (1, 3) and not stepped.terminations.any()
        assert stepped.obs["states"][0, 2] > out.obs["states"][0, 2] + 0.01
        assert not torch.equal(stepped.obs["main_images"], main)
        assert metrics["return"].numel() == 0  # no episode finished


def test_the_seed_picks_task_and_initial_state_and_groups_share_them() -> None:
    cfg = EnvConfig(
        env_type="libero",
        env_id="libero_object",
        num_envs=4,
        group_size=2,
        obs_mode="state",
        env_kwargs={"task_ids": [0, 3], "init_state_ids": [1, 2], "settle_steps": 0},
    )
    with make_env(cfg) as env:
        assert len(env.spec.instructions) == 2
        out = env.reset()
        starts = [env.start_of(int(s)) for s in env.reset_seeds]
        assert starts[0] == starts[1] and starts[2] == starts[3]
        assert out.obs["task_ids"].tolist() == [t for t, _ in starts]
        suite = libero.benchmark.get_benchmark_dict()["libero_object"]()
        for i, (task, state_id) in enumerate(starts):
            want = suite.get_task_init_states([0, 3][task])[state_id]
            np.testing.assert_array_equal(env._envs[i].get_sim_state(), want)


def _pick_and_place(env: LiberoVectorEnv) -> dict[str, torch.Tensor]:
    """A hand-built controller for "pick up X and place it in the basket", through chunk_step.

    The object's and the basket's positions are read once from LIBERO after the
    reset; the end effector's comes from our ``states``. Returns the metrics of
    the episode that ended (empty if none did).
    """
    sim = env._envs[0]
    target_name, dest_name = sim.env.obj_of_interest
    raw = sim.env._get_observations()
    obj, dest = raw[f"{target_name}_pos"].copy(), raw[f"{dest_name}_pos"].copy()
    eef = env.reset(seed=None).obs["states"][0, :3].numpy()

    def up(height: float) -> np.ndarray:
        return np.array([0.0, 0.0, height])

    plan = [  # (target position, gripper -1 open / +1 closed, sub-steps to hold)
        (obj + up(0.12), -1.0, 0),
        (obj + up(0.0), -1.0, 0),
        (None, 1.0, 15),
        (obj + up(0.25), 1.0, 0),
        (dest + up(0.25), 1.0, 0),
        (dest + up(0.15), 1.0, 0),
        (None, -1.0, 40),
    ]
    for target, grip, hold in plan:
        goal = eef.copy() if target is None else np.asarray(target)
        for step in range(150):
            action = torch.zeros(1, 1, 7)
            action[0, 0, :3] = torch.from_numpy(np.clip((goal - eef) / 0.05 * 1.5, -1, 1))
            action[0, 0, 6] = grip
            out, metrics = env.chunk_step(action)
            if metrics["return"].numel():
                return metrics
            eef = out.obs["states"][0, :3].numpy()
            if step >= hold and np.linalg.norm(goal - eef) < (1.0 if target is None else 0.01):
                break
    return metrics


def test_a_scripted_pick_and_place_reaches_success() -> None:
    cfg = libero_cfg("libero_object", obs_mode="state", reward_scale=5.0)
    with make_env(cfg) as env:
        env.reset()
        metrics = _pick_and_place(env)
    assert metrics["success_once"].tolist() == [1.0]
    assert metrics["return"].tolist() == [5.0]  # reward_scale on the success sub-step
    assert 50 < metrics["episode_len"].item() < 280


def test_openvla_gripper_convention_maps_open_to_minus_one() -> None:
    cfg = libero_cfg(obs_mode="state", env_kwargs={"gripper": "openvla", "settle_steps": 0})
    with make_env(cfg) as env:
        out = env.reset()
        width0 = out.obs["states"][0, 6] - out.obs["states"][0, 7]
        close = torch.zeros(1, 10, 7)  # OpenVLA: 0 = close
        closed = env.chunk_step(close)[0].obs["states"][0]
        opened = env.chunk_step(close + torch.tensor([0, 0, 0, 0, 0, 0, 1.0]))[0].obs["states"][0]
    assert closed[6] - closed[7] < width0 - 0.01 < opened[6] - opened[7] + 0.01


@pytest.mark.parametrize(
    ("suite", "env_kwargs", "match"),
    [
        ("libero_100x", {}, r"env\.env_id='libero_100x' is not a LIBERO suite; use one of"),
        (
            "libero_goal",
            {"task_ids": [10]},
            r"env\.env_kwargs\.task_ids=\[10\]: give task ids in 0\.\.9",
        ),
        (
            "libero_goal",
            {"init_state_ids": [50]},
            r"init_state_ids=\[50\]: give initial-state ids in 0\.\.49",
        ),
        ("libero_goal", {"gripper": "robotiq"}, r"gripper='robotiq' must be 'libero' or 'openvla'"),
        ("libero_goal", {"camera": "x"}, r"unknown LIBERO options \['camera'\]"),
    ],
)
def test_bad_suite_task_or_option_names_the_key(
    suite: str, env_kwargs: dict[str, Any], match: str
) -> None:
    cfg = EnvConfig(env_type="libero", env_id=suite, num_envs=1, env_kwargs=env_kwargs)
    with pytest.raises(ValueError, match=match):
        make_env(cfg)


def test_a_missing_asset_names_the_file_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    real = libero.get_libero_path

    def elsewhere(kind: str) -> str:
        return str(tmp_path) if kind == "bddl_files" else real(kind)

    monkeypatch.setattr(libero, "get_libero_path", elsewhere)
    with pytest.raises(FileNotFoundError, match=r"LIBERO asset .*\.bddl .* is missing: reinstall"):
        make_env(libero_cfg())
