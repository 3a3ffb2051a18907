"""``token_vla`` and ``flow_vla``: the two VLA families behind the :class:`BasePolicy` contract.

A policy is built from ``(PolicyConfig, EnvSpec)`` like every other policy, but
its sizes come from a Hugging Face directory (``actor.model.model_path``):
``config.json`` + weights through ``AutoModel.from_pretrained`` (our configs are
registered, so no ``trust_remote_code``), the tokenizer through
``AutoTokenizer``, ``preprocessor_config.json`` and ``dataset_statistics.json``.
Every mismatch between that directory, the env spec and the config is checked
once at construction, with an error naming the key, the value and the fix, so a
wrong checkpoint fails before the first rollout instead of scoring 0%.

Observations: ``main_images`` [n, H, W, 3] uint8, ``task_ids`` [n] int64 indices
into ``EnvSpec.instructions`` (tokenized once here and cached as buffers), and
``states`` [n, d] float32 when the model has a proprio token, ``wrist_images``
[n, H, W, 3] uint8 when it has a wrist image (``wrist_image``). ``forward_inputs``
carries those entries (raw uint8 images: the actor re-runs the same
deterministic preprocessing) plus ``action_tokens`` [n, C, A] int64 (token) or
``chains`` [n, N + 1, H, A] float32 and ``denoise_inds`` [n, N] int64 (flow).
Train-mode sampling reads ``cfg.temperature``/``cfg.top_k`` or
``cfg.flow_sampler``/``cfg.noise_level``, the same fields the actor re-scores
with; eval mode takes the argmax (token) or integrates the ODE from
``cfg.flow_start`` (flow; deterministic with the default ``zero``).

LoRA (``actor.model.lora``): the loaded model gets adapters through
:func:`~rlinf.embodied.models.vla.lora.apply_lora` before the policy stores it.
PEFT injects them in place, so ``self.model`` stays the typed VLA model (every
method the policy calls works unchanged) and the ``PeftModel`` wrapper is kept
outside the module tree, only for saving; the state dict therefore has the same
keys in every policy built from the same config (rollout and actor). Nothing is
merged on the hot path.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from peft import PeftModel
from safetensors.torch import save_file
from torch import Tensor
from transformers import AutoModel, PreTrainedModel

from rlinf.core.protocols.embodied import EnvSpec, PolicyOutput
from rlinf.embodied.models.base import BasePolicy
from rlinf.embodied.models.config import PolicyConfig
from rlinf.embodied.models.registry import register_policy
from rlinf.embodied.models.vla.configuration import FlowVLAConfig, TokenVLAConfig
from rlinf.embodied.models.vla.instructions import encode_instructions, load_instruction_tokenizer
from rlinf.embodied.models.vla.lora import (
    ADAPTER_DIR,
    HEADS_FILE,
    apply_lora,
    base_state_dict,
    head_state_dict,
    merged_copy,
)
from rlinf.embodied.models.vla.modeling_flow import (
    FlowPrefix,
    FlowVLAModel,
    flow_matching_loss,
    sample_chain,
    score_chain,
)
from rlinf.embodied.models.vla.modeling_token import TokenVLAModel, TokenVLAOutput
from rlinf.embodied.models.vla.preprocessing import VLAImageProcessor
from rlinf.embodied.models.vla.statistics import load_action_normalizer
from rlinf.embodied.models.vla.token_sampling import (
    sample_action_ids,
    token_entropy,
    token_log_probs,
    warp_action_logits,
)

__all__ = ["FlowVLAPolicy", "TokenVLAPolicy"]


@dataclass
class _ModelInputs:
    """Observation entries turned into model inputs, on the policy's device."""

    pixel_values: Tensor
    input_ids: Tensor
    attention_mask: Tensor
    states: Tensor | None


