"""PolicyHost and InProcessPolicy without Ray: weight loading, acting, and the channel order
the env loop relies on when the policy lives in the env process."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlinf.core.channel import Channel
from rlinf.core.config import compose_config, validate_config
from rlinf.core.protocols.embodied import EnvSpec
from rlinf.core.weight_sync import WeightBucket
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.models import build_policy
from rlinf.embodied.workers.common import LastObs
from rlinf.embodied.workers.policy_host import InProcessPolicy, PolicyHost, sampling_generator
from rlinf.embodied.workers.rollout_worker import MultiStepRolloutWorker

CONFIG_DIR = Path(__file__).resolve().parents[3] / "examples" / "embodiment" / "config"
SPEC = EnvSpec(state_dim=4, image_shape=None, action_dim=1, num_actions=2, max_episode_steps=500)


@pytest.fixture
def cfg() -> EmbodiedConfig:
    return validate_config(compose_config("cartpole_ppo_mlp", CONFIG_DIR), EmbodiedConfig)


def _buckets(state: dict[str, torch.Tensor], version: int) -> list[WeightBucket]:
    items = list(state.items())
    half = len(items) // 2
    return [
        WeightBucket(version, 0, 2, items[:half]),
        WeightBucket(version, 1, 2, items[half:]),
    ]


def test_load_sync_takes_the_actors_weights_and_names_a_missing_one(cfg: EmbodiedConfig) -> None:
    host = PolicyHost(cfg, SPEC, rank=0, device=torch.device("cpu"))
    torch.manual_seed(123)
    actor = build_policy(cfg.actor.model, SPEC)
    state = {k: v.detach().clone() for k, v in actor.state_dict().items()}
    assert any(not torch.equal(v, host.policy.state_dict()[k]) for k, v in state.items())
    buckets = iter(_buckets(state, 7))
    assert host.load_sync(lambda: next(buckets)) == 7 == host.version
    for key, value in host.policy.state_dict().items():
        assert torch.equal(value, state[key]), key
    assert host.last_sync["tensors"] == len(state)
    missing = dict(state)
    dropped = sorted(missing)[0]
    del missing[dropped]
    buckets = iter(_buckets(missing, 8))
    with pytest.raises(RuntimeError, match=dropped.replace(".", r"\.")):
        host.load_sync(lambda: next(buckets))


def test_in_process_policy_answers_like_the_channels(cfg: EmbodiedConfig) -> None:
    """send_obs then recv_actions -> the action chunk, recv_output -> the full output."""
    host = PolicyHost(cfg, SPEC, rank=0, device=torch.device("cpu"))
    obs = {"states": torch.randn(3, 4)}
    final = {"states": torch.randn(3, 4)}
    train = InProcessPolicy(host, "train", sampling_generator(cfg, 5, 0, "train", host.device))
    with pytest.raises(RuntimeError, match=r"stream '0\.1': nothing to receive"):
        train.recv_actions("0.1")
    train.send_obs("0.0", (obs, final))
    train.send_obs("0.1", (obs, None))
    actions = train.recv_actions("0.0")
    assert actions.shape == (3, 1, 1) and bool(((actions == 0) | (actions == 1)).all())
    output = train.recv_output("0.0")
    assert torch.equal(output.actions, actions) and output.version == -1
    assert output.prev_values.shape[0] == 3 and output.bootstrap_values is not None
    with torch.no_grad():
        want = host.policy.get_value(final)[:, :1]
    assert torch.equal(output.bootstrap_values, want)
    torch.testing.assert_close(output.prev_values, host.policy.get_value(obs))
    train.recv_actions("0.1")
    assert train.recv_output("0.1").bootstrap_values is None
    train.send_obs("0.1", None)  # a stream's end: nothing to answer
    with pytest.raises(RuntimeError, match="nothing to receive"):
        train.recv_output("0.1")
    assert host.take_infer_time() > 0 and host.take_infer_time() == 0

    # The same seed samples the same actions; eval answers with the action only.
    again = InProcessPolicy(host, "train", sampling_generator(cfg, 5, 0, "train", host.device))
    again.send_obs("0.0", (obs, final))
    assert torch.equal(again.recv_actions("0.0"), actions)
    evaluate = InProcessPolicy(host, "eval", sampling_generator(cfg, 5, 0, "eval", host.device))
    evaluate.send_obs("0.0", (obs, None))
    evaluate.recv_actions("0.0")
    with pytest.raises(RuntimeError, match="nothing to receive"):
        evaluate.recv_output("0.0")


def test_a_last_observation_gets_its_values_without_an_action(cfg: EmbodiedConfig) -> None:
    """LastObs: one get, the values (and bootstrap values) that a full act would give, an
    empty action chunk, and the sampling generator left as it was (nothing is sampled)."""
    host = PolicyHost(cfg, SPEC, rank=0, device=torch.device("cpu"))
    obs, final = {"states": torch.randn(3, 4)}, {"states": torch.randn(3, 4)}
    generator = sampling_generator(cfg, 5, 0, "train", host.device)
    state = generator.get_state()
    local = InProcessPolicy(host, "train", generator)
    local.send_obs("0.0", LastObs((obs, final)))
    assert torch.equal(generator.get_state(), state)
    values_only = local.recv_output("0.0")
    with pytest.raises(RuntimeError, match="nothing to receive"):
        local.recv_output("0.0")  # no second message: the output was the only one
    assert values_only.actions.shape == (3, 0) and values_only.prev_logprobs is None
    assert values_only.version == host.version
    full = InProcessPolicy(host, "train", sampling_generator(cfg, 5, 0, "train", host.device))
    full.send_obs("0.0", (obs, final))
    full.recv_actions("0.0")
    complete = full.recv_output("0.0")
    assert torch.equal(values_only.prev_values, complete.prev_values)
    assert torch.equal(values_only.bootstrap_values, complete.bootstrap_values)


def test_rollout_worker_sends_last_observations_only_their_values(
    cfg: EmbodiedConfig, channel_name: str
) -> None:
    """MultiStepRolloutWorker._act on a real channel: a batch mixing an observation to act
    on and a LastObs samples actions for the batch but sends the LastObs stream only its
    output (values of a full act); a batch of LastObs alone samples nothing."""
    host = PolicyHost(cfg, SPEC, rank=0, device=torch.device("cpu"))
    worker = SimpleNamespace(cfg=cfg, _require_host=lambda: host)  # what _act reads of self
    acting, ending = {"states": torch.randn(2, 4)}, {"states": torch.randn(3, 4)}
    channel = Channel.create(channel_name, capacity_bytes=1 << 20)
    try:
        generator = sampling_generator(cfg, 5, 0, "train", host.device)
        items = [(acting, None), LastObs((ending, None))]
        MultiStepRolloutWorker._act(worker, items, ["0.0", "1.0"], channel, "train", generator)
        assert channel.qsize("0.0") == 2 and channel.qsize("1.0") == 1
        assert channel.get("0.0", timeout=60).shape == (2, 1, 1)
        assert channel.get("0.0", timeout=60).prev_logprobs is not None
        ended = channel.get("1.0", timeout=60)
        assert ended.actions.shape == (3, 1, 1)  # the complete output of the batch's act
        # Its values come from a 5-row batch: equal to a 3-row call up to float rounding.
        torch.testing.assert_close(ended.prev_values, host.policy.get_value(ending))

        state = generator.get_state()
        MultiStepRolloutWorker._act(
            worker, [LastObs((ending, None))], ["1.0"], channel, "train", generator
        )
        assert torch.equal(generator.get_state(), state)  # nothing sampled
        assert channel.qsize("1.0") == 1
        values_only = channel.get("1.0", timeout=60)
        assert values_only.actions.shape == (3, 0) and values_only.prev_logprobs is None
        assert torch.equal(values_only.prev_values, host.policy.get_value(ending))
    finally:
        channel.close()
        channel.unlink()


def test_rollout_worker_sends_the_actions_before_it_computes_the_values(
    cfg: EmbodiedConfig, channel_name: str
) -> None:
    """MLP policies set values_after_actions: _act sends the action chunk, then computes
    the values with get_value (while the env steps); the output equals one full act with
    the same generator (actions, logprobs, values and bootstrap values)."""
    host = PolicyHost(cfg, SPEC, rank=0, device=torch.device("cpu"))
    assert host.values_after_actions
    worker = SimpleNamespace(cfg=cfg, _require_host=lambda: host)
    obs, final = {"states": torch.randn(3, 4)}, {"states": torch.randn(3, 4)}
    channel = Channel.create(channel_name, capacity_bytes=1 << 20)
    queued_at_get_value: list[int] = []
    get_value = host.policy.get_value

    def recording_get_value(observations: dict[str, torch.Tensor]) -> torch.Tensor:
        queued_at_get_value.append(channel.qsize("0.0"))
        return get_value(observations)

    try:
        host.policy.get_value = recording_get_value  # type: ignore[method-assign]
        generator = sampling_generator(cfg, 5, 0, "train", host.device)
        MultiStepRolloutWorker._act(worker, [(obs, final)], ["0.0"], channel, "train", generator)
        host.policy.get_value = get_value  # type: ignore[method-assign]
        # get_value ran twice (values, then bootstrap values), each after the actions went out.
        assert queued_at_get_value == [1, 1]
        actions = channel.get("0.0", timeout=60)
        output = channel.get("0.0", timeout=60)
        one_call = host.act(
            [(obs, final)], "train", sampling_generator(cfg, 5, 0, "train", host.device)
        )
        assert torch.equal(actions, one_call.actions) and torch.equal(output.actions, actions)
        assert torch.equal(output.prev_logprobs, one_call.prev_logprobs)
        assert torch.equal(output.prev_values, one_call.prev_values)
        assert torch.equal(output.bootstrap_values, one_call.bootstrap_values)
        assert output.version == one_call.version
    finally:
        host.policy.get_value = get_value  # type: ignore[method-assign]
        channel.close()
        channel.unlink()
