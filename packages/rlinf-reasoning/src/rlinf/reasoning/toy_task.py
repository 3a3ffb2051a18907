"""A synthetic arithmetic task for CPU-sized reasoning RL, built entirely offline.

The task: ``"12+7="`` -> ``"19"``, ``"3-41="`` -> ``"-38"`` (sums and
differences of 0..``max_operand``). Everything a GRPO run needs is generated
locally:

* ``train.jsonl`` / ``test.jsonl`` with rows ``{"problem": "12+7=", "answer": "19"}``
  (the two splits share no problem);
* a character-level tokenizer built with the ``tokenizers`` library and saved
  as a ``PreTrainedTokenizerFast`` (``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``;
  BOS prepended on encode; left padding);
* a tiny ``Qwen2ForCausalLM`` given a *short* supervised warm start, so that it
  answers in the right format but only partly correctly and RL has room to
  improve.

Answer format: the model continues the prompt with the answer's characters and
then ``<eos>``: ``"<bos>12+7=" -> "19<eos>"``. Decoded with
``skip_special_tokens=True`` the response is exactly ``"19"``, which a math
verifier grades directly; :func:`extract_answer` (the last integer in the
text) is the fallback a reward can use for anything less clean.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from torch import nn
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from rlinf.reasoning.engines.base import SamplingParams
from rlinf.reasoning.engines.hf import HFEngine

__all__ = [
    "SPECIAL_TOKENS",
    "VOCAB_CHARS",
    "SFTResult",
    "ToyTaskConfig",
    "ToyTaskResult",
    "build_tokenizer",
    "build_toy_model",
    "char_level_tokenizer",
    "evaluate_accuracy",
    "extract_answer",
    "is_correct",
    "make_problems",
    "make_smoke_task",
    "make_toy_task",
    "read_jsonl",
    "sft_warm_start",
    "toy_model_config",
    "write_jsonl",
]

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>")
"""Special tokens; their ids are 0, 1, 2, 3 in this order."""

VOCAB_CHARS: str = "0123456789+-*/=(). \\boxed{}"
"""Ordinary characters of the tokenizer (the ``\\boxed{}`` letters allow that format too)."""

_INT_RE = re.compile(r"-?\d+")


# --------------------------------------------------------------------------- data


def make_problems(
    num_train: int,
    num_test: int,
    *,
    max_operand: int = 99,
    ops: Sequence[str] = ("+", "-"),
    seed: int = 0,
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Draws disjoint train and test sets of ``a op b =`` problems.

    Args:
        num_train: Number of training rows.
        num_test: Number of held-out rows (no problem appears in both splits).
        max_operand: Operands are drawn from ``0..max_operand``.
        ops: Operators, a subset of ``("+", "-")``.
        seed: RNG seed.

    Returns:
        ``(train, test)`` lists of ``{"problem": "a+b=", "answer": "c"}``.

    Raises:
        ValueError: For unsupported operators, bad sizes, or more rows than distinct problems.
    """
    if not ops or any(op not in ("+", "-") for op in ops):
        raise ValueError(f"ops must be a non-empty subset of ('+', '-'), got {tuple(ops)!r}")
    if num_train < 0 or num_test < 0:
        raise ValueError(f"num_train and num_test must be >= 0, got {num_train}, {num_test}")
    if max_operand < 1:
        raise ValueError(f"max_operand must be >= 1, got {max_operand}")
    ops = sorted(set(ops))
    total = (max_operand + 1) ** 2 * len(ops)
    if num_train + num_test > total:
        raise ValueError(
            f"num_train + num_test = {num_train + num_test} exceeds the {total} distinct "
            f"problems with max_operand={max_operand} and ops={ops}"
        )
    rng = random.Random(seed)
    chosen = rng.sample(range(total), num_train + num_test)
    rows = []
    for code in chosen:
        op = ops[code % len(ops)]
        a, b = divmod(code // len(ops), max_operand + 1)
        value = a + b if op == "+" else a - b
        rows.append({"problem": f"{a}{op}{b}=", "answer": str(value)})
    return rows[:num_train], rows[num_train:]


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Writes one JSON object per line.

    Args:
        path: Output file.
        rows: JSON-serialisable dicts.
    """
    with Path(path).open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Reads a JSON-lines file (blank lines are skipped).

    Args:
        path: Input file.

    Returns:
        The rows.
    """
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------------- grading


def extract_answer(text: str) -> str | None:
    r"""The last integer in ``text`` (``"19"``, ``"\boxed{-3}"`` -> ``"-3"``), or None.

    Args:
        text: A decoded response.

    Returns:
        The integer's text, or ``None`` when there is none.
    """
    found = _INT_RE.findall(text)
    return found[-1] if found else None


def is_correct(response: str, answer: str) -> bool:
    """Whether the last integer of ``response`` equals ``answer`` numerically.

    Args:
        response: Decoded response text.
        answer: Reference answer, e.g. ``"19"``.

    Returns:
        True on a match.
    """
    got = extract_answer(response)
    if got is None:
        return False
    try:
        return int(got) == int(answer.strip())
    except ValueError:
        return False


# -------------------------------------------------------------- tokenizer/model


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character of :data:`VOCAB_CHARS`.

    ``encode`` prepends ``<bos>``; ``decode`` concatenates characters without
    spaces; padding is on the left (for generation). Unknown characters map to
    ``<unk>``.

    Returns:
        The tokenizer, ready for ``save_pretrained``.
    """
    return char_level_tokenizer(VOCAB_CHARS, prepend_bos=True)


def char_level_tokenizer(chars: Sequence[str], *, prepend_bos: bool) -> PreTrainedTokenizerFast:
    """A tokenizer with one token per entry of ``chars`` after :data:`SPECIAL_TOKENS`.

    Args:
        chars: The ordinary tokens (single characters, split one per token).
        prepend_bos: ``encode`` prepends ``<bos>`` (off when a chat template writes it).

    Returns:
        The tokenizer (left padding), ready for ``save_pretrained``.
    """
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *chars])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    if prepend_bos:
        bos_id = vocab["<bos>"]
        backend.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos_id)]
        )
    fast_cls: Any = PreTrainedTokenizerFast  # untyped constructor in transformers' stubs
    tokenizer: PreTrainedTokenizerFast = fast_cls(
        tokenizer_object=backend,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )
    return tokenizer


def toy_model_config(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    max_position_embeddings: int = 128,
) -> Qwen2Config:
    """Config of a tiny Qwen2 sized to ``tokenizer``.

    Args:
        tokenizer: The task tokenizer (sets vocab size and special ids).
        hidden_size: Model width.
        num_layers: Decoder layers.
        num_heads: Attention heads.
        num_kv_heads: Key/value heads (grouped-query attention).
        intermediate_size: MLP width.
        max_position_embeddings: Longest prompt + response.

    Returns:
        The config (tied embeddings).
    """
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_toy_model(config: Qwen2Config, *, seed: int = 0) -> Qwen2ForCausalLM:
    """Randomly initialised model for ``config``, with a matching generation config.

    Args:
        config: From :func:`toy_model_config`.
        seed: Seed of the initialisation.

    Returns:
        The model (float32, CPU).
    """
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    gen_cls: Any = GenerationConfig  # untyped constructor in transformers' stubs
    model.generation_config = gen_cls(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    return model


def make_smoke_task(out: str | Path, num_prompts: int = 64) -> Path:
    """The smallest runnable task: an untrained one-layer model and ``n+1=`` prompts.

    For smoke tests of the plumbing (placement, restarts, Ctrl-C, config
    errors), where learning does not matter and the SFT warm start of
    :func:`make_toy_task` would only cost time. Writes ``out/model`` (weights,
    config and tokenizer: a ``model_path``) and ``out/train.jsonl`` (rows
    ``{"problem": "3+1=", "answer": "4"}``).

    Args:
        out: The folder to write (created if missing).
        num_prompts: Rows of ``train.jsonl``.

    Returns:
        ``out`` as a Path.
    """
    out = Path(out)
    tokenizer = build_tokenizer()
    model = build_toy_model(
        toy_model_config(
            tokenizer,
            hidden_size=32,
            num_layers=1,
            num_heads=2,
            num_kv_heads=1,
            intermediate_size=64,
        )
    )
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    write_jsonl(
        out / "train.jsonl",
        ({"problem": f"{i}+1=", "answer": str(i + 1)} for i in range(num_prompts)),
    )
    return out


# ------------------------------------------------------------------------- SFT


@dataclass
class SFTResult:
    """Outcome of :func:`sft_warm_start`.

    Attributes:
        steps: Optimizer steps taken.
        seconds: Wall time of the loop.
        losses: Mean answer-token cross-entropy per step.
    """

    steps: int
    seconds: float
    losses: list[float] = field(default_factory=list)

    @property
    def final_loss(self) -> float:
        """Mean loss over the last 10% of steps (NaN if no step ran)."""
        if not self.losses:
            return float("nan")
        tail = self.losses[-max(1, len(self.losses) // 10) :]
        return sum(tail) / len(tail)


def _encode_examples(
    tokenizer: PreTrainedTokenizerFast, rows: Sequence[dict[str, str]]
) -> list[tuple[list[int], int]]:
    """``(ids, prompt_len)`` per row: ``<bos> problem answer <eos>``."""
    eos = tokenizer.eos_token_id
    assert isinstance(eos, int)
    prompts = tokenizer([row["problem"] for row in rows])["input_ids"]
    answers = tokenizer([row["answer"] for row in rows], add_special_tokens=False)["input_ids"]
    return [([*p, *a, eos], len(p)) for p, a in zip(prompts, answers, strict=True)]


def _sft_batch(
    batch: list[tuple[list[int], int]], pad: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``(input_ids, labels, attention_mask)``; labels only after the prompt."""
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for r, (ids, plen) in enumerate(batch):
        input_ids[r, : len(ids)] = torch.tensor(ids)
        labels[r, plen : len(ids)] = torch.tensor(ids[plen:])
        mask[r, : len(ids)] = 1
    return input_ids, labels, mask


def sft_warm_start(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    rows: Sequence[dict[str, str]],
    *,
    steps: int,
    batch_size: int = 128,
    lr: float = 3e-3,
    warmup_steps: int = 20,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
    log_every: int = 100,
) -> SFTResult:
    """Teacher-forced training on ``<bos> problem answer <eos>``, loss on answer and EOS.

    AdamW with linear warm-up then cosine decay to 10% of ``lr``. Batches are
    drawn uniformly at random (seeded); the model is left in eval mode.

    Args:
        model: The model to train in place (any device).
        tokenizer: The task tokenizer.
        rows: Training rows ``{"problem", "answer"}``.
        steps: Optimizer steps (0 skips training).
        batch_size: Sequences per step.
        lr: Peak learning rate.
        warmup_steps: Linear warm-up length.
        seed: Seed of the batch sampler.
        log: Optional callback for progress lines.
        log_every: Steps between progress lines.

    Returns:
        Steps, wall time and per-step losses.
    """
    if not rows:
        raise ValueError("sft_warm_start needs at least one training row")
    examples = _encode_examples(tokenizer, rows)
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    assert isinstance(pad, int)
    opt = torch.optim.AdamW(
        model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01, foreach=True
    )

    def lr_at(step: int) -> float:
        if step < warmup_steps:
            return lr * (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, steps - warmup_steps)
        return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))

    gen = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        index = torch.randint(len(examples), (batch_size,), generator=gen).tolist()
        batch = [examples[i] for i in index]
        input_ids, labels, mask = (t.to(device) for t in _sft_batch(batch, pad))
        logits = model(input_ids=input_ids, attention_mask=mask).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
            labels[:, 1:].reshape(-1),
            ignore_index=-100,
        )
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if log is not None and log_every > 0 and ((step + 1) % log_every == 0):
            log(f"sft step {step + 1}/{steps} loss {losses[-1]:.4f}")
    nn.Module.eval(model)
    return SFTResult(steps=steps, seconds=time.perf_counter() - start, losses=losses)


