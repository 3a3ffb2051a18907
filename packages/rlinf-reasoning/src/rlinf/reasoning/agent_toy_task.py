"""A toy task where a tool is necessary: multiply two 3-digit numbers with the ``python`` tool.

The tiny model cannot multiply ``417*863`` in its head, but it can learn to
ask the ``python`` tool and copy the answer::

    prompt:      <bos>[python]417*863=
    turn 1:      <tool_call>{"name":"python","arguments":{"code":"print(417*863)"}}</tool_call>
    observation: <tool_response>359871</tool_response>
    turn 2:      359871<eos>

Everything is built offline: a character-level tokenizer whose chat template
renders the tools' names into the prompt and tool messages as
``<tool_response>...</tool_response>`` (with ``<tool_call>``,
``</tool_call>``, ``<tool_response>``, ``</tool_response>`` as single
tokens), the ``train.jsonl``/``test.jsonl`` splits, and a tiny Qwen2 given a
short supervised warm start on whole trajectories (loss on the model's turns
only, as RL trains them), so it knows the call format but not yet reliably.

``python -m rlinf.reasoning.agent_toy_task --out DIR`` writes it all.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from rlinf.reasoning.toy_task import (
    build_toy_model,
    char_level_tokenizer,
    toy_model_config,
    write_jsonl,
)

__all__ = [
    "CHAT_TEMPLATE",
    "build_agent_tokenizer",
    "main",
    "make_agent_problems",
    "make_agent_toy_task",
    "sft_on_trajectories",
    "trajectory_of",
]

_TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
_CHARS = "0123456789+-*/=()[]{}\":,.'!? _abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n"

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}{% for t in tools %}[{{ t['function']['name'] }}]{% endfor %}{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<tool_response>{{ m['content'] }}</tool_response>"
    "{% else %}{{ m['content'] }}{% endif %}"
    "{% endfor %}"
)
"""Tools' names in brackets, then the turns back to back; tool answers in tags."""


def build_agent_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer with the tool tags as single tokens and :data:`CHAT_TEMPLATE`."""
    tokenizer = char_level_tokenizer([*_TOOL_TOKENS, *_CHARS], prepend_bos=False)
    tokenizer.add_tokens(list(_TOOL_TOKENS))  # matched whole, before the character split
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_agent_problems(
    num_train: int, num_test: int, *, low: int = 100, high: int = 999, seed: int = 0
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Disjoint train/test rows ``{"problem": "417*863=", "answer": "359871"}``."""
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    rows: list[dict[str, str]] = []
    while len(rows) < num_train + num_test:
        a, b = rng.randint(low, high), rng.randint(low, high)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        rows.append({"problem": f"{a}*{b}=", "answer": str(a * b)})
    return rows[:num_train], rows[num_train:]


def trajectory_of(problem: str) -> tuple[str, str, str]:
    """The ideal ``(call turn, tool answer, final turn)`` of a problem."""
    expression = problem.rstrip("=")
    call = {"name": "python", "arguments": {"code": f"print({expression})"}}
    answer = str(eval(expression, {"__builtins__": {}}))
    turn = "<tool_call>" + json.dumps(call, separators=(",", ":")) + "</tool_call>"
    return turn, answer, answer


