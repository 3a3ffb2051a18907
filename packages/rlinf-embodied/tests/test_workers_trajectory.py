"""Worker pieces without Ray: the trajectory builder (T+1 rows, episode-end flags at the
real sub-step, truncation bootstrap, padding of early-ended streams) and the routing helpers."""

from __future__ import annotations

import pytest
import torch

from rlinf.core.protocols.embodied import EnvOutput, PolicyOutput, Trajectory
from rlinf.embodied.workers import TrajectoryBuilder
from rlinf.embodied.workers.common import (
    actor_pieces,
    concat_trajectories,
    serving_env_ranks,
    split_trajectory,
)

# ----------------------------------------------------------------------------- no Ray


def policy_output(n: int, c: int, value: float, boot: float | None = None) -> PolicyOutput:
    return PolicyOutput(
        actions=torch.zeros(n, c, 1),
        prev_logprobs=torch.zeros(n, c),
        prev_values=torch.full((n, c), value),
        forward_inputs={"states": torch.zeros(n, 4), "action": torch.zeros(n, c, 1)},
        bootstrap_values=None if boot is None else torch.full((n, 1), boot),
        version=3,
    )


def env_output(rewards: list[list[float]], term: list[bool], trunc: list[bool]) -> EnvOutput:
    n, c = len(rewards), len(rewards[0])
    t = torch.zeros(n, c, dtype=torch.bool)
    u = torch.zeros(n, c, dtype=torch.bool)
    t[:, -1] = torch.tensor(term)
    u[:, -1] = torch.tensor(trunc)
    return EnvOutput(
        obs={"states": torch.zeros(n, 4)},
        terminations=t,
        truncations=u,
        rewards=torch.tensor(rewards),
    )


def test_builder_places_flags_at_the_real_end_and_bootstraps_truncations() -> None:
    b = TrajectoryBuilder(num_envs=3, num_chunks=3, gamma=0.5, bootstrap_type="standard")
    b.add_policy_output(policy_output(3, 3, value=1.0))
    # env 0 terminates at sub-step 1, env 1 is truncated at sub-step 2, env 2 goes on.
    alive = torch.tensor([[True, True, False], [True, True, True], [True, True, True]])
    b.add_chunk(
        env_output([[1, 1, 0], [1, 1, 1], [1, 1, 1]], [True, False, False], [False, True, False]),
        alive,
    )
    b.add_policy_output(policy_output(3, 3, value=2.0, boot=10.0))  # V(final obs) = 10
    b.add_chunk(
        env_output([[1, 1, 1]] * 3, [False] * 3, [False] * 3), torch.ones(3, 3, dtype=torch.bool)
    )
    traj = b.finish(policy_output(3, 3, value=7.0), torch.tensor([0, 1, 2]))
    assert traj.rewards.shape == (2, 3, 3) and traj.dones.shape == (3, 3, 3)
    assert traj.prev_values.shape == (3, 3, 3) and traj.prev_values[2, 0, 0] == 7.0
    assert not traj.dones[0].any()  # the T+1 bootstrap row
    assert traj.terminations[1, 0].tolist() == [False, True, False]  # moved to sub-step 1
    assert traj.truncations[1, 1].tolist() == [False, False, True]
    # Only the truncated env gets gamma * V(final obs) = 0.5 * 10 on its last sub-step.
    assert traj.rewards[0].tolist() == [[1, 1, 0], [1, 1, 6.0], [1, 1, 1]]
    assert traj.alive is not None and traj.alive[0, 0].tolist() == [True, True, False]
    assert traj.versions.tolist() == [3, 3]


def test_builder_pads_a_stream_that_ended_early() -> None:
    b = TrajectoryBuilder(num_envs=2, num_chunks=1, gamma=1.0, bootstrap_type="always")
    b.add_policy_output(policy_output(2, 1, value=1.0))
    b.add_chunk(
        env_output([[1.0], [1.0]], [True, True], [False, False]), torch.ones(2, 1, dtype=torch.bool)
    )
    traj = b.finish(policy_output(2, 1, value=4.0), torch.tensor([0, 0]), num_steps=3)
    assert traj.rewards.shape == (3, 2, 1)
    # bootstrap_type always: the termination also gets gamma * V(held final obs) = 4.
    assert traj.rewards[:, 0, 0].tolist() == [5.0, 0.0, 0.0]
    assert traj.alive is not None and traj.alive[:, 0, 0].tolist() == [True, False, False]
    assert traj.dones[:, 0, 0].tolist() == [False, True, False, False]


