"""RL sampling and re-scoring on ``transformers.PI0ForConditionalGeneration``.

pi0 runs its PaliGemma prefix (camera frames, prompt) once and keeps the
per-layer key/value cache; its Gemma action expert then attends to that cache
at every denoising step (:func:`encode_prefix`, :func:`velocity`). The stock
``sample_actions`` integrates the ODE; RL needs stochastic steps whose
log-density the actor can recompute, so the loop lives here, built from the
stock model's own submodules (``model.model.embed_prefix``, ``model.model.vlm``,
``model.embed_action_time``, ``model.model`` and ``model.action_out_proj``,
called exactly as ``sample_actions`` calls them). The transition math is
:mod:`rlinf.embodied.models.vla.flow_sampling` (openpi's conventions: ``t = 1``
noise, ``t = 0`` data, ``N`` Euler steps).

Samplers: ``ode`` (deterministic; with the same start noise it reproduces
``sample_actions``), ``sde`` (one step per call, drawn once and shared by the
batch, is Gaussian with std from ``noise_level``), ``noise`` (every step
Gaussian with a learned std, :class:`Pi0Heads.noise_head`). Log-densities are
per element, averaged over a row's stochastic steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import DynamicCache, PI0ForConditionalGeneration

from rlinf.embodied.models.vla.backbones import ValueMLP
from rlinf.embodied.models.vla.flow_sampling import (
    euler_mean,
    gaussian_entropy,
    gaussian_log_density,
    sde_mean_std,
    time_grid,
)

__all__ = [
    "FLOW_SAMPLERS",
    "Pi0Chain",
    "Pi0Heads",
    "Pi0Prefix",
    "encode_prefix",
    "flow_matching_loss",
    "sample_chain",
    "score_chain",
    "velocity",
]

FLOW_SAMPLERS = ("ode", "sde", "noise")
NOISE_SIGMA_RANGE = (0.08, 0.16)
"""Range of the ``noise`` sampler's learned std, in normalised action units."""


@dataclass
class Pi0Prefix:
    """The encoded observation the action expert attends to.

    Attributes:
        keys: Per VLM layer, ``[B, kv_heads, P, head_dim]`` cached keys.
        values: Per VLM layer, the cached values (same shapes).
        attention_mask: ``[B, P]`` 1 at real prefix positions (0 at prompt padding).
        state: ``[B, max_state_dim]`` normalised, zero-padded robot state.
    """

    keys: list[Tensor]
    values: list[Tensor]
    attention_mask: Tensor
    state: Tensor

    @property
    def batch(self) -> int:
        """Rows ``B``."""
        return int(self.state.shape[0])

    def select(self, rows: Tensor) -> Pi0Prefix:
        """The prefix of the given rows (repeats allowed)."""
        return Pi0Prefix(
            [k.index_select(0, rows) for k in self.keys],
            [v.index_select(0, rows) for v in self.values],
            self.attention_mask.index_select(0, rows),
            self.state.index_select(0, rows),
        )

    def cache(self) -> DynamicCache:
        """A fresh cache holding the prefix (the expert's forward appends to the copy only)."""
        return DynamicCache(ddp_cache_data=list(zip(self.keys, self.values, strict=True)))


@dataclass
class Pi0Chain:
    """One sampled denoising chain.

    Attributes:
        chains: ``[B, N + 1, H, A]`` float32; ``chains[:, 0]`` the start, ``chains[:, N]``
            the normalised action chunk (``H = chunk_size``, ``A = max_action_dim``).
        denoise_inds: ``[B, N]`` int64, 1 at the stochastic (scored) steps.
        log_probs: ``[B, H, A]`` float32 log-density, averaged over the scored steps.
        entropy: ``[B, H, A]`` float32 Gaussian entropy, averaged the same way.
        start_hidden: ``[B, H, W]`` expert outputs of the first step (the value query
            when the chain starts at zero), or None.
    """

    chains: Tensor
    denoise_inds: Tensor
    log_probs: Tensor
    entropy: Tensor
    start_hidden: Tensor | None = None

    @property
    def actions(self) -> Tensor:
        """``[B, H, A]`` normalised actions (the end of the chain)."""
        return self.chains[:, -1]


class Pi0Heads(nn.Module):
    """What RL adds on top of pi0: a value head and the ``noise`` sampler's std head.

    Both read the action expert's output at the action tokens (width ``W``).

    Args:
        width: The expert's hidden size.
        action_dim: ``max_action_dim``.
        value_dim: ``V`` values per call.
    """

    def __init__(self, width: int, action_dim: int, value_dim: int) -> None:
        super().__init__()
        self.value_head = ValueMLP(width, [width], value_dim)
        self.noise_head = nn.Sequential(
            nn.Linear(width, width), nn.SiLU(), nn.Linear(width, action_dim)
        )

    def noise_std(self, hidden: Tensor) -> Tensor:
        """Per-element std ``[B, H, A]`` (float32) in :data:`NOISE_SIGMA_RANGE`."""
        low, high = (math.log(v) for v in NOISE_SIGMA_RANGE)
        raw = self.noise_head(hidden).float()
        return torch.exp(low + (high - low) * torch.sigmoid(raw))

    def values(self, hidden: Tensor) -> Tensor:
        """Values ``[B, V]`` (float32) from the expert outputs of the ``x = 0, t = 1`` query."""
        out: Tensor = self.value_head(hidden.mean(dim=1))
        return out