def _require_model_path(cfg: PolicyConfig) -> Path:
    if cfg.model_path is None:
        raise ValueError(
            f"actor.model.model_path is not set; model_type {cfg.model_type!r} loads a "
            "Hugging Face-format directory. Set actor.model.model_path to one (make a tiny "
            "one with `python -m rlinf.embodied.models.vla.tiny --kind token|flow --out DIR`)"
        )
    path = Path(cfg.model_path)
    if not (path / "config.json").is_file():
        raise ValueError(
            f"actor.model.model_path={str(path)!r} has no config.json; point it at a "
            "directory written by save_pretrained"
        )
    return path


class _VLAPolicy(BasePolicy):
    """What both VLA policies share: loading, consistency checks, observation handling.

    Args:
        cfg: The policy config (``model_path`` required).
        spec: The env spec (continuous actions, images and instructions required).
    """

    supports_lora = True
    model_class: ClassVar[type[PreTrainedModel]]
    config_class: ClassVar[type[TokenVLAConfig] | type[FlowVLAConfig]]
    prompt_ids: Tensor
    prompt_mask: Tensor
    reads_wrist_image: bool
    """Whether the model takes ``obs["wrist_images"]`` (its config's ``wrist_image``)."""
    reads_states: bool
    """Whether the model takes ``obs["states"]`` (a proprio token: ``state_dim > 0``)."""
    peft_model: PeftModel | None
    """The PEFT wrapper of ``self.model`` when ``cfg.lora`` is set (not a submodule)."""

    def __init__(self, cfg: PolicyConfig, spec: EnvSpec) -> None:
        super().__init__(cfg, spec)
        path = _require_model_path(cfg)
        model = AutoModel.from_pretrained(str(path), local_files_only=True)
        if not isinstance(model, self.model_class):
            raise ValueError(
                f"actor.model.model_path={str(path)!r} holds a {type(model).__name__} "
                f"(model_type {model.config.model_type!r}) but model_type {cfg.model_type!r} "
                f"needs a {self.config_class.model_type!r} model; fix model_type or model_path"
            )
        self.model_path = path
        self.image_processor = VLAImageProcessor.load(path)
        self.unnorm_key, self.action_normalizer = load_action_normalizer(path, cfg.unnorm_key)
        tokenizer = load_instruction_tokenizer(path)
        self._check_model(model.config, len(tokenizer))
        self.reads_wrist_image = bool(model.config.wrist_image)
        self.reads_states = int(model.config.state_dim) > 0
        assert spec.instructions is not None  # check_spec guarantees it
        ids, mask = encode_instructions(
            tokenizer, spec.instructions, int(model.config.max_prompt_length)
        )
        self.register_buffer("prompt_ids", ids, persistent=False)
        self.register_buffer("prompt_mask", mask, persistent=False)
        # Kept out of the module tree (its parameters are self.model's): registering it
        # would duplicate every key in state_dict under a second prefix.
        peft_model = None if cfg.lora is None else apply_lora(model, cfg.lora)
        object.__setattr__(self, "peft_model", peft_model)
        self._set_model(model)

    def _set_model(self, model: PreTrainedModel) -> None:
        raise NotImplementedError

    @property
    def frozen_from_disk(self) -> bool:
        """With LoRA the frozen base is ``model_path``'s, in every worker."""
        return self.peft_model is not None

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Writes this policy's model directory (what ``model_path`` loads).

        Weights and ``config.json``, plus the files the policy was loaded with
        (tokenizer, ``preprocessor_config.json``, ``dataset_statistics.json``).
        With LoRA the weights are the plain base model (adapter layers unwrapped,
        nothing merged), and ``out_dir/adapter`` holds the PEFT adapter plus the
        trainable heads (``trainable_heads.safetensors``); ``model_path: out_dir``
        with ``lora.path: out_dir/adapter`` rebuilds this policy exactly, and so
        does the original base ``model_path`` with that ``lora.path``.

        Args:
            out_dir: The directory (created; may be the one loaded from).

        Returns:
            ``out_dir``, loadable as ``actor.model.model_path``.
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if out.resolve() != self.model_path.resolve():
            for item in self.model_path.iterdir():
                if item.is_file() and item.name != "config.json" and item.suffix != ".safetensors":
                    shutil.copy2(item, out / item.name)
        model = self.model
        assert isinstance(model, PreTrainedModel)
        if self.peft_model is None:
            model.save_pretrained(str(out))
            return out
        model.save_pretrained(str(out), state_dict=base_state_dict(model))
        adapter = out / ADAPTER_DIR
        self.peft_model.save_pretrained(str(adapter))
        save_file(head_state_dict(model), str(adapter / HEADS_FILE))
        return out

    def merged_model(self) -> PreTrainedModel:
        """A copy of the model with the LoRA updates folded into the weights (export only).

        The policy is untouched. ``merged.save_pretrained(dir)`` plus the tokenizer and
        statistics files gives a plain directory loadable without ``lora``.

        Returns:
            The merged, adapter-free model (a copy of ``self.model`` without LoRA).
        """
        model = self.model
        assert isinstance(model, PreTrainedModel)
        if self.peft_model is None:
            return copy.deepcopy(model)
        merged = merged_copy(self.peft_model)
        assert isinstance(merged, PreTrainedModel)
        return merged

    @classmethod
    def check_spec(cls, cfg: PolicyConfig, spec: EnvSpec) -> None:
        """Requires continuous actions, RGB images and a tuple of instructions."""
        super().check_spec(cfg, spec)
        name = cfg.model_type
        if spec.num_actions is not None:
            raise ValueError(
                f"model_type {name!r} predicts continuous actions but the env has "
                f"num_actions={spec.num_actions} discrete actions; use model_type mlp or cnn"
            )
        if spec.image_shape is None:
            raise ValueError(
                f"model_type {name!r} needs images (obs['main_images']) but EnvSpec.image_shape "
                "is None; use an RGB obs mode of the env"
            )
        if not spec.instructions:
            raise ValueError(
                f"model_type {name!r} needs language instructions but EnvSpec.instructions is "
                f"{spec.instructions!r}; use a language-conditioned env (e.g. lang_reach)"
            )

    def _model_action_dim(self, config: Any) -> int:
        return int(config.action_dim)

    def _check_model(self, config: Any, tokenizer_size: int) -> None:
        cfg, spec, path = self.cfg, self.spec, str(self.model_path)
        action_dim = self._model_action_dim(config)
        if spec.action_dim != action_dim:
            raise ValueError(
                f"EnvSpec.action_dim={spec.action_dim} but the model at actor.model.model_path="
                f"{path!r} acts in action_dim={action_dim} (config.json); use a model made for "
                f"this env (make_tiny_vla --action-dim {spec.action_dim})"
            )
        if self.action_normalizer.action_dim != action_dim:
            raise ValueError(
                f"dataset_statistics.json entry {self.unnorm_key!r} covers "
                f"{self.action_normalizer.action_dim} action dims but the model has "
                f"action_dim={action_dim}; set actor.model.unnorm_key to the model's dataset"
            )
        assert spec.image_shape is not None
        height, width = spec.image_shape[0], spec.image_shape[1]
        size = self.image_processor.image_size
        if size != config.image_size:
            raise ValueError(
                f"preprocessor_config.json image_size={size} disagrees with config.json "
                f"image_size={config.image_size} in {path!r}; make them equal"
            )
        if (height, width) != (size, size) and not self.image_processor.do_resize:
            raise ValueError(
                f"EnvSpec.image_shape={spec.image_shape} but the model at {path!r} takes "
                f"{size}x{size} images (image_size); render the env at that size or set "
                "do_resize: true in preprocessor_config.json"
            )
        if config.wrist_image and spec.wrist_image_shape is None:
            raise ValueError(
                f"the model at {path!r} takes a wrist image (config wrist_image: true) but "
                "EnvSpec.wrist_image_shape is None; use an env with a wrist camera (lang_reach: "
                "env_kwargs.wrist_camera: true; ManiSkill: env_kwargs.wrist_camera: <sensor>; "
                "robosuite: a second camera_names entry) or a model without wrist_image"
            )
        wrist = spec.wrist_image_shape
        resizes = self.image_processor.do_resize
        if config.wrist_image and wrist is not None and wrist[:2] != (size, size) and not resizes:
            raise ValueError(
                f"EnvSpec.wrist_image_shape={wrist} but the model at {path!r} takes "
                f"{size}x{size} images; render the wrist camera at that size or set "
                "do_resize: true in preprocessor_config.json"
            )
        if config.state_dim > 0 and spec.state_dim != config.state_dim:
            raise ValueError(
                f"EnvSpec.state_dim={spec.state_dim} but the model at {path!r} has a proprio "
                f"token of state_dim={config.state_dim}; use an env with that state size or a "
                "model with state_dim matching the env (0 ignores states)"
            )
        if cfg.num_action_chunks != config.num_action_chunks:
            raise ValueError(
                f"actor.model.num_action_chunks={cfg.num_action_chunks} but the model at "
                f"{path!r} predicts num_action_chunks={config.num_action_chunks}; set "
                f"actor.model.num_action_chunks: {config.num_action_chunks}"
            )
        if cfg.add_value_head and not config.add_value_head:
            raise ValueError(
                f"actor.model.add_value_head=true but the model at {path!r} has no value head "
                "(config add_value_head: false); set actor.model.add_value_head: false (GRPO) "
                "or use a model with a value head"
            )
        if cfg.add_value_head and cfg.value_type != config.value_type:
            raise ValueError(
                f"actor.model.value_type={cfg.value_type!r} but the model's value head is "
                f"{config.value_type!r}; set actor.model.value_type: {config.value_type}"
            )
        limit = self._text_vocab_limit(config)
        if tokenizer_size > limit:
            raise ValueError(
                f"the tokenizer in {path!r} has {tokenizer_size} ids but the model's text "
                f"vocabulary has room for {limit}; save the tokenizer the model was built with"
            )

    def _text_vocab_limit(self, config: Any) -> int:
        return int(config.text_config["vocab_size"])

    def _read_obs(
        self, obs: Mapping[str, Any], *, needs_states: bool | None = None
    ) -> dict[str, Tensor]:
        """Picks and checks ``main_images``, ``task_ids`` and (if used) ``states``, wrist images.

        ``needs_states`` defaults to :attr:`reads_states`.
        """
        wrist = self.reads_wrist_image
        needs_states = self.reads_states if needs_states is None else needs_states
        keys = ["main_images", "task_ids"] + (["states"] if needs_states else [])
        keys += ["wrist_images"] if wrist else []
        missing = [key for key in keys if key not in obs]
        if missing:
            raise KeyError(
                f"{type(self).__name__} reads obs{missing} but they are missing (got keys "
                f"{sorted(obs)}); a VLA needs {keys}"
            )
        images, task_ids = obs["main_images"], obs["task_ids"]
        assert self.spec.image_shape is not None
        if images.dtype != torch.uint8 or tuple(images.shape[1:]) != tuple(self.spec.image_shape):
            raise ValueError(
                f"obs['main_images'] must be uint8 [n, *{tuple(self.spec.image_shape)}], got "
                f"{images.dtype} {tuple(images.shape)}"
            )
        task_ids = task_ids.reshape(-1).long()
        count = self.prompt_ids.shape[0]
        if task_ids.numel() != images.shape[0]:
            raise ValueError(
                f"obs['task_ids'] has {task_ids.numel()} entries for {images.shape[0]} images"
            )
        if task_ids.numel() and (int(task_ids.min()) < 0 or int(task_ids.max()) >= count):
            raise ValueError(
                f"obs['task_ids'] must index EnvSpec.instructions (0..{count - 1}), got "
                f"values in [{int(task_ids.min())}, {int(task_ids.max())}]"
            )
        inputs = {"main_images": images, "task_ids": task_ids}
        if wrist:
            wrist_images = obs["wrist_images"]
            shape = tuple(self.spec.wrist_image_shape or ())
            if wrist_images.dtype != torch.uint8 or tuple(wrist_images.shape) != (
                images.shape[0],
                *shape,
            ):
                raise ValueError(
                    f"obs['wrist_images'] must be uint8 [n={images.shape[0]}, *{shape}], got "
                    f"{wrist_images.dtype} {tuple(wrist_images.shape)}"
                )
            inputs["wrist_images"] = wrist_images
        if needs_states:
            states = obs["states"]
            if states.ndim != 2 or states.shape[0] != images.shape[0]:
                raise ValueError(
                    f"obs['states'] must be [n={images.shape[0]}, d], got {tuple(states.shape)}"
                )
            inputs["states"] = states.float()
        return inputs

    def _model_inputs(self, inputs: Mapping[str, Tensor]) -> _ModelInputs:
        device = self.prompt_ids.device
        task_ids = inputs["task_ids"].to(device)
        states = inputs.get("states")
        pixel_values = self.image_processor(inputs["main_images"].to(device))
        if "wrist_images" in inputs:  # [B, 2, 3, S, S]: main, then wrist
            wrist = self.image_processor(inputs["wrist_images"].to(device))
            pixel_values = torch.stack([pixel_values, wrist], dim=1)
        return _ModelInputs(
            pixel_values=pixel_values,
            input_ids=self.prompt_ids[task_ids],
            attention_mask=self.prompt_mask[task_ids],
            states=None if states is None else states.to(device),
        )


