"""Building blocks shared by the policies: MLP trunks, action heads and the value head.

Action heads own the action distribution of a chunk of ``C`` actions:

* :class:`GaussianActionHead` (continuous): a diagonal Normal with a
  state-independent ``log_std``; logprobs and entropy are per dimension, ``[n, C * A]``.
* :class:`CategoricalActionHead` (discrete): one Categorical per sub-step;
  logprobs and entropy are ``[n, C]``.

Distribution parameters, samples, logprobs and entropies are always float32,
whatever the parameter dtype of the network.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from rlinf.embodied.models.config import Activation

__all__ = [
    "ActionHead",
    "CategoricalActionHead",
    "GaussianActionHead",
    "ValueHead",
    "build_mlp",
    "categorical_entropy",
    "categorical_log_prob",
    "gaussian_entropy",
    "gaussian_log_prob",
    "orthogonal_init",
]

_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
}

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_SQRT2 = math.sqrt(2.0)


def orthogonal_init(gain: float) -> Callable[[nn.Module], None]:
    """An initialiser for ``nn.Linear``/``nn.Conv2d``: orthogonal weights with ``gain``, zero bias.

    Args:
        gain: Scale of the orthogonal weight matrix.

    Returns:
        A function that initialises one layer in place.
    """

    def init(layer: nn.Module) -> None:
        if isinstance(layer, nn.Linear | nn.Conv2d):
            nn.init.orthogonal_(layer.weight, gain=gain)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

    return init


def _kaiming_init(layer: nn.Module) -> None:
    if isinstance(layer, nn.Linear):
        nn.init.kaiming_normal_(layer.weight)
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)


def build_mlp(
    in_dim: int,
    hidden_dims: Sequence[int],
    activation: Activation,
    init: Callable[[nn.Module], None] | None = None,
) -> tuple[nn.Sequential, int]:
    """A stack of ``Linear -> activation`` layers.

    Args:
        in_dim: Input width.
        hidden_dims: Width of each hidden layer; empty gives an identity.
        activation: Nonlinearity after every layer.
        init: Applied to every linear layer (default: orthogonal with gain sqrt(2)).

    Returns:
        The module and its output width.
    """
    layers: list[nn.Module] = []
    width = in_dim
    for hidden in hidden_dims:
        layers += [nn.Linear(width, hidden), _ACTIVATIONS[activation]()]
        width = hidden
    body = nn.Sequential(*layers)
    body.apply(init or orthogonal_init(_SQRT2))
    return body, width


def gaussian_log_prob(x: Tensor, mean: Tensor, log_std: Tensor) -> Tensor:
    """Per-dimension log-density of ``x`` under ``Normal(mean, exp(log_std))``.

    Args:
        x: Values, broadcastable with ``mean``.
        mean: Means.
        log_std: Log standard deviations, broadcastable with ``mean``.

    Returns:
        Log-densities, shaped like the broadcast of the inputs (not summed).
    """
    z = (x - mean) * torch.exp(-log_std)
    return -0.5 * z * z - log_std - _HALF_LOG_2PI


def gaussian_entropy(log_std: Tensor) -> Tensor:
    """Per-dimension entropy of a Normal with log standard deviation ``log_std``.

    Args:
        log_std: Log standard deviations.

    Returns:
        Entropies shaped like ``log_std``.
    """
    return 0.5 + _HALF_LOG_2PI + log_std


def categorical_log_prob(logits: Tensor, index: Tensor) -> Tensor:
    """Log-probability of ``index`` under ``Categorical(logits=logits)``.

    Args:
        logits: ``[..., K]`` unnormalised log-probabilities.
        index: ``[...]`` integer classes.

    Returns:
        ``[...]`` log-probabilities.
    """
    log_p = torch.log_softmax(logits, dim=-1)
    return log_p.gather(-1, index.long().unsqueeze(-1)).squeeze(-1)


def categorical_entropy(logits: Tensor) -> Tensor:
    """Entropy of ``Categorical(logits=logits)``.

    Args:
        logits: ``[..., K]`` unnormalised log-probabilities.

    Returns:
        ``[...]`` entropies.
    """
    log_p = torch.log_softmax(logits, dim=-1).clamp(min=torch.finfo(logits.dtype).min)
    return -(log_p.exp() * log_p).sum(-1)


class ActionHead(nn.Module, ABC):
    """Maps trunk features to the distribution of an action chunk.

    ``forward`` returns the distribution parameters (float32); the other methods
    take those parameters, so one trunk pass serves sampling, logprobs and entropy.
    """

    num_chunks: int
    action_dim: int

    @abstractmethod
    def sample(
        self, params: Tensor, deterministic: bool, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Draws (or, if ``deterministic``, picks the mode of) an action chunk.

        Args:
            params: Distribution parameters from ``forward``.
            deterministic: Return the mean / argmax instead of a sample.
            generator: Random generator for sampling (the global one if None).

        Returns:
            ``(env_actions [n, C, A] float32, stored_action, logprobs)``, where
            ``stored_action`` is what :meth:`log_prob` takes back; the env may write
            ``env_actions`` in place (``stored_action`` does not share its memory).
        """

    @abstractmethod
    def log_prob(self, params: Tensor, action: Tensor) -> Tensor:
        """Log-probabilities of a stored action (``[n, C * A]`` or ``[n, C]``)."""

    @abstractmethod
    def entropy(self, params: Tensor) -> Tensor:
        """Entropies shaped like :meth:`log_prob`'s output."""


