"""The value head that pi0 and OpenVLA share (:class:`ValueMLP`).

Both VLA policies (``model_type: pi0`` and ``model_type: openvla``) put the same
small GELU MLP on their features to predict ``V`` values per observation.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

__all__ = ["ValueMLP"]


class ValueMLP(nn.Module):
    """Value head: GELU MLP whose last layer has no bias and N(0, 0.02) weights.

    Args:
        in_dim: Input width.
        hidden_dims: Hidden widths.
        out_dim: ``V`` values.
    """

    def __init__(self, in_dim: int, hidden_dims: Sequence[int], out_dim: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_dim
        for hidden in hidden_dims:
            layers += [nn.Linear(width, hidden), nn.GELU()]
            width = hidden
        last = nn.Linear(width, out_dim, bias=False)
        nn.init.normal_(last.weight, std=0.02)
        layers.append(last)
        self.net = nn.Sequential(*layers)

    def forward(self, features: Tensor) -> Tensor:
        """Values ``[n, V]`` in float32 from ``[n, in_dim]`` features."""
        out: Tensor = self.net(features)
        return out.float()