def evaluate_accuracy(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    rows: Sequence[dict[str, str]],
    *,
    max_new_tokens: int = 8,
    batch_size: int = 256,
) -> float:
    """Held-out greedy accuracy, graded with :func:`is_correct`.

    Decodes through :class:`~rlinf.reasoning.engines.hf.HFEngine` with
    ``top_k=1`` (the same path a rollout uses).

    Args:
        model: The model (used in place; left in eval mode).
        tokenizer: The task tokenizer.
        rows: Rows ``{"problem", "answer"}``.
        max_new_tokens: Generation budget.
        batch_size: Sequences decoded at once.

    Returns:
        Fraction correct in ``[0, 1]`` (0 for no rows).
    """
    if not rows:
        return 0.0
    engine = HFEngine.from_model(model, max_batch_size=batch_size)
    prompts = [tokenizer.encode(row["problem"]) for row in rows]
    outputs = engine.generate(prompts, 1, SamplingParams(top_k=1, max_new_tokens=max_new_tokens))
    correct = 0
    for out in outputs:
        text = tokenizer.decode(out.output_ids, skip_special_tokens=True)
        assert isinstance(text, str)
        correct += is_correct(text, rows[out.prompt_index]["answer"])
    return correct / len(rows)


# ---------------------------------------------------------------------- driver


