"""Generate the toy arithmetic task for CPU-sized reasoning RL (no downloads).

Writes, under --out:

  train.jsonl, test.jsonl   rows {"problem": "12+7=", "answer": "19"}
  warmstart/                a tiny Qwen2ForCausalLM + character-level tokenizer
                            (save_pretrained; use it as the actor/rollout model_path)
  toy_task.json             the settings and the measured warm-start accuracy

The warm start is deliberately short: the model learns the answer format
("19" then <eos>) but gets only part of the held-out problems right, so GRPO
has room to improve. The reward grades the decoded response with the math
verifier; extracting the last integer is the fallback.

    uv run python examples/reasoning/make_toy_task.py --out /tmp/toy
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from rlinf.reasoning.toy_task import ToyTaskConfig, make_toy_task


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = ToyTaskConfig()
    p = argparse.ArgumentParser(
        description="Generate the synthetic arithmetic task, tokenizer and warm-started model.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", required=True, help="output directory (created if missing)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed for data, init and SFT")
    p.add_argument("--num-train", type=int, default=d.num_train, help="training problems")
    p.add_argument("--num-test", type=int, default=d.num_test, help="held-out problems")
    p.add_argument("--max-operand", type=int, default=d.max_operand, help="largest operand")
    p.add_argument("--ops", default="".join(d.ops), help="operators to use, from '+-'")
    p.add_argument("--hidden-size", type=int, default=d.hidden_size, help="model width")
    p.add_argument("--num-layers", type=int, default=d.num_layers, help="decoder layers")
    p.add_argument("--intermediate-size", type=int, default=d.intermediate_size, help="MLP width")
    p.add_argument("--sft-steps", type=int, default=d.sft_steps, help="warm-start steps")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="warm-start batch size")
    p.add_argument("--lr", type=float, default=d.lr, help="warm-start peak learning rate")
    p.add_argument(
        "--eval-size", type=int, default=None, help="held-out rows to score (default: all)"
    )
    p.add_argument("--device", default=d.device, help="device for the warm start")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (tiny models run fastest on one; 0 keeps torch's default)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    cfg = ToyTaskConfig(
        seed=args.seed,
        num_train=args.num_train,
        num_test=args.num_test,
        max_operand=args.max_operand,
        ops=tuple(args.ops),
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        intermediate_size=args.intermediate_size,
        sft_steps=args.sft_steps,
        batch_size=args.batch_size,
        lr=args.lr,
        eval_size=args.eval_size,
        device=args.device,
    )
    start = time.perf_counter()
    result = make_toy_task(args.out, cfg, log=lambda line: print(line, flush=True))
    total = time.perf_counter() - start
    print(f"wrote {result.train_path} ({cfg.num_train} rows), {result.test_path} ({cfg.num_test})")
    print(f"wrote {result.model_dir} (model + tokenizer)")
    print(
        f"warm start: {result.sft.steps} steps in {result.sft.seconds:.1f}s, "
        f"final loss {result.sft.final_loss:.3f}"
    )
    print(f"held-out greedy accuracy: {result.accuracy:.3f} (total {total:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