def _encode(
    tokenizer: PreTrainedTokenizerFast,
    problem: str,
    tools: list[dict[Any, Any] | Callable[..., Any]],
) -> tuple[list[int], list[int], list[bool]]:
    """``(prompt ids, response ids, generated mask)`` of the ideal trajectory."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": problem}], tools=tools, tokenize=False
    )
    turn, observation, final = trajectory_of(problem)
    segments = [(turn, True), (f"<tool_response>{observation}</tool_response>", False)]
    segments.append((final, True))
    ids: list[int] = []
    mask: list[bool] = []
    for text, generated in segments:
        part = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += part
        mask += [generated] * len(part)
    eos = tokenizer.eos_token_id
    assert isinstance(eos, int)
    prompt_ids = tokenizer(str(prompt), add_special_tokens=False)["input_ids"]
    return list(prompt_ids), [*ids, eos], [*mask, True]


def sft_on_trajectories(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    problems: Sequence[str],
    tools: list[dict[Any, Any] | Callable[..., Any]],
    *,
    steps: int,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """Teacher-forced training on ideal trajectories, loss on the model's turns only.

    Returns:
        The per-step losses.
    """
    examples = [_encode(tokenizer, p, tools) for p in problems]
    pad = tokenizer.pad_token_id
    assert isinstance(pad, int)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    model.train()
    for _ in range(steps):
        batch = [examples[i] for i in torch.randint(len(examples), (batch_size,), generator=gen)]
        width = max(len(p) + len(r) for p, r, _ in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (prompt, response, mask) in enumerate(batch):
            full = prompt + response
            ids[row, : len(full)] = torch.tensor(full)
            attention[row, : len(full)] = 1
            for k, (token, generated) in enumerate(zip(response, mask, strict=True)):
                if generated:
                    labels[row, len(prompt) + k] = token
        logits = model(input_ids=ids, attention_mask=attention).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
            labels[:, 1:].reshape(-1),
            ignore_index=-100,
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    model.train(False)
    return losses


def make_agent_toy_task(
    out: str | Path,
    *,
    num_train: int = 512,
    num_test: int = 128,
    sft_examples: int = 64,
    sft_steps: int = 200,
    seed: int = 0,
    hidden_size: int = 96,
    num_layers: int = 3,
    sft_batch_size: int = 32,
) -> Path:
    """Writes the data, tokenizer and warm-started model of the task under ``out``.

    Layout: ``train.jsonl``, ``test.jsonl``, ``warmstart/`` (model + tokenizer)
    and ``base/`` (the same model before the warm start).

    Args:
        out: Directory to create.
        num_train: Training problems.
        num_test: Held-out problems.
        sft_examples: Training problems the warm start sees.
        sft_steps: Warm-start steps (few: the format, not mastery).
        seed: Seeds data, initialisation and warm start.
        hidden_size: Model width (the default model has ~0.3 M parameters).
        num_layers: Decoder layers.
        sft_batch_size: Trajectories per warm-start step.

    Returns:
        ``out`` as a path.
    """
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    train, test = make_agent_problems(num_train, num_test, seed=seed)
    write_jsonl(root / "train.jsonl", train)
    write_jsonl(root / "test.jsonl", test)
    tokenizer = build_agent_tokenizer()
    model = build_toy_model(
        toy_model_config(
            tokenizer,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=hidden_size * 8 // 3,
            max_position_embeddings=160,
        ),
        seed=seed,
    )
    for name, trained in (("base", False), ("warmstart", True)):
        if trained:
            tools: list[dict[Any, Any] | Callable[..., Any]] = [_python_schema()]
            problems = [row["problem"] for row in train[:sft_examples]]
            sft_on_trajectories(
                model,
                tokenizer,
                problems,
                tools,
                steps=sft_steps,
                batch_size=sft_batch_size,
                seed=seed,
            )
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def _python_schema() -> dict[str, Any]:
    """The ``python`` tool's schema, without probing the sandbox (rendering needs only the name)."""
    return {"type": "function", "function": {"name": "python", "description": "", "parameters": {}}}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rlinf.reasoning.agent_toy_task --out DIR``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="Directory to write the task into.")
    parser.add_argument("--num-train", type=int, default=512)
    parser.add_argument("--num-test", type=int, default=128)
    parser.add_argument("--sft-examples", type=int, default=64)
    parser.add_argument("--sft-steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    root = make_agent_toy_task(
        args.out,
        num_train=args.num_train,
        num_test=args.num_test,
        sft_examples=args.sft_examples,
        sft_steps=args.sft_steps,
        seed=args.seed,
    )
    print(f"wrote the agent toy task to {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
