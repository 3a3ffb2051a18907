r"""``openvla``: OpenVLA (``autoregressive``) and OpenVLA-OFT (``parallel``) as a policy.

``actor.model.model_path`` is an openvla-format directory: ``config.json``
(``model_type: openvla``; ``decode_mode`` picks the decoding, default
``autoregressive``), weights under the prismatic key names, a Llama 2 tokenizer,
``preprocessor_config.json`` and action statistics (``dataset_statistics.json``,
else ``config.json``'s ``norm_stats``). Mismatches with the env spec and the
config are errors at construction that name the key, the value and the fix.

Observations: ``main_images`` [n, H, W, 3] uint8 (resized to the towers' size if
needed), ``task_ids`` [n] into ``EnvSpec.instructions`` (each instruction is
tokenized once, as OpenVLA's prompt ``In: What action should the robot take to
{instruction}?\nOut:`` with ``<s>``, plus the empty ``"▁"`` piece (29871 in Llama 2)
that ``predict_action`` appends), or, when the env sends its own wording
(``instruction_text`` [n, L] uint8, :mod:`rlinf.core.protocols.instruction_text`),
that text instead of ``task_ids`` (any wording, unseen ones included: tokenized
on first sight and cached by string), and ``states`` [n, d] when the model has a
proprio projector (normalised with the statistics' ``proprio`` q01/q99 when
present, as OFT does). ``forward_inputs`` holds those entries (so the actor
re-scores with the rollout's prompt) plus ``action_tokens`` [n, C, A] int64
vocabulary ids.

Sampling restricts the logits to the ``n_action_bins`` action ids, then applies
``cfg.temperature`` and ``cfg.top_k`` (:mod:`..token_sampling`), in rollout and
actor alike; ``eval`` takes the argmax. Logprobs and entropy are per token,
``[n, C * A]``.

LoRA (``actor.model.lora``): adapters per :mod:`..lora`; with ``target_modules: null``
the targets are :data:`LORA_TARGET_MODULES` (RLinf's OpenVLA list) instead of the
SigLIP/Llama default, which names modules this model does not have.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from safetensors.torch import save_file
from torch import Tensor
from transformers import AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rlinf.core.protocols.embodied import EnvSpec, PolicyOutput
from rlinf.core.protocols.instruction_text import INSTRUCTION_TEXT_KEY, decode_instruction_text
from rlinf.embodied.models.base import BasePolicy
from rlinf.embodied.models.config import PolicyConfig
from rlinf.embodied.models.registry import register_policy
from rlinf.embodied.models.vla.lora import (
    ADAPTER_DIR,
    HEADS_FILE,
    apply_lora,
    base_state_dict,
    head_state_dict,
    merged_copy,
)
from rlinf.embodied.models.vla.model_dir import copy_side_files, require_model_path
from rlinf.embodied.models.vla.openvla.action_tokenizer import OpenVLAActionTokenizer
from rlinf.embodied.models.vla.openvla.configuration import OpenVLAConfig
from rlinf.embodied.models.vla.openvla.modeling import OpenVLAModel, OpenVLAOutput
from rlinf.embodied.models.vla.openvla.vision import OpenVLAImageProcessor
from rlinf.embodied.models.vla.statistics import (
    STATISTICS_FILE,
    ActionNormalizer,
    resolve_unnorm_key,
)
from rlinf.embodied.models.vla.token_sampling import (
    sample_action_ids,
    token_entropy,
    token_log_probs,
    warp_action_logits,
)

__all__ = ["EMPTY_PIECE", "LORA_TARGET_MODULES", "OpenVLAPolicy", "encode_prompts", "prompt_text"]

LORA_TARGET_MODULES = (
    "qkv",
    "proj",
    "fc3",
    "lm_head",
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)
"""Default LoRA targets (RLinf's OpenVLA list): ViT ``qkv``/``proj`` (``proj`` also matches
the patch-embedding conv and the attention-pool projection), the projector's ``fc3``, the
LM head and the Llama attention/MLP projections."""

EMPTY_PIECE = "▁"
"""The SentencePiece word-start piece OpenVLA appends after ``Out:`` (id 29871 in Llama 2)."""

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


def prompt_text(instruction: str) -> str:
    """OpenVLA's prompt for one instruction (lower-cased, as in OpenVLA's ``predict_action``)."""
    return f"In: What action should the robot take to {instruction.lower()}?\nOut:"


def _empty_piece(tokenizer: PreTrainedTokenizerBase) -> int:
    empty = tokenizer.convert_tokens_to_ids(EMPTY_PIECE)
    if not isinstance(empty, int) or empty == tokenizer.unk_token_id:
        raise ValueError(
            f"the tokenizer has no {EMPTY_PIECE!r} piece (OpenVLA appends it, id 29871 in "
            "Llama 2, after 'Out:'); use the Llama 2 tokenizer the model was trained with"
        )
    return empty


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase,
    instructions: Sequence[str],
    pad_id: int,
    cache: dict[str, list[int]] | None = None,
) -> tuple[Tensor, Tensor]:
    """Tokenizes each distinct instruction once into OpenVLA's prompt, left-padded.

    Each prompt gets ``<s>`` (the tokenizer's) and ends with the ``"▁"`` piece.

    Args:
        tokenizer: The model's Llama 2 tokenizer.
        instructions: ``EnvSpec.instructions`` (or the texts of one batch).
        pad_id: Id put at padded positions (masked out).
        cache: Instruction -> prompt ids, read and filled (None: a fresh one per call).

    Returns:
        ``input_ids`` and ``attention_mask``, ``[len(instructions), L]`` int64, ``L`` the
        longest prompt of ``instructions``.

    Raises:
        ValueError: The tokenizer has no ``"▁"`` piece, or ``instructions`` is empty.
    """
    if not instructions:
        raise ValueError("encode_prompts needs at least one instruction")
    empty = _empty_piece(tokenizer)
    cache = {} if cache is None else cache
    rows = []
    for text in instructions:
        if text not in cache:
            ids = list(tokenizer(prompt_text(text))["input_ids"])
            cache[text] = ids if ids and ids[-1] == empty else [*ids, empty]
        rows.append(cache[text])
    length = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for index, row in enumerate(rows):
        input_ids[index, length - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[index, length - len(row) :] = 1
    return input_ids, mask


def _require_model_path(cfg: PolicyConfig) -> Path:
    path = require_model_path(
        cfg,
        "an openvla-format directory (config.json, model.safetensors, tokenizer, "
        "preprocessor_config.json, dataset_statistics.json; e.g. openvla/openvla-7b)",
        "make-tiny-vla --kind openvla --out DIR",
    )
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    if model_type != OpenVLAConfig.model_type:
        raise ValueError(
            f"actor.model.model_path={str(path)!r} has config.json model_type={model_type!r} but "
            "model_type 'openvla' needs model_type 'openvla'; point model_path at an OpenVLA "
            "checkpoint or set actor.model.model_type to the policy of that model "
            "(pi0 checkpoints -> pi0)"
        )
    return path


def _statistics(path: Path, config: OpenVLAConfig) -> tuple[str, dict[str, Any]]:
    """Statistics entries: ``dataset_statistics.json``, else ``config.json``'s ``norm_stats``."""
    file = path / STATISTICS_FILE
    if file.is_file():
        data: dict[str, Any] = json.loads(file.read_text())
        return str(file), data
    if config.norm_stats:
        return f"{path / 'config.json'} norm_stats", dict(config.norm_stats)
    raise FileNotFoundError(
        f"{file} is missing and config.json has no norm_stats; an OpenVLA directory needs "
        "action statistics to de-normalise actions (copy the checkpoint's "
        f"{STATISTICS_FILE})"
    )


def _bounds(block: Mapping[str, Any], where: str) -> ActionNormalizer:
    missing = [name for name in ("q01", "q99") if name not in block]
    if missing:
        raise ValueError(f"{where} lacks {missing}")
    low = torch.tensor(block["q01"], dtype=torch.float32)
    high = torch.tensor(block["q99"], dtype=torch.float32)
    mask = torch.tensor(block.get("mask", [True] * len(low)), dtype=torch.bool)
    return ActionNormalizer(low, high, mask)


@register_policy("openvla")
class OpenVLAPolicy(BasePolicy):
    """OpenVLA / OpenVLA-OFT (see the module docstring).

    Args:
        cfg: The policy config (``model_path`` required).
        spec: The env spec (continuous actions, images and instructions required).
    """

    supports_lora = True
    model: OpenVLAModel
    prompt_ids: Tensor
    prompt_mask: Tensor
    peft_model: PeftModel | None

    def __init__(self, cfg: PolicyConfig, spec: EnvSpec) -> None:
        super().__init__(cfg, spec)
        path = _require_model_path(cfg)
        self.model_path = path
        config = OpenVLAConfig.from_pretrained(str(path), local_files_only=True)
        fresh_value_head = cfg.add_value_head and not config.add_value_head
        overrides: dict[str, Any] = {}
        if fresh_value_head:
            overrides = {"add_value_head": True, "value_type": cfg.value_type}
        self.image_processor = OpenVLAImageProcessor.load(path)
        where, statistics = _statistics(path, config)
        self.unnorm_key = resolve_unnorm_key(list(statistics), cfg.unnorm_key)
        entry = statistics[self.unnorm_key]
        if not isinstance(entry.get("action"), Mapping):
            raise ValueError(f"{where}: entry {self.unnorm_key!r} has no 'action' statistics")
        self.action_normalizer = _bounds(entry["action"], f"{where} [{self.unnorm_key!r}].action")
        proprio = entry.get("proprio")
        self.proprio_normalizer = (
            _bounds(proprio, f"{where} [{self.unnorm_key!r}].proprio")
            if isinstance(proprio, Mapping) and "q01" in proprio and config.proprio_dim > 0
            else None
        )
        tokenizer = self._load_tokenizer(path)
        self._check_model(config, len(tokenizer))
        model = AutoModel.from_pretrained(str(path), local_files_only=True, **overrides)
        if not isinstance(model, OpenVLAModel):  # pragma: no cover - model_type was checked
            raise ValueError(f"{str(path)!r} loaded a {type(model).__name__}, not an OpenVLAModel")
        if fresh_value_head:
            _reset_value_head(model)
        self.action_tokenizer = OpenVLAActionTokenizer(
            config.n_action_bins, config.action_vocab_size
        )
        pad_token = tokenizer.pad_token_id
        pad_id = int(pad_token) if isinstance(pad_token, int) else int(config.pad_token_id or 0)
        assert spec.instructions is not None  # check_spec guarantees it
        self.tokenizer = tokenizer
        self.pad_id = pad_id
        self._prompt_cache: dict[str, list[int]] = {}
        ids, mask = encode_prompts(tokenizer, spec.instructions, pad_id, self._prompt_cache)
        self.register_buffer("prompt_ids", ids, persistent=False)
        self.register_buffer("prompt_mask", mask, persistent=False)
        peft_model = None
        if cfg.lora is not None:
            lora = cfg.lora
            if lora.target_modules is None and lora.path is None:
                lora = lora.model_copy(update={"target_modules": list(LORA_TARGET_MODULES)})
            peft_model = apply_lora(model, lora)
        # Outside the module tree: its parameters are self.model's.
        object.__setattr__(self, "peft_model", peft_model)
        self.model = model

    @staticmethod
    def _load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
        if not any((path / name).is_file() for name in _TOKENIZER_FILES):
            raise FileNotFoundError(
                f"{path} has no tokenizer ({' or '.join(_TOKENIZER_FILES)}); copy the "
                "checkpoint's Llama 2 tokenizer files next to config.json"
            )
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True
        )
        return tokenizer

    @classmethod
    def check_spec(cls, cfg: PolicyConfig, spec: EnvSpec) -> None:
        """Requires continuous actions, RGB images and instructions."""
        super().check_spec(cfg, spec)
        if spec.num_actions is not None:
            raise ValueError(
                f"model_type 'openvla' predicts continuous actions but the env has "
                f"num_actions={spec.num_actions} discrete actions; use model_type mlp or cnn"
            )
        if spec.image_shape is None:
            raise ValueError(
                "model_type 'openvla' needs images (obs['main_images']) but "
                "EnvSpec.image_shape is None; use an RGB obs mode of the env"
            )
        if not spec.instructions:
            raise ValueError(
                f"model_type 'openvla' needs language instructions but EnvSpec.instructions is "
                f"{spec.instructions!r}; use a language-conditioned env (e.g. lang_reach)"
            )

    def _check_model(self, config: OpenVLAConfig, tokenizer_size: int) -> None:
        cfg, spec, path = self.cfg, self.spec, str(self.model_path)
        if spec.action_dim != config.action_dim:
            raise ValueError(
                f"EnvSpec.action_dim={spec.action_dim} but the model at actor.model.model_path="
                f"{path!r} acts in action_dim={config.action_dim} (config.json action_dim); use "
                f"a model made for this env (make_tiny_openvla(action_dim={spec.action_dim}))"
            )
        if self.action_normalizer.action_dim != config.action_dim:
            raise ValueError(
                f"action statistics entry {self.unnorm_key!r} covers "
                f"{self.action_normalizer.action_dim} action dims but the model has "
                f"action_dim={config.action_dim}; set actor.model.unnorm_key to the model's "
                "dataset"
            )
        if cfg.num_action_chunks != config.num_action_chunks:
            raise ValueError(
                f"actor.model.num_action_chunks={cfg.num_action_chunks} but the model at "
                f"{path!r} predicts num_action_chunks={config.num_action_chunks}; set "
                f"actor.model.num_action_chunks: {config.num_action_chunks}"
            )
        if config.proprio_dim > 0 and spec.state_dim != config.proprio_dim:
            raise ValueError(
                f"EnvSpec.state_dim={spec.state_dim} but the model at {path!r} has a proprio "
                f"projector of proprio_dim={config.proprio_dim} (config.json); use an env with "
                "that state size or a model without proprio (proprio_dim: 0)"
            )
        if cfg.add_value_head and config.add_value_head and cfg.value_type != config.value_type:
            raise ValueError(
                f"actor.model.value_type={cfg.value_type!r} but the model's value head is "
                f"{config.value_type!r}; set actor.model.value_type: {config.value_type}"
            )
        processor = self.image_processor
        if processor.use_fused_vision_backbone != config.use_fused_vision_backbone:
            raise ValueError(
                f"preprocessor_config.json use_fused_vision_backbone="
                f"{processor.use_fused_vision_backbone} disagrees with config.json "
                f"use_fused_vision_backbone={config.use_fused_vision_backbone} in {path!r}; "
                "make them equal"
            )
        if processor.image_size != int(config.image_sizes[0]):
            raise ValueError(
                f"preprocessor_config.json input_sizes={processor.input_sizes} disagree with "
                f"config.json image_sizes={config.image_sizes} in {path!r}; make them equal"
            )
        if tokenizer_size > int(config.text_config["vocab_size"]):
            raise ValueError(
                f"the tokenizer in {path!r} has {tokenizer_size} ids but text_config.vocab_size="
                f"{config.text_config['vocab_size']}; save the tokenizer the model was built with"
            )

    @property
    def frozen_from_disk(self) -> bool:
        """With LoRA the frozen base is ``model_path``'s, in every worker."""
        return self.peft_model is not None

    @property
    def config(self) -> OpenVLAConfig:
        """The loaded model's config."""
        return self.model.config

    # --- observations -------------------------------------------------------------------------

    def _read_obs(self, obs: Mapping[str, Any]) -> dict[str, Tensor]:
        reads_states = self.config.proprio_dim > 0
        keys = ["main_images", "task_ids"] + (["states"] if reads_states else [])
        missing = [key for key in keys if key not in obs]
        if missing:
            raise KeyError(
                f"OpenVLAPolicy reads obs{missing} but they are missing (got keys "
                f"{sorted(obs)}); it needs {keys}"
            )
        images, task_ids = obs["main_images"], obs["task_ids"].reshape(-1).long()
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(
                f"obs['main_images'] must be uint8 [n, H, W, 3], got {images.dtype} "
                f"{tuple(images.shape)}"
            )
        count = self.prompt_ids.shape[0]
        if task_ids.numel() != images.shape[0]:
            raise ValueError(
                f"obs['task_ids'] has {task_ids.numel()} entries for {images.shape[0]} images"
            )
        if task_ids.numel() and (int(task_ids.min()) < 0 or int(task_ids.max()) >= count):
            raise ValueError(
                f"obs['task_ids'] must index EnvSpec.instructions (0..{count - 1}), got values "
                f"in [{int(task_ids.min())}, {int(task_ids.max())}]"
            )
        inputs = {"main_images": images, "task_ids": task_ids}
        if INSTRUCTION_TEXT_KEY in obs:  # the env's own wording wins over task_ids
            text = obs[INSTRUCTION_TEXT_KEY]
            if text.dtype != torch.uint8 or text.ndim != 2 or text.shape[0] != images.shape[0]:
                raise ValueError(
                    f"obs[{INSTRUCTION_TEXT_KEY!r}] must be uint8 [n={images.shape[0]}, L] "
                    f"(UTF-8, zero-padded), got {text.dtype} {tuple(text.shape)}"
                )
            inputs[INSTRUCTION_TEXT_KEY] = text
        if reads_states:
            states = obs["states"]
            if states.ndim != 2 or tuple(states.shape) != (
                images.shape[0],
                self.config.proprio_dim,
            ):
                raise ValueError(
                    f"obs['states'] must be [n={images.shape[0]}, {self.config.proprio_dim}], "
                    f"got {tuple(states.shape)}"
                )
            inputs["states"] = states.float()
        return inputs

    def _model_inputs(self, inputs: Mapping[str, Tensor]) -> dict[str, Any]:
        device = self.prompt_ids.device
        task_ids = inputs["task_ids"].to(device)
        proprio = None
        if "states" in inputs:
            proprio = inputs["states"].to(device)
            if self.proprio_normalizer is not None:
                proprio = self.proprio_normalizer.to(device).normalize(proprio)
        if INSTRUCTION_TEXT_KEY in inputs:
            texts = decode_instruction_text(inputs[INSTRUCTION_TEXT_KEY])
            ids, mask = encode_prompts(self.tokenizer, texts, self.pad_id, self._prompt_cache)
            input_ids, attention_mask = ids.to(device), mask.to(device)
        else:
            input_ids, attention_mask = self.prompt_ids[task_ids], self.prompt_mask[task_ids]
        return {
            "pixel_values": self.image_processor(inputs["main_images"].to(device)),
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "proprio": proprio,
        }

    # --- the action distribution --------------------------------------------------------------

    def _warp(
        self, logits: Tensor, temperature: float | None = None, top_k: int | None = None
    ) -> Tensor:
        bins = self.action_tokenizer.action_bins()
        return warp_action_logits(
            logits[..., : bins.vocab_size],
            bins,
            self.cfg.temperature if temperature is None else temperature,
            self.cfg.top_k if top_k is None else top_k,
        )

    def _values(self, out: OpenVLAOutput, batch: int) -> Tensor:
        if out.values is None or not self.cfg.add_value_head:
            return self._zero_values(batch, self.prompt_ids.device)
        return out.values

    def _decode(
        self, inputs: Mapping[str, Tensor], greedy: bool, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor, OpenVLAOutput]:
        """``(ids [B, C*A], warped logits, output)`` of one rollout decode."""
        batch = self._model_inputs(inputs)
        if self.config.decode_mode == "parallel":
            out: OpenVLAOutput = self.model(**batch)
            warped = self._warp(out.action_logits)
            return sample_action_ids(warped, greedy=greedy, generator=generator), warped, out

        def pick(logits: Tensor) -> Tensor:
            return sample_action_ids(self._warp(logits), greedy=greedy, generator=generator)

        ids, out = self.model.decode_autoregressive(**batch, pick=pick)
        return ids, self._warp(out.action_logits), out

    def predict_action_batch(
        self,
        obs: Mapping[str, Tensor],
        mode: str = "train",
        *,
        generator: torch.Generator | None = None,
        compute_values: bool = True,
    ) -> PolicyOutput:
        """Decodes ``C*A`` action tokens (see :meth:`BasePolicy.predict_action_batch`).

        ``train`` samples with ``cfg.temperature``/``cfg.top_k``; ``eval`` takes the argmax
        (its logprobs are still scored under the train warping).
        """
        self._check_mode(mode)
        config = self.config
        with torch.no_grad():
            inputs = self._read_obs(obs)
            ids, warped, out = self._decode(inputs, mode == "eval", generator)
            log_probs = token_log_probs(warped, ids)
            batch = ids.shape[0]
            tokens = ids.view(batch, config.num_action_chunks, config.action_dim)
            normalizer = self.action_normalizer.to(tokens.device)
            actions = normalizer.denormalize(self.action_tokenizer.decode(tokens))
            values = self._values(out, batch) if compute_values else None
        return PolicyOutput(
            actions=actions,
            prev_logprobs=log_probs,
            prev_values=values,
            forward_inputs={**inputs, "action_tokens": tokens},
        )

    def _score(self, inputs: Mapping[str, Tensor], tokens: Tensor | None) -> OpenVLAOutput:
        batch = self._model_inputs(inputs)
        action_ids = None
        if self.config.decode_mode == "autoregressive":
            assert tokens is not None
            action_ids = tokens.reshape(tokens.shape[0], -1).to(self.prompt_ids.device)
        out: OpenVLAOutput = self.model(**batch, action_ids=action_ids)
        return out

    def default_forward(
        self,
        forward_inputs: Mapping[str, Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = False,
        compute_values: bool = False,
    ) -> dict[str, Tensor]:
        """Re-scores stored action tokens, warped as in the rollout; see ``default_forward``."""
        if compute_values:
            self._check_values_requested(self.model.value_head is not None)
        self._require_stored(forward_inputs, "action_tokens")
        inputs = self._read_obs(forward_inputs)
        tokens = forward_inputs["action_tokens"]
        out = self._score(inputs, tokens)
        result: dict[str, Tensor] = {}
        if compute_logprobs or compute_entropy:
            warped = self._warp(out.action_logits)
            if compute_logprobs:
                flat = tokens.to(warped.device).reshape(tokens.shape[0], -1)
                result["logprobs"] = token_log_probs(warped, flat)
            if compute_entropy:
                result["entropy"] = token_entropy(warped)
        if compute_values:
            assert out.values is not None
            result["values"] = out.values
        return result

    def get_value(self, obs: Mapping[str, Tensor]) -> Tensor:
        """Values ``[n, V]`` (float32, no grad; zeros without a value head).

        Reads only the prefix: under causal attention the last prompt token does not see
        the action tokens.
        """
        with torch.no_grad():
            inputs = self._read_obs(obs)
            batch = self._model_inputs(inputs)
            count = int(inputs["task_ids"].shape[0])
            if self.model.value_head is None or not self.cfg.add_value_head:
                return self._zero_values(count, self.prompt_ids.device)
            prefix, valid = self.model.embed_prefix(**batch)
            hidden, _ = self.model.hidden_states(prefix, valid)
            values: Tensor = self.model.value_head(hidden[:, -1])
            return values

    def behaviour_cloning_loss(
        self,
        obs: Mapping[str, Tensor],
        actions: Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Cross-entropy of the expert's action tokens (OpenVLA's binning; all bins, temperature 1).

        ``actions`` are ``[n, C, A]`` in env units; ``generator`` is unused.

        Raises:
            ValueError: ``actions`` has the wrong shape.
        """
        config = self.config
        expected = (config.num_action_chunks, config.action_dim)
        if actions.ndim != 3 or tuple(actions.shape[1:]) != expected:
            raise ValueError(
                f"actions must be [n, C={expected[0]}, A={expected[1]}], got {tuple(actions.shape)}"
            )
        device = self.prompt_ids.device
        normalizer = self.action_normalizer.to(device)
        targets = self.action_tokenizer.encode(normalizer.normalize(actions.to(device).float()))
        out = self._score(self._read_obs(obs), targets)
        warped = self._warp(out.action_logits, 1.0, 0)
        return -token_log_probs(warped, targets.reshape(targets.shape[0], -1)).mean()

    # --- saving -------------------------------------------------------------------------------

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Writes this policy's model directory (what ``model_path`` loads).

        Weights and ``config.json`` plus the other files of the loaded directory
        (tokenizer, ``preprocessor_config.json``, statistics). With LoRA the weights are
        the plain base model and ``out_dir/adapter`` holds the adapter and the trainable
        heads (:data:`..lora.HEADS_FILE`).

        Args:
            out_dir: The directory (created; may be the one loaded from).

        Returns:
            ``out_dir``.
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        copy_side_files(self.model_path, out)
        if self.peft_model is None:
            self.model.save_pretrained(str(out))
            return out
        self.model.save_pretrained(str(out), state_dict=base_state_dict(self.model))
        adapter = out / ADAPTER_DIR
        self.peft_model.save_pretrained(str(adapter))
        save_file(head_state_dict(self.model), str(adapter / HEADS_FILE))
        return out

    def merged_model(self) -> PreTrainedModel:
        """A copy of the model with the LoRA updates folded in (export only)."""
        if self.peft_model is None:
            return copy.deepcopy(self.model)
        merged = merged_copy(self.peft_model)
        assert isinstance(merged, PreTrainedModel)
        return merged


def _reset_value_head(model: OpenVLAModel, seed: int = 0) -> None:
    """Seeded init of a value head the checkpoint lacks (rollout and actor build the same one)."""
    assert model.value_head is not None
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.value_head.parameters():
            if param.ndim > 1:
                std = param.shape[1] ** -0.5
                param.copy_(torch.randn(param.shape, generator=generator) * std)
            else:
                param.zero_()
