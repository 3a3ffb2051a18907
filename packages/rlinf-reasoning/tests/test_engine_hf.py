"""HFEngine: generation, logprobs vs the actor's recomputation, weights, offload."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

from rlinf.reasoning.engines import (
    GenerationOutput,
    HFEngine,
    RolloutEngine,
    SamplingParams,
    create_engine,
)
from rlinf.reasoning.models import (
    compute_token_logprobs,
    compute_token_logprobs_and_entropy,
    position_ids_from_attention_mask,
)
from rlinf.reasoning.toy_task import build_tokenizer, build_toy_model, toy_model_config

PROMPTS = [[1, 5, 6, 18, 7], [1, 9], [1, 12, 13, 14, 15, 16, 17, 4], [1, 8, 8]]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    # Tiny models are an order of magnitude faster on one thread on a shared box.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tiny_model(seed: int = 0) -> Qwen2ForCausalLM:
    tok = build_tokenizer()
    model = build_toy_model(toy_model_config(tok, hidden_size=64, num_layers=2), seed=seed)
    torch.nn.Module.eval(model)
    return model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny_model")
    _tiny_model(seed=0).save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path


@pytest.fixture
def engine(model_dir: Path) -> HFEngine:
    return HFEngine(model_dir, dtype="float32", device="cpu")


def _actor_batch(
    prompts: list[list[int]], outs: list[GenerationOutput], pad: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The actor layout: prompts left-padded to P, responses right-padded after P."""
    p_len = max(len(p) for p in prompts)
    r_len = max(o.num_tokens for o in outs)
    ids = torch.full((len(outs), p_len + r_len), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for k, o in enumerate(outs):
        prompt = prompts[o.prompt_index]
        ids[k, p_len - len(prompt) : p_len] = torch.tensor(prompt)
        mask[k, p_len - len(prompt) : p_len] = 1
        ids[k, p_len : p_len + o.num_tokens] = torch.tensor(o.output_ids)
        mask[k, p_len : p_len + o.num_tokens] = 1
    return ids, mask, p_len


def _recompute(
    model: torch.nn.Module, prompts: list[list[int]], outs: list[GenerationOutput], t: float
) -> torch.Tensor:
    ids, mask, p_len = _actor_batch(prompts, outs, pad=0)
    dev = next(model.parameters()).device
    with torch.no_grad():
        return compute_token_logprobs(
            model, ids.to(dev), mask.to(dev), response_start=p_len, temperature=t
        )


# ----------------------------------------------------------------- logprobs


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"),
    [(1.0, 1.0, -1), (0.7, 1.0, -1), (0.7, 0.9, -1), (0.7, 1.0, 5), (1.3, 0.8, 8)],
)
def test_engine_logprobs_match_actor_recomputation(
    engine: HFEngine, temperature: float, top_p: float, top_k: int
) -> None:
    params = SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=20, seed=3
    )
    outs = engine.generate(PROMPTS, 4, params)
    recomputed = _recompute(engine.model, PROMPTS, outs, temperature)
    for k, o in enumerate(outs):
        assert len(o.logprobs) == o.num_tokens
        got = torch.tensor(o.logprobs)
        assert torch.allclose(got, recomputed[k, : o.num_tokens], atol=1e-4, rtol=0), k
        assert (got <= 0).all()


def test_filtered_sampling_only_draws_inside_top_k(engine: HFEngine) -> None:
    top_k = 3
    outs = engine.generate(PROMPTS, 4, SamplingParams(top_k=top_k, max_new_tokens=12, seed=0))
    ids, mask, p_len = _actor_batch(PROMPTS, outs, pad=0)
    with torch.no_grad():
        logits = engine.model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids_from_attention_mask(mask)
        ).logits[:, p_len - 1 : -1]
    for k, o in enumerate(outs):
        for t, tok in enumerate(o.output_ids):
            rank = int((logits[k, t] > logits[k, t, tok]).sum())
            assert rank < top_k


