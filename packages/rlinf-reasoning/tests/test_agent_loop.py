"""The multi-turn agent loop on the real HF engine and the real tools.

The agent toy task's tiny Qwen2 (warm-started on a few ideal trajectories)
generates real trajectories with the sandboxed ``python`` tool: observation
tokens are masked and carry logprob 0, the actor's teacher-forced logprobs
over the whole trajectory equal the engine's on every generated token, and
observation tokens never reach a gradient.

The bad-input cases need a model that writes *specific* broken calls, which
no trained model does on demand: there :class:`ScriptedEngine` stands in for
the engine (it implements the engine protocol and replays fixed turns); the
tools, parser, executor and loop are the real ones.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlinf.core.algorithms import get_policy_loss
from rlinf.reasoning.agent.config import AgentConfig
from rlinf.reasoning.agent.executor import LocalToolExecutor
from rlinf.reasoning.agent.loop import AgentLoop, Trajectory
from rlinf.reasoning.agent.rewards import final_answer_ids
from rlinf.reasoning.agent_toy_task import make_agent_toy_task
from rlinf.reasoning.engines.base import GenerationOutput, SamplingParams
from rlinf.reasoning.engines.hf import HFEngine
from rlinf.reasoning.models import compute_token_logprobs
from rlinf.reasoning.tools.factory import build_registry
from rlinf.reasoning.tools.registry import Tool, ToolRegistry, python_tool
from rlinf.reasoning.toy_task import read_jsonl
from rlinf.reasoning.workers.batch import pack_samples, response_logprobs


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return make_agent_toy_task(tmp_path_factory.mktemp("agent"), num_train=128, num_test=32)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer(task: Path) -> Any:
    return AutoTokenizer.from_pretrained(task / "warmstart")


def _prompts(task: Path, tokenizer: Any, schemas: list[dict[str, Any]], n: int) -> list[list[int]]:
    rows = read_jsonl(task / "test.jsonl")[:n]
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": r["problem"]}], tools=schemas, tokenize=False
        )
        for r in rows
    ]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def _run(task: Path, tokenizer: Any, dtype: torch.dtype) -> tuple[list[Trajectory], HFEngine]:
    cfg = AgentConfig(tools=["python"], max_turns=3, max_response_tokens=112)
    registry = build_registry(cfg)
    engine = HFEngine(task / "warmstart", dtype=dtype, device="cpu")
    executor = LocalToolExecutor(registry, 16)
    loop = AgentLoop(engine, tokenizer, cfg, executor, [tokenizer.eos_token_id])
    try:
        prompts = _prompts(task, tokenizer, registry.schemas(), 8)
        params = SamplingParams(temperature=1.0, max_new_tokens=80, seed=3)
        trajectories, stats = loop.run(prompts, 2, params)
    finally:
        executor.close()
    assert stats.engine_calls >= 2 and stats.seconds >= stats.generate_s > 0
    return trajectories, engine


@pytest.fixture(scope="module")
def float64_run(task: Path, tokenizer: Any) -> tuple[list[Trajectory], HFEngine]:
    return _run(task, tokenizer, torch.float64)


def test_observations_are_masked_and_have_no_logprob(
    float64_run: tuple[list[Trajectory], HFEngine], tokenizer: Any
) -> None:
    trajectories, _ = float64_run
    assert len(trajectories) == 16
    answered = [t for t in trajectories if not all(t.generated)]
    assert answered, "the warm start calls the tool"
    open_id, close_id = tokenizer.convert_tokens_to_ids(["<tool_response>", "</tool_response>"])
    for t in answered:
        observed = [tok for tok, gen in zip(t.tokens, t.generated, strict=True) if not gen]
        assert observed[0] == open_id and observed[-1] == close_id
        assert all(lp == 0.0 for lp, gen in zip(t.logprobs, t.generated, strict=True) if not gen)
        assert all(lp < 0.0 for lp, gen in zip(t.logprobs, t.generated, strict=True) if gen)
        assert t.turns >= 2 and t.tool_calls >= 1
        stats = t.stats()
        assert stats["turns"] == t.turns and stats["tool_seconds"] >= 0
        per_tool = sum(v for k, v in stats.items() if k.startswith("calls/"))
        assert per_tool == t.tool_calls  # every call counted under a tool (or malformed/unknown)
        answer = final_answer_ids(t.tokens, t.generated)
        assert answer and answer == t.tokens[len(t.tokens) - len(answer) :]


def test_actor_logprobs_equal_the_rollout_over_multi_turn_trajectories(
    float64_run: tuple[list[Trajectory], HFEngine],
) -> None:
    trajectories, engine = float64_run
    pairs = [(t.prompt_ids, t.tokens) for t in trajectories]
    masks = [t.generated for t in trajectories]
    actor = engine.model  # the engine's own weights, teacher-forced in the actor's layout
    recomputed = response_logprobs(actor, pairs, 0, 1.0, 4, masks)
    for t, lp in zip(trajectories, recomputed, strict=True):
        assert lp.shape[0] == len(t.tokens)
        torch.testing.assert_close(
            lp.double(), torch.tensor(t.logprobs).double(), atol=1e-5, rtol=0
        )


def test_float32_rollout_matches_within_the_single_turn_bound(task: Path, tokenizer: Any) -> None:
    trajectories, _ = _run(task, tokenizer, torch.float32)
    model = AutoModelForCausalLM.from_pretrained(task / "warmstart", dtype=torch.float32)
    pairs = [(t.prompt_ids, t.tokens) for t in trajectories]
    recomputed = response_logprobs(model, pairs, 0, 1.0, 16, [t.generated for t in trajectories])
    worst = max(
        (lp - torch.tensor(t.logprobs)).abs().max().item()
        for t, lp in zip(trajectories, recomputed, strict=True)
    )
    # float32 KV-cache decoding vs one full forward: the bound of the single-turn test
    assert worst < 1e-4


def test_observation_tokens_never_receive_gradient(
    float64_run: tuple[list[Trajectory], HFEngine], task: Path
) -> None:
    trajectories = [t for t in float64_run[0] if not all(t.generated)][:4]
    model = AutoModelForCausalLM.from_pretrained(task / "warmstart", dtype=torch.float64)
    packed = pack_samples(
        [(t.prompt_ids, t.tokens) for t in trajectories], 0, [t.generated for t in trajectories]
    )
    width = packed.response_mask.shape[1]
    observed = torch.zeros_like(packed.response_mask)
    for row, t in enumerate(trajectories):
        observed[row, : len(t.tokens)] = ~torch.tensor(t.generated)
    assert observed.any() and not (observed & packed.response_mask).any()
    loss_fn = get_policy_loss("ppo")
    generator = torch.Generator().manual_seed(0)
    old = torch.randn((len(trajectories), width), generator=generator, dtype=torch.float64) * 0.1
    adv = torch.randn((len(trajectories), width), generator=generator, dtype=torch.float64)

    def grads(old_lp: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
        model.zero_grad()
        lp = compute_token_logprobs(
            model,
            packed.input_ids,
            packed.attention_mask,
            response_start=packed.response_start,
            response_mask=packed.response_mask,
        )
        loss, _ = loss_fn(
            logprobs=lp,
            old_logprobs=old_lp,
            advantages=advantages,
            loss_mask=packed.response_mask,
            clip_ratio_low=0.2,
            clip_ratio_high=0.2,
            loss_agg_mode="token-mean",
        )
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    base = grads(old, adv)
    noise = torch.randn(old.shape, generator=generator, dtype=torch.float64) * 5
    # anything written at observation positions changes nothing
    assert torch.equal(grads(old + noise * observed, adv + noise * observed), base)
    # the same perturbation at generated positions does change the gradient
    generated = packed.response_mask
    assert not torch.allclose(grads(old, adv + noise * generated), base)


# ------------------------------------------------------------------ bad input


class ScriptedEngine:
    """Replays fixed turns (text) per trajectory: the engine protocol, minus a model.

    It answers ``generate`` with the next scripted turn of each context's
    trajectory (told apart by its prompt), honours the stop tokens (a turn
    ending in ``</tool_call>`` ends with finish ``stop``) and reports logprob
    -1 per token.
    """

    version = 0

    def __init__(self, tokenizer: Any, scripts: dict[int, list[str]], eos: int) -> None:
        self.tokenizer, self.scripts, self.eos = tokenizer, scripts, eos
        self.turn: dict[int, int] = {}

    def _key(self, context: Sequence[int]) -> int:
        """The script of a context: its prompt's first token."""
        return int(context[0])

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams
    ) -> list[GenerationOutput]:
        out = []
        for i, context in enumerate(prompt_ids):
            key = self._key(context)
            k = self.turn.get(key, 0)
            self.turn[key] = k + 1
            script = self.scripts[key]
            text = script[min(k, len(script) - 1)]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if not text.endswith("</tool_call>"):
                ids = [*ids, self.eos]
            ids = ids[: params.max_new_tokens]
            finish = "stop" if ids[-1] in params.stop_token_ids else "length"
            out.append(GenerationOutput(i, 0, ids, finish, [-1.0] * len(ids)))
        return out


