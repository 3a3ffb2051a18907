"""The vLLM engine on vLLM's CPU build, against the HF engine and the actor's logprobs.

Runs in its own environment (vLLM's CPU build cannot share the main lock):

    uv run --project tests/engines/vllm pytest tests/engines/vllm

The main environment's ``uv run pytest`` skips this module, naming that command.
The model is the toy task's tiny Qwen2 (tokenizer and config from
:mod:`rlinf.reasoning.toy_task`, saved to a directory and loaded from it by
both engines), with 2 heads of 32 dims: vLLM's CPU attention has no kernel
for the toy task's 16-dim heads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "vllm",
    reason="vLLM's CPU build runs in its own environment: "
    "uv run --project tests/engines/vllm pytest tests/engines/vllm",
)

import torch

from rlinf.reasoning.engines import SamplingParams, create_engine
from rlinf.reasoning.engines.hf import HFEngine
from rlinf.reasoning.engines.vllm_engine import VLLMEngine
from rlinf.reasoning.models import token_logprobs_from_logits
from rlinf.reasoning.toy_task import build_tokenizer, build_toy_model, toy_model_config

PROMPTS = [[1, 5, 6, 7], [1, 9, 12], [1, 3, 4, 5, 6, 7, 8, 9, 10, 11], [1, 20]]
MAX_LEN = 128


def save_model(out: Path, *, seed: int, scale: float = 1.0) -> Path:
    """Saves the tiny Qwen2 (weights scaled for peaked logits: no near-ties in greedy)."""
    tokenizer = build_tokenizer()
    config = toy_model_config(tokenizer, num_heads=2, num_kv_heads=1)
    config.initializer_range = 0.2
    model = build_toy_model(config, seed=seed)
    if scale != 1.0:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(scale)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[VLLMEngine]:
    engine = create_engine("vllm", model_path=model_dir, dtype="float32", max_model_len=MAX_LEN)
    assert isinstance(engine, VLLMEngine)
    yield engine


def greedy(max_new_tokens: int = 24) -> SamplingParams:
    return SamplingParams(top_k=1, max_new_tokens=max_new_tokens)


def actor_logprobs(
    model: torch.nn.Module, prompt: list[int], output: list[int], temperature: float = 1.0
) -> torch.Tensor:
    """``log_softmax(logits / T)[token]`` of each output token, as the actor computes it."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    steps = logits[len(prompt) - 1 : len(prompt) - 1 + len(output)]
    return token_logprobs_from_logits(steps, torch.tensor(output), temperature)


