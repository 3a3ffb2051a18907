"""lang_reach: the built-in language-conditioned task (observations, layouts, rewards, expert)."""

from __future__ import annotations

import pytest
import torch

from rlinf.embodied.envs import EnvConfig, make_env
from rlinf.embodied.envs.lang_reach import COLOURS, INSTRUCTIONS, LangReachEnv


def _env(layout: str = "fixed", n: int = 8, **kwargs: object) -> LangReachEnv:
    cfg = EnvConfig(env_type="lang_reach", env_id=layout, num_envs=n, obs_mode="rgb", **kwargs)
    env = make_env(cfg)
    assert isinstance(env, LangReachEnv)
    return env


def _pixel(image: torch.Tensor, xy: torch.Tensor) -> torch.Tensor:
    height, width = image.shape[:2]
    col = round((float(xy[0]) + 1) / 2 * (width - 1))
    row = round((1 - float(xy[1])) / 2 * (height - 1))
    return image[row, col]


def test_spec_and_observations() -> None:
    env = _env(n=4)
    spec = env.spec
    assert spec.instructions == INSTRUCTIONS and len(INSTRUCTIONS) == 9
    assert spec.image_shape == (32, 32, 3) and spec.state_dim == 2 and spec.action_dim == 2
    obs = env.reset().obs
    assert set(obs) == {"main_images", "states", "task_ids"}
    assert obs["main_images"].dtype == torch.uint8 and obs["main_images"].shape == (4, 32, 32, 3)
    assert obs["task_ids"].dtype == torch.int64 and obs["task_ids"].shape == (4,)
    texts = spec.task_descriptions(obs["task_ids"])
    assert len(texts) == 4 and all(t in INSTRUCTIONS for t in texts)
    with pytest.raises(ValueError, match="outside"):
        spec.task_descriptions(torch.tensor([9]))
    state_env = make_env(EnvConfig(env_type="lang_reach", env_id="fixed", num_envs=2))
    state_obs = state_env.reset().obs
    assert state_env.spec.image_shape is None and state_obs["states"].shape == (2, 8)
    assert "main_images" not in state_obs


def test_image_shows_targets_in_their_colours_and_the_agent() -> None:
    env = _env("random", n=6)
    obs = env.reset().obs
    for i in range(6):
        image = obs["main_images"][i]
        for colour, name in enumerate(COLOURS):
            expected = {"red": 0, "green": 1, "blue": 2}[name]
            pixel = _pixel(image, env._targets[i, colour])
            assert int(pixel.argmax()) == expected, (i, name, pixel)
        assert _pixel(image, env._agent[i]).tolist() == [255, 255, 255]


def test_wrist_camera_follows_the_agent_at_twice_the_zoom() -> None:
    env = _env("random", n=6, env_kwargs={"wrist_camera": True})
    assert env.spec.wrist_image_shape == (32, 32, 3)
    obs = env.reset(seed=3).obs
    assert obs["wrist_images"].dtype == torch.uint8
    assert obs["wrist_images"].shape == obs["main_images"].shape
    for _ in range(2):
        for i in range(6):
            wrist, agent = obs["wrist_images"][i], env._agent[i]
            assert _pixel(wrist, torch.zeros(2)).tolist() == [255, 255, 255]  # agent at centre
            for colour in range(len(COLOURS)):
                seen = (env._targets[i, colour] - agent) * 2  # view coordinates
                if bool((seen.abs() < 0.9).all()):
                    assert int(_pixel(wrist, seen).argmax()) == colour, (i, colour)
            corner = torch.sign(agent) * 0.999  # the view's corner nearest to the arena edge
            outside = bool(((agent + corner / 2).abs() > 1).any())
            assert (_pixel(wrist, corner).tolist() == [90, 90, 90]) == outside, (i, agent)
        obs = env.chunk_step(torch.ones(6, 3, 2))[0].obs  # towards the top-right edge
    plain = _env(n=2).reset().obs
    assert "wrist_images" not in plain and _env(n=2).spec.wrist_image_shape is None


def test_fixed_layout_never_moves_targets_and_random_layout_does() -> None:
    fixed, rand = _env("fixed", n=16), _env("random", n=16)
    fixed.reset()
    rand.reset()
    assert torch.equal(fixed._targets, fixed._targets[:1].expand_as(fixed._targets))
    layouts = {tuple(rand._targets[i].flatten().tolist()) for i in range(16)}
    assert len(layouts) > 3  # 24 ways to deal 3 colours onto 4 corners


def test_same_seed_same_episodes() -> None:
    a, b = _env("random", n=4), _env("random", n=4)
    oa, ob = a.reset(seed=7).obs, b.reset(seed=7).obs
    assert all(torch.equal(oa[k], ob[k]) for k in oa)
    oc = a.reset(seed=8).obs
    assert not torch.equal(oa["states"], oc["states"])


@pytest.mark.parametrize("layout", ["fixed", "random"])
def test_expert_succeeds_where_random_actions_rarely_do(layout: str) -> None:
    n = 64
    expert, rand = _env(layout, n=n), _env(layout, n=n)
    expert.reset(seed=1)
    rand.reset(seed=1)
    successes = {"expert": 0.0, "random": 0.0}
    generator = torch.Generator().manual_seed(0)
    for _ in range(16):
        _, m = expert.chunk_step(expert.expert_actions().unsqueeze(1))
        successes["expert"] += float(m.get("success_once", torch.zeros(0)).sum())
        actions = torch.rand(n, 1, 2, generator=generator) * 2 - 1
        _, m = rand.chunk_step(actions)
        successes["random"] += float(m.get("success_once", torch.zeros(0)).sum())
    assert successes["expert"] == n
    assert successes["random"] < 0.3 * n


def test_sparse_and_shaped_rewards() -> None:
    sparse = _env(n=8)
    sparse.reset(seed=3)
    total = torch.zeros(8)
    for _ in range(16):
        out, _ = sparse.chunk_step(sparse.expert_actions().unsqueeze(1))
        assert out.rewards is not None
        total += out.rewards[:, 0]
    assert torch.equal(total, torch.ones(8))  # 1 on the success step, 0 elsewhere

    shaped = _env(n=8, env_kwargs={"reward": "shaped"})
    shaped.reset(seed=3)
    start = shaped._distance().clone()
    out, _ = shaped.chunk_step(torch.zeros(8, 1, 2))
    assert out.rewards is not None
    assert torch.allclose(out.rewards[:, 0], torch.zeros(8))
    out, _ = shaped.chunk_step(shaped.expert_actions().unsqueeze(1))
    assert out.rewards is not None
    gained = start - shaped._distance()
    expected = gained + (shaped._distance() < 0.12).float()
    assert torch.allclose(out.rewards[:, 0], expected, atol=1e-6)
    assert bool((gained > 0).all())


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"env_id": "maze"}, "not a lang_reach layout"),
        ({"env_kwargs": {"reward": "dense"}}, "env_kwargs.reward='dense'"),
        ({"env_kwargs": {"speed": 2}}, "not lang_reach options"),
        ({"obs_mode": "state", "env_kwargs": {"wrist_camera": True}}, "needs obs_mode: rgb"),
        ({"image_size": 8}, "too small"),
        ({"sim_backend": "gpu"}, "sim_backend='gpu'"),
    ],
)
def test_bad_config_is_named(overrides: dict[str, object], match: str) -> None:
    cfg = {"env_type": "lang_reach", "env_id": "fixed", "obs_mode": "rgb", **overrides}
    with pytest.raises(ValueError, match=match):
        make_env(EnvConfig.model_validate(cfg))
