"""Training-step metrics that stay on the device until the step ends.

Loss functions return their metrics as detached 0-d tensors. Converting each
one with ``float()`` would make the host wait for the device once per metric
and micro-batch; instead a training loop adds them up here and reads them all
with one copy at the end of the step::

    means = MetricMeans()
    for batch in micro_batches:
        loss, metrics = policy_loss(...)
        means.add(metrics)
    train_metrics = means.means()  # {name: float}, one device-to-host copy

Plain numbers (e.g. from a custom loss) are accepted too.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["MetricMeans", "to_floats"]

MetricValue = torch.Tensor | float | int


class MetricMeans:
    """Weighted running means of named scalar metrics."""

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor | float] = {}
        self._weights: dict[str, float] = {}

    def add(self, values: Mapping[str, MetricValue], weight: float = 1.0) -> None:
        """Adds one observation of each metric.

        Args:
            values: Name -> 0-d tensor (any device) or number.
            weight: The observations' weight in the means.

        Raises:
            ValueError: If a tensor value has more than one element.
        """
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(
                        f"metric {name!r} must be a scalar, got a tensor of shape "
                        f"{tuple(value.shape)}; reduce it (e.g. .mean()) before logging"
                    )
                value = value.detach().reshape(()).to(torch.float64)
            self._sums[name] = self._sums.get(name, 0.0) + value * weight
            self._weights[name] = self._weights.get(name, 0.0) + weight

    def means(self) -> dict[str, float]:
        """The weighted mean of each metric, as floats (one device-to-host copy per device)."""
        return to_floats({name: total / self._weights[name] for name, total in self._sums.items()})


def to_floats(values: Mapping[str, MetricValue]) -> dict[str, float]:
    """Converts a mapping of 0-d tensors and numbers to floats.

    Tensors on the same device are stacked and copied to the host together,
    so the host waits for each device once, not once per value.
    """
    out: dict[str, float] = {}
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for name, value in values.items():
        if isinstance(value, torch.Tensor):
            by_device.setdefault(value.device, []).append((name, value))
        else:
            out[name] = float(value)
    for items in by_device.values():
        stacked = torch.stack([v.detach().reshape(()).to(torch.float64) for _, v in items])
        for (name, _), number in zip(items, stacked.tolist(), strict=True):
            out[name] = float(number)
    return {name: out[name] for name in values}