def test_greedy_outputs_equal_the_hf_engine(engine: VLLMEngine, model_dir: Path) -> None:
    hf = HFEngine(model_dir, dtype="float32", device="cpu")
    ours = engine.generate(PROMPTS, 1, greedy())
    theirs = hf.generate(PROMPTS, 1, greedy())
    assert [o.output_ids for o in ours] == [o.output_ids for o in theirs]
    assert [o.finish_reason for o in ours] == [o.finish_reason for o in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_sampled_logprobs_agree_with_the_actors_recomputation(
    engine: VLLMEngine, model_dir: Path
) -> None:
    hf = HFEngine(model_dir, dtype="float32", device="cpu")
    params = SamplingParams(top_p=0.9, top_k=8, max_new_tokens=32, seed=3)
    outputs = engine.generate(PROMPTS, 4, params)
    assert [(o.prompt_index, o.sample_index) for o in outputs] == [
        (i, j) for i in range(len(PROMPTS)) for j in range(4)
    ]
    assert len({tuple(o.output_ids) for o in outputs}) > len(PROMPTS)  # it sampled
    worst = 0.0
    for out in outputs:
        assert len(out.logprobs) == len(out.output_ids) >= 1
        want = actor_logprobs(hf.model, PROMPTS[out.prompt_index], out.output_ids)
        worst = max(worst, float((torch.tensor(out.logprobs) - want).abs().max()))
    assert worst <= 1e-4, worst
    # A seeded call repeats itself.
    again = engine.generate(PROMPTS, 4, params)
    assert [o.output_ids for o in again] == [o.output_ids for o in outputs]


def test_stop_tokens_end_samples_and_are_returned(engine: VLLMEngine) -> None:
    eos = build_tokenizer().eos_token_id
    outs = engine.generate(PROMPTS, 1, greedy(8))
    for out in outs:  # EOS ends a sample and is its last token, or the budget does
        ended = out.output_ids[-1] == eos
        assert out.finish_reason == ("stop" if ended else "length")
        assert ended or out.num_tokens == 8
        assert eos not in out.output_ids[:-1]
    first = max(outs, key=lambda o: o.num_tokens)
    assert first.num_tokens >= 3
    stop = first.output_ids[1]
    params = replace(greedy(8), stop_token_ids=(stop,))
    out = engine.generate([PROMPTS[first.prompt_index]], 1, params)[0]
    assert out.finish_reason == "stop" and out.output_ids[-1] == stop
    assert out.output_ids == first.output_ids[: first.output_ids.index(stop) + 1]


SAMPLED = SamplingParams(max_new_tokens=24, seed=5)

_FRESH = """
import json, sys
from rlinf.reasoning.engines import SamplingParams
from rlinf.reasoning.engines.vllm_engine import VLLMEngine
engine = VLLMEngine(sys.argv[1], max_model_len=int(sys.argv[2]))
prompts = json.loads(sys.argv[3])
out = {}
for kind, params in (("greedy", SamplingParams(top_k=1, max_new_tokens=24)),
                     ("sampled", SamplingParams(max_new_tokens=24, seed=5))):
    res = engine.generate(prompts, 2, params)
    out[kind] = {"ids": [o.output_ids for o in res], "logprobs": [o.logprobs for o in res]}
print("RESULT " + json.dumps(out))
"""


def child_result(script: str, model_dir: Path) -> dict[str, Any]:
    """Runs ``script`` (which prints ``RESULT <json>``) in a new process: one engine each."""
    proc = subprocess.run(
        [sys.executable, "-c", script, str(model_dir), str(MAX_LEN), json.dumps(PROMPTS)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def test_weight_sync_by_buckets_equals_a_fresh_engine(engine: VLLMEngine, tmp_path: Path) -> None:
    new_dir = save_model(tmp_path / "new", seed=1)
    new = HFEngine(new_dir, dtype="float32", device="cpu")
    named = sorted(new.model.state_dict().items())
    assert "model.layers.0.self_attn.q_proj.weight" in dict(named)
    # Bucket boundaries inside fused groups: q | k, v and gate | up of one layer.
    names = [n for n, _ in named]
    cut1 = names.index("model.layers.0.self_attn.k_proj.weight")
    cut2 = names.index("model.layers.1.mlp.up_proj.weight")
    buckets = [named[:cut1], named[cut1:cut2], named[cut2:]]
    loaded = [engine.load_weights(bucket, version=7) for bucket in buckets]
    engine.finish_weight_sync()
    assert sum(loaded) == len(named) and engine.version == 7
    fresh = child_result(_FRESH, new_dir)  # another process: one vLLM engine per process
    for kind, params in (("greedy", greedy()), ("sampled", SAMPLED)):
        ours = engine.generate(PROMPTS, 2, params)
        assert [o.output_ids for o in ours] == fresh[kind]["ids"]
        for a, b in zip(ours, fresh[kind]["logprobs"], strict=True):
            assert a.logprobs == pytest.approx(b, abs=1e-5)
    hf_greedy = new.generate(PROMPTS, 1, greedy())
    assert [o.output_ids for o in engine.generate(PROMPTS, 1, greedy())] == [
        o.output_ids for o in hf_greedy
    ]


def test_a_sync_that_leaves_a_fused_group_incomplete_is_rejected(
    engine: VLLMEngine, model_dir: Path
) -> None:
    hf = HFEngine(model_dir, dtype="float32", device="cpu")
    state = hf.model.state_dict()
    q = "model.layers.0.self_attn.q_proj.weight"
    before = engine.generate(PROMPTS, 1, greedy())
    assert engine.load_weights([(q, state[q] * 3.0)], version=9) == 0  # held back
    with pytest.raises(ValueError, match=r"k_proj\.weight.*v_proj\.weight"):
        engine.finish_weight_sync()
    assert [o.output_ids for o in engine.generate(PROMPTS, 1, greedy())] == [
        o.output_ids for o in before
    ]
    engine.load_weights([(q, state[q])], version=10)
    with pytest.raises(ValueError, match="a sync of version 11 started"):
        engine.load_weights([], version=11)


def test_a_raw_logprobs_engine_refuses_sampling_at_other_temperatures(
    engine: VLLMEngine,
) -> None:
    assert engine.logprobs_mode == "raw_logprobs"
    with pytest.raises(ValueError, match=r"temperature=0\.7.*'raw_logprobs'.*processed_logprobs"):
        engine.generate(PROMPTS, 1, SamplingParams(temperature=0.7))
    with pytest.raises(ValueError, match="n must be"):
        engine.generate(PROMPTS, 0, greedy())
    # vLLM's greedy logprobs are at temperature 1: greedy at 0.7 is refused too.
    with pytest.raises(ValueError, match=r"temperature=0\.7"):
        engine.generate(PROMPTS, 1, replace(greedy(), temperature=0.7))


TEMPERATURE = 0.7

_PROCESSED = f"""
import json, sys
from rlinf.reasoning.engines import SamplingParams
from rlinf.reasoning.engines.vllm_engine import VLLMEngine
engine = VLLMEngine(sys.argv[1], max_model_len=int(sys.argv[2]), logprobs_mode="processed_logprobs")
prompts = json.loads(sys.argv[3])
out = {{}}
for kind, n, params in (
    ("sampled", 4, SamplingParams(temperature={TEMPERATURE}, max_new_tokens=32, seed=3)),
    ("greedy", 2, SamplingParams(top_k=1, max_new_tokens=24)),
):
    res = engine.generate(prompts, n, params)
    out[kind] = {{"index": [[o.prompt_index, o.sample_index] for o in res],
                 "ids": [o.output_ids for o in res], "logprobs": [o.logprobs for o in res]}}
for kind, params in (
    ("filtered", SamplingParams(temperature={TEMPERATURE}, top_p=0.9)),
    ("cold_greedy", SamplingParams(temperature={TEMPERATURE}, top_k=1)),
):
    try:
        engine.generate(prompts, 1, params)
        out[kind] = None
    except ValueError as exc:
        out[kind] = str(exc)
print("RESULT " + json.dumps(out))
"""


def test_processed_logprobs_at_temperature_0_7_agree_with_the_actors_recomputation(
    model_dir: Path,
) -> None:
    hf = HFEngine(model_dir, dtype="float32", device="cpu")
    got = child_result(_PROCESSED, model_dir)  # another process: one vLLM engine per process
    sampled = got["sampled"]
    assert sampled["index"] == [[i, j] for i in range(len(PROMPTS)) for j in range(4)]
    assert len({tuple(ids) for ids in sampled["ids"]}) > len(PROMPTS)  # it sampled
    worst = untempered = 0.0
    for (i, _), ids, lps in zip(sampled["index"], sampled["ids"], sampled["logprobs"], strict=True):
        assert len(lps) == len(ids) >= 1
        reported = torch.tensor(lps)
        want = actor_logprobs(hf.model, PROMPTS[i], ids, TEMPERATURE)
        worst = max(worst, float((reported - want).abs().max()))
        at_one = actor_logprobs(hf.model, PROMPTS[i], ids)
        untempered = max(untempered, float((reported - at_one).abs().max()))
    assert worst <= 1e-4, worst
    assert untempered > 1e-2  # the temperature is in the reported numbers
    # Greedy at temperature 1 is unaffected: the HF engine's tokens and logprobs, n times.
    greedy_hf = hf.generate(PROMPTS, 1, greedy())
    assert got["greedy"]["index"] == [[i, j] for i in range(len(PROMPTS)) for j in range(2)]
    assert got["greedy"]["ids"] == [o.output_ids for o in greedy_hf for _ in range(2)]
    twice = [o for o in greedy_hf for _ in range(2)]
    for lps, want in zip(got["greedy"]["logprobs"], twice, strict=True):
        assert torch.allclose(torch.tensor(lps), torch.tensor(want.logprobs), atol=1e-4)
    for kind, text in (("filtered", "top_p=0.9"), ("cold_greedy", "top_k=1")):
        assert got[kind] is not None and text in got[kind], kind
        assert "'processed_logprobs'" in got[kind]


@pytest.mark.parametrize(
    ("algorithm", "names"),
    [
        (
            {
                "sampling_params": {"temperature": 0.7, "top_p": 0.9},
                "val_sampling_params": {"temperature": 0.7},
            },
            ["algorithm.sampling_params (temperature=0.7, top_k=-1, top_p=0.9)", "top_p: 1.0"],
        ),
        (  # the default evaluation: greedy at the training temperature
            {"sampling_params": {"temperature": 0.7}},
            ["for greedy decoding in algorithm.val_sampling_params set temperature: 1.0"],
        ),
        (
            {"sampling_params": {"top_k": 8}, "val_sampling_params": {"temperature": 0.5}},
            [
                "temperature other than 1 in algorithm.val_sampling_params",
                "top-k/top-p filtering in algorithm.sampling_params",
            ],
        ),
    ],
)
def test_a_vllm_config_that_no_logprobs_mode_fits_fails_at_load(
    tmp_path: Path, algorithm: dict[str, Any], names: list[str]
) -> None:
    from rlinf.core.config import ConfigError, validate_config
    from rlinf.reasoning.config import ReasoningConfig

    data = {
        "cluster": {
            "cpu_slots_per_node": 2,
            "component_placement": {"actor": 0, "rollout": 1, "reward": 1},
        },
        "data": {"train_files": [str(tmp_path / "t.jsonl")], "max_prompt_length": 16},
        "runner": {"max_steps": 1, "val_check_interval": -1, "val_before_train": False},
        "algorithm": {"group_size": 4, "rollout_batch_size": 4},
        "actor": {"model_path": str(tmp_path), "micro_batch_size": 4},
        "rollout": {"engine": "vllm"},
    }
    loads = {
        "sampling_params": {"temperature": 0.7},
        "val_sampling_params": {"temperature": 1.0, "top_k": 1},  # greedy eval
    }
    ok = validate_config({**data, "algorithm": {**data["algorithm"], **loads}}, ReasoningConfig)
    assert ok.algorithm.sampling_params.temperature == 0.7
    with pytest.raises(ConfigError) as info:
        validate_config({**data, "algorithm": {**data["algorithm"], **algorithm}}, ReasoningConfig)
    for name in names:
        assert name in str(info.value)


def test_heads_narrower_than_32_dims_are_refused_on_cpu(tmp_path: Path) -> None:
    tokenizer = build_tokenizer()
    narrow = toy_model_config(tokenizer)  # the toy task's 4 heads of 16 dims
    build_toy_model(narrow, seed=0).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"16-dim attention heads.*32 or more"):
        VLLMEngine(tmp_path, max_model_len=MAX_LEN)


def test_offload_is_a_tracked_no_op_on_cpu(engine: VLLMEngine) -> None:
    before = engine.generate(PROMPTS[:1], 1, greedy(8))
    engine.offload()
    assert engine.is_offloaded
    engine.onload()
    assert not engine.is_offloaded
    assert engine.generate(PROMPTS[:1], 1, greedy(8))[0].output_ids == before[0].output_ids
    with pytest.raises(NotImplementedError, match="validate_weight_first_sync"):
        engine.weights_max_abs_diff([])


def test_multi_turn_trajectories_agree_with_the_actors_recomputation(tmp_path: Path) -> None:
    """The agent loop on vLLM: the python tool's answers are observations (masked, logprob
    0), and the actor's teacher-forced logprobs over the whole trajectory equal vLLM's on
    every generated token (the same bound as single-turn samples)."""
    from transformers import AutoTokenizer

    from rlinf.reasoning.agent.config import AgentConfig
    from rlinf.reasoning.agent.executor import LocalToolExecutor
    from rlinf.reasoning.agent.loop import AgentLoop
    from rlinf.reasoning.agent_toy_task import make_agent_toy_task
    from rlinf.reasoning.tools.factory import build_registry
    from rlinf.reasoning.toy_task import read_jsonl
    from rlinf.reasoning.workers.batch import response_logprobs

    # 4 heads of 32 dims: vLLM's CPU attention has no kernel for narrower heads
    task = make_agent_toy_task(tmp_path / "agent", num_train=64, num_test=16, hidden_size=128)
    tokenizer = AutoTokenizer.from_pretrained(task / "warmstart")
    vllm = create_engine("vllm", model_path=task / "warmstart", dtype="float32", max_model_len=160)
    cfg = AgentConfig(tools=["python"], max_turns=3, max_response_tokens=112)
    registry = build_registry(cfg)
    executor = LocalToolExecutor(registry, 8)
    loop = AgentLoop(vllm, tokenizer, cfg, executor, [tokenizer.eos_token_id])
    prompts = [
        tokenizer(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": row["problem"]}],
                tools=registry.schemas(),
                tokenize=False,
            ),
            add_special_tokens=False,
        )["input_ids"]
        for row in read_jsonl(task / "test.jsonl")[:8]
    ]
    try:
        trajectories, _ = loop.run(prompts, 2, SamplingParams(max_new_tokens=80, seed=5))
    finally:
        executor.close()
    assert any(not all(t.generated) for t in trajectories), "the warm start calls the tool"
    hf = HFEngine(task / "warmstart", dtype="float32", device="cpu")
    recomputed = response_logprobs(
        hf.model,
        [(t.prompt_ids, t.tokens) for t in trajectories],
        0,
        1.0,
        8,
        [t.generated for t in trajectories],
    )
    worst = 0.0
    for t, lp in zip(trajectories, recomputed, strict=True):
        assert all(x == 0.0 for x, g in zip(t.logprobs, t.generated, strict=True) if not g)
        worst = max(worst, float((torch.tensor(t.logprobs) - lp).abs().max()))
    assert worst <= 1e-4, worst