@dataclass
class ToyTaskConfig:
    """Sizes and hyper-parameters of :func:`make_toy_task` (defaults: the standard task).

    Attributes:
        seed: Seed for data, initialisation and SFT batches.
        num_train: Training problems.
        num_test: Held-out problems.
        max_operand: Largest operand.
        ops: Operators.
        hidden_size: Model width.
        num_layers: Decoder layers.
        num_heads: Attention heads.
        num_kv_heads: Key/value heads.
        intermediate_size: MLP width.
        max_position_embeddings: Longest prompt + response.
        sft_steps: Warm-start optimizer steps.
        batch_size: Warm-start batch size.
        lr: Warm-start peak learning rate.
        eval_size: Held-out rows scored at the end (``None`` = all of ``test``).
        device: Device for the warm start (``"cpu"`` or ``"cuda"``).
    """

    seed: int = 0
    num_train: int = 5000
    num_test: int = 500
    max_operand: int = 99
    ops: tuple[str, ...] = ("+", "-")
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 128
    sft_steps: int = 500
    batch_size: int = 128
    lr: float = 3e-3
    eval_size: int | None = None
    device: str = "cpu"


@dataclass
class ToyTaskResult:
    """What :func:`make_toy_task` wrote and measured.

    Attributes:
        out_dir: The output directory.
        train_path: ``train.jsonl``.
        test_path: ``test.jsonl``.
        model_dir: ``warmstart/`` (model and tokenizer; a valid ``model_path``).
        accuracy: Held-out greedy accuracy of the warm start.
        sft: The warm-start record.
    """

    out_dir: Path
    train_path: Path
    test_path: Path
    model_dir: Path
    accuracy: float
    sft: SFTResult