def test_greedy_is_padding_invariant_and_takes_argmax(engine: HFEngine) -> None:
    greedy = SamplingParams(top_k=1, max_new_tokens=10)
    batched = engine.generate(PROMPTS, 1, greedy)
    for i, prompt in enumerate(PROMPTS):
        alone = engine.generate([prompt], 1, greedy)[0]
        assert alone.output_ids == batched[i].output_ids
        assert alone.logprobs == pytest.approx(batched[i].logprobs, abs=1e-5)
    # Each greedy token is the argmax of the recomputed distribution.
    ids, mask, p_len = _actor_batch(PROMPTS, batched, pad=0)
    with torch.no_grad():
        logits = engine.model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids_from_attention_mask(mask)
        ).logits[:, p_len - 1 : -1]
    for k, o in enumerate(batched):
        assert logits[k, : o.num_tokens].argmax(-1).tolist() == o.output_ids


def test_compute_token_logprobs_masks_and_entropy() -> None:
    model = _tiny_model(seed=1)
    ids = torch.tensor([[0, 0, 1, 5, 6, 7, 8], [1, 9, 10, 11, 12, 13, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0]])
    with torch.no_grad():
        lp, ent = compute_token_logprobs_and_entropy(
            model, ids, mask, response_start=4, temperature=0.5, response_mask=mask
        )
        plain = compute_token_logprobs(model, ids, mask, response_start=4, temperature=0.5)
        # Row 0 without padding, positions from 0: same values.
        alone = model(input_ids=ids[:1, 2:]).logits[0, 1:4].float() / 0.5
    assert lp.shape == ent.shape == (2, 3)
    assert lp[1, 2] == 0 and ent[1, 2] == 0  # masked (right padding)
    assert torch.allclose(lp[:, :2], plain[:, :2])
    expected = torch.log_softmax(alone, -1).gather(-1, ids[0, 4:, None]).squeeze(-1)
    assert torch.allclose(plain[0], expected, atol=1e-5)
    assert (ent[:, :2] > 0).all()
    with pytest.raises(ValueError, match="temperature"):
        compute_token_logprobs(model, ids, mask, response_start=4, temperature=0.0)
    with pytest.raises(ValueError, match="response_start"):
        compute_token_logprobs(model, ids, mask, response_start=7)


class _MaskedVocab(torch.nn.Module):
    """A causal LM whose vocabulary from ``keep`` on is masked to ``-inf`` (padded vocab)."""

    def __init__(self, inner: torch.nn.Module, keep: int) -> None:
        super().__init__()
        self.inner, self.keep = inner, keep

    def forward(self, **kwargs: object) -> SimpleNamespace:
        logits = self.inner(**kwargs).logits.clone()
        logits[..., self.keep :] = -float("inf")
        return SimpleNamespace(logits=logits)


