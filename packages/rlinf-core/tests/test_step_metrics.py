"""MetricMeans / to_floats: device-side metric sums read once per step."""

from __future__ import annotations

import pytest
import torch

from rlinf.core.algorithms import MetricMeans, ppo_policy_loss, to_floats, value_loss


def test_weighted_means_of_tensors_and_numbers() -> None:
    means = MetricMeans()
    means.add({"a": torch.tensor(1.0), "b": 2.0})
    means.add({"a": torch.tensor([3.0]), "b": 4})  # a 1-element tensor is a scalar too
    means.add({"a": torch.tensor(5.0, dtype=torch.float16)}, weight=2.0)
    got = means.means()
    assert got == {"a": pytest.approx((1 + 3 + 2 * 5) / 4), "b": pytest.approx(3.0)}
    assert all(type(v) is float for v in got.values())


def test_empty_means_and_key_order() -> None:
    assert MetricMeans().means() == {}
    assert list(to_floats({"z": torch.tensor(1.0), "y": 2, "x": torch.tensor(3)})) == [
        "z",
        "y",
        "x",
    ]


def test_non_scalar_tensor_is_named() -> None:
    with pytest.raises(ValueError, match=r"metric 'adv' must be a scalar.*shape \(2,\)"):
        MetricMeans().add({"adv": torch.zeros(2)})


def test_means_do_not_keep_the_graph() -> None:
    w = torch.tensor(2.0, requires_grad=True)
    means = MetricMeans()
    means.add({"loss": w * 3})
    assert means.means() == {"loss": 6.0}
    assert all(not t.requires_grad for t in means._sums.values() if isinstance(t, torch.Tensor))


def test_losses_return_grad_free_0d_tensors() -> None:
    lp = torch.randn(4, 5, requires_grad=True)
    _, pm = ppo_policy_loss(
        logprobs=lp, old_logprobs=lp.detach() + 0.1, advantages=torch.randn(4, 1)
    )
    v = torch.randn(4, 5, requires_grad=True)
    _, vm = value_loss(v, v.detach(), torch.randn(4, 5), None, 0.2)
    for metrics in (pm, vm):
        for name, value in metrics.items():
            assert isinstance(value, torch.Tensor) and value.dim() == 0, name
            assert not value.requires_grad, name
    floats = to_floats(pm)
    assert floats["actor/ratio"] == pytest.approx(float(pm["actor/ratio"]))