def _raises(x: int) -> str:
    raise ValueError(f"no {x}")


def _hangs(x: int) -> str:
    time.sleep(60)
    return "never"


def _int_tool(name: str, fn: Any, timeout_s: float = 10.0) -> Tool:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    return Tool(name, name, schema, fn, timeout_s)


def _call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture
def bad_input_run(tokenizer: Any) -> Iterator[dict[str, Trajectory]]:
    registry = ToolRegistry(
        [
            python_tool(),
            _int_tool("fails", _raises),
            _int_tool("hangs", _hangs, timeout_s=1.0),
        ]
    )
    cases = {
        "malformed": ["<tool_call>{not json</tool_call>", "1"],
        "unknown": [_call("nope", {}), "2"],
        "bad_args": [_call("python", {"source": "print(1)"}), "3"],
        "raises": [_call("fails", {"x": 1}), "4"],
        "hangs": [_call("hangs", {"x": 1}), "5"],
        "never_stops": [_call("python", {"code": "print(0)"})],  # calls forever
        "unopened": ["12</tool_call>", "6"],
    }
    keys = "abcdefg"
    prompts, scripts = [], {}
    for key, script in zip(keys, cases.values(), strict=True):
        ids = tokenizer(key + "=", add_special_tokens=False)["input_ids"]
        prompts.append(ids)
        scripts[ids[0]] = script
    eos = tokenizer.eos_token_id
    engine = ScriptedEngine(tokenizer, scripts, eos)
    cfg = AgentConfig(tools=["python"], max_turns=3, max_response_tokens=400)
    executor = LocalToolExecutor(registry, 8)
    loop = AgentLoop(engine, tokenizer, cfg, executor, [eos])  # type: ignore[arg-type]
    try:
        trajectories, _ = loop.run(prompts, 1, SamplingParams(max_new_tokens=100))
    finally:
        executor.close()
    yield dict(zip(cases, trajectories, strict=True))


