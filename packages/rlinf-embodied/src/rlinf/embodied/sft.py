r"""Supervised fine-tuning (behaviour cloning) of a policy from demonstrations: the RL warm start.

RLinf's users start RL from an SFT model; this module makes that model inside the
framework. :func:`run_sft` loads a VLA from ``model_path``, trains it on
demonstrations (a ``.npz`` of :mod:`rlinf.embodied.demos`, or recorded from an
env's scripted expert such as ``lang_reach``) with the policy's own supervised
loss (:meth:`BasePolicy.behaviour_cloning_loss`: flow matching for ``pi0``,
cross-entropy on binned action tokens for ``openvla``), evaluates success
before and after on the env, and writes a model directory that an RL config's
``actor.model.model_path`` loads.

It runs in one process (AdamW, no FSDP): the tiny models of the tests and the
tutorial train in seconds to minutes on a CPU. Command line::

    uv run python -m rlinf.embodied.sft --model-path models/tiny --out models/sft \\
        --env-type lang_reach --env-id fixed --steps 400
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlinf.core.logging import get_logger, setup_logging
from rlinf.embodied.demos import Demonstrations, collect_expert_demos
from rlinf.embodied.envs import EnvConfig, make_env
from rlinf.embodied.models import BasePolicy, PolicyConfig, build_policy

__all__ = ["SFTResult", "behaviour_clone", "evaluate_success", "main", "run_sft"]

_log = get_logger("rlinf.embodied.sft")


@dataclass
class SFTResult:
    """What :func:`run_sft` did.

    Attributes:
        out_dir: The model directory written.
        losses: The loss of every optimizer step.
        success_before: Eval success rate of the loaded model (None without eval).
        success_after: Eval success rate of the trained model (None without eval).
        seconds: Wall-clock time of the training steps.
    """

    out_dir: Path
    losses: list[float] = field(default_factory=list)
    success_before: float | None = None
    success_after: float | None = None
    seconds: float = 0.0


def behaviour_clone(
    policy: BasePolicy,
    demos: Demonstrations,
    *,
    steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    log_every: int = 50,
) -> list[float]:
    """Trains ``policy`` on ``demos`` with its behaviour-cloning loss (AdamW, grad clip 1).

    Args:
        policy: The policy (trained in place).
        demos: Observations and expert chunks; ``actions`` must have the policy's
            ``C`` (pi0: up to its ``chunk_size``) rows per sample.
        steps: Optimizer steps.
        batch_size: Samples per step.
        lr: AdamW learning rate.
        seed: Seeds the batch order and any noise the loss draws.
        log_every: Log the mean loss every this many steps (0: never).

    Returns:
        The loss of every step.

    Raises:
        ValueError: ``steps`` < 1, or the loss is not finite.
    """
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(
        [p for p in policy.parameters() if p.requires_grad], lr=lr, weight_decay=0.0
    )
    batches = demos.batches(batch_size, generator)
    policy.train()
    losses: list[float] = []
    for step in range(1, steps + 1):
        obs, actions = next(batches)
        loss = policy.behaviour_cloning_loss(obs, actions, generator=generator)
        if not torch.isfinite(loss):
            raise ValueError(f"behaviour-cloning loss is {float(loss)} at step {step}; lower lr")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if log_every and step % log_every == 0:
            recent = losses[-log_every:]
            _log.info("sft step %d/%d: loss %.4f", step, steps, sum(recent) / len(recent))
    policy.eval()
    return losses


def evaluate_success(
    policy: BasePolicy, env_cfg: EnvConfig, *, num_envs: int = 192, seed: int = 1000
) -> float:
    """Success rate of one deterministic (eval-mode) episode per env.

    Args:
        policy: The policy.
        env_cfg: The env (built here without auto-reset; it must report success).
        num_envs: Episodes, one per env.
        seed: Reset seed.

    Returns:
        The fraction of episodes that succeeded at least once.

    Raises:
        ValueError: The env does not report success.
    """
    cfg = env_cfg.model_copy(update={"num_envs": num_envs, "group_size": 1, "auto_reset": False})
    with make_env(cfg) as env:
        obs = env.reset(seed=seed).obs
        for _ in range(math.ceil(env.spec.max_episode_steps / policy.num_action_chunks)):
            actions = policy.predict_action_batch(obs, mode="eval").actions
            obs = env.chunk_step(actions.cpu())[0].obs
        # Without auto-reset every env holds its (finished or cut) episode: one row each.
        metrics = env.running_metrics()
    if "success_once" not in metrics:
        raise ValueError(f"env {cfg.env_type}/{cfg.env_id} does not report success")
    return float(metrics["success_once"].mean())


def run_sft(
    model_type: str,
    model_path: str | Path,
    out_dir: str | Path,
    env_cfg: EnvConfig,
    *,
    num_action_chunks: int,
    demos: Demonstrations | None = None,
    num_demos: int = 4096,
    noise_std: float = 0.5,
    steps: int = 400,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    eval_envs: int = 192,
) -> SFTResult:
    """Loads a policy from ``model_path``, behaviour-clones it, writes ``out_dir``.

    Args:
        model_type: ``pi0`` or ``openvla`` (a policy with a model directory).
        model_path: The model directory to start from.
        out_dir: Where the trained model directory goes (may equal ``model_path``).
        env_cfg: The env the policy acts in (its spec builds the policy; it records the
            expert's demonstrations when ``demos`` is None, and evaluates).
        num_action_chunks: ``C`` of the model (its config's value).
        demos: Demonstrations to learn from; None records ``num_demos`` from the env's
            scripted expert (``expert_chunk``) with ``noise_std`` execution noise.
        num_demos: Samples to record when ``demos`` is None.
        noise_std: Execution noise of the recording.
        steps: Optimizer steps.
        batch_size: Samples per step.
        lr: AdamW learning rate.
        seed: Seeds recording, batches and noise.
        eval_envs: Episodes of the before/after evaluation (0: skip it).

    Returns:
        The :class:`SFTResult`.
    """
    torch.manual_seed(seed)
    with make_env(env_cfg.model_copy(update={"auto_reset": True})) as env:
        spec = env.spec
        if demos is None:
            _log.info("recording %d expert samples from %s", num_demos, env_cfg.env_type)
            demos = collect_expert_demos(
                env, num_demos, num_action_chunks, noise_std=noise_std, seed=seed
            )
    if demos.instructions is not None and demos.instructions != spec.instructions:
        raise ValueError(
            "the demonstrations' instructions differ from the env's; their task_ids would "
            "name other tasks. Record them with this env or remap task_ids"
        )
    cfg = PolicyConfig(
        model_type=model_type,
        model_path=Path(model_path),
        num_action_chunks=num_action_chunks,
        add_value_head=False,
    )
    policy = build_policy(cfg, spec)
    result = SFTResult(out_dir=Path(out_dir))
    if eval_envs:
        result.success_before = evaluate_success(policy, env_cfg, num_envs=eval_envs)
        _log.info("success before SFT: %.1f%%", 100 * result.success_before)
    start = time.perf_counter()
    result.losses = behaviour_clone(
        policy, demos, steps=steps, batch_size=batch_size, lr=lr, seed=seed
    )
    result.seconds = time.perf_counter() - start
    if eval_envs:
        result.success_after = evaluate_success(policy, env_cfg, num_envs=eval_envs)
        _log.info("success after SFT: %.1f%%", 100 * result.success_after)
    policy.save_pretrained(out_dir)
    _log.info("wrote %s (%d steps in %.0f s)", out_dir, steps, result.seconds)
    return result


def _camera_kwargs(model_path: str, env_type: str) -> dict[str, Any]:
    """``{wrist_camera: true}`` for lang_reach when the model reads a wrist image."""
    config = Path(model_path) / "config.json"
    wrist = config.is_file() and bool(json.loads(config.read_text()).get("wrist_image", False))
    return {"wrist_camera": True} if wrist and env_type == "lang_reach" else {}


def main(argv: Sequence[str] | None = None) -> int:
    """Command line of :func:`run_sft` (``python -m rlinf.embodied.sft --help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m rlinf.embodied.sft",
        description="Behaviour-clone a VLA from demonstrations and write a model_path for RL.",
    )
    parser.add_argument(
        "--model-type",
        choices=["pi0", "openvla"],
        default="pi0",
        help="policy of --model-path: pi0 or openvla (OpenVLA / OpenVLA-OFT, its config.json "
        "decode_mode) (default pi0)",
    )
    parser.add_argument("--model-path", required=True, help="model directory to start from")
    parser.add_argument("--out", required=True, help="model directory to write")
    parser.add_argument("--env-type", default="lang_reach", help="env for demos and eval")
    parser.add_argument("--env-id", default="fixed", help="task id / lang_reach layout")
    parser.add_argument("--num-envs", type=int, default=64, help="envs recording demos")
    parser.add_argument("--image-size", type=int, default=None, help="square image side")
    parser.add_argument("--num-action-chunks", type=int, default=4, help="C of the model")
    parser.add_argument("--demos", default=None, help=".npz demonstrations (default: expert)")
    parser.add_argument("--num-demos", type=int, default=4096, help="expert samples to record")
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per step")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed")
    parser.add_argument("--eval-envs", type=int, default=192, help="eval episodes (0: none)")
    args = parser.parse_args(argv)
    setup_logging()
    env_cfg = EnvConfig.model_validate(
        {
            "env_type": args.env_type,
            "env_id": args.env_id,
            "num_envs": args.num_envs,
            "obs_mode": "rgb",
            "image_size": args.image_size,
            "env_kwargs": _camera_kwargs(args.model_path, args.env_type),
        }
    )
    demos = Demonstrations.load(args.demos) if args.demos else None
    try:
        result = run_sft(
            args.model_type,
            args.model_path,
            args.out,
            env_cfg,
            num_action_chunks=args.num_action_chunks,
            demos=demos,
            num_demos=args.num_demos,
            steps=args.steps,
            batch_size=args.batch_size,
            lr=args.lr,
            seed=args.seed,
            eval_envs=args.eval_envs,
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"sft: {exc}", file=sys.stderr)
        return 2
    before, after = result.success_before, result.success_after
    if before is not None and after is not None:
        print(f"success {100 * before:.1f}% -> {100 * after:.1f}% ({result.out_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
