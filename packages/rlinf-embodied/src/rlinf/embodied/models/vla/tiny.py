r"""``make_tiny_vla``: write a complete, randomly initialised VLA model directory (and its CLI).

Tests, docs and quick experiments need a real Hugging Face directory without the
network, so this builds one from configs: ``config.json`` and
``model.safetensors`` (``save_pretrained``), ``tokenizer.json`` +
``tokenizer_config.json`` (a word-level tokenizer over the given instructions),
``preprocessor_config.json`` and ``dataset_statistics.json``. Policies load it
through ``actor.model.model_path`` exactly as they would load a real checkpoint.

Command line::

    python -m rlinf.embodied.models.vla.tiny --kind token --out /tmp/tiny_token \\
        --action-dim 2 --state-dim 2 --num-action-chunks 4 \\
        --instruction "move to the red square" --instruction "go to the green block"
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch

from rlinf.core.protocols.embodied import EnvSpec
from rlinf.embodied.models.vla.configuration import (
    FlowVLAConfig,
    TokenVLAConfig,
    default_expert_config,
    default_text_config,
    default_vision_config,
)
from rlinf.embodied.models.vla.instructions import build_instruction_tokenizer
from rlinf.embodied.models.vla.modeling_flow import FlowVLAModel
from rlinf.embodied.models.vla.modeling_token import TokenVLAModel
from rlinf.embodied.models.vla.preprocessing import VLAImageProcessor
from rlinf.embodied.models.vla.statistics import write_dataset_statistics

__all__ = ["DEFAULT_INSTRUCTIONS", "main", "make_tiny_vla", "random_observations", "tiny_env_spec"]

DEFAULT_INSTRUCTIONS = (
    "move to the red square",
    "go to the green block",
    "reach the blue target",
)
"""The three ``lang_reach`` instruction templates."""

Kind = Literal["token", "flow"]


def make_tiny_vla(
    kind: Kind,
    out_dir: str | Path,
    *,
    image_size: int = 32,
    state_dim: int = 0,
    action_dim: int = 2,
    num_action_chunks: int = 4,
    instructions: Sequence[str] = DEFAULT_INSTRUCTIONS,
    seed: int = 0,
    wrist_image: bool = False,
    patch_size: int = 8,
    n_action_bins: int = 32,
    action_horizon: int | None = None,
    num_steps: int = 4,
    add_value_head: bool = True,
    value_type: str = "action_level",
    max_prompt_length: int | None = None,
    unnorm_key: str = "tiny",
    action_low: Sequence[float] | None = None,
    action_high: Sequence[float] | None = None,
    action_mask: Sequence[bool] | None = None,
) -> Path:
    """Builds a random tiny VLA and saves it as a Hugging Face directory.

    Args:
        kind: ``token`` (OpenVLA-OFT style) or ``flow`` (pi0 style).
        out_dir: Directory to write (created if needed).
        image_size: Square image side in pixels.
        state_dim: Proprio state length (0: no proprio token).
        action_dim: ``A``.
        num_action_chunks: ``C``.
        instructions: The instructions the tokenizer must cover.
        seed: Seed of the random initialisation.
        wrist_image: The model also sees ``obs["wrist_images"]``.
        patch_size: Vision patch side (divides ``image_size``).
        n_action_bins: Bins per action dimension (token).
        action_horizon: ``H >= C`` (flow; default ``C``).
        num_steps: Euler steps (flow).
        add_value_head: Build a value head.
        value_type: ``action_level`` (C values) or ``chunk_level`` (1).
        max_prompt_length: Prompt length (default: the longest instruction, at least 8).
        unnorm_key: Name of the single ``dataset_statistics.json`` entry.
        action_low: ``q01``/``min`` per dimension (default -1).
        action_high: ``q99``/``max`` per dimension (default 1).
        action_mask: Which dimensions are de-normalised (default all).

    Returns:
        The directory.

    Raises:
        ValueError: Inconsistent sizes (the message names the argument).
    """
    if kind not in ("token", "flow"):
        raise ValueError(f"kind={kind!r} must be 'token' or 'flow'")
    if not instructions:
        raise ValueError("instructions is empty; give the instructions the model must read")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_instruction_tokenizer(instructions)
    longest = max(len(tokenizer(text)["input_ids"]) for text in instructions)
    prompt_length = max_prompt_length if max_prompt_length is not None else max(8, longest)
    vision = {**default_vision_config(), "patch_size": patch_size}
    text = default_text_config()
    common: dict[str, Any] = {
        "vision_config": vision,
        "action_dim": action_dim,
        "num_action_chunks": num_action_chunks,
        "image_size": image_size,
        "state_dim": state_dim,
        "wrist_image": wrist_image,
        "max_prompt_length": prompt_length,
        "add_value_head": add_value_head,
        "value_type": value_type,
    }
    torch.manual_seed(seed)
    model: TokenVLAModel | FlowVLAModel
    if kind == "token":
        text["vocab_size"] = len(tokenizer) + n_action_bins
        model = TokenVLAModel(
            TokenVLAConfig(text_config=text, n_action_bins=n_action_bins, **common)
        )
    else:
        text["vocab_size"] = len(tokenizer)
        model = FlowVLAModel(
            FlowVLAConfig(
                text_config=text,
                expert_config=default_expert_config(),
                action_horizon=action_horizon if action_horizon is not None else num_action_chunks,
                num_steps=num_steps,
                **common,
            )
        )
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    VLAImageProcessor(image_size=image_size).save(out)
    low = list(action_low) if action_low is not None else [-1.0] * action_dim
    high = list(action_high) if action_high is not None else [1.0] * action_dim
    mask = list(action_mask) if action_mask is not None else [True] * action_dim
    if not len(low) == len(high) == len(mask) == action_dim:
        raise ValueError(
            f"action_low/action_high/action_mask need action_dim={action_dim} entries, got "
            f"{len(low)}/{len(high)}/{len(mask)}"
        )
    write_dataset_statistics(
        out, {unnorm_key: {"q01": low, "q99": high, "min": low, "max": high, "mask": mask}}
    )
    return out


def tiny_env_spec(
    *,
    image_size: int = 32,
    state_dim: int = 0,
    action_dim: int = 2,
    instructions: Sequence[str] = DEFAULT_INSTRUCTIONS,
    wrist_image: bool = False,
) -> EnvSpec:
    """The :class:`EnvSpec` of an env that a default tiny VLA serves (for tests and docs)."""
    return EnvSpec(
        state_dim=state_dim if state_dim > 0 else None,
        image_shape=(image_size, image_size, 3),
        action_dim=action_dim,
        instructions=tuple(instructions),
        wrist_image_shape=(image_size, image_size, 3) if wrist_image else None,
    )


def random_observations(
    spec: EnvSpec, num_envs: int, generator: torch.Generator | None = None
) -> dict[str, torch.Tensor]:
    """Random ``main_images``, ``task_ids`` (and ``states``, ``wrist_images``) that fit ``spec``.

    Raises:
        ValueError: ``spec`` has no images or no instructions.
    """
    if spec.image_shape is None or not spec.instructions:
        raise ValueError("random_observations needs a spec with image_shape and instructions")

    def images(shape: tuple[int, int, int]) -> torch.Tensor:
        return torch.randint(0, 256, (num_envs, *shape), dtype=torch.uint8, generator=generator)

    obs = {
        "main_images": images(spec.image_shape),
        "task_ids": torch.randint(0, len(spec.instructions), (num_envs,), generator=generator),
    }
    if spec.state_dim is not None:
        obs["states"] = torch.randn(num_envs, spec.state_dim, generator=generator)
    if spec.wrist_image_shape is not None:
        obs["wrist_images"] = images(spec.wrist_image_shape)
    return obs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlinf.embodied.models.vla.tiny",
        description=(
            "Write a randomly initialised tiny VLA (Hugging Face directory: config.json, "
            "model.safetensors, tokenizer, preprocessor_config.json, dataset_statistics.json) "
            "that actor.model.model_path can point at."
        ),
    )
    parser.add_argument(
        "--kind",
        choices=["token", "flow"],
        required=True,
        help="token: OpenVLA-OFT-style discrete actions; flow: pi0-style flow matching",
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    add_int = partial(parser.add_argument, type=int)
    add_int("--image-size", default=32, help="square image side (default 32)")
    add_int("--patch-size", default=8, help="vision patch side (default 8)")
    add_int("--state-dim", default=0, help="proprio state length; 0 = no proprio token (default 0)")
    add_int("--action-dim", default=2, help="action dimensions A (default 2)")
    add_int("--num-action-chunks", default=4, help="actions per call C (default 4)")
    parser.add_argument(
        "--instruction",
        action="append",
        dest="instructions",
        metavar="TEXT",
        help="an instruction the tokenizer must cover (repeat the flag; default: "
        "the three lang_reach templates)",
    )
    add_int("--seed", default=0, help="initialisation seed (default 0)")
    add_int("--n-action-bins", default=32, help="token: bins per action dimension (default 32)")
    add_int("--action-horizon", help="flow: denoised actions per call H >= C (default C)")
    add_int("--num-steps", default=4, help="flow: Euler steps (default 4)")
    parser.add_argument(
        "--value-type",
        choices=["action_level", "chunk_level"],
        default="action_level",
        help="value head output: C values or 1",
    )
    parser.add_argument("--no-value-head", action="store_true", help="build no value head")
    parser.add_argument(
        "--wrist-image",
        action="store_true",
        help="the model also sees obs['wrist_images'] (lang_reach: env_kwargs.wrist_camera)",
    )
    parser.add_argument(
        "--unnorm-key",
        default="tiny",
        help="name of the dataset_statistics.json entry (default tiny)",
    )
    parser.add_argument(
        "--task",
        choices=sorted(_TASKS),
        default=None,
        help="with --sft-steps: the env whose scripted expert the model imitates",
    )
    add_int(
        "--sft-steps",
        default=0,
        help="behaviour-clone the new model for this many steps on --task (default 0: "
        "random weights; see python -m rlinf.embodied.sft for more options)",
    )
    return parser


_TASKS = {"lang_reach_fixed": "fixed", "lang_reach_random": "random"}
"""``--task`` -> lang_reach layout (``env_id``)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.sft_steps < 0 or (args.sft_steps and args.task is None):
        print(
            f"make-tiny-vla: --sft-steps={args.sft_steps} needs a value >= 0 and, when > 0, "
            f"--task (one of {', '.join(sorted(_TASKS))})",
            file=sys.stderr,
        )
        return 2
    out = make_tiny_vla(
        args.kind,
        args.out,
        image_size=args.image_size,
        patch_size=args.patch_size,
        state_dim=args.state_dim,
        action_dim=args.action_dim,
        num_action_chunks=args.num_action_chunks,
        instructions=tuple(args.instructions or DEFAULT_INSTRUCTIONS),
        seed=args.seed,
        n_action_bins=args.n_action_bins,
        action_horizon=args.action_horizon,
        num_steps=args.num_steps,
        add_value_head=not args.no_value_head,
        value_type=args.value_type,
        unnorm_key=args.unnorm_key,
        wrist_image=args.wrist_image,
    )
    print(f"wrote a tiny {args.kind} VLA to {out}")
    if args.sft_steps:
        from rlinf.embodied.envs import EnvConfig
        from rlinf.embodied.sft import run_sft

        env = EnvConfig.model_validate(
            {
                "env_type": "lang_reach",
                "env_id": _TASKS[args.task],
                "num_envs": 64,
                "obs_mode": "rgb",
                "image_size": args.image_size,
                "env_kwargs": {"wrist_camera": True} if args.wrist_image else {},
            }
        )
        try:
            result = run_sft(
                f"{args.kind}_vla",
                out,
                out,
                env,
                num_action_chunks=args.num_action_chunks,
                steps=args.sft_steps,
                seed=args.seed,
            )
        except ValueError as exc:
            print(f"make-tiny-vla: {exc}", file=sys.stderr)
            return 2
        before, after = result.success_before or 0.0, result.success_after or 0.0
        print(f"SFT on {args.task}: success {100 * before:.1f}% -> {100 * after:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
