"""Generation speed of the vLLM engine (CPU build) against the HF engine, same run.

Runs in the vLLM test environment (the main environment has no vLLM and skips):

    uv run --project tests/engines/vllm pytest benchmarks/test_vllm_generation.py

Two shapes, both info rows (issue 16 asks for the ratio, no target):

- the toy task's RL shape (``toy_grpo_cpu.yaml``): 64 prompts x 16 samples,
  8 new tokens, on the toy Qwen2 with 2 heads of 32 dims (vLLM's CPU attention
  has no 16-dim kernel);
- a larger tiny Qwen2 (4 layers, hidden 256, 8 heads of 32 dims): 8 prompts x
  4 samples, 256-token responses.

Generated tokens per second of ``generate`` (sampling at temperature 1, as in
training), median of a few calls after a warm-up. vLLM keeps one engine per
process, so each vLLM measurement runs in a child process; the HF rounds run
in this process before and after it (their median is the baseline).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip(
    "vllm",
    reason="vLLM's CPU build runs in its own environment: "
    "uv run --project tests/engines/vllm pytest benchmarks/test_vllm_generation.py",
)

import torch

from rlinf.reasoning.engines import SamplingParams
from rlinf.reasoning.engines.hf import HFEngine
from rlinf.reasoning.toy_task import build_tokenizer, build_toy_model, toy_model_config

ROUNDS = 3

_VLLM_ROUNDS = """
import json, statistics, sys, time
from rlinf.reasoning.engines import SamplingParams
from rlinf.reasoning.engines.vllm_engine import VLLMEngine
path, max_len, prompts = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
n, new, rounds = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
engine = VLLMEngine(path, max_model_len=max_len)
rates = []
for r in range(rounds + 1):
    start = time.perf_counter()
    out = engine.generate(prompts, n, SamplingParams(max_new_tokens=new, seed=r))
    if r:  # the first call warms up
        rates.append(sum(o.num_tokens for o in out) / (time.perf_counter() - start))
print("RATE " + json.dumps(statistics.median(rates)))
"""


def save_model(out: Path, *, hidden: int, layers: int, heads: int, positions: int) -> Path:
    tokenizer = build_tokenizer()
    config = toy_model_config(
        tokenizer,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=max(1, heads // 2),
        intermediate_size=4 * hidden,
        max_position_embeddings=positions,
    )
    build_toy_model(config, seed=0).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def vllm_rate(path: Path, max_len: int, prompts: list[list[int]], n: int, new: int) -> float:
    args = [str(path), str(max_len), json.dumps(prompts), str(n), str(new), str(ROUNDS)]
    proc = subprocess.run(
        [sys.executable, "-c", _VLLM_ROUNDS, *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RATE ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return float(json.loads(lines[-1].removeprefix("RATE ")))


def hf_rates(engine: HFEngine, prompts: list[list[int]], n: int, new: int) -> list[float]:
    rates = []
    for r in range(ROUNDS):
        start = time.perf_counter()
        out = engine.generate(prompts, n, SamplingParams(max_new_tokens=new, seed=r))
        rates.append(sum(o.num_tokens for o in out) / (time.perf_counter() - start))
    return rates


SHAPES = {
    "toy RL shape (2 layers, hidden 64; 64 prompts x 16, 8 tokens)": (
        {"hidden": 64, "layers": 2, "heads": 2, "positions": 128},
        64,
        16,
        8,
    ),
    "4 layers, hidden 256 (8 prompts x 4, 256 tokens)": (
        {"hidden": 256, "layers": 4, "heads": 8, "positions": 320},
        8,
        4,
        256,
    ),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_vllm_vs_hf_generation_tokens_per_second(
    shape: str, tmp_path: Path, record_ratio: Callable[..., object]
) -> None:
    sizes, num_prompts, n, new = SHAPES[shape]
    path = save_model(tmp_path / "model", **sizes)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(6, 14, (num_prompts,), generator=gen).tolist()
    prompts = [[1, *torch.randint(3, 30, (k,), generator=gen).tolist()] for k in lengths]
    hf = HFEngine(path, dtype="float32", device="cpu")
    hf.generate(prompts[:2], 1, SamplingParams(max_new_tokens=4))  # warm-up
    baseline = hf_rates(hf, prompts, n, new)
    ours = vllm_rate(path, sizes["positions"], prompts, n, new)
    baseline += hf_rates(hf, prompts, n, new)
    record_ratio(
        f"vLLM (CPU) vs HF engine generation, {shape}",
        ours,
        statistics.median(baseline),
        unit="tokens/s",
        baseline_name="HF engine",
        target=None,
        floor=None,
    )