def encode_prefix(
    model: PI0ForConditionalGeneration,
    input_ids: Tensor,
    attention_mask: Tensor,
    pixel_values: Tensor,
    pixel_attention_mask: Tensor,
    state: Tensor,
) -> Pi0Prefix:
    r"""Runs the VLM over ``[camera tokens] <bos> prompt \n`` once and keeps its KV cache.

    Args:
        model: The pi0 model.
        input_ids: ``[B, P]`` prompt ids with ``image_token_id`` placeholders.
        attention_mask: ``[B, P]`` 1 at real tokens.
        pixel_values: ``[B, K, 3, S, S]`` normalised camera frames.
        pixel_attention_mask: ``[B, K]`` True for present cameras.
        state: ``[B, max_state_dim]`` normalised, padded state.

    Returns:
        The prefix.
    """
    position_ids = attention_mask.cumsum(-1) - 1
    dtype = model.action_out_proj.weight.dtype
    embeds = model.model.embed_prefix(input_ids, pixel_values.to(dtype), pixel_attention_mask)
    token_type_ids = torch.zeros_like(embeds)[:, :, 0]
    cache = model.model.vlm(
        inputs_embeds=embeds,
        attention_mask=attention_mask,
        position_ids=position_ids,
        token_type_ids=token_type_ids,
        use_cache=True,
    ).past_key_values
    layers = cache.layers
    return Pi0Prefix(
        [layer.keys for layer in layers],
        [layer.values for layer in layers],
        attention_mask,
        state.to(dtype),
    )


def velocity(
    model: PI0ForConditionalGeneration, prefix: Pi0Prefix, x_t: Tensor, t: Tensor
) -> tuple[Tensor, Tensor]:
    """The expert's velocity at ``(x_t, t)`` given the prefix, as the stock forward computes it.

    Args:
        model: The pi0 model.
        prefix: ``B`` encoded observations.
        x_t: ``[B, H, A]`` noisy action chunks.
        t: ``[B]`` times.

    Returns:
        ``[B, H, A]`` float32 velocity and ``[B, H, W]`` expert outputs at the action tokens.
    """
    dtype = model.action_out_proj.weight.dtype
    embeds = model.embed_action_time(prefix.state, x_t.to(dtype), t.float())
    out = model.model(
        action_embeds=embeds,
        attention_mask=prefix.attention_mask,
        past_key_values=prefix.cache(),
    )
    hidden = out.last_hidden_state[:, -model.config.chunk_size :]
    return model.action_out_proj(hidden).float(), hidden


def _check_sampler(sampler: str) -> None:
    if sampler not in FLOW_SAMPLERS:
        raise ValueError(
            f"flow sampler {sampler!r} is not one of {list(FLOW_SAMPLERS)}; set "
            "actor.model.flow_sampler to one of them"
        )


def sample_chain(
    model: PI0ForConditionalGeneration,
    heads: Pi0Heads,
    prefix: Pi0Prefix,
    *,
    sampler: str,
    noise_level: float,
    start: Tensor,
    generator: torch.Generator | None = None,
) -> Pi0Chain:
    """Integrates from ``start`` (t = 1) to an action chunk (t = 0) in ``num_inference_steps``.

    Args:
        model: The pi0 model.
        heads: The RL heads (the ``noise`` sampler's std).
        prefix: The encoded observations.
        sampler: ``ode``, ``sde`` or ``noise``.
        noise_level: The ``sde`` noise scale.
        start: ``[B, H, A]`` the chain's start (noise, or zeros).
        generator: Random generator of the stochastic steps.

    Returns:
        The chain, its scored steps, their log-density and entropy.

    Raises:
        ValueError: An unknown sampler, or ``sde`` with fewer than 2 steps.
    """
    _check_sampler(sampler)
    steps = int(model.config.num_inference_steps)
    if sampler == "sde" and steps < 2:
        raise ValueError(
            f"the sde sampler needs num_inference_steps >= 2, the model has {steps}; use "
            "flow_sampler: noise or a model config with more steps"
        )
    device = prefix.state.device
    batch = prefix.batch
    grid = time_grid(steps, device)
    x = start.to(device=device, dtype=torch.float32)
    chain = [x]
    denoise_inds = torch.zeros(batch, steps, dtype=torch.long, device=device)
    log_sum = torch.zeros_like(x)
    entropy_sum = torch.zeros_like(x)
    stochastic_step = -1
    if sampler == "sde":
        stochastic_step = int(torch.randint(steps, (1,), generator=generator))
    start_hidden: Tensor | None = None
    for i in range(steps):
        t, t_next = grid[i].expand(batch), grid[i + 1].expand(batch)
        v, hidden = velocity(model, prefix, x, t)
        if i == 0:
            start_hidden = hidden
        if sampler == "noise" or i == stochastic_step:
            if sampler == "noise":
                mean, std = euler_mean(x, v, t, t_next), heads.noise_std(hidden)
            else:
                mean, std = sde_mean_std(x, v, t, t_next, noise_level)
            eps = torch.randn(mean.shape, device=device, generator=generator)
            x = mean + std * eps
            log_sum = log_sum + gaussian_log_density(x, mean, std)
            entropy_sum = entropy_sum + gaussian_entropy(std).expand_as(mean)
            denoise_inds[:, i] = 1
        else:
            x = euler_mean(x, v, t, t_next)
        chain.append(x)
    count = denoise_inds.sum(dim=1).clamp_min(1).float().view(-1, 1, 1)
    return Pi0Chain(
        chains=torch.stack(chain, dim=1),
        denoise_inds=denoise_inds,
        log_probs=log_sum / count,
        entropy=entropy_sum / count,
        start_hidden=start_hidden,
    )


