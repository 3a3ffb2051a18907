"""Flow-matching VLA (pi0 style): a VLM prefix plus an action expert that denoises an action chunk.

* Prefix: image patches, an optional proprio token and the left-padded prompt go
  through a Llama with bidirectional attention among valid positions, once per
  call; its hidden states are projected to the expert width (:class:`FlowPrefix`).
* Expert: a separate, smaller Llama over ``[prefix, H action tokens]`` with a block
  mask (prefix rows see only the prefix; action rows see the valid prefix and every
  action token). An action token is ``MLP([Linear(x_t), sincos(t)])``; the output
  goes through ``Linear`` to the velocity. Re-running the prefix rows inside the
  expert at each step is wasteful but tiny here, and keeps the expert a stock
  Llama with one custom mask (no shared KV cache).
* Sampling (:func:`sample_chain`) and re-scoring (:func:`score_chain`) use
  :mod:`.flow_sampling`; the ``noise`` sampler's standard deviation comes from
  :meth:`FlowVLAModel.noise_std`, a small head on the expert output squashed into
  ``config.noise_sigma_range`` (default 0.08-0.16 in normalised action units).
* Value head: the expert output of the action tokens for the query ``x = 0, t = 1``
  (the mean of the initial noise), averaged over the H tokens. That makes the
  value a deterministic function of the observation, identical in rollout, actor
  and ``get_value``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AutoModel, PreTrainedModel

from rlinf.embodied.models.vla.backbones import (
    ValueMLP,
    additive_attention_mask,
    build_image_embeddings,
    build_llama,
    build_prefix_modules,
    prefix_embeddings,
    run_llama,
    sinusoidal_embedding,
)
from rlinf.embodied.models.vla.configuration import FlowVLAConfig
from rlinf.embodied.models.vla.flow_sampling import (
    euler_mean,
    gaussian_entropy,
    gaussian_log_density,
    sde_mean_std,
    time_grid,
)

__all__ = [
    "FlowPrefix",
    "FlowSample",
    "FlowVLAModel",
    "flow_matching_loss",
    "sample_chain",
    "score_chain",
]

_FLOW_SAMPLERS = ("ode", "sde", "noise")


@dataclass
class FlowPrefix:
    """The encoded observation the expert attends to.

    Attributes:
        hidden: ``[B, P, We]`` prefix hidden states in the expert width.
        valid: ``[B, P]`` bool, False at prompt padding.
    """

    hidden: Tensor
    valid: Tensor

    def select(self, rows: Tensor) -> FlowPrefix:
        """The prefix of the given rows (repeats allowed)."""
        return FlowPrefix(self.hidden.index_select(0, rows), self.valid.index_select(0, rows))


@dataclass
class FlowSample:
    """One sampled denoising chain.

    Attributes:
        chains: ``[B, N + 1, H, A]`` float32, ``chains[:, 0]`` the initial noise,
            ``chains[:, N]`` the normalised actions.
        denoise_inds: ``[B, N]`` int64, 1 at the stochastic (scored) steps.
        log_probs: ``[B, H, A]`` float32 log-density of the stochastic transitions,
            averaged over them (0 where there is none).
        entropy: ``[B, H, A]`` float32 Gaussian entropy, averaged the same way.
    """

    chains: Tensor
    denoise_inds: Tensor
    log_probs: Tensor
    entropy: Tensor

    @property
    def actions(self) -> Tensor:
        """``[B, H, A]`` normalised actions (the end of the chain)."""
        return self.chains[:, -1]


def _silu_mlp(in_dim: int, hidden: int, out_dim: int) -> nn.Sequential:
    """``Linear(in_dim, hidden) -> SiLU -> Linear(hidden, out_dim)``."""
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.SiLU(), nn.Linear(hidden, out_dim))


class FlowVLAModel(PreTrainedModel):  # type: ignore[no-untyped-call]
    """SigLIP + projector + Llama prefix, and a Llama action expert trained by flow matching.

    Args:
        config: The model config.
    """

    config_class = FlowVLAConfig
    config: FlowVLAConfig
    base_model_prefix = "flow_vla"
    main_input_name = "pixel_values"
    _supports_sdpa = True

    def __init__(self, config: FlowVLAConfig) -> None:
        super().__init__(config)
        width = int(config.text_config["hidden_size"])
        expert_width = int(config.expert_config["hidden_size"])
        self.vision_tower, self.projector, self.language_model, self.proprio_projector = (
            build_prefix_modules(config, width)
        )
        self.image_embeddings = build_image_embeddings(config, width)
        self.prefix_to_expert = nn.Linear(width, expert_width)
        self.expert = build_llama(config.expert_config)
        self.action_in = nn.Linear(config.action_dim, expert_width)
        self.action_time_mlp = _silu_mlp(2 * expert_width, expert_width, expert_width)
        self.action_out = nn.Linear(expert_width, config.action_dim)
        self.noise_head = _silu_mlp(expert_width, expert_width, config.action_dim)
        self.value_head = (
            ValueMLP(expert_width, config.value_hidden_dims, config.value_dim)
            if config.add_value_head
            else None
        )
        self.post_init()  # type: ignore[no-untyped-call]

    @property
    def expert_width(self) -> int:
        """Hidden width of the action expert."""
        return int(self.config.expert_config["hidden_size"])

    def encode_prefix(
        self,
        pixel_values: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        states: Tensor | None = None,
    ) -> FlowPrefix:
        """Runs the VLM prefix once.

        Args:
            pixel_values: ``[B, 3, S, S]`` (or ``[B, 2, 3, S, S]`` with a wrist image) images.
            input_ids: ``[B, L]`` left-padded prompt ids.
            attention_mask: ``[B, L]`` prompt validity.
            states: ``[B, state_dim]`` when the model has a proprio token.

        Returns:
            The prefix in the expert width.
        """
        dtype = self.action_out.weight.dtype
        embeds, valid = prefix_embeddings(
            self, pixel_values, input_ids, attention_mask, states, dtype
        )
        allowed = valid.unsqueeze(1).expand(-1, valid.shape[1], -1)
        positions = (valid.long().cumsum(dim=1) - 1).clamp_min(0)
        hidden = run_llama(
            self.language_model, embeds, additive_attention_mask(allowed, dtype), positions
        )
        return FlowPrefix(self.prefix_to_expert(hidden), valid)

    def expert_forward(self, prefix: FlowPrefix, x_t: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        """Predicts the velocity at ``(x_t, t)``.

        Args:
            prefix: The encoded observation, ``B`` rows.
            x_t: ``[B, H, A]`` noisy actions.
            t: ``[B]`` times in ``[0, 1]``.

        Returns:
            ``[B, H, A]`` float32 velocity and ``[B, H, We]`` expert outputs of the action tokens.
        """
        dtype = self.action_out.weight.dtype
        batch, horizon = x_t.shape[0], x_t.shape[1]
        time = sinusoidal_embedding(t, self.expert_width).to(dtype)
        tokens = torch.cat(
            [self.action_in(x_t.to(dtype)), time.unsqueeze(1).expand(-1, horizon, -1)], dim=-1
        )
        embeds = torch.cat([prefix.hidden, self.action_time_mlp(tokens)], dim=1)
        prefix_len = prefix.valid.shape[1]
        device = embeds.device
        valid = torch.cat(
            [prefix.valid, torch.ones(batch, horizon, dtype=torch.bool, device=device)], dim=1
        )
        is_prefix = torch.arange(prefix_len + horizon, device=device) < prefix_len
        rule = is_prefix.unsqueeze(0) | (~is_prefix).unsqueeze(1)
        allowed = rule.unsqueeze(0) & valid.unsqueeze(1)
        positions = (valid.long().cumsum(dim=1) - 1).clamp_min(0)
        hidden = run_llama(self.expert, embeds, additive_attention_mask(allowed, dtype), positions)
        action_hidden = hidden[:, prefix_len:]
        return self.action_out(action_hidden).float(), action_hidden

    def noise_std(self, action_hidden: Tensor) -> Tensor:
        """Per-element std ``[B, H, A]`` of the ``noise`` sampler (float32, in the sigma range)."""
        low, high = (math.log(float(v)) for v in self.config.noise_sigma_range)
        raw = self.noise_head(action_hidden).float()
        return torch.exp(low + (high - low) * torch.sigmoid(raw))

    def values(self, prefix: FlowPrefix) -> Tensor:
        """Values ``[B, V]`` (float32) from the expert's answer to the query ``x = 0, t = 1``.

        Raises:
            ValueError: The model has no value head.
        """
        if self.value_head is None:
            raise ValueError("this flow VLA has no value head (config add_value_head: false)")
        batch = prefix.hidden.shape[0]
        query = torch.zeros(
            batch, self.config.action_horizon, self.config.action_dim, device=prefix.hidden.device
        )
        ones = torch.ones(batch, device=prefix.hidden.device)
        _, action_hidden = self.expert_forward(prefix, query, ones)
        out: Tensor = self.value_head(action_hidden.mean(dim=1))
        return out

    def forward(
        self,
        pixel_values: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        noisy_actions: Tensor,
        timesteps: Tensor,
        states: Tensor | None = None,
    ) -> Tensor:
        """The velocity ``[B, H, A]`` (float32) at ``(noisy_actions, timesteps)``."""
        prefix = self.encode_prefix(pixel_values, input_ids, attention_mask, states)
        velocity, _ = self.expert_forward(prefix, noisy_actions, timesteps)
        return velocity


def _check_sampler(sampler: str) -> None:
    if sampler not in _FLOW_SAMPLERS:
        raise ValueError(
            f"flow sampler {sampler!r} is not one of {list(_FLOW_SAMPLERS)}; set "
            "actor.model.flow_sampler to one of them"
        )


def sample_chain(
    model: FlowVLAModel,
    prefix: FlowPrefix,
    *,
    sampler: str,
    noise_level: float,
    generator: torch.Generator | None = None,
    start_at_mean: bool = False,
) -> FlowSample:
    """Integrates from noise (t=1) to actions (t=0) with ``N`` steps.

    ``ode``: every step deterministic. ``sde``: one step, drawn uniformly once per
    call and shared by the batch, is the Gaussian ``sde`` transition, the others
    are Euler steps. ``noise``: every step is Gaussian with the learned std; the
    log-density is the MEAN over the ``N`` transitions (a per-step scale, so clip
    ranges mean the same as for ``sde``; the policy-independent density of the
    initial noise is not included).

    Args:
        model: The flow VLA.
        prefix: The encoded observations.
        sampler: ``ode``, ``sde`` or ``noise``.
        noise_level: The ``sde`` noise scale.
        generator: Random generator for the noise and the stochastic step.
        start_at_mean: Start from ``x_1 = 0``, the mean of the noise, instead of a draw
            (with ``ode`` the whole chain is then a deterministic function of the prefix).

    Returns:
        The chain, which steps were stochastic, and their log-density and entropy.
    """
    _check_sampler(sampler)
    config = model.config
    device = prefix.hidden.device
    batch, horizon, dim, steps = (
        prefix.hidden.shape[0],
        config.action_horizon,
        config.action_dim,
        config.num_steps,
    )
    grid = time_grid(steps, device)
    x = (
        torch.zeros(batch, horizon, dim, device=device)
        if start_at_mean
        else torch.randn(batch, horizon, dim, device=device, generator=generator)
    )
    chain = [x]
    denoise_inds = torch.zeros(batch, steps, dtype=torch.long, device=device)
    log_sum = torch.zeros(batch, horizon, dim, device=device)
    entropy_sum = torch.zeros(batch, horizon, dim, device=device)
    stochastic_step = -1
    if sampler == "sde":
        stochastic_step = int(torch.randint(steps, (1,), device=device, generator=generator))
    for i in range(steps):
        t = grid[i].expand(batch)
        t_next = grid[i + 1].expand(batch)
        velocity, action_hidden = model.expert_forward(prefix, x, t)
        if sampler == "noise" or i == stochastic_step:
            if sampler == "noise":
                mean, std = euler_mean(x, velocity, t, t_next), model.noise_std(action_hidden)
            else:
                mean, std = sde_mean_std(x, velocity, t, t_next, noise_level)
            eps = torch.randn(mean.shape, device=device, generator=generator)
            x = mean + std * eps
            log_sum = log_sum + gaussian_log_density(x, mean, std)
            entropy_sum = entropy_sum + gaussian_entropy(std).expand_as(mean)
            denoise_inds[:, i] = 1
        else:
            x = euler_mean(x, velocity, t, t_next)
        chain.append(x)
    count = denoise_inds.sum(dim=1).clamp_min(1).float().view(-1, 1, 1)
    return FlowSample(
        chains=torch.stack(chain, dim=1),
        denoise_inds=denoise_inds,
        log_probs=log_sum / count,
        entropy=entropy_sum / count,
    )


def score_chain(
    model: FlowVLAModel,
    prefix: FlowPrefix,
    chains: Tensor,
    denoise_inds: Tensor,
    *,
    sampler: str,
    noise_level: float,
) -> tuple[Tensor, Tensor]:
    """Recomputes the log-density and entropy of stored stochastic transitions (with grad).

    All (row, step) pairs marked in ``denoise_inds`` go through the expert in one
    batch; each row's result is the mean over its marked steps, as in
    :func:`sample_chain`.

    Args:
        model: The flow VLA.
        prefix: The encoded observations (``B`` rows).
        chains: ``[B, N + 1, H, A]`` stored chains.
        denoise_inds: ``[B, N]`` stored step markers.
        sampler: The sampler that produced the chains (``ode`` scores 0).
        noise_level: The ``sde`` noise scale it used.

    Returns:
        ``log_probs`` and ``entropy``, both ``[B, H, A]`` float32.
    """
    _check_sampler(sampler)
    batch, _, horizon, dim = chains.shape
    device = prefix.hidden.device
    chains = chains.to(device=device, dtype=torch.float32)
    zeros = torch.zeros(batch, horizon, dim, device=device)
    rows, steps = denoise_inds.to(device).nonzero(as_tuple=True)
    if sampler == "ode" or rows.numel() == 0:
        return zeros, zeros.clone()
    grid = time_grid(model.config.num_steps, device)
    x, x_next = chains[rows, steps], chains[rows, steps + 1]
    t, t_next = grid[steps], grid[steps + 1]
    velocity, action_hidden = model.expert_forward(prefix.select(rows), x, t)
    if sampler == "noise":
        mean, std = euler_mean(x, velocity, t, t_next), model.noise_std(action_hidden)
    else:
        mean, std = sde_mean_std(x, velocity, t, t_next, noise_level)
    log_probs = zeros.index_add(0, rows, gaussian_log_density(x_next, mean, std))
    entropy = zeros.index_add(0, rows, gaussian_entropy(std).expand_as(mean))
    count = torch.bincount(rows, minlength=batch).clamp_min(1).float().view(-1, 1, 1)
    return log_probs / count, entropy / count


def flow_matching_loss(
    model: FlowVLAModel,
    prefix: FlowPrefix,
    actions: Tensor,
    *,
    generator: torch.Generator | None = None,
) -> Tensor:
    """The flow-matching MSE for supervised fine-tuning.

    Draws ``eps ~ N(0, I)`` and ``t ~ U(0.001, 1)`` per sample, forms
    ``x_t = t eps + (1 - t) a`` and regresses the velocity onto ``eps - a``.

    Args:
        model: The flow VLA.
        prefix: The encoded observations (``encode_prefix``), with grad.
        actions: ``[B, H, A]`` normalised target actions.
        generator: Random generator for ``eps`` and ``t``.

    Returns:
        The scalar loss (float32).
    """
    device = prefix.hidden.device
    target_actions = actions.to(device=device, dtype=torch.float32)
    eps = torch.randn(target_actions.shape, device=device, generator=generator)
    t = 0.001 + 0.999 * torch.rand(target_actions.shape[0], device=device, generator=generator)
    tb = t.view(-1, 1, 1)
    x_t = tb * eps + (1.0 - tb) * target_actions
    velocity, _ = model.expert_forward(prefix, x_t, t)
    return F.mse_loss(velocity, eps - target_actions)


AutoModel.register(FlowVLAConfig, FlowVLAModel, exist_ok=True)