def _observation(tokenizer: Any, t: Trajectory) -> str:
    ids = [tok for tok, gen in zip(t.tokens, t.generated, strict=True) if not gen]
    return str(tokenizer.decode(ids))


def test_bad_calls_become_error_observations(
    bad_input_run: dict[str, Trajectory], tokenizer: Any
) -> None:
    run = bad_input_run
    expected = {
        "malformed": ("not valid JSON", "invalid_tool_calls"),
        "unknown": ("unknown tool", "invalid_tool_calls"),
        "bad_args": ("bad arguments", "invalid_tool_calls"),
        "raises": ("raised ValueError", "tool_errors"),
        "hangs": ("did not answer within 1 s", "tool_errors"),
        "unopened": ("never opened", "invalid_tool_calls"),
    }
    for case, (message, counter) in expected.items():
        t = run[case]
        # the toy tokenizer loads as Qwen2's byte-level one, which drops spaces
        assert message.replace(" ", "") in _observation(tokenizer, t), case
        assert t.stats()[counter] == 1.0, case
        assert t.is_end and t.turns == 2, case  # the model answered after the error
    assert run["unknown"].stats()["calls/unknown"] == 1.0
    assert run["malformed"].stats()["calls/malformed"] == 1.0


def test_a_model_that_never_stops_calling_tools_is_cut_at_max_turns(
    bad_input_run: dict[str, Trajectory],
) -> None:
    t = bad_input_run["never_stops"]
    assert t.done and not t.is_end and t.cut_at_max_turns
    assert t.turns == 3 and t.tool_calls == 3 and t.stats()["cut_at_max_turns"] == 1.0


def test_a_tokenizer_without_the_call_tag_is_refused(task: Path) -> None:
    from rlinf.reasoning.toy_task import build_tokenizer

    plain = build_tokenizer()
    cfg = AgentConfig(tools=["python"])
    with pytest.raises(ValueError, match="</tool_call>"):
        AgentLoop(None, plain, cfg, LocalToolExecutor(ToolRegistry(), 1), [2])  # type: ignore[arg-type]


def test_a_search_call_mid_answer_reads_the_corpus(tokenizer: Any, tmp_path: Path) -> None:
    """Search-R1's shape: the model searches, reads the passage, then answers."""
    from rlinf.reasoning.tools.search import build_search_index

    corpus = [
        {"title": "zorbia", "text": "the capital of zorbia is quellmont"},
        {"title": "amber", "text": "the amber sea freezes in deep winter"},
    ]
    index = build_search_index(corpus, tmp_path / "index")
    cfg = AgentConfig(tools=["search"], search_corpus=index, max_turns=3, max_response_tokens=400)
    registry = build_registry(cfg)
    assert registry.names == ["search"]
    eos = tokenizer.eos_token_id
    prompt = tokenizer("q=", add_special_tokens=False)["input_ids"]
    script = [_call("search", {"query": "zorbia"}), "quellmont"]  # one word: no spaces in toy ids
    engine = ScriptedEngine(tokenizer, {prompt[0]: script}, eos)
    executor = LocalToolExecutor(registry, 2)
    loop = AgentLoop(engine, tokenizer, cfg, executor, [eos])  # type: ignore[arg-type]
    try:
        (trajectory,), _ = loop.run([prompt], 1, SamplingParams(max_new_tokens=100))
    finally:
        executor.close()
    assert "quellmont" in _observation(tokenizer, trajectory).replace(" ", "")
    assert trajectory.stats()["calls/search"] == 1.0 and trajectory.is_end
    answer = tokenizer.decode(final_answer_ids(trajectory.tokens, trajectory.generated))
    assert answer.replace("<eos>", "") == "quellmont"
    with pytest.raises(ValueError, match=r"agent\.search_corpus is null"):
        build_registry(AgentConfig(tools=["search"]))
