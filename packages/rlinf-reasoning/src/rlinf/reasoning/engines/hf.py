"""A rollout engine on plain Hugging Face transformers (CPU and GPU).

The decoding loop is written here, over ``model(...)`` with a KV cache, rather
than delegated to ``model.generate``: transformers' logits processors rewrite
the scores (temperature, top-k/top-p masking) before they can be read back, and
the logprobs must come from the *raw* logits divided by the temperature to
match the actor's recomputation (see :mod:`rlinf.reasoning.models.logprobs`).

Batching: all ``len(prompts) * n`` samples are decoded together (in chunks of
``max_batch_size`` when set), prompts left-padded, position ids starting at 0
on each row's first real token (the actor's convention). Finished rows are
dropped from the batch and the KV cache once a quarter of the batch is done.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlinf.reasoning.engines.base import FinishReason, GenerationOutput, SamplingParams
from rlinf.reasoning.engines.sampling import make_generator, sample_tokens
from rlinf.reasoning.models.loading import load_causal_lm, resolve_device, resolve_dtype
from rlinf.reasoning.models.logprobs import (
    position_ids_from_attention_mask,
    token_logprobs_from_logits,
)

__all__ = ["HFEngine"]

logger = logging.getLogger(__name__)


def _as_id_list(value: object) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, Iterable):
        return [int(v) for v in value]
    raise TypeError(f"expected a token id or a list of ids, got {value!r}")


class HFEngine:
    """Rollout engine over a ``transformers`` causal LM.

    Attributes:
        model: The wrapped model (eval mode, no grad).
        device: The device generation runs on.
        version: Weight version, set by :meth:`load_weights`.
        eos_token_ids: Ids that always end a sample.
        pad_token_id: Id used for padding (its value never matters: it is masked).
        max_batch_size: Most sequences decoded at once; ``None`` means no limit.
    """

    def __init__(
        self,
        model_path: str | Path,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device | None = None,
        *,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int | None = None,
        max_batch_size: int | None = None,
    ) -> None:
        """Loads ``model_path`` (a local ``save_pretrained`` directory).

        Args:
            model_path: Directory holding ``config.json`` and weights.
            dtype: Parameter dtype (``"float32"``, ``"bfloat16"``, ``"float16"``...).
            device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``; ``None`` picks CUDA if available.
            eos_token_id: Stop id(s); defaults to the model's generation/config EOS.
            pad_token_id: Padding id; defaults to the model's pad id, then EOS, then 0.
            max_batch_size: Decode at most this many sequences at a time.

        Raises:
            FileNotFoundError: If ``model_path`` does not exist or is not a model directory.
        """
        model = load_causal_lm(model_path, dtype=dtype, device=device)
        self._setup(model, eos_token_id, pad_token_id, max_batch_size)

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        *,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int | None = None,
        max_batch_size: int | None = None,
    ) -> HFEngine:
        """Wraps an already-built model (used in place, not copied, and put in eval mode).

        Args:
            model: A Hugging Face causal LM; its current device and dtype are kept.
            eos_token_id: Stop id(s); defaults to the model's EOS.
            pad_token_id: Padding id; defaults to the model's pad id, then EOS, then 0.
            max_batch_size: Decode at most this many sequences at a time.

        Returns:
            The engine.
        """
        engine = cls.__new__(cls)
        engine._setup(model, eos_token_id, pad_token_id, max_batch_size)
        return engine

    def _setup(
        self,
        model: nn.Module,
        eos_token_id: int | Sequence[int] | None,
        pad_token_id: int | None,
        max_batch_size: int | None,
    ) -> None:
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size!r}")
        self.model = model
        self.model.eval()
        first = next(iter(model.parameters()))
        self.device = resolve_device(first.device)
        self.dtype = resolve_dtype(first.dtype)
        self.version = 0
        self.max_batch_size = max_batch_size
        config: Any = getattr(model, "config", None)
        gen_config: Any = getattr(model, "generation_config", None)
        if eos_token_id is None:
            eos_ids = _as_id_list(getattr(gen_config, "eos_token_id", None))
            eos_ids = eos_ids or _as_id_list(getattr(config, "eos_token_id", None))
        else:
            eos_ids = _as_id_list(eos_token_id)
        if not eos_ids and eos_token_id is None:
            logger.warning("model has no eos_token_id: samples stop only on stop_token_ids")
        self.eos_token_ids: tuple[int, ...] = tuple(eos_ids)
        if pad_token_id is None:
            pads = _as_id_list(getattr(gen_config, "pad_token_id", None))
            pads = pads or _as_id_list(getattr(config, "pad_token_id", None))
            pad_token_id = pads[0] if pads else (eos_ids[0] if eos_ids else 0)
        self.pad_token_id = int(pad_token_id)
        embeddings: Any = model.get_input_embeddings()  # type: ignore[operator]
        self.vocab_size = int(embeddings.num_embeddings)
        self._offloaded = False

    # ------------------------------------------------------------------ weights

    @property
    def is_offloaded(self) -> bool:
        """Whether :meth:`offload` was called without a matching :meth:`onload`."""
        return self._offloaded

    def _state(self) -> dict[str, torch.Tensor]:
        # state_dict() returns views sharing storage with the live parameters, so
        # copying into them updates the model in place (tied weights included).
        return dict(self.model.state_dict())

    @staticmethod
    def _lookup(state: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        try:
            return state[name]
        except KeyError:
            raise KeyError(
                f"weight {name!r} is not a parameter of the rollout model "
                f"(expected Hugging Face names such as {next(iter(state))!r})"
            ) from None

    def load_weights(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        *,
        version: int | None = None,
        strict: bool = True,
    ) -> int:
        """Copies ``(name, tensor)`` pairs into the model in place (one call per bucket).

        Tensors may live on any device and have any floating dtype; they are
        cast to the model's. Works while offloaded (the copy lands in the CPU
        weights and moves with the next :meth:`onload`); on a GPU, calling
        :meth:`onload` first avoids the detour through host memory.

        Args:
            named_tensors: Hugging Face parameter names and full (unsharded) tensors.
            version: If given, the new :attr:`version` after loading.
            strict: Raise on names the model does not have (else skip them).

        Returns:
            The number of tensors copied.

        Raises:
            KeyError: An unknown name while ``strict``.
            ValueError: A shape mismatch.
        """
        state = self._state()
        count = 0
        with torch.no_grad():
            for name, tensor in named_tensors:
                if not strict and name not in state:
                    continue
                target = self._lookup(state, name)
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"weight {name!r} has shape {tuple(tensor.shape)}, "
                        f"the rollout model expects {tuple(target.shape)}"
                    )
                target.copy_(tensor)
                count += 1
        if version is not None:
            self.version = int(version)
        return count

    def weights_max_abs_diff(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Largest ``|engine - given|`` over the given tensors (0.0 means bit-equal values).

        Args:
            named_tensors: Hugging Face names and tensors, e.g. the actor's state dict.

        Returns:
            The maximum absolute difference, compared in float32; 0.0 for no tensors.

        Raises:
            KeyError: A name the model does not have.
            ValueError: A shape mismatch.
        """
        state = self._state()
        worst = 0.0
        with torch.no_grad():
            for name, tensor in named_tensors:
                target = self._lookup(state, name)
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"weight {name!r} has shape {tuple(tensor.shape)}, "
                        f"the rollout model has {tuple(target.shape)}"
                    )
                if target.numel() == 0:
                    continue
                diff = (target.float() - tensor.to(target.device).float()).abs().max()
                worst = max(worst, float(diff))
        return worst

    def offload(self) -> None:
        """Moves the weights to CPU and frees cached device memory (no-op move on CPU)."""
        if self._offloaded:
            return
        if self.device.type != "cpu":
            self.model.to("cpu")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        self._offloaded = True

    def onload(self) -> None:
        """Moves the weights back to :attr:`device`."""
        if not self._offloaded:
            return
        if self.device.type != "cpu":
            self.model.to(self.device)
        self._offloaded = False

    # --------------------------------------------------------------- generation

    def _check_prompts(self, prompt_ids: Sequence[Sequence[int]], n: int) -> list[list[int]]:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        prompts = [list(p) for p in prompt_ids]
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty")
            bad = [t for t in p if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(
                    f"prompt {i} has token ids outside the vocabulary [0, {self.vocab_size}): {bad}"
                )
        return prompts

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams
    ) -> list[GenerationOutput]:
        """Samples ``n`` continuations of every prompt.

        Args:
            prompt_ids: Unpadded prompts, one list of token ids each.
            n: Samples per prompt (the GRPO group size).
            params: Sampling parameters.

        Returns:
            ``len(prompt_ids) * n`` outputs, prompt-major.

        Raises:
            ValueError: Bad ``n`` or prompt ids.
            RuntimeError: If the engine is offloaded.
        """
        if self._offloaded:
            raise RuntimeError("HFEngine.generate called while offloaded; call onload() first")
        prompts = self._check_prompts(prompt_ids, n)
        rows = [(i, j) for i in range(len(prompts)) for j in range(n)]
        if not rows:
            return []
        generator = make_generator(params.seed, self.device)
        chunk = self.max_batch_size or len(rows)
        outputs: list[GenerationOutput] = []
        with torch.inference_mode():
            for start in range(0, len(rows), chunk):
                outputs.extend(
                    self._generate_batch(prompts, rows[start : start + chunk], params, generator)
                )
        return outputs

    def _left_padded(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompts left-padded into one batch, and its attention mask (on the device)."""
        max_len = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), max_len), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), max_len), dtype=torch.long)
        for r, p in enumerate(prompts):
            input_ids[r, max_len - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[r, max_len - len(p) :] = 1
        return input_ids.to(self.device), mask.to(self.device)

    def _generate_batch(
        self,
        prompts: list[list[int]],
        rows: list[tuple[int, int]],
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> list[GenerationOutput]:
        batch = len(rows)
        dev = self.device
        input_ids, mask = self._left_padded([prompts[i] for i, _ in rows])
        positions = position_ids_from_attention_mask(mask)

        stop_ids = set(self.eos_token_ids) | set(params.stop_token_ids)
        out_ids: list[list[int]] = [[] for _ in rows]
        out_lps: list[list[float]] = [[] for _ in rows]
        reasons: list[FinishReason | None] = [None] * batch

        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = out.past_key_values
        logits = out.logits[:, -1, :]
        next_pos = positions[:, -1] + 1
        # alive[k] is the output row held at batch position k; finished rows are
        # fed padding until enough of them accumulate to prune the batch.
        alive = list(range(batch))
        for step in range(params.max_new_tokens):
            tokens = sample_tokens(logits, params, generator)
            lps = token_logprobs_from_logits(logits, tokens, params.temperature)
            last = step == params.max_new_tokens - 1
            keep: list[int] = []
            for k, (tok, lp) in enumerate(zip(tokens.tolist(), lps.tolist(), strict=True)):
                r = alive[k]
                if r < 0:
                    continue
                out_ids[r].append(tok)
                out_lps[r].append(lp)
                if tok in stop_ids:
                    reasons[r] = "stop"
                    alive[k] = -1
                elif last:
                    reasons[r] = "length"
                else:
                    keep.append(k)
            if last or not keep:
                break
            if len(alive) - len(keep) >= max(1, len(alive) // 4):
                index = torch.tensor(keep, device=dev)
                cache.batch_select_indices(index)
                tokens, mask, next_pos = tokens[index], mask[index], next_pos[index]
                alive = [alive[k] for k in keep]
            else:
                tokens = tokens.masked_fill(
                    torch.tensor([r < 0 for r in alive], device=dev), self.pad_token_id
                )
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=next_pos[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            logits = out.logits[:, -1, :]
            next_pos = next_pos + 1

        results = []
        for r, (i, j) in enumerate(rows):
            reason = reasons[r]
            assert reason is not None  # every row stops or runs out of budget
            results.append(GenerationOutput(i, j, out_ids[r], reason, out_lps[r]))
        return results

    def __repr__(self) -> str:
        return (
            f"HFEngine(model={type(self.model).__name__}, device={self.device}, "
            f"dtype={self.dtype}, version={self.version}, offloaded={self._offloaded})"
        )