@register_policy("token_vla")
class TokenVLAPolicy(_VLAPolicy):
    """OpenVLA-OFT-style token VLA (see :mod:`.modeling_token`).

    Logprobs and entropy are per action token, ``[n, C * A]``; values ``[n, V]``.
    """

    model_class = TokenVLAModel
    config_class = TokenVLAConfig
    model: TokenVLAModel

    def _set_model(self, model: PreTrainedModel) -> None:
        assert isinstance(model, TokenVLAModel)
        self.model = model
        self.action_bins = model.action_bins

    def _text_vocab_limit(self, config: Any) -> int:
        return int(config.first_bin_id)

    def _run(self, inputs: Mapping[str, Tensor]) -> TokenVLAOutput:
        batch = self._model_inputs(inputs)
        out: TokenVLAOutput = self.model(
            batch.pixel_values, batch.input_ids, batch.attention_mask, batch.states
        )
        return out

    def _warp(self, logits: Tensor) -> Tensor:
        return warp_action_logits(logits, self.action_bins, self.cfg.temperature, self.cfg.top_k)

    def _values(self, values: Tensor | None, batch: int) -> Tensor:
        if values is None or not self.cfg.add_value_head:
            return self._zero_values(batch, self.prompt_ids.device)
        return values

    def predict_action_batch(
        self,
        obs: Mapping[str, Tensor],
        mode: str = "train",
        *,
        generator: torch.Generator | None = None,
        compute_values: bool = True,
    ) -> PolicyOutput:
        """Decodes a whole action chunk in one forward pass.

        See :meth:`BasePolicy.predict_action_batch`. ``train`` samples with
        ``cfg.temperature``/``cfg.top_k``; ``eval`` takes the argmax (its logprobs are still
        scored under the train warping). ``forward_inputs`` holds the observation entries
        plus ``action_tokens`` ``[n, C, A]`` int64 vocabulary ids.
        """
        self._check_mode(mode)
        config = self.model.config
        with torch.no_grad():
            inputs = self._read_obs(obs)
            out = self._run(inputs)
            warped = self._warp(out.action_logits)
            ids = sample_action_ids(warped, greedy=mode == "eval", generator=generator)
            log_probs = token_log_probs(warped, ids)
            batch = ids.shape[0]
            tokens = ids.view(batch, config.num_action_chunks, config.action_dim)
            actions = self.action_normalizer.denormalize(self.action_bins.ids_to_values(tokens))
            values = self._values(out.values, batch) if compute_values else None
        return PolicyOutput(
            actions=actions,
            prev_logprobs=log_probs,
            prev_values=values,
            forward_inputs={**inputs, "action_tokens": tokens},
        )

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
        inputs = self._read_obs(forward_inputs)
        out = self._run(inputs)
        result: dict[str, Tensor] = {}
        if compute_logprobs or compute_entropy:
            warped = self._warp(out.action_logits)
            if compute_logprobs:
                self._require_stored(forward_inputs, "action_tokens")
                tokens = forward_inputs["action_tokens"].to(warped.device)
                result["logprobs"] = token_log_probs(warped, tokens.reshape(tokens.shape[0], -1))
            if compute_entropy:
                result["entropy"] = token_entropy(warped)
        if compute_values:
            assert out.values is not None
            result["values"] = out.values
        return result

    def get_value(self, obs: Mapping[str, Tensor]) -> Tensor:
        """Values ``[n, V]`` (float32, no grad; zeros without a value head)."""
        with torch.no_grad():
            inputs = self._read_obs(obs)
            out = self._run(inputs)
            return self._values(out.values, int(inputs["task_ids"].shape[0]))

    def behaviour_cloning_loss(
        self,
        obs: Mapping[str, Tensor],
        actions: Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Cross-entropy of the expert's binned action tokens (temperature 1, all bins).

        See :meth:`BasePolicy.behaviour_cloning_loss` (``actions`` ``[n, C, A]``); ``generator``
        is unused.
        """
        config = self.model.config
        expected = (config.num_action_chunks, config.action_dim)
        if actions.ndim != 3 or tuple(actions.shape[1:]) != expected:
            raise ValueError(
                f"actions must be [n, C={expected[0]}, A={expected[1]}], got {tuple(actions.shape)}"
            )
        out = self._run(self._read_obs(obs))
        logits = warp_action_logits(out.action_logits, self.action_bins, 1.0, 0)
        normalized = self.action_normalizer.normalize(actions.to(logits.device).float())
        targets = self.action_bins.values_to_ids(normalized).reshape(actions.shape[0], -1)
        log_probs = token_log_probs(logits, targets)
        return -log_probs.mean()


@register_policy("flow_vla")
class FlowVLAPolicy(_VLAPolicy):
    """pi0-style flow-matching VLA (see :mod:`.modeling_flow`).

    Logprobs and entropy cover the executed chunk only, ``[n, C * A_env]``; values ``[n, V]``.
    """

    model_class = FlowVLAModel
    config_class = FlowVLAConfig
    model: FlowVLAModel

    def _set_model(self, model: PreTrainedModel) -> None:
        assert isinstance(model, FlowVLAModel)
        self.model = model

    def _model_action_dim(self, config: Any) -> int:
        return int(config.executed_action_dim)

    def _executed(self, per_element: Tensor) -> Tensor:
        """``[n, H, A]`` -> the executed ``[n, C, A_env]`` block."""
        config = self.model.config
        return per_element[:, : config.num_action_chunks, : config.executed_action_dim]

    def _encode(self, inputs: Mapping[str, Tensor]) -> FlowPrefix:
        batch = self._model_inputs(inputs)
        return self.model.encode_prefix(
            batch.pixel_values, batch.input_ids, batch.attention_mask, batch.states
        )

    def _values_of(self, prefix: FlowPrefix, batch: int) -> Tensor:
        if self.model.value_head is None or not self.cfg.add_value_head:
            return self._zero_values(batch, self.prompt_ids.device)
        return self.model.values(prefix)

    def predict_action_batch(
        self,
        obs: Mapping[str, Tensor],
        mode: str = "train",
        *,
        generator: torch.Generator | None = None,
        compute_values: bool = True,
    ) -> PolicyOutput:
        """Denoises an action chunk; see :meth:`BasePolicy.predict_action_batch`.

        ``train`` samples with ``cfg.flow_sampler``/``cfg.noise_level``; ``eval`` integrates
        the ODE (logprobs are zeros). Both start from ``cfg.flow_start``: with ``zero`` eval
        is a deterministic function of the observation, like a Gaussian policy's mean
        action. ``forward_inputs`` holds the observation entries plus ``chains`` and
        ``denoise_inds``.
        """
        self._check_mode(mode)
        sampler = self.cfg.flow_sampler if mode == "train" else "ode"
        with torch.no_grad():
            inputs = self._read_obs(obs)
            prefix = self._encode(inputs)
            sample = sample_chain(
                self.model,
                prefix,
                sampler=sampler,
                noise_level=self.cfg.noise_level,
                generator=generator,
                start_at_mean=self.cfg.flow_start == "zero",
            )
            batch = sample.chains.shape[0]
            actions = self.action_normalizer.denormalize(self._executed(sample.actions))
            log_probs = self._executed(sample.log_probs).reshape(batch, -1)
            values = self._values_of(prefix, batch) if compute_values else None
        return PolicyOutput(
            actions=actions,
            prev_logprobs=log_probs,
            prev_values=values,
            forward_inputs={
                **inputs,
                "chains": sample.chains,
                "denoise_inds": sample.denoise_inds,
            },
        )

    def default_forward(
        self,
        forward_inputs: Mapping[str, Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = False,
        compute_values: bool = False,
    ) -> dict[str, Tensor]:
        """Re-scores the stored stochastic transitions; see :meth:`BasePolicy.default_forward`.

        ``entropy`` is the Gaussian entropy of the scored transitions (zeros for ``ode``).
        """
        if compute_values:
            self._check_values_requested(self.model.value_head is not None)
        inputs = self._read_obs(forward_inputs)
        prefix = self._encode(inputs)
        result: dict[str, Tensor] = {}
        if compute_logprobs or compute_entropy:
            self._require_stored(forward_inputs, "chains", "denoise_inds")
            log_probs, entropy = score_chain(
                self.model,
                prefix,
                forward_inputs["chains"],
                forward_inputs["denoise_inds"],
                sampler=self.cfg.flow_sampler,
                noise_level=self.cfg.noise_level,
            )
            batch = log_probs.shape[0]
            if compute_logprobs:
                result["logprobs"] = self._executed(log_probs).reshape(batch, -1)
            if compute_entropy:
                result["entropy"] = self._executed(entropy).reshape(batch, -1)
        if compute_values:
            result["values"] = self.model.values(prefix)
        return result

    def get_value(self, obs: Mapping[str, Tensor]) -> Tensor:
        """Values ``[n, V]`` (float32, no grad; zeros without a value head)."""
        with torch.no_grad():
            inputs = self._read_obs(obs)
            return self._values_of(self._encode(inputs), int(inputs["task_ids"].shape[0]))

    def behaviour_cloning_loss(
        self,
        obs: Mapping[str, Tensor],
        actions: Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Supervised flow-matching loss; see :meth:`BasePolicy.behaviour_cloning_loss`.

        ``actions`` are ``[n, H, A_env]`` (model dims beyond ``A_env`` are trained towards 0);
        ``generator`` draws the noise and times.

        Raises:
            ValueError: ``actions`` is not ``[n, H, A_env]``.
        """
        config = self.model.config
        expected = (config.action_horizon, config.executed_action_dim)
        if actions.ndim != 3 or tuple(actions.shape[1:]) != expected:
            raise ValueError(
                f"actions must be [n, H={expected[0]}, A_env={expected[1]}], got "
                f"{tuple(actions.shape)}"
            )
        inputs = self._read_obs(obs)
        prefix = self._encode(inputs)
        normalized = self.action_normalizer.normalize(actions.to(self.prompt_ids.device))
        pad = config.action_dim - config.executed_action_dim
        if pad:
            normalized = torch.nn.functional.pad(normalized, (0, pad))
        return flow_matching_loss(self.model, prefix, normalized, generator=generator)

    flow_matching_loss = behaviour_cloning_loss
    """The behaviour-cloning loss under its own name (this family's SFT loss)."""