def test_entropy_with_a_masked_vocabulary_is_finite_and_backpropagates() -> None:
    inner = _tiny_model(seed=2)
    keep, temperature = 20, 0.7
    model = _MaskedVocab(inner, keep)
    ids = torch.tensor([[0, 0, 1, 5, 6, 7, 8], [1, 9, 10, 11, 12, 13, 0]])  # all < keep
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0]])
    lp, ent = compute_token_logprobs_and_entropy(
        model, ids, mask, response_start=4, temperature=temperature, response_mask=mask
    )
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all(), (lp, ent)
    # The same numbers as the distribution over the unmasked vocabulary alone.
    with torch.no_grad():
        full = inner(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position_ids_from_attention_mask(mask),
        ).logits[:, 3:-1, :keep]
    logp = torch.log_softmax(full.double() / temperature, dim=-1)
    want = -(logp.exp() * logp).sum(-1) * mask[:, 4:]
    torch.testing.assert_close(ent.detach().double(), want, atol=1e-5, rtol=0)
    want_lp = logp.gather(-1, ids[:, 4:, None]).squeeze(-1) * mask[:, 4:]
    torch.testing.assert_close(lp.detach().double(), want_lp, atol=1e-5, rtol=0)
    # An entropy bonus loss backpropagates to finite gradients.
    loss = -lp.sum() - 0.01 * ent.sum()
    loss.backward()
    grads = [p.grad for p in inner.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


# --------------------------------------------------------------- generation


def test_n_samples_per_prompt_in_prompt_major_order(engine: HFEngine) -> None:
    outs = engine.generate(PROMPTS, 3, SamplingParams(max_new_tokens=8, seed=0))
    assert len(outs) == len(PROMPTS) * 3
    assert [(o.prompt_index, o.sample_index) for o in outs] == [
        (i, j) for i in range(len(PROMPTS)) for j in range(3)
    ]
    group = {tuple(o.output_ids) for o in outs if o.prompt_index == 0}
    assert len(group) > 1  # independent samples, not copies


def test_stops_at_eos_and_reports_finish_reasons(engine: HFEngine) -> None:
    eos = engine.eos_token_ids
    assert eos == (2,)
    # Hot sampling from a random model: some samples hit EOS, others run out.
    params = SamplingParams(temperature=2.0, max_new_tokens=30, seed=0)
    outs = engine.generate(PROMPTS, 8, params)
    reasons = {o.finish_reason for o in outs}
    assert reasons == {"stop", "length"}
    for o in outs:
        body = o.output_ids[:-1]
        assert not set(body) & set(eos)
        if o.finish_reason == "stop":
            assert o.output_ids[-1] in eos and o.is_end
            assert o.num_tokens <= 30
        else:
            assert o.num_tokens == 30 and o.output_ids[-1] not in eos and not o.is_end


def test_stop_token_ids(engine: HFEngine) -> None:
    greedy = SamplingParams(top_k=1, max_new_tokens=12)
    full = engine.generate([PROMPTS[0]], 1, greedy)[0]
    stop = full.output_ids[3]
    cut = engine.generate(
        [PROMPTS[0]], 1, SamplingParams(top_k=1, max_new_tokens=12, stop_token_ids=[stop])
    )[0]
    first = full.output_ids.index(stop)
    assert cut.output_ids == full.output_ids[: first + 1]
    assert cut.finish_reason == "stop"
    assert cut.logprobs == pytest.approx(full.logprobs[: first + 1], abs=1e-5)


def test_seeded_determinism_and_chunking(model_dir: Path) -> None:
    engine = HFEngine(model_dir)
    params = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=16, seed=42)
    a = engine.generate(PROMPTS, 4, params)
    b = engine.generate(PROMPTS, 4, params)
    assert [o.output_ids for o in a] == [o.output_ids for o in b]
    assert [o.logprobs for o in a] == [o.logprobs for o in b]
    c = engine.generate(
        PROMPTS, 4, SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=16, seed=43)
    )
    assert [o.output_ids for o in a] != [o.output_ids for o in c]
    # Micro-batching keeps order and, for greedy decoding, the tokens.
    chunked = HFEngine(model_dir, max_batch_size=3)
    greedy = SamplingParams(top_k=1, max_new_tokens=8)
    whole = engine.generate(PROMPTS, 2, greedy)
    parts = chunked.generate(PROMPTS, 2, greedy)
    assert [(o.prompt_index, o.sample_index, o.output_ids) for o in parts] == [
        (o.prompt_index, o.sample_index, o.output_ids) for o in whole
    ]


def test_bad_generate_arguments(engine: HFEngine) -> None:
    params = SamplingParams(max_new_tokens=4)
    with pytest.raises(ValueError, match="n must be"):
        engine.generate(PROMPTS, 0, params)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[1, 2], []], 1, params)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate([[1, 10_000]], 1, params)
    assert engine.generate([], 2, params) == []


# ------------------------------------------------------------------ weights


