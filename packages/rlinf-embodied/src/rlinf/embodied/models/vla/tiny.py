r"""``make_tiny_vla``: write a complete, randomly initialised VLA model directory (and its CLI).

Tests, docs and quick experiments need a real checkpoint directory without the
network, so this builds one at a tiny size with random weights: ``pi0``
(:func:`~.pi0.tiny.make_tiny_pi0`, transformers' ``PI0ForConditionalGeneration``)
or ``openvla`` / ``openvla-oft`` (:func:`~.openvla.tiny.make_tiny_openvla`, an
openvla-format model decoding autoregressively / in parallel), each with its
tokenizer, image processor config and action statistics. Policies load it
through ``actor.model.model_path`` exactly as they would load a real checkpoint.

Command line::

    python -m rlinf.embodied.models.vla.tiny --kind pi0 --out /tmp/tiny_pi0 \\
        --action-dim 2 --state-dim 2 --num-action-chunks 4 \\
        --instruction "move to the red square" --instruction "go to the green block"
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Literal

import torch

from rlinf.core.protocols.embodied import EnvSpec

__all__ = ["DEFAULT_INSTRUCTIONS", "main", "make_tiny_vla", "random_observations", "tiny_env_spec"]

DEFAULT_INSTRUCTIONS = (
    "move to the red square",
    "go to the green block",
    "reach the blue target",
)
"""The three ``lang_reach`` instruction templates."""

Kind = Literal["pi0", "openvla", "openvla-oft"]

_KINDS = ("pi0", "openvla", "openvla-oft")
"""``--kind`` / ``make_tiny_vla(kind=...)`` values."""

_MODEL_TYPES = {"pi0": "pi0", "openvla": "openvla", "openvla-oft": "openvla"}
"""``--kind`` -> ``actor.model.model_type``."""


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
    action_horizon: int | None = None,
    num_steps: int = 4,
    add_value_head: bool = True,
    value_type: str = "action_level",
    unnorm_key: str = "tiny",
    action_low: Sequence[float] | None = None,
    action_high: Sequence[float] | None = None,
    layers: int = 2,
) -> Path:
    """Builds a random tiny VLA and saves it as a Hugging Face directory.

    Args:
        kind: ``pi0`` (the stock ``PI0ForConditionalGeneration``,
            :func:`~.pi0.tiny.make_tiny_pi0`; it reads ``image_size``, ``patch_size``,
            ``state_dim``, ``action_dim``, ``num_action_chunks``/``action_horizon`` (its
            ``chunk_size``), ``num_steps``, ``instructions``, ``seed``, ``unnorm_key`` and
            ``layers``), ``openvla`` (OpenVLA,
            autoregressive decoding) or ``openvla-oft`` (OpenVLA-OFT, parallel decoding): the
            openvla-format model of :func:`~.openvla.tiny.make_tiny_openvla`, which reads
            ``image_size``, ``patch_size``, ``state_dim`` (its proprio projector),
            ``action_dim``, ``num_action_chunks``, ``instructions``, ``seed``,
            ``unnorm_key``, ``add_value_head``, ``value_type`` and ``action_low``/
            ``action_high`` (its bins are OpenVLA's 256; no wrist image).
        out_dir: Directory to write (created if needed).
        image_size: Square image side in pixels.
        state_dim: Proprio state length (0: no proprio token).
        action_dim: ``A``.
        num_action_chunks: ``C``.
        instructions: The instructions the tokenizer must cover.
        seed: Seed of the random initialisation.
        wrist_image: The env also sends ``obs["wrist_images"]`` (pi0 reads them as a
            second camera; openvla has no wrist input and refuses it).
        patch_size: Vision patch side (divides ``image_size``).
        action_horizon: pi0: ``chunk_size >= C`` (default ``C``).
        num_steps: pi0: Euler steps.
        add_value_head: openvla: build a value head (pi0's heads live in the policy).
        value_type: openvla: ``action_level`` (C values) or ``chunk_level`` (1).
        unnorm_key: Name of the single ``dataset_statistics.json`` entry.
        action_low: openvla: ``q01``/``min`` per dimension (default -1).
        action_high: openvla: ``q99``/``max`` per dimension (default 1).
        layers: ``pi0``: layers of each transformer (default 2; the random lang_reach
            layout needs 4).

    Returns:
        The directory.

    Raises:
        ValueError: Inconsistent sizes (the message names the argument).
    """
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r} must be one of {', '.join(map(repr, _KINDS))}")
    if not instructions:
        raise ValueError("instructions is empty; give the instructions the model must read")
    if kind == "pi0":
        from rlinf.embodied.models.vla.pi0.tiny import make_tiny_pi0

        return make_tiny_pi0(
            out_dir,
            instructions=instructions,
            action_dim=action_dim,
            chunk_size=action_horizon if action_horizon is not None else num_action_chunks,
            image_size=image_size,
            patch_size=patch_size,
            num_steps=num_steps,
            seed=seed,
            unnorm_key=unnorm_key,
            state_dim=state_dim,
            layers=layers,
        )
    if wrist_image:
        raise ValueError(
            f"kind={kind!r} has no wrist camera input; use wrist_image=False (or kind pi0)"
        )
    from rlinf.embodied.models.vla.openvla.tiny import make_tiny_openvla

    return make_tiny_openvla(
        out_dir,
        decode_mode="parallel" if kind == "openvla-oft" else "autoregressive",
        action_dim=action_dim,
        num_action_chunks=num_action_chunks,
        instructions=instructions,
        image_size=image_size,
        patch_size=patch_size,
        state_dim=state_dim,
        seed=seed,
        unnorm_key=unnorm_key,
        add_value_head=add_value_head,
        value_type=value_type,
        action_low=action_low,
        action_high=action_high,
    )


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
        choices=list(_KINDS),
        required=True,
        help="pi0: transformers' PI0ForConditionalGeneration at a tiny size; openvla / "
        "openvla-oft: an openvla-format model (model_type openvla) decoding its action "
        "tokens autoregressively / in parallel",
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
    add_int(
        "--layers",
        default=2,
        help="pi0: layers of SigLIP, the VLM and the expert (default 2; use 4 for "
        "lang_reach_random, where the target is only in the image)",
    )
    add_int("--action-horizon", help="pi0: chunk_size, denoised actions per call >= C (default C)")
    add_int("--num-steps", default=4, help="pi0: Euler steps (default 4)")
    parser.add_argument(
        "--value-type",
        choices=["action_level", "chunk_level"],
        default="action_level",
        help="openvla: value head output, C values or 1",
    )
    parser.add_argument("--no-value-head", action="store_true", help="openvla: build no value head")
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
        action_horizon=args.action_horizon,
        num_steps=args.num_steps,
        add_value_head=not args.no_value_head,
        value_type=args.value_type,
        unnorm_key=args.unnorm_key,
        wrist_image=args.wrist_image,
        layers=args.layers,
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
                _MODEL_TYPES[args.kind],
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
