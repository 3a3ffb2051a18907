"""``openvla`` policy on tiny OpenVLA / OpenVLA-OFT directories: decoding against stock
``generate``, the parallel layout, rollout-vs-actor logprobs, the value position, LoRA,
errors and behaviour cloning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor
from transformers import LogitsProcessor, LogitsProcessorList

from rlinf.core.protocols.instruction_text import INSTRUCTION_TEXT_KEY, encode_instruction_text
from rlinf.embodied.models import PolicyConfig, build_policy
from rlinf.embodied.models.config import LoRAConfig
from rlinf.embodied.models.vla.openvla.policy import LORA_TARGET_MODULES, OpenVLAPolicy
from rlinf.embodied.models.vla.openvla.tiny import make_tiny_openvla
from rlinf.embodied.models.vla.tiny import make_tiny_vla, random_observations, tiny_env_spec

ACTION_DIM, STATE_DIM, N = 3, 2, 5
CHUNKS = {"autoregressive": 2, "parallel": 2}
MODES = ("autoregressive", "parallel")
INSTRUCTIONS = ("move to the red square", "go to the green block", "reach the blue target now")

pytestmark = pytest.mark.usefixtures("vla_offline")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("openvla")
    return {
        "autoregressive": make_tiny_openvla(
            root / "ar",
            decode_mode="autoregressive",
            action_dim=ACTION_DIM,
            num_action_chunks=CHUNKS["autoregressive"],
            instructions=INSTRUCTIONS[:2],  # the third is split further: padding
            seed=1,
        ),
        "parallel": make_tiny_openvla(
            root / "oft",
            decode_mode="parallel",
            action_dim=ACTION_DIM,
            num_action_chunks=CHUNKS["parallel"],
            instructions=INSTRUCTIONS[:2],  # the third is split further: padding
            state_dim=STATE_DIM,
            seed=2,
            action_low=[-0.5, 0.0, -2.0],
            action_high=[0.5, 2.0, 2.0],
        ),
    }


def spec(mode: str, **overrides: Any) -> Any:
    kwargs: dict[str, Any] = {
        "action_dim": ACTION_DIM,
        "state_dim": STATE_DIM if mode == "parallel" else 0,
        "instructions": INSTRUCTIONS,
    }
    return tiny_env_spec(**{**kwargs, **overrides})


def make_policy(path: Path, mode: str, **overrides: Any) -> OpenVLAPolicy:
    cfg = PolicyConfig(
        model_type="openvla", model_path=path, num_action_chunks=CHUNKS[mode], **overrides
    )
    policy = build_policy(cfg, spec(mode))
    assert isinstance(policy, OpenVLAPolicy)
    return policy


def observations(mode: str, n: int = N, seed: int = 0) -> dict[str, Tensor]:
    obs = random_observations(spec(mode), n, torch.Generator().manual_seed(seed))
    obs["task_ids"] = torch.arange(n) % len(INSTRUCTIONS)  # every prompt length, padding too
    return obs


class RestrictToBins(LogitsProcessor):
    """The reference restriction: every id outside ``[first, end)`` gets -inf."""

    def __init__(self, first: int, end: int) -> None:
        self.first, self.end = first, end

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        out = torch.full_like(scores, float("-inf"))
        out[:, self.first : self.end] = scores[:, self.first : self.end]
        return out  # type: ignore[return-value]


def test_prompts_are_openvla_prompts_left_padded_with_the_empty_piece(
    model_dirs: dict[str, Path],
) -> None:
    policy = make_policy(model_dirs["autoregressive"], "autoregressive")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dirs["autoregressive"]))
    empty = tokenizer.convert_tokens_to_ids("▁")
    lengths = policy.prompt_mask.sum(1)
    assert len(set(lengths.tolist())) > 1  # the prompts differ in length: padding is tested
    for row, text in enumerate(INSTRUCTIONS):
        ids = policy.prompt_ids[row][policy.prompt_mask[row].bool()].tolist()
        prompt = f"In: What action should the robot take to {text.lower()}?\nOut:"
        assert ids == [*tokenizer(prompt)["input_ids"], empty]
        assert ids[0] == tokenizer.bos_token_id
    assert bool((policy.prompt_mask[:, -1] == 1).all())  # left padding


def test_greedy_autoregressive_decode_equals_generate_with_a_bin_processor(
    model_dirs: dict[str, Path],
) -> None:
    policy = make_policy(model_dirs["autoregressive"], "autoregressive")
    obs = observations("autoregressive")
    out = policy.predict_action_batch(obs, "eval")
    tokens = out.forward_inputs["action_tokens"].reshape(N, -1)
    model, config = policy.model, policy.model.config
    with torch.no_grad():
        prefix, valid = model.embed_prefix(**policy._model_inputs(policy._read_obs(obs)))
        reference = model.language_model.generate(  # type: ignore[misc]
            inputs_embeds=prefix,
            attention_mask=valid.long(),
            max_new_tokens=config.num_action_tokens,
            do_sample=False,
            logits_processor=LogitsProcessorList(
                [RestrictToBins(config.action_vocab_size - 256, config.action_vocab_size)]
            ),
            pad_token_id=config.pad_token_id,
            eos_token_id=None,
        )
    assert torch.equal(tokens, reference[:, -config.num_action_tokens :])
    # the actions are the de-normalised bin centres of those tokens
    centers = policy.action_tokenizer.decode(out.forward_inputs["action_tokens"])
    torch.testing.assert_close(out.actions, centers)  # statistics are [-1, 1]


def test_parallel_decode_is_one_forward_over_zero_placeholders_then_stop_read_shifted(
    model_dirs: dict[str, Path],
) -> None:
    policy = make_policy(model_dirs["parallel"], "parallel")
    model, config = policy.model, policy.model.config
    obs = observations("parallel")
    batch = policy._model_inputs(policy._read_obs(obs))
    count = config.num_action_tokens
    assert count == CHUNKS["parallel"] * ACTION_DIM
    with torch.no_grad():
        out = model(**batch)
        prefix, valid = model.embed_prefix(**batch)
        tail = model.parallel_tail(N, prefix.dtype, prefix.device)
        stop = model.embed_tokens(torch.tensor([config.stop_token_id]))
        full = model.language_model(
            inputs_embeds=torch.cat([prefix, tail], dim=1),
            attention_mask=torch.cat([valid, valid.new_ones(N, count + 1)], dim=1).long(),
        ).logits
    assert tail.shape == (N, count + 1, prefix.shape[-1])
    assert bool((tail[:, :count] == 0).all())
    assert torch.equal(tail[:, count], stop.expand(N, -1))
    assert config.stop_token_id == 2
    # position P - 1 + j predicts action token j (the last prompt token predicts the first)
    length = prefix.shape[1]
    assert out.action_logits.shape == (N, count, config.text_config["vocab_size"])
    torch.testing.assert_close(
        out.action_logits, full[:, length - 1 : length - 1 + count].float(), atol=1e-5, rtol=1e-5
    )
    # the proprio token sits right after the patches: changing the states changes the actions
    moved = dict(batch, proprio=batch["proprio"] + 1.0)
    with torch.no_grad():
        assert not torch.allclose(model(**moved).action_logits, out.action_logits)
    result = policy.predict_action_batch(obs, "train", generator=torch.Generator().manual_seed(0))
    assert result.actions.shape == (N, CHUNKS["parallel"], ACTION_DIM)
    low, high = torch.tensor([-0.5, 0.0, -2.0]), torch.tensor([0.5, 2.0, 2.0])
    assert bool(((result.actions >= low) & (result.actions <= high)).all())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("top_k", [0, 5])
def test_actor_logprobs_equal_rollout_logprobs(
    model_dirs: dict[str, Path], mode: str, temperature: float, top_k: int
) -> None:
    policy = make_policy(model_dirs[mode], mode, temperature=temperature, top_k=top_k)
    out = policy.predict_action_batch(
        observations(mode, 6), "train", generator=torch.Generator().manual_seed(7)
    )
    assert out.prev_logprobs is not None and out.prev_values is not None
    count = CHUNKS[mode] * ACTION_DIM
    assert out.prev_logprobs.shape == (6, count)
    fi = out.forward_inputs
    expected_keys = {"main_images", "task_ids", "action_tokens"}
    assert set(fi) == expected_keys | ({"states"} if mode == "parallel" else set())
    assert fi["action_tokens"].dtype == torch.int64
    first = policy.action_tokenizer.first_id
    assert bool(((fi["action_tokens"] >= first) & (fi["action_tokens"] < first + 256)).all())
    stats = policy(fi, compute_entropy=True, compute_values=True)
    assert stats["logprobs"].requires_grad
    assert float((stats["logprobs"].detach() - out.prev_logprobs).abs().max()) <= 1e-5
    assert float((stats["values"].detach() - out.prev_values).abs().max()) <= 1e-5
    bound = torch.log(torch.tensor(float(top_k or 256))) + 1e-5
    assert bool((stats["entropy"] > 0).all()) and bool((stats["entropy"] <= bound).all())
    perm = torch.tensor([4, 1, 3])  # the actor's re-batched minibatches score the same
    sub = policy.default_forward({key: value[perm] for key, value in fi.items()})
    assert float((sub["logprobs"].detach() - out.prev_logprobs[perm]).abs().max()) <= 1e-5
    if top_k:  # sampled tokens obey top-k: probability 0 outside would give -inf logprobs
        assert bool(torch.isfinite(out.prev_logprobs).all())


@pytest.mark.parametrize("mode", MODES)
def test_value_head_reads_the_last_prompt_token(model_dirs: dict[str, Path], mode: str) -> None:
    policy = make_policy(model_dirs[mode], mode)
    model = policy.model
    assert model.value_head is not None
    obs = observations(mode)
    out = policy.predict_action_batch(obs, "train", generator=torch.Generator().manual_seed(1))
    batch = policy._model_inputs(policy._read_obs(obs))
    with torch.no_grad():
        prefix, valid = model.embed_prefix(**batch)
        hidden, _ = model.hidden_states(prefix, valid)
        expected = model.value_head(hidden[:, -1])
        # the last prefix position is the "▁" piece in every (left-padded) row
        assert bool((batch["input_ids"][:, -1] == batch["input_ids"][0, -1]).all())
    assert out.prev_values is not None and out.prev_values.shape == (N, CHUNKS[mode])
    torch.testing.assert_close(out.prev_values, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(policy.get_value(obs), expected, atol=1e-5, rtol=1e-5)
    # other action tokens do not change the values (the value position precedes them)
    fi = dict(out.forward_inputs)
    fi["action_tokens"] = torch.full_like(fi["action_tokens"], policy.action_tokenizer.first_id)
    values = policy.default_forward(fi, compute_logprobs=False, compute_values=True)["values"]
    torch.testing.assert_close(values.detach(), expected, atol=1e-5, rtol=1e-5)


def test_a_checkpoint_without_value_head_gets_a_seeded_fresh_one(tmp_path: Path) -> None:
    path = make_tiny_openvla(tmp_path / "m", action_dim=ACTION_DIM, add_value_head=False)
    cfg = PolicyConfig(model_type="openvla", model_path=path, value_type="chunk_level")
    first = build_policy(cfg, spec("autoregressive"))
    second = build_policy(cfg, spec("autoregressive"))
    obs = random_observations(spec("autoregressive"), 3, torch.Generator().manual_seed(0))
    values = first.get_value(obs)
    assert values.shape == (3, 1)
    assert torch.equal(values, second.get_value(obs))  # rollout and actor build the same head
    no_head = build_policy(cfg.model_copy(update={"add_value_head": False}), spec("autoregressive"))
    assert torch.equal(no_head.get_value(obs), torch.zeros(3, 1))


@pytest.mark.parametrize("mode", MODES)
def test_lora_adapts_the_openvla_targets_and_trains(model_dirs: dict[str, Path], mode: str) -> None:
    plain = make_policy(model_dirs[mode], mode)
    policy = make_policy(model_dirs[mode], mode, lora=LoRAConfig(rank=4))
    obs = observations(mode)
    # a fresh adapter is an identity
    assert torch.equal(
        plain.predict_action_batch(obs, "eval").actions,
        policy.predict_action_batch(obs, "eval").actions,
    )
    adapted = {
        name.split(".lora_A.")[0] for name, _ in policy.named_parameters() if ".lora_A." in name
    }
    suffixes = {name.rsplit(".", 1)[-1] for name in adapted}
    assert suffixes == set(LORA_TARGET_MODULES)
    assert "model.vision_backbone.featurizer.patch_embed.proj" in adapted  # conv, as RLinf
    assert "model.projector.fc3" in adapted and "model.language_model.lm_head" in adapted
    assert not any("proprio_projector" in name or "value_head" in name for name in adapted)
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    assert all("lora_" in name or name.startswith("model.value_head.") for name in trainable)
    assert any(name.startswith("model.value_head.") for name in trainable)
    frozen = {
        name: p.detach().clone() for name, p in policy.named_parameters() if not p.requires_grad
    }
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    actions = torch.rand(N, CHUNKS[mode], ACTION_DIM, generator=torch.Generator().manual_seed(3))
    before = float(policy.behaviour_cloning_loss(obs, actions).detach())
    for _ in range(3):
        loss = policy.behaviour_cloning_loss(obs, actions)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    assert float(policy.behaviour_cloning_loss(obs, actions).detach()) < before
    for name, param in policy.named_parameters():
        if name in frozen:
            assert torch.equal(param.detach(), frozen[name]), name
    assert any(
        float(p.detach().abs().max()) > 0 for n, p in policy.named_parameters() if "lora_B" in n
    )


@pytest.mark.parametrize("mode", MODES)
def test_behaviour_cloning_loss_decreases_on_fixed_data(
    model_dirs: dict[str, Path], mode: str
) -> None:
    policy = make_policy(model_dirs[mode], mode)
    obs = observations(mode, 4, seed=5)
    gen = torch.Generator().manual_seed(6)
    low = torch.tensor([-0.5, 0.0, -2.0]) if mode == "parallel" else -torch.ones(ACTION_DIM)
    high = torch.tensor([0.5, 2.0, 2.0]) if mode == "parallel" else torch.ones(ACTION_DIM)
    actions = low + torch.rand(4, CHUNKS[mode], ACTION_DIM, generator=gen) * (high - low)
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = policy.behaviour_cloning_loss(obs, actions)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[0] == pytest.approx(float(torch.log(torch.tensor(256.0))), rel=0.05)
    assert losses[-1] < 0.5 * losses[0]
    if mode == "parallel":
        # zero-input placeholders are told apart only by RoPE from layer 2 on: slower to fit
        return
    # after fitting, greedy decoding reproduces the expert's tokens
    tokens = policy.predict_action_batch(obs, "eval").forward_inputs["action_tokens"]
    normalizer = policy.action_normalizer
    target = policy.action_tokenizer.encode(normalizer.normalize(actions))
    assert float((tokens == target).float().mean()) > 0.9


def test_save_pretrained_reloads_the_same_policy(
    model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    policy = make_policy(model_dirs["parallel"], "parallel")
    with torch.no_grad():
        for param in policy.model.projector.parameters():
            param.add_(0.01)
    out = policy.save_pretrained(tmp_path / "saved")
    reloaded = make_policy(out, "parallel")
    obs = observations("parallel")
    first = policy.predict_action_batch(obs, "eval")
    second = reloaded.predict_action_batch(obs, "eval")
    assert torch.equal(first.actions, second.actions)
    assert first.prev_values is not None and second.prev_values is not None
    assert torch.equal(first.prev_values, second.prev_values)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_errors_name_the_key_the_value_and_the_fix(
    model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    ar = model_dirs["autoregressive"]
    build = build_policy
    with pytest.raises(ValueError, match=r"model_path is not set.*make-tiny-vla --kind openvla"):
        build(PolicyConfig(model_type="openvla", num_action_chunks=2), spec("autoregressive"))
    pi0_dir = make_tiny_vla("pi0", tmp_path / "pi0", action_dim=ACTION_DIM)
    with pytest.raises(ValueError, match=r"model_type='pi0' but model_type 'openvla'.*-> pi0"):
        build(PolicyConfig(model_type="openvla", model_path=pi0_dir), spec("autoregressive"))
    with pytest.raises(ValueError, match=r"EnvSpec\.action_dim=4 .*action_dim=3.*action_dim=4\)"):
        build(
            PolicyConfig(model_type="openvla", model_path=ar, num_action_chunks=2),
            spec("autoregressive", action_dim=4),
        )
    with pytest.raises(ValueError, match=r"num_action_chunks=1 .*num_action_chunks: 2"):
        build(PolicyConfig(model_type="openvla", model_path=ar), spec("autoregressive"))
    with pytest.raises(ValueError, match=r"EnvSpec\.state_dim=5 .*proprio_dim=2"):
        build(
            PolicyConfig(
                model_type="openvla", model_path=model_dirs["parallel"], num_action_chunks=2
            ),
            spec("parallel", state_dim=5),
        )
    no_tokenizer = _copy(ar, tmp_path / "no_tok")
    (no_tokenizer / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"no tokenizer \(tokenizer\.json"):
        build(
            PolicyConfig(model_type="openvla", model_path=no_tokenizer, num_action_chunks=2),
            spec("autoregressive"),
        )
    no_processor = _copy(ar, tmp_path / "no_proc")
    (no_processor / "preprocessor_config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"preprocessor_config\.json"):
        build(
            PolicyConfig(model_type="openvla", model_path=no_processor, num_action_chunks=2),
            spec("autoregressive"),
        )
    no_stats = _copy(ar, tmp_path / "no_stats")
    (no_stats / "dataset_statistics.json").unlink()
    config = json.loads((no_stats / "config.json").read_text())
    build(  # config.json's norm_stats are the fallback, as in openvla-7b
        PolicyConfig(model_type="openvla", model_path=no_stats, num_action_chunks=2),
        spec("autoregressive"),
    )
    config["norm_stats"] = None
    (no_stats / "config.json").write_text(json.dumps(config))
    with pytest.raises(FileNotFoundError, match=r"dataset_statistics\.json is missing.*norm_stats"):
        build(
            PolicyConfig(model_type="openvla", model_path=no_stats, num_action_chunks=2),
            spec("autoregressive"),
        )
    with pytest.raises(ValueError, match=r"unnorm_key='bridge'.*\['tiny'\]"):
        build(
            PolicyConfig(
                model_type="openvla", model_path=ar, num_action_chunks=2, unnorm_key="bridge"
            ),
            spec("autoregressive"),
        )
    bad_mode = _copy(ar, tmp_path / "bad_mode")
    config = json.loads((bad_mode / "config.json").read_text())
    config["decode_mode"] = "beam"
    (bad_mode / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"decode_mode='beam'.*autoregressive"):
        build(
            PolicyConfig(model_type="openvla", model_path=bad_mode, num_action_chunks=2),
            spec("autoregressive"),
        )


# --- free-form instructions (obs["instruction_text"]) -----------------------------------------

UNSEEN = ("navigate towards the crimson tile please", "go to the green block", "ok")


def text_observations(
    mode: str, texts: tuple[str, ...], n: int = N, seed: int = 0
) -> dict[str, Tensor]:
    obs = observations(mode, n, seed)
    obs[INSTRUCTION_TEXT_KEY] = encode_instruction_text([texts[i % len(texts)] for i in range(n)])
    return obs


@pytest.mark.parametrize("mode", MODES)
def test_an_unseen_instruction_text_is_tokenized_into_the_prompt(
    model_dirs: dict[str, Path], mode: str
) -> None:
    from transformers import AutoTokenizer

    policy = make_policy(model_dirs[mode], mode)
    assert UNSEEN[0] not in INSTRUCTIONS
    obs = text_observations(mode, UNSEEN)
    out = policy.predict_action_batch(obs, "train", generator=torch.Generator().manual_seed(0))
    assert out.prev_logprobs is not None and bool(torch.isfinite(out.prev_logprobs).all())
    assert out.actions.shape == (N, CHUNKS[mode], ACTION_DIM)
    # the text rides along, so the actor reads what the rollout read
    assert torch.equal(out.forward_inputs[INSTRUCTION_TEXT_KEY], obs[INSTRUCTION_TEXT_KEY])
    tokenizer = AutoTokenizer.from_pretrained(str(model_dirs[mode]))
    empty = tokenizer.convert_tokens_to_ids("▁")
    batch = policy._model_inputs(policy._read_obs(obs))
    for row in range(N):
        text = UNSEEN[row % len(UNSEEN)]
        ids = batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist()
        prompt = f"In: What action should the robot take to {text.lower()}?\nOut:"
        assert ids == [*tokenizer(prompt)["input_ids"], empty], text
    assert set(UNSEEN) <= set(policy._prompt_cache)  # each text tokenized once, then cached


@pytest.mark.parametrize("mode", MODES)
def test_actor_logprobs_equal_rollout_logprobs_with_instruction_text(
    model_dirs: dict[str, Path], mode: str
) -> None:
    policy = make_policy(model_dirs[mode], mode, temperature=0.7)
    obs = text_observations(mode, UNSEEN, 6)
    out = policy.predict_action_batch(obs, "train", generator=torch.Generator().manual_seed(3))
    assert out.prev_logprobs is not None and out.prev_values is not None
    fi = out.forward_inputs
    assert INSTRUCTION_TEXT_KEY in fi
    stats = policy(fi, compute_values=True)
    assert float((stats["logprobs"].detach() - out.prev_logprobs).abs().max()) <= 1e-5
    assert float((stats["values"].detach() - out.prev_values).abs().max()) <= 1e-5
    # a minibatch of the short prompts only is padded less: the same scores
    perm = torch.tensor([1, 2, 4, 5])
    sub = policy.default_forward({key: value[perm] for key, value in fi.items()})
    assert float((sub["logprobs"].detach() - out.prev_logprobs[perm]).abs().max()) <= 1e-5


@pytest.mark.parametrize("mode", MODES)
def test_instruction_text_overrides_task_ids(model_dirs: dict[str, Path], mode: str) -> None:
    policy = make_policy(model_dirs[mode], mode)
    plain = observations(mode, 6)
    by_ids = policy.predict_action_batch(plain, "eval")
    # every task_id says instruction 0, the text says the instruction task_ids named
    texted = dict(plain)
    texted["task_ids"] = torch.zeros_like(plain["task_ids"])
    texted[INSTRUCTION_TEXT_KEY] = encode_instruction_text(
        [INSTRUCTIONS[int(i)] for i in plain["task_ids"]]
    )
    by_text = policy.predict_action_batch(texted, "eval")
    assert torch.equal(
        by_text.forward_inputs["action_tokens"], by_ids.forward_inputs["action_tokens"]
    )
    torch.testing.assert_close(by_text.prev_logprobs, by_ids.prev_logprobs, atol=1e-5, rtol=1e-5)
    # and without the text the zeros would be read: other scores
    zeros = {k: v for k, v in texted.items() if k != INSTRUCTION_TEXT_KEY}
    scored = policy.default_forward(
        {**zeros, "action_tokens": by_ids.forward_inputs["action_tokens"]}
    )
    assert by_ids.prev_logprobs is not None
    assert float((scored["logprobs"].detach() - by_ids.prev_logprobs).abs().max()) > 1e-3


def test_a_malformed_instruction_text_is_refused(model_dirs: dict[str, Path]) -> None:
    policy = make_policy(model_dirs["autoregressive"], "autoregressive")
    obs = observations("autoregressive")
    obs[INSTRUCTION_TEXT_KEY] = encode_instruction_text(["move"] * (N - 1))
    with pytest.raises(ValueError, match=r"instruction_text'\] must be uint8 \[n=5, L\]"):
        policy.predict_action_batch(obs, "eval")