def score_chain(
    model: PI0ForConditionalGeneration,
    heads: Pi0Heads,
    prefix: Pi0Prefix,
    chains: Tensor,
    denoise_inds: Tensor,
    *,
    sampler: str,
    noise_level: float,
) -> tuple[Tensor, Tensor]:
    """Recomputes the log-density and entropy of stored stochastic steps (with grad).

    Every marked (row, step) pair goes through the expert in one batch.

    Args:
        model: The pi0 model.
        heads: The RL heads.
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
    device = prefix.state.device
    chains = chains.to(device=device, dtype=torch.float32)
    zeros = torch.zeros(batch, horizon, dim, device=device)
    rows, steps = denoise_inds.to(device).nonzero(as_tuple=True)
    if sampler == "ode" or rows.numel() == 0:
        return zeros, zeros.clone()
    grid = time_grid(int(model.config.num_inference_steps), device)
    x, x_next = chains[rows, steps], chains[rows, steps + 1]
    t, t_next = grid[steps], grid[steps + 1]
    v, hidden = velocity(model, prefix.select(rows), x, t)
    if sampler == "noise":
        mean, std = euler_mean(x, v, t, t_next), heads.noise_std(hidden)
    else:
        mean, std = sde_mean_std(x, v, t, t_next, noise_level)
    log_probs = zeros.index_add(0, rows, gaussian_log_density(x_next, mean, std))
    entropy = zeros.index_add(0, rows, gaussian_entropy(std).expand_as(mean))
    count = torch.bincount(rows, minlength=batch).clamp_min(1).float().view(-1, 1, 1)
    return log_probs / count, entropy / count


def value_query(model: PI0ForConditionalGeneration, prefix: Pi0Prefix) -> Tensor:
    """Expert outputs ``[B, H, W]`` for the query ``x = 0, t = 1`` (what the value head reads)."""
    config = model.config
    query = torch.zeros(
        prefix.batch, config.chunk_size, config.max_action_dim, device=prefix.state.device
    )
    _, hidden = velocity(model, prefix, query, torch.ones(prefix.batch, device=query.device))
    return hidden


def flow_matching_loss(
    model: PI0ForConditionalGeneration,
    prefix: Pi0Prefix,
    actions: Tensor,
    *,
    generator: torch.Generator | None = None,
) -> Tensor:
    """pi0's supervised flow-matching loss on normalised, padded action chunks.

    ``t`` follows pi0's training distribution, ``Beta(alpha, beta) * scale + offset``
    (drawn by inverse CDF from ``generator`` when ``beta == 1``, pi0's default);
    ``x_t = t eps + (1 - t) a`` and the velocity regresses onto ``eps - a``.

    Args:
        model: The pi0 model.
        prefix: The encoded observations, with grad.
        actions: ``[B, H, A]`` normalised targets (``H = chunk_size``, ``A = max_action_dim``).
        generator: Random generator for ``eps`` and ``t``.

    Returns:
        The scalar MSE (float32).
    """
    config = model.config
    device = prefix.state.device
    target = actions.to(device=device, dtype=torch.float32)
    batch = target.shape[0]
    eps = torch.randn(target.shape, device=device, generator=generator)
    alpha, beta = float(config.time_sampling_beta_alpha), float(config.time_sampling_beta_beta)
    if beta == 1.0:
        uniform = torch.rand(batch, device=device, generator=generator)
        draw = uniform.pow(1.0 / alpha)
    else:
        draw = torch.distributions.Beta(alpha, beta).sample((batch,)).to(device)
    t = draw * float(config.time_sampling_scale) + float(config.time_sampling_offset)
    tb = t.view(-1, 1, 1)
    x_t = tb * eps + (1.0 - tb) * target
    v, _ = velocity(model, prefix, x_t, t)
    return F.mse_loss(v, eps - target)