class GaussianActionHead(ActionHead):
    """Diagonal Gaussian over ``C * A`` continuous dims with a state-independent ``log_std``.

    Args:
        in_dim: Trunk feature width.
        num_chunks: ``C``.
        action_dim: ``A``.
        init_log_std: Initial value of every ``log_std`` entry.
    """

    def __init__(self, in_dim: int, num_chunks: int, action_dim: int, init_log_std: float) -> None:
        super().__init__()
        self.num_chunks, self.action_dim = num_chunks, action_dim
        self.mean = nn.Linear(in_dim, num_chunks * action_dim)
        orthogonal_init(0.01 * _SQRT2)(self.mean)
        self.log_std = nn.Parameter(torch.full((num_chunks * action_dim,), float(init_log_std)))

    def forward(self, features: Tensor) -> Tensor:
        """Action means ``[n, C * A]`` (float32)."""
        means: Tensor = self.mean(features)
        return means.float()

    def sample(
        self, params: Tensor, deterministic: bool, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Samples ``mean + std * eps`` (unclipped), or takes the mean.

        Args:
            params: Means ``[n, C * A]``.
            deterministic: Take the mean.
            generator: Random generator for ``eps``.

        Returns:
            ``(actions [n, C, A], stored actions [n, C, A] (a copy), logprobs [n, C * A])``.
        """
        log_std = self.log_std.float()
        if deterministic:
            flat = params.clone()
        else:
            eps = torch.randn(
                params.shape, generator=generator, device=params.device, dtype=params.dtype
            )
            flat = torch.addcmul(params, log_std.exp(), eps)
        actions = flat.view(-1, self.num_chunks, self.action_dim)
        return actions, actions.clone(), gaussian_log_prob(flat, params, log_std)

    def log_prob(self, params: Tensor, action: Tensor) -> Tensor:
        """Per-dimension logprobs ``[n, C * A]`` of ``action`` (``[n, C, A]`` or ``[n, C * A]``)."""
        flat = action.reshape(params.shape).to(params.dtype)
        return gaussian_log_prob(flat, params, self.log_std.float())

    def entropy(self, params: Tensor) -> Tensor:
        """Per-dimension entropies ``[n, C * A]``."""
        return gaussian_entropy(self.log_std.float()).expand_as(params)


class CategoricalActionHead(ActionHead):
    """One Categorical over ``num_actions`` classes per chunk sub-step.

    Args:
        in_dim: Trunk feature width.
        num_chunks: ``C``.
        num_actions: Number of discrete actions ``K``.
    """

    def __init__(self, in_dim: int, num_chunks: int, num_actions: int) -> None:
        super().__init__()
        self.num_chunks, self.action_dim, self.num_actions = num_chunks, 1, num_actions
        self.logits = nn.Linear(in_dim, num_chunks * num_actions)
        orthogonal_init(0.01 * _SQRT2)(self.logits)

    def forward(self, features: Tensor) -> Tensor:
        """Logits ``[n, C, K]`` (float32)."""
        logits: Tensor = self.logits(features)
        return logits.float().view(-1, self.num_chunks, self.num_actions)

    def sample(
        self, params: Tensor, deterministic: bool, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Samples an index per sub-step, or takes the argmax; see :meth:`ActionHead.sample`.

        Args:
            params: Logits ``[n, C, K]``.
            deterministic: Take the argmax.
            generator: Random generator for sampling.

        Returns:
            ``(indices as float [n, C, 1], indices int64 [n, C, 1], logprobs [n, C])``.
        """
        if deterministic:
            index = params.argmax(-1)
        else:
            probs = torch.softmax(params, dim=-1).view(-1, self.num_actions)
            index = torch.multinomial(probs, 1, generator=generator).view(params.shape[:-1])
        stored = index.unsqueeze(-1)
        return stored.float(), stored, categorical_log_prob(params, index)

    def log_prob(self, params: Tensor, action: Tensor) -> Tensor:
        """Logprobs ``[n, C]`` of stored indices (``[n, C, 1]`` or ``[n, C]``, any dtype)."""
        return categorical_log_prob(params, action.reshape(params.shape[:-1]))

    def entropy(self, params: Tensor) -> Tensor:
        """Entropies ``[n, C]``."""
        return categorical_entropy(params)


class ValueHead(nn.Module):
    """Value MLP: hidden layers (Kaiming-normal init), then a bias-free ``N(0, 0.02)`` output.

    Args:
        in_dim: Input width.
        hidden_dims: Hidden layer widths.
        out_dim: ``V``: values per step.
        activation: Hidden nonlinearity.
    """

    def __init__(
        self, in_dim: int, hidden_dims: Sequence[int], out_dim: int, activation: Activation
    ) -> None:
        super().__init__()
        self.body, width = build_mlp(in_dim, hidden_dims, activation, init=_kaiming_init)
        self.out = nn.Linear(width, out_dim, bias=False)
        nn.init.normal_(self.out.weight, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        """Values ``[n, V]`` (float32)."""
        values: Tensor = self.out(self.body(x))
        return values.float()