def _without_values(n: int, c: int) -> PolicyOutput:
    """A policy output without prev_values."""
    out = policy_output(n, c, value=0.0)
    out.prev_values = None
    return out


def test_builder_refuses_an_output_without_values() -> None:
    b = TrajectoryBuilder(2, 1, gamma=0.5, bootstrap_type="standard")
    with pytest.raises(ValueError, match="needs prev_values"):
        b.add_policy_output(_without_values(2, 1))


def test_split_and_concat_round_trip() -> None:
    b = TrajectoryBuilder(num_envs=4, num_chunks=2, gamma=1.0, bootstrap_type="standard")
    b.add_policy_output(policy_output(4, 2, value=1.0))
    b.add_chunk(
        env_output([[1, 2], [3, 4], [5, 6], [7, 8]], [False] * 4, [False] * 4),
        torch.ones(4, 2, dtype=torch.bool),
    )
    traj = b.finish(policy_output(4, 2, value=0.0), torch.arange(4))
    pieces = split_trajectory(traj, 2)
    assert [p.num_envs for p in pieces] == [2, 2]
    back = concat_trajectories(pieces)
    for name in ("rewards", "dones", "prev_values", "alive", "group_ids"):
        assert torch.equal(getattr(back, name), getattr(traj, name)), name
    assert isinstance(back, Trajectory)


def test_routing_helpers() -> None:
    assert actor_pieces(actor_world_size=2, env_world_size=1, stages=2) == (1, 1)
    assert actor_pieces(actor_world_size=2, env_world_size=1, stages=1) == (2, 1)
    assert actor_pieces(actor_world_size=1, env_world_size=2, stages=2) == (1, 4)
    assert serving_env_ranks(1, env_world_size=4, rollout_world_size=2) == [1, 3]


def test_builder_records_next_obs_for_sac_and_transitions_keep_the_final_obs() -> None:
    from rlinf.embodied.workers.sac_actor_worker import trajectory_transitions

    b = TrajectoryBuilder(2, 1, gamma=0.9, bootstrap_type="standard", collect_next_obs=True)
    for t in range(2):
        out = policy_output(2, 1, value=0.0)
        out.forward_inputs = {"states": torch.full((2, 4), float(t))}
        out.actions = torch.full((2, 1, 1), float(t))
        b.add_policy_output(out)
        env = env_output([[1.0], [2.0]], [False, t == 1], [t == 0, False])
        env.obs = {"states": torch.full((2, 4), 10.0 + t)}  # after the chunk (reset rows)
        # Env 0 is truncated at t = 0: its real last obs is final_obs, not the reset obs.
        env.final_obs = {"states": torch.full((2, 4), 10.0 + t)}
        env.final_obs["states"][0] = -1.0 if t == 0 else env.final_obs["states"][0]
        b.add_chunk(env, torch.ones(2, 1, dtype=torch.bool))
    traj = b.finish(policy_output(2, 1, value=0.0), torch.tensor([0, 1]))
    assert torch.equal(traj.forward_inputs["next_states"][0, 0], torch.full((4,), -1.0))
    assert torch.equal(traj.forward_inputs["next_states"][0, 1], torch.full((4,), 10.0))
    batch = trajectory_transitions(traj)
    assert len(batch) == 4
    assert batch.obs["states"][:, 0].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert batch.next_obs["states"][:, 0].tolist() == [-1.0, 10.0, 11.0, 11.0]
    assert batch.actions.shape == (4, 1) and batch.rewards.tolist() == [1.0, 2.0, 1.0, 2.0]
    assert batch.truncations.tolist() == [True, False, False, False]
    assert batch.terminations.tolist() == [False, False, False, True]
