"""Token VLA numerics: shapes, the restricted/top-k distribution, rollout-vs-actor parity,
greedy determinism, slot bidirectionality and sampling frequencies."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlinf.embodied.models import PolicyConfig, build_policy
from rlinf.embodied.models.vla.policy import TokenVLAPolicy
from rlinf.embodied.models.vla.tiny import make_tiny_vla, random_observations, tiny_env_spec
from rlinf.embodied.models.vla.token_sampling import sample_action_ids, warp_action_logits

STATE_DIM, ACTION_DIM, CHUNKS, BINS, N = 3, 2, 4, 32, 6
LOW, HIGH = [-0.5, 0.0], [0.5, 2.0]


pytestmark = pytest.mark.usefixtures("vla_offline")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_vla(
        "token",
        tmp_path_factory.mktemp("token_vla"),
        state_dim=STATE_DIM,
        action_dim=ACTION_DIM,
        num_action_chunks=CHUNKS,
        n_action_bins=BINS,
        action_low=LOW,
        action_high=HIGH,
        seed=1,
    )


def make_policy(model_dir: Path, temperature: float = 1.0, top_k: int = 0) -> TokenVLAPolicy:
    cfg = PolicyConfig(
        model_type="token_vla",
        model_path=model_dir,
        num_action_chunks=CHUNKS,
        temperature=temperature,
        top_k=top_k,
    )
    policy = build_policy(cfg, tiny_env_spec(state_dim=STATE_DIM, action_dim=ACTION_DIM))
    assert isinstance(policy, TokenVLAPolicy)
    return policy


@pytest.fixture(scope="module")
def policy(model_dir: Path) -> TokenVLAPolicy:
    return make_policy(model_dir)


def observations(n: int = N, seed: int = 0) -> dict[str, torch.Tensor]:
    spec = tiny_env_spec(state_dim=STATE_DIM, action_dim=ACTION_DIM)
    return random_observations(spec, n, torch.Generator().manual_seed(seed))


def slot_logits(policy: TokenVLAPolicy, obs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return policy._run(obs).action_logits


def test_predict_shapes_dtypes_and_action_range(policy: TokenVLAPolicy) -> None:
    obs = observations()
    out = policy.predict_action_batch(obs, "train", generator=torch.Generator().manual_seed(0))
    assert out.actions.shape == (N, CHUNKS, ACTION_DIM) and out.actions.dtype == torch.float32
    assert out.prev_logprobs is not None and out.prev_logprobs.shape == (N, CHUNKS * ACTION_DIM)
    assert out.prev_logprobs.dtype == torch.float32 and bool((out.prev_logprobs <= 0).all())
    assert out.prev_values is not None and out.prev_values.shape == (N, CHUNKS)
    fi = out.forward_inputs
    assert set(fi) == {"main_images", "task_ids", "states", "action_tokens"}
    assert all(isinstance(v, torch.Tensor) for v in fi.values())
    assert fi["main_images"].dtype == torch.uint8 and fi["task_ids"].dtype == torch.int64
    assert fi["states"].dtype == torch.float32
    tokens = fi["action_tokens"]
    assert tokens.shape == (N, CHUNKS, ACTION_DIM) and tokens.dtype == torch.int64
    vocab = policy.action_bins.vocab_size
    assert bool(((tokens >= vocab - BINS) & (tokens < vocab)).all())
    # de-normalised bin centres lie strictly inside [q01, q99] per dimension
    low, high = torch.tensor(LOW), torch.tensor(HIGH)
    assert bool(((out.actions > low) & (out.actions < high)).all())
    expected = low + (policy.action_bins.ids_to_values(tokens) + 1) / 2 * (high - low)
    assert torch.allclose(out.actions, expected, atol=1e-6)


def test_probability_is_zero_outside_the_bins_and_outside_top_k(policy: TokenVLAPolicy) -> None:
    logits = slot_logits(policy, observations())
    bins = policy.action_bins
    assert bool(torch.isfinite(logits[..., : bins.first_id]).all())  # words do get raw logits
    for top_k in (0, 5):
        probs = torch.softmax(warp_action_logits(logits, bins, 1.3, top_k), dim=-1)
        assert bool((probs[..., : bins.first_id] == 0).all())
        assert torch.allclose(probs.sum(-1), torch.ones(probs.shape[:-1]))
        kept = (probs > 0).sum(-1)
        assert bool((kept == (top_k or BINS)).all())
        if top_k:
            top = torch.topk(logits[..., bins.first_id :], top_k, dim=-1).indices + bins.first_id
            allowed = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, top, True)
            assert bool((probs[~allowed] == 0).all())
    # sampled tokens obey top-k
    policy5 = make_policy(policy.model_path, top_k=5)
    obs = observations()
    out = policy5.predict_action_batch(obs, "train", generator=torch.Generator().manual_seed(4))
    top = torch.topk(logits[..., bins.first_id :], 5, dim=-1).indices + bins.first_id
    flat = out.forward_inputs["action_tokens"].reshape(N, -1, 1)
    assert bool((flat == top).any(-1).all())


@pytest.mark.parametrize("temperature", [1.0, 1.6])
@pytest.mark.parametrize("top_k", [0, 5])
def test_actor_logprobs_equal_rollout_logprobs(
    model_dir: Path, temperature: float, top_k: int
) -> None:
    policy = make_policy(model_dir, temperature, top_k)
    out = policy.predict_action_batch(
        observations(8), "train", generator=torch.Generator().manual_seed(7)
    )
    assert out.prev_logprobs is not None
    stats = policy(out.forward_inputs, compute_entropy=True, compute_values=True)
    assert stats["logprobs"].requires_grad
    assert float((stats["logprobs"].detach() - out.prev_logprobs).abs().max()) <= 1e-5
    assert stats["entropy"].shape == (8, CHUNKS * ACTION_DIM)
    assert bool((stats["entropy"] > 0).all())
    assert bool((stats["entropy"] <= torch.log(torch.tensor(float(top_k or BINS))) + 1e-5).all())
    # re-batched rows (the actor's minibatches) score the same
    perm = torch.tensor([5, 2, 7, 0])
    sub = {key: value[perm] for key, value in out.forward_inputs.items()}
    sub_stats = policy.default_forward(sub)
    assert float((sub_stats["logprobs"].detach() - out.prev_logprobs[perm]).abs().max()) <= 1e-5
    # the check can fail: another warping gives other logprobs
    other = make_policy(model_dir, temperature * 0.5, top_k)
    shifted = other.default_forward(out.forward_inputs)["logprobs"].detach()
    assert float((shifted - out.prev_logprobs).abs().max()) > 1e-3


def test_greedy_eval_is_deterministic_argmax(policy: TokenVLAPolicy) -> None:
    obs = observations()
    first = policy.predict_action_batch(obs, "eval", generator=torch.Generator().manual_seed(0))
    second = policy.predict_action_batch(obs, "eval", generator=torch.Generator().manual_seed(9))
    assert torch.equal(first.actions, second.actions)
    assert first.prev_logprobs is not None and second.prev_logprobs is not None
    assert torch.equal(first.prev_logprobs, second.prev_logprobs)
    argmax = slot_logits(policy, obs)[..., policy.action_bins.first_id :].argmax(-1)
    tokens = first.forward_inputs["action_tokens"].reshape(N, -1)
    assert torch.equal(tokens, argmax + policy.action_bins.first_id)
    sampled = policy.predict_action_batch(obs, "train", generator=torch.Generator().manual_seed(0))
    assert not torch.equal(sampled.actions, first.actions)


def test_action_slots_are_bidirectional_and_never_leak_into_the_prefix(
    policy: TokenVLAPolicy,
) -> None:
    obs = observations(3)
    batch = policy._model_inputs(policy._read_obs(obs, needs_states=True))
    model = policy.model
    slots = model.slot_embeddings.weight.detach().unsqueeze(0).expand(3, -1, -1).clone()
    with torch.no_grad():
        base = model(
            batch.pixel_values,
            batch.input_ids,
            batch.attention_mask,
            batch.states,
            slot_embeds=slots,
        )
        for j in (0, CHUNKS * ACTION_DIM - 1):
            perturbed = slots.clone()
            perturbed[:, j] += torch.randn(
                perturbed[:, j].shape, generator=torch.Generator().manual_seed(j)
            )
            out = model(
                batch.pixel_values,
                batch.input_ids,
                batch.attention_mask,
                batch.states,
                slot_embeds=perturbed,
            )
            assert torch.equal(out.prefix_hidden, base.prefix_hidden)
            assert out.values is not None and base.values is not None
            assert torch.equal(out.values, base.values)
            others = [i for i in range(CHUNKS * ACTION_DIM) if i != j]
            change = (out.action_logits[:, others] - base.action_logits[:, others]).abs()
            # every other slot (before AND after j) reacts: attention is not causal among slots
            assert bool((change.amax(dim=(0, 2)) > 1e-6).all())


def test_padding_does_not_change_the_outputs(policy: TokenVLAPolicy) -> None:
    obs = observations(3)
    batch = policy._model_inputs(policy._read_obs(obs, needs_states=True))
    longer_ids = torch.nn.functional.pad(batch.input_ids, (3, 0))
    longer_mask = torch.nn.functional.pad(batch.attention_mask, (3, 0))
    with torch.no_grad():
        a = policy.model(batch.pixel_values, batch.input_ids, batch.attention_mask, batch.states)
        b = policy.model(batch.pixel_values, longer_ids, longer_mask, batch.states)
    assert torch.allclose(a.action_logits, b.action_logits, atol=1e-5)
    assert a.values is not None and b.values is not None
    assert torch.allclose(a.values, b.values, atol=1e-5)


def test_sample_frequencies_match_the_softmax(policy: TokenVLAPolicy) -> None:
    logits = slot_logits(policy, observations(1))[0, 0]
    warped = warp_action_logits(logits, policy.action_bins, 0.05, 0)
    probs = torch.softmax(warped, -1)[policy.action_bins.first_id :].double()
    assert float(probs.max() / probs.min()) > 3  # a clearly non-uniform target
    draws = 20_000
    ids = sample_action_ids(
        warped.expand(draws, -1), greedy=False, generator=torch.Generator().manual_seed(123)
    )
    counts = torch.bincount(ids - policy.action_bins.first_id, minlength=BINS).double()
    assert int(counts.sum()) == draws
    expected = probs * draws
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum().view(1)])
    wanted = torch.cat([expected[big], expected[~big].sum().view(1)])
    if float(wanted[-1]) == 0:
        observed, wanted = observed[:-1], wanted[:-1]
    chi2 = float(((observed - wanted) ** 2 / wanted).sum())
    dof = observed.numel() - 1
    assert chi2 < dof + 6 * (2 * dof) ** 0.5, (chi2, dof)  # ~6 sigma: loose, but catches bias
    # and the test can fail: against uniform frequencies the statistic explodes
    uniform = torch.full_like(counts, draws / BINS)
    assert float(((counts - uniform) ** 2 / uniform).sum()) > 10 * (dof + 6 * (2 * dof) ** 0.5)