def test_load_weights_changes_outputs_and_round_trips(engine: HFEngine) -> None:
    greedy = SamplingParams(top_k=1, max_new_tokens=10)
    before = engine.generate(PROMPTS, 1, greedy)
    own = {k: v.clone() for k, v in engine.model.state_dict().items()}
    other = _tiny_model(seed=7).state_dict()
    assert engine.weights_max_abs_diff(own.items()) == 0.0
    assert engine.weights_max_abs_diff(other.items()) > 0.0

    # Two buckets, as the actor would send them; the version lands with the last one.
    names = list(other)
    n1 = engine.load_weights((k, other[k]) for k in names[: len(names) // 2])
    n2 = engine.load_weights(((k, other[k]) for k in names[len(names) // 2 :]), version=5)
    assert n1 + n2 == len(names)
    assert engine.version == 5
    assert engine.weights_max_abs_diff(other.items()) == 0.0
    after = engine.generate(PROMPTS, 1, greedy)
    assert [o.logprobs for o in after] != [o.logprobs for o in before]

    # Loading the original state back restores the original behaviour exactly.
    assert engine.load_weights(own.items(), version=6) == len(own)
    assert engine.weights_max_abs_diff(own.items()) == 0.0
    restored = engine.generate(PROMPTS, 1, greedy)
    assert [o.output_ids for o in restored] == [o.output_ids for o in before]
    assert [o.logprobs for o in restored] == [o.logprobs for o in before]


def test_load_weights_casts_dtype_and_rejects_bad_names(engine: HFEngine) -> None:
    name, tensor = next(iter(engine.model.state_dict().items()))
    assert engine.load_weights([(name, tensor.to(torch.bfloat16))]) == 1
    with pytest.raises(KeyError, match="not_a_weight"):
        engine.load_weights([("not_a_weight", tensor)])
    with pytest.raises(ValueError, match="shape"):
        engine.load_weights([(name, tensor[:1])])
    assert engine.load_weights([("not_a_weight", tensor)], strict=False) == 0
    with pytest.raises(KeyError, match="not_a_weight"):
        engine.weights_max_abs_diff([("not_a_weight", tensor)])


def test_offload_onload_tracked_on_cpu(engine: HFEngine) -> None:
    params = SamplingParams(top_k=1, max_new_tokens=4)
    assert not engine.is_offloaded
    engine.offload()
    engine.offload()  # idempotent
    assert engine.is_offloaded
    with pytest.raises(RuntimeError, match="onload"):
        engine.generate(PROMPTS, 1, params)
    own = engine.model.state_dict()
    assert engine.load_weights(own.items(), version=1) == len(own)  # allowed while offloaded
    engine.onload()
    assert not engine.is_offloaded
    assert len(engine.generate(PROMPTS, 1, params)) == len(PROMPTS)


# ------------------------------------------------------------ construction


def test_model_path_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_model"
    with pytest.raises(FileNotFoundError, match="no_such_model"):
        HFEngine(missing)
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        HFEngine(tmp_path)


def test_registry_builds_hf_engine(model_dir: Path) -> None:
    engine = create_engine("hf", model_path=str(model_dir), dtype="fp32", device="cpu")
    assert isinstance(engine, HFEngine)
    typed: RolloutEngine = HFEngine.from_model(engine.model)  # mypy checks the protocol
    assert typed.version == 0
    assert isinstance(engine, RolloutEngine)
    reloaded = AutoModelForCausalLM.from_pretrained(model_dir)
    assert engine.weights_max_abs_diff(reloaded.state_dict().items()) == 0.0
    assert "HFEngine" in repr(engine)


def test_bf16_engine_logprobs_match_bf16_recomputation(model_dir: Path) -> None:
    engine = HFEngine(model_dir, dtype="bfloat16", device="cpu")
    assert engine.dtype == torch.bfloat16
    params = SamplingParams(temperature=0.8, max_new_tokens=8, seed=0)
    outs = engine.generate(PROMPTS[:2], 2, params)
    recomputed = _recompute(engine.model, PROMPTS[:2], outs, 0.8)
    for k, o in enumerate(outs):
        # Same dtype on both sides; bf16 kernels (KV cache vs full forward) differ slightly.
        assert torch.allclose(torch.tensor(o.logprobs), recomputed[k, : o.num_tokens], atol=0.05)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_engine_logprobs_and_offload(model_dir: Path) -> None:
    engine = HFEngine(model_dir, dtype="float32", device="cuda")
    assert engine.device.type == "cuda"
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=16, seed=1)
    outs = engine.generate(PROMPTS, 4, params)
    recomputed = _recompute(engine.model, PROMPTS, outs, 0.7).cpu()
    for k, o in enumerate(outs):
        assert torch.allclose(torch.tensor(o.logprobs), recomputed[k, : o.num_tokens], atol=1e-4)
    again = engine.generate(PROMPTS, 4, params)
    assert [o.output_ids for o in again] == [o.output_ids for o in outs]
    engine.offload()
    assert next(engine.model.parameters()).device.type == "cpu"
    cpu_state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    engine.onload()
    assert next(engine.model.parameters()).device.type == "cuda"
    assert engine.weights_max_abs_diff(cpu_state.items()) == 0.0