def make_toy_task(
    out_dir: str | Path,
    config: ToyTaskConfig | None = None,
    *,
    log: Callable[[str], None] | None = None,
) -> ToyTaskResult:
    """Generates the data, tokenizer and warm-started model under ``out_dir``.

    Writes ``train.jsonl``, ``test.jsonl``, ``warmstart/`` (``save_pretrained``
    model + tokenizer) and ``toy_task.json`` (the config and measurements).

    Args:
        out_dir: Output directory (created if missing).
        config: Sizes and hyper-parameters; defaults to :class:`ToyTaskConfig`.
        log: Optional callback for progress lines.

    Returns:
        Paths and measurements.
    """
    cfg = config or ToyTaskConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, test = make_problems(
        cfg.num_train, cfg.num_test, max_operand=cfg.max_operand, ops=cfg.ops, seed=cfg.seed
    )
    train_path, test_path = out / "train.jsonl", out / "test.jsonl"
    write_jsonl(train_path, train)
    write_jsonl(test_path, test)

    tokenizer = build_tokenizer()
    model = build_toy_model(
        toy_model_config(
            tokenizer,
            hidden_size=cfg.hidden_size,
            num_layers=cfg.num_layers,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            intermediate_size=cfg.intermediate_size,
            max_position_embeddings=cfg.max_position_embeddings,
        ),
        seed=cfg.seed,
    )
    nn.Module.to(model, torch.device(cfg.device))
    sft = sft_warm_start(
        model,
        tokenizer,
        train,
        steps=cfg.sft_steps,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        seed=cfg.seed,
        log=log,
    )
    eval_rows = test if cfg.eval_size is None else test[: cfg.eval_size]
    accuracy = evaluate_accuracy(model, tokenizer, eval_rows)

    model_dir = out / "warmstart"
    nn.Module.to(model, torch.device("cpu"))
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    record = {
        "config": asdict(cfg),
        "accuracy": accuracy,
        "eval_rows": len(eval_rows),
        "sft_seconds": sft.seconds,
        "sft_final_loss": sft.final_loss,
        "answer_format": "answer digits then <eos>, e.g. '12+7=' -> '19<eos>'",
    }
    (out / "toy_task.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return ToyTaskResult(out, train_path, test_path, model_dir, accuracy, sft)
