"""``model_type: pi0``: RL on the stock ``transformers.PI0ForConditionalGeneration``.

The policy loads a pi0 checkpoint directory (``actor.model.model_path``) in the
transformers, lerobot or openpi layout (:mod:`.checkpoint`), the tokenizer
``AutoTokenizer`` finds there, the image processor config (:mod:`.images`) and
the state/action statistics (:mod:`.normalization`). A wrong or incomplete
checkpoint fails at construction with the key, the value and the fix.

Observations: ``main_images`` [n, H, W, 3] uint8 (and ``wrist_images`` when the
env has a wrist camera: pi0 takes up to three cameras), ``task_ids`` [n] into
``EnvSpec.instructions`` (or the env's own text, ``instruction_text``, when it
sends one: any wording, tokenized here and cached by string), and ``states``
[n, d] when the env has them (normalised, zero-padded to ``max_state_dim``;
zeros otherwise). Actions: the first
``num_action_chunks`` steps and the env's ``action_dim`` dimensions of pi0's
``chunk_size x max_action_dim`` chunk, de-normalised; only those are scored.

What RL adds (:class:`~.sampling.Pi0Heads`, saved as ``rlinf_heads.safetensors``
beside the weights): a value head on the expert's output, and the ``noise``
sampler's std head. LoRA (``actor.model.lora``) puts adapters on the VLM part
(``model.vlm``) only and freezes its weights; the action expert (``model.dit``),
its input/output projections and the heads train fully.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from torch import Tensor
from transformers import AutoTokenizer, PI0ForConditionalGeneration, PreTrainedModel
from transformers.utils import logging as hf_logging

from rlinf.core.protocols.embodied import EnvSpec, PolicyOutput
from rlinf.core.protocols.instruction_text import INSTRUCTION_TEXT_KEY, decode_instruction_text
from rlinf.embodied.models.base import BasePolicy
from rlinf.embodied.models.config import PolicyConfig
from rlinf.embodied.models.registry import register_policy
from rlinf.embodied.models.vla.lora import ADAPTER_DIR, apply_lora, base_state_dict, merged_copy
from rlinf.embodied.models.vla.model_dir import copy_side_files, require_model_path
from rlinf.embodied.models.vla.pi0.checkpoint import read_pi0_config
from rlinf.embodied.models.vla.pi0.images import Pi0ImageProcessor
from rlinf.embodied.models.vla.pi0.normalization import load_pi0_statistics
from rlinf.embodied.models.vla.pi0.prompts import DEFAULT_PROMPT_LENGTH, PromptCache
from rlinf.embodied.models.vla.pi0.sampling import (
    Pi0Heads,
    Pi0Prefix,
    encode_prefix,
    flow_matching_loss,
    sample_chain,
    score_chain,
    value_query,
)

__all__ = ["HEADS_FILE", "LORA_SCOPE", "MAX_CAMERAS", "Pi0Policy"]

HEADS_FILE = "rlinf_heads.safetensors"
"""The RL heads (value, noise std) beside the pi0 weights."""

MAX_CAMERAS = 3
"""Camera slots of pi0 (base, left wrist, right wrist)."""

LORA_SCOPE = "model.vlm"
"""Where LoRA puts adapters in pi0: its VLM (PaliGemma); the expert trains fully."""


def _load_model(path: Path) -> PI0ForConditionalGeneration:
    config, _ = read_pi0_config(path)
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # a bar per worker log
    try:
        loaded: Any = PI0ForConditionalGeneration.from_pretrained(
            str(path), config=config, local_files_only=True, output_loading_info=True
        )
    finally:
        if bar:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
    model, info = loaded
    missing, unexpected = sorted(info["missing_keys"]), sorted(info["unexpected_keys"])
    if missing or unexpected:
        raise ValueError(
            f"the weights in actor.model.model_path={str(path)!r} do not fit pi0: "
            f"{len(missing)} missing (e.g. {missing[:3]}) and {len(unexpected)} unexpected "
            f"(e.g. {unexpected[:3]}) keys. Layouts that load: transformers, lerobot "
            "(model.paligemma_with_expert...), openpi (paligemma_with_expert...); check that "
            "config.json matches the weights"
        )
    assert isinstance(model, PI0ForConditionalGeneration)
    return model


@register_policy("pi0")
class Pi0Policy(BasePolicy):
    """pi0 with RL sampling, re-scoring, a value head and LoRA on its VLM.

    Logprobs and entropy cover the executed chunk only, ``[n, C * A_env]``; values ``[n, V]``.

    Args:
        cfg: The policy config (``model_path`` required).
        spec: The env spec (continuous actions, images and instructions required).
    """

    supports_lora = True
    peft_model: PeftModel | None

    def __init__(self, cfg: PolicyConfig, spec: EnvSpec) -> None:
        super().__init__(cfg, spec)
        path = require_model_path(
            cfg,
            "a pi0 checkpoint directory (transformers, lerobot or openpi layout)",
            "make-tiny-vla --kind pi0 --out DIR",
        )
        self.model_path = path
        model = _load_model(path)
        config: Any = model.config
        vision = config.vlm_config.vision_config
        self.image_processor = Pi0ImageProcessor.from_directory(path, int(vision.image_size))
        self.statistics = load_pi0_statistics(path, cfg.unnorm_key)
        self.cameras = 1 + (spec.wrist_image_shape is not None)
        self._check_model(config)
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        limit = int(getattr(tokenizer, "model_max_length", DEFAULT_PROMPT_LENGTH))
        patches = (int(vision.image_size) // int(vision.patch_size)) ** 2
        self.prompts = PromptCache(
            tokenizer,
            int(config.vlm_config.image_token_id),
            patches * self.cameras,
            limit if limit < 4096 else DEFAULT_PROMPT_LENGTH,
        )
        assert spec.instructions is not None
        for text in spec.instructions:
            self.prompts.encode(text)  # every known instruction fits, or fail now
        self.heads = Pi0Heads(
            int(config.dit_config.hidden_size), int(config.max_action_dim), cfg.value_dim
        )
        heads_path = path / HEADS_FILE
        if heads_path.is_file():
            self._load_heads(heads_path)
        # The expert's vocabulary embedding is in the checkpoint layout but no forward
        # reads it (the expert takes embeddings): no gradients or optimizer state for it.
        model.model.dit.embed_tokens.requires_grad_(False)
        peft_model = None
        if cfg.lora is not None:
            peft_model = apply_lora(model, cfg.lora, scope=LORA_SCOPE)
            # Adapters go on the VLM only; the action expert and its projections train fully.
            for part in (model.model.dit.layers, model.model.dit.norm):
                part.requires_grad_(True)
            for part in (model.embed_action_time, model.action_out_proj):
                part.requires_grad_(True)
        object.__setattr__(self, "peft_model", peft_model)
        self.model = model

    # ------------------------------------------------------------------ checks

    @classmethod
    def check_spec(cls, cfg: PolicyConfig, spec: EnvSpec) -> None:
        """Requires continuous actions, RGB images and instructions."""
        super().check_spec(cfg, spec)
        if spec.num_actions is not None:
            raise ValueError(
                f"model_type 'pi0' predicts continuous actions but the env has "
                f"num_actions={spec.num_actions} discrete actions; use model_type mlp or cnn"
            )
        if spec.image_shape is None:
            raise ValueError(
                "model_type 'pi0' needs camera images (obs['main_images']) but "
                "EnvSpec.image_shape is None; use an RGB obs mode of the env"
            )
        if not spec.instructions:
            raise ValueError(
                "model_type 'pi0' needs language instructions but EnvSpec.instructions is "
                f"{spec.instructions!r}; use a language-conditioned env or set env.instruction"
            )

    def _check_model(self, config: Any) -> None:
        cfg, spec, path = self.cfg, self.spec, str(self.model_path)
        if spec.action_dim > config.max_action_dim:
            raise ValueError(
                f"EnvSpec.action_dim={spec.action_dim} exceeds the model's max_action_dim="
                f"{config.max_action_dim} ({path}); use a checkpoint with a larger max_action_dim"
            )
        if self.statistics.actions.dim != spec.action_dim:
            raise ValueError(
                f"the action statistics ({self.statistics.source} in {path}) cover "
                f"{self.statistics.actions.dim} dims but the env acts in action_dim="
                f"{spec.action_dim}; use the statistics of this env's dataset (actor.model."
                "unnorm_key) or a checkpoint trained on it"
            )
        state_dim = spec.state_dim or 0
        if state_dim > config.max_state_dim:
            raise ValueError(
                f"EnvSpec.state_dim={state_dim} exceeds the model's max_state_dim="
                f"{config.max_state_dim} ({path})"
            )
        state_stats = self.statistics.state
        if state_stats is not None and state_dim and state_stats.dim != state_dim:
            raise ValueError(
                f"the state statistics ({self.statistics.source}) cover {state_stats.dim} dims "
                f"but EnvSpec.state_dim={state_dim}; use this env's statistics"
            )
        if cfg.num_action_chunks > config.chunk_size:
            raise ValueError(
                f"actor.model.num_action_chunks={cfg.num_action_chunks} exceeds the model's "
                f"chunk_size={config.chunk_size}; execute at most chunk_size actions per call"
            )
        if self.cameras > MAX_CAMERAS:
            raise ValueError(f"pi0 takes at most {MAX_CAMERAS} cameras, the env has {self.cameras}")

    # ------------------------------------------------------------------ LoRA and saving

    @property
    def frozen_from_disk(self) -> bool:
        """With LoRA the frozen base is ``model_path``'s, in every worker."""
        return self.peft_model is not None

    def _load_heads(self, path: Path) -> None:
        """Loads the saved heads; a value head is only read when this policy uses one."""
        tensors = load_file(str(path))
        if not self.cfg.add_value_head:
            tensors = {k: v for k, v in tensors.items() if not k.startswith("value_head.")}
        expected = self.heads.state_dict()
        bad = sorted(
            k for k, v in tensors.items() if k not in expected or v.shape != expected[k].shape
        )
        if bad:
            raise ValueError(
                f"{path} does not fit this policy's heads ({bad[:4]} differ: saved with another "
                "actor.model.value_type or num_action_chunks?); set them as when it was saved, "
                "or delete the file to start fresh heads"
            )
        self.heads.load_state_dict(tensors, strict=False)

    def _heads_to_save(self) -> dict[str, Tensor]:
        """The noise head, and the value head when this policy trains one."""
        return {
            k: v.detach().contiguous()
            for k, v in self.heads.state_dict().items()
            if self.cfg.add_value_head or not k.startswith("value_head.")
        }

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Writes a checkpoint directory that ``model_path`` loads (transformers layout).

        The pi0 weights and ``config.json`` (transformers format, whatever layout was
        loaded), the heads (:data:`HEADS_FILE`), and the loaded directory's other files
        (tokenizer, statistics, processor config). With LoRA the weights are the plain
        base and ``out_dir/adapter`` holds the adapter (``lora.path``).

        Args:
            out_dir: The directory (created; may be the one loaded from).

        Returns:
            ``out_dir``.
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        copy_side_files(self.model_path, out)
        state = None if self.peft_model is None else base_state_dict(self.model)
        self.model.save_pretrained(str(out), state_dict=state)
        save_file(self._heads_to_save(), str(out / HEADS_FILE))
        if self.peft_model is not None:
            self.peft_model.save_pretrained(str(out / ADAPTER_DIR))
        return out

    def merged_model(self) -> PreTrainedModel:
        """A copy of the pi0 model with LoRA folded in (export only; the policy is untouched)."""
        if self.peft_model is None:
            return copy.deepcopy(self.model)
        merged = merged_copy(self.peft_model)
        assert isinstance(merged, PreTrainedModel)
        return merged

    # ------------------------------------------------------------------ inputs

    def _read_obs(self, obs: Mapping[str, Any]) -> dict[str, Tensor]:
        """Picks and checks the observation entries pi0 reads."""
        keys = ["main_images", "task_ids"]
        keys += ["wrist_images"] if self.cameras > 1 else []
        keys += ["states"] if self.spec.state_dim else []
        missing = [key for key in keys if key not in obs]
        if missing:
            raise KeyError(
                f"Pi0Policy reads obs{missing} but they are missing (got keys {sorted(obs)})"
            )
        inputs = {key: obs[key] for key in keys}
        if INSTRUCTION_TEXT_KEY in obs:  # the env's own wording wins over task_ids
            inputs[INSTRUCTION_TEXT_KEY] = obs[INSTRUCTION_TEXT_KEY]
        images = inputs["main_images"]
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(
                f"obs['main_images'] must be uint8 [n, H, W, 3], got {images.dtype} "
                f"{tuple(images.shape)}"
            )
        task_ids = inputs["task_ids"].reshape(-1).long()
        count = len(self.spec.instructions or ())
        if task_ids.numel() != images.shape[0]:
            raise ValueError(
                f"obs['task_ids'] has {task_ids.numel()} entries for {images.shape[0]} images"
            )
        if task_ids.numel() and (int(task_ids.min()) < 0 or int(task_ids.max()) >= count):
            raise ValueError(
                f"obs['task_ids'] must index EnvSpec.instructions (0..{count - 1}), got "
                f"values in [{int(task_ids.min())}, {int(task_ids.max())}]"
            )
        inputs["task_ids"] = task_ids
        if "states" in inputs:
            inputs["states"] = inputs["states"].float()
        return inputs

    def _prefix(self, inputs: Mapping[str, Tensor]) -> Pi0Prefix:
        device = self.model.action_out_proj.weight.device
        config = self.model.config
        frames = [inputs["main_images"]] + (
            [inputs["wrist_images"]] if "wrist_images" in inputs else []
        )
        pixel_values = torch.stack(
            [self.image_processor(frame.to(device)) for frame in frames], dim=1
        )
        batch = pixel_values.shape[0]
        present = torch.ones(batch, len(frames), dtype=torch.bool, device=device)
        if INSTRUCTION_TEXT_KEY in inputs:
            texts = decode_instruction_text(inputs[INSTRUCTION_TEXT_KEY])
        else:
            texts = self.spec.task_descriptions(inputs["task_ids"])
        input_ids, attention_mask = self.prompts.batch(texts, device)
        state = torch.zeros(batch, int(config.max_state_dim), device=device)
        if "states" in inputs:
            raw = inputs["states"].to(device)
            if self.statistics.state is not None:
                raw = self.statistics.state.normalize(raw)
            state[:, : raw.shape[1]] = raw
        return encode_prefix(self.model, input_ids, attention_mask, pixel_values, present, state)

    def _executed(self, per_element: Tensor) -> Tensor:
        """``[n, H, A_max]`` -> the executed ``[n, C, A_env]`` block."""
        return per_element[:, : self.cfg.num_action_chunks, : self.spec.action_dim]

    def _start(self, batch: int, device: torch.device, generator: torch.Generator | None) -> Tensor:
        config = self.model.config
        shape = (batch, int(config.chunk_size), int(config.max_action_dim))
        if self.cfg.flow_start == "zero":
            return torch.zeros(shape, device=device)
        return torch.randn(shape, device=device, generator=generator)

    # ------------------------------------------------------------------ the contract

    def predict_action_batch(
        self,
        obs: Mapping[str, Tensor],
        mode: str = "train",
        *,
        generator: torch.Generator | None = None,
        compute_values: bool = True,
    ) -> PolicyOutput:
        """Denoises an action chunk; see :meth:`BasePolicy.predict_action_batch`.

        ``train`` samples with ``cfg.flow_sampler``/``cfg.noise_level``; ``eval``
        integrates the ODE. Both start from ``cfg.flow_start`` (``zero``: eval is a
        deterministic function of the observation). ``forward_inputs`` holds the
        observation entries plus ``chains`` and ``denoise_inds``.
        """
        self._check_mode(mode)
        sampler = self.cfg.flow_sampler if mode == "train" else "ode"
        with torch.no_grad():
            inputs = self._read_obs(obs)
            prefix = self._prefix(inputs)
            start = self._start(prefix.batch, prefix.state.device, generator)
            chain = sample_chain(
                self.model,
                self.heads,
                prefix,
                sampler=sampler,
                noise_level=self.cfg.noise_level,
                start=start,
                generator=generator,
            )
            actions = self.statistics.actions.denormalize(self._executed(chain.actions))
            log_probs = self._executed(chain.log_probs).reshape(prefix.batch, -1)
            values = None
            if compute_values:
                if not self.cfg.add_value_head:
                    values = self._zero_values(prefix.batch, prefix.state.device)
                else:
                    hidden = chain.start_hidden
                    if self.cfg.flow_start != "zero" or hidden is None:
                        hidden = value_query(self.model, prefix)
                    values = self.heads.values(hidden)
        return PolicyOutput(
            actions=actions,
            prev_logprobs=log_probs,
            prev_values=values,
            forward_inputs={
                **inputs,
                "chains": chain.chains,
                "denoise_inds": chain.denoise_inds,
            },
        )

    def default_forward(
        self,
        forward_inputs: Mapping[str, Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = False,
        compute_values: bool = False,
    ) -> dict[str, Tensor]:
        """Re-scores the stored stochastic steps; see :meth:`BasePolicy.default_forward`."""
        if compute_values:
            self._check_values_requested(True)
        inputs = self._read_obs(forward_inputs)
        prefix = self._prefix(inputs)
        result: dict[str, Tensor] = {}
        if compute_logprobs or compute_entropy:
            self._require_stored(forward_inputs, "chains", "denoise_inds")
            log_probs, entropy = score_chain(
                self.model,
                self.heads,
                prefix,
                forward_inputs["chains"],
                forward_inputs["denoise_inds"],
                sampler=self.cfg.flow_sampler,
                noise_level=self.cfg.noise_level,
            )
            if compute_logprobs:
                result["logprobs"] = self._executed(log_probs).reshape(prefix.batch, -1)
            if compute_entropy:
                result["entropy"] = self._executed(entropy).reshape(prefix.batch, -1)
        if compute_values:
            result["values"] = self.heads.values(value_query(self.model, prefix))
        return result

    def get_value(self, obs: Mapping[str, Tensor]) -> Tensor:
        """Values ``[n, V]`` (float32, no grad; zeros without a value head)."""
        with torch.no_grad():
            inputs = self._read_obs(obs)
            prefix = self._prefix(inputs)
            if not self.cfg.add_value_head:
                return self._zero_values(prefix.batch, prefix.state.device)
            return self.heads.values(value_query(self.model, prefix))

    def behaviour_cloning_loss(
        self,
        obs: Mapping[str, Tensor],
        actions: Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """pi0's flow-matching loss on expert chunks ``[n, T, A_env]`` (``T <= chunk_size``).

        Steps beyond ``T`` and dimensions beyond ``A_env`` are trained towards 0 (the
        normalised mean), as pi0's padding does. See
        :meth:`BasePolicy.behaviour_cloning_loss`.

        Raises:
            ValueError: ``actions`` is not ``[n, T <= chunk_size, A_env]``.
        """
        config = self.model.config
        if (
            actions.ndim != 3
            or actions.shape[1] > config.chunk_size
            or actions.shape[2] != self.spec.action_dim
        ):
            raise ValueError(
                f"actions must be [n, T <= chunk_size={config.chunk_size}, A_env="
                f"{self.spec.action_dim}], got {tuple(actions.shape)}"
            )
        inputs = self._read_obs(obs)
        prefix = self._prefix(inputs)
        normalized = self.statistics.actions.normalize(actions.to(prefix.state.device))
        target = torch.zeros(
            actions.shape[0],
            int(config.chunk_size),
            int(config.max_action_dim),
            device=prefix.state.device,
        )
        target[:, : actions.shape[1], : actions.shape[2]] = normalized
        return flow_matching_loss(self.model, prefix, target, generator=generator)
