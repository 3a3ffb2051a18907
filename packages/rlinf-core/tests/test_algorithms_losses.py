"""Policy/value losses, loss aggregation, KL estimators, entropy, masked statistics."""

from __future__ import annotations

import math

import pytest
import torch

from rlinf.core.algorithms import (
    LOSS_AGG_MODES,
    agg_loss,
    entropy_from_logits,
    explained_variance,
    get_policy_loss,
    kl_penalty,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    ppo_policy_loss,
    value_loss,
)


def close(actual: torch.Tensor | float, expected: object, atol: float = 1e-5) -> None:
    a = torch.as_tensor(actual, dtype=torch.float64)
    torch.testing.assert_close(a, torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


RATIOS = [1.5, 0.9, 0.5, 1.1]
ADVS = [1.0, 1.0, -1.0, -1.0]


def ppo_inputs() -> dict[str, torch.Tensor]:
    logprobs = torch.log(torch.tensor(RATIOS)).requires_grad_()
    return {
        "logprobs": logprobs,
        "old_logprobs": torch.zeros(4),
        "advantages": torch.tensor(ADVS),
    }


def test_ppo_asymmetric_clip_by_hand() -> None:
    # eps_low = 0.2, eps_high = 0.28:
    #   e0: A=+1, r=1.5: max(-1.5, -1.28) = -1.28  (clipped)
    #   e1: A=+1, r=0.9: max(-0.9, -0.9)  = -0.9
    #   e2: A=-1, r=0.5: max(0.5, 0.8)    = 0.8    (clipped)
    #   e3: A=-1, r=1.1: max(1.1, 1.1)    = 1.1
    # token-mean = (-1.28 - 0.9 + 0.8 + 1.1) / 4 = -0.07
    inputs = ppo_inputs()
    loss, metrics = ppo_policy_loss(**inputs, clip_ratio_low=0.2, clip_ratio_high=0.28)
    close(loss, -0.07)
    assert set(metrics) == {
        "actor/ratio",
        "actor/clip_fraction",
        "actor/dual_clip_fraction",
        "actor/approx_kl",
        "actor/policy_loss",
    }
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values())
    close(metrics["actor/ratio"], 1.0)
    close(metrics["actor/clip_fraction"], 0.5)
    close(metrics["actor/dual_clip_fraction"], 0.0)
    close(metrics["actor/approx_kl"], -sum(math.log(r) for r in RATIOS) / 4)
    close(metrics["actor/policy_loss"], -0.07)
    # Gradient d loss / d logp = -A * r / 4 where unclipped, 0 where clipped.
    loss.backward()
    close(inputs["logprobs"].grad, [0.0, -0.9 / 4, 0.0, 1.1 / 4])


def test_ppo_symmetric_default_high_equals_low() -> None:
    # e0 becomes max(-1.5, -1.2) = -1.2 -> (-1.2 - 0.9 + 0.8 + 1.1) / 4 = -0.05
    loss, _ = ppo_policy_loss(**ppo_inputs(), clip_ratio_low=0.2)
    close(loss, -0.05)


def test_ppo_dual_clip() -> None:
    # One more entry: A=-1, r=5: max(5, 1.28) = 5, capped at c * |A| = 3.
    # Positive advantages are never capped (e0 stays -1.28).
    # Loss = (-1.28 - 0.9 + 0.8 + 1.1 + 3) / 5 = 0.544
    logprobs = torch.log(torch.tensor([*RATIOS, 5.0]))
    kw = {"old_logprobs": torch.zeros(5), "advantages": torch.tensor([*ADVS, -1.0])}
    loss, m = ppo_policy_loss(logprobs=logprobs, **kw, clip_ratio_high=0.28, dual_clip_c=3.0)
    close(loss, 0.544)
    close(m["actor/dual_clip_fraction"], 0.2)
    # e0 and e2; for e4 the unclipped term (5) is the larger one, so the ratio clip is inactive
    close(m["actor/clip_fraction"], 0.4)
    loss, m = ppo_policy_loss(logprobs=logprobs, **kw, clip_ratio_high=0.28)
    close(loss, (-0.28 + 5.0) / 5)
    for bad in (1.0, 0.5):
        with pytest.raises(ValueError, match=f"dual_clip_c={bad} must be > 1"):
            ppo_policy_loss(logprobs=logprobs, **kw, dual_clip_c=bad)


def test_ppo_mask_broadcast_and_padding() -> None:
    # [2, 2] entries, advantages [2, 1] broadcast over the last dim, second row half masked.
    # Padding holds garbage (inf) that must not leak.
    logprobs = torch.tensor([[0.0, 0.0], [math.log(1.5), float("inf")]])
    old = torch.tensor([[0.0, 0.0], [0.0, -float("inf")]])
    adv = torch.tensor([[2.0], [1.0]])
    mask = torch.tensor([[True, True], [True, False]])
    # valid: -2, -2, -1.2 -> token-mean -5.2/3; seq-mean-token-mean: (-2 + -1.2)/2 = -1.6;
    # seq-mean-token-sum: (-4 + -1.2) / 2 = -2.6
    expected = {"token-mean": -5.2 / 3, "seq-mean-token-mean": -1.6, "seq-mean-token-sum": -2.6}
    for mode, value in expected.items():
        loss, m = ppo_policy_loss(
            logprobs=logprobs,
            old_logprobs=old,
            advantages=adv,
            loss_mask=mask,
            loss_agg_mode=mode,
        )
        close(loss, value)
        close(m["actor/ratio"], (1 + 1 + 1.5) / 3)
        close(m["actor/clip_fraction"], 1 / 3)


def test_ppo_all_masked_is_zero() -> None:
    loss, m = ppo_policy_loss(**ppo_inputs(), loss_mask=torch.zeros(4, dtype=torch.bool))
    assert float(loss.detach()) == 0.0 and m["actor/ratio"] == 0.0


def test_ppo_low_precision_inputs_computed_in_float32() -> None:
    inputs = {k: v.detach().to(torch.bfloat16) for k, v in ppo_inputs().items()}
    loss, _ = ppo_policy_loss(**inputs, clip_ratio_high=0.28)
    assert loss.dtype == torch.float32
    close(loss, -0.07, atol=1e-2)


def test_ppo_log_ratio_clamp() -> None:
    # log-ratios [0.405, -0.105, -0.693, 0.095] clamped to [-0.1, 0.1]:
    # ratios [e^0.1, e^-0.1, e^-0.1, 1.1], all inside [0.8, 1.28] so no ratio clip:
    # loss = (-e^0.1 - e^-0.1 + e^-0.1 + 1.1) / 4
    loss, _ = ppo_policy_loss(
        **ppo_inputs(), clip_ratio_high=0.28, clip_log_ratio_min=-0.1, clip_log_ratio_max=0.1
    )
    close(loss, (1.1 - math.exp(0.1)) / 4)


def test_ppo_registered_names_resolve() -> None:
    for name in ("ppo", "actor", "actor_critic"):
        loss, _ = get_policy_loss(name)(**ppo_inputs(), clip_ratio_high=0.28)
        close(loss, -0.07)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clip_ratio_low": 0.0}, "clip_ratio_low=0.0 must be > 0"),
        ({"clip_ratio_low": 1.0}, "clip_ratio_low=1.0 must be < 1"),
        ({"clip_ratio_high": -0.1}, "clip_ratio_high=-0.1 must be > 0"),
        ({"loss_agg_mode": "sum"}, "loss_agg_mode='sum' is not supported"),
        ({"old_logprobs": torch.zeros(3)}, r"old_logprobs.shape=\(3,\) does not match"),
        ({"advantages": torch.zeros(2)}, r"advantages.shape=\(2,\) does not broadcast"),
        ({"loss_mask": torch.ones(4, 2)}, r"loss_mask.shape=\(4, 2\) does not broadcast"),
    ],
)
def test_ppo_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = dict(ppo_inputs())
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ppo_policy_loss(**args)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- agg_loss

LOSSES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])


def test_agg_loss_modes_by_hand() -> None:
    # valid: row 0 {1, 2}, row 1 {4}, row 2 none (excluded from the seq modes).
    close(agg_loss(LOSSES, MASK, "token-mean"), 7 / 3)
    close(agg_loss(LOSSES, MASK, "seq-mean-token-sum"), (3 + 4) / 2)
    close(agg_loss(LOSSES, MASK, "seq-mean-token-mean"), (1.5 + 4) / 2)
    # episode-length-norm: mean over all 9 entries of l * m * 4 / mask_sum,
    # mask_sum per row [2, 1, 5]: (1*2 + 2*2 + 4*4) / 9 = 22 / 9
    mask_sum = torch.tensor([[2], [1], [5]])
    close(
        agg_loss(LOSSES, MASK, "episode-length-norm", mask_sum=mask_sum, max_episode_steps=4),
        22 / 9,
    )
    # no mask: everything valid
    close(agg_loss(LOSSES, None, "token-mean"), 5.0)
    close(agg_loss(LOSSES, None, "seq-mean-token-sum"), 15.0)


def test_agg_loss_empty_mask_and_errors() -> None:
    empty = torch.zeros_like(MASK)
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        assert float(agg_loss(LOSSES, empty, mode)) == 0.0
    assert "token-mean" in LOSS_AGG_MODES
    with pytest.raises(ValueError, match="loss_agg_mode='mean' is not supported"):
        agg_loss(LOSSES, MASK, "mean")
    with pytest.raises(ValueError, match="needs mask_sum and max_episode_steps"):
        agg_loss(LOSSES, MASK, "episode-length-norm")
    with pytest.raises(ValueError, match=r"mask.shape=\(2,\) does not broadcast"):
        agg_loss(LOSSES, torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="has no sequence dim"):
        agg_loss(torch.tensor(1.0), None, "seq-mean-token-sum")


# ----------------------------------------------------------------------------- value loss


def test_value_loss_clipped_by_hand() -> None:
    # v = [1, 2], v_old = [0.5, 2], R = [2, 1], clip 0.2.
    # e0: 0.5*(2-1)^2 = 0.5; v_clip = 0.5 + 0.2 = 0.7 -> 0.5*1.3^2 = 0.845 -> 0.845 (clipped)
    # e1: v_clip = v -> 0.5.          token-mean = (0.845 + 0.5) / 2 = 0.6725
    values = torch.tensor([1.0, 2.0], requires_grad=True)
    old, ret = torch.tensor([0.5, 2.0]), torch.tensor([2.0, 1.0])
    loss, m = value_loss(values, old, ret, None, 0.2)
    close(loss, 0.6725)
    assert set(m) == {"critic/value_loss", "critic/value_clip_fraction"}
    close(m["critic/value_clip_fraction"], 0.5)
    loss.backward()
    close(values.grad, [0.0, 0.5])  # the clipped term has no gradient w.r.t. v
    # Huber(delta=1): e0 clipped |1.3| -> 1.3 - 0.5 = 0.8; e1 0.5 -> 0.65
    close(value_loss(values, old, ret, clip_range_value=0.2, huber_delta=1.0)[0], 0.65)
    # no clipping: (0.5 + 0.5) / 2; masked: only e0
    close(value_loss(values, old, ret)[0], 0.5)
    close(value_loss(values, old, ret, torch.tensor([True, False]), 0.2)[0], 0.845)


def test_value_loss_chunk_values_broadcast_to_action_returns() -> None:
    # values [N, 1] vs returns [N, C]: loss over [N, C].
    loss, _ = value_loss(
        torch.zeros(2, 1), torch.zeros(2, 1), torch.tensor([[1.0, 3.0], [1.0, 1.0]])
    )
    close(loss, (0.5 + 4.5 + 0.5 + 0.5) / 4)
    with pytest.raises(ValueError, match=r"returns\.shape"):
        value_loss(torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"old_values\.shape"):
        value_loss(torch.zeros(2, 2), torch.zeros(2, 1), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"clip_range_value=0\.0 must be > 0"):
        value_loss(torch.zeros(2), torch.zeros(2), torch.zeros(2), clip_range_value=0.0)


def test_explained_variance() -> None:
    # R = [1, 2, 3, 4] (var 1.25), err = R - v = [0, 0, 0, -1] (var 0.25 - 0.0625 = 0.1875)
    # -> 1 - 0.1875 / 1.25 = 0.85. The masked-out entry is ignored.
    returns = torch.tensor([1.0, 2.0, 3.0, 4.0, 100.0])
    values = torch.tensor([1.0, 2.0, 3.0, 5.0, -100.0])
    mask = torch.tensor([True, True, True, True, False])
    close(explained_variance(values, returns, mask), 0.85)
    close(explained_variance(returns, returns), 1.0)
    assert math.isnan(explained_variance(values, torch.ones(5)))
    assert math.isnan(explained_variance(values, returns, torch.zeros(5, dtype=torch.bool)))


# ----------------------------------------------------------------------------- KL, entropy


def test_kl_estimators_by_hand() -> None:
    # logp = -1, ref = -2 -> d = ref - logp = -1.
    # k1 = 1, k2 = 0.5, k3 = e^-1 + 1 - 1 = 0.3679, abs = 1
    logp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    close(kl_penalty(logp, ref, "k1"), [1.0])
    close(kl_penalty(logp, ref, "kl"), [1.0])
    close(kl_penalty(logp, ref, "k2"), [0.5])
    close(kl_penalty(logp, ref, "mse"), [0.5])
    close(kl_penalty(logp, ref, "k3"), [math.exp(-1.0)])
    close(kl_penalty(logp, ref, "low_var_kl"), [math.exp(-1.0)])
    close(kl_penalty(logp, ref, "abs"), [1.0])
    # k3 is >= 0 and clamped: d = +30 -> exp(20) - 21 -> 10; d = -30 -> e^-20 + 19 -> 10
    close(kl_penalty(torch.tensor([0.0, 0.0]), torch.tensor([30.0, -30.0]), "k3"), [10.0, 10.0])
    close(kl_penalty(torch.tensor([0.5]), torch.tensor([0.5]), "k3"), [0.0])


def test_kl_errors() -> None:
    with pytest.raises(ValueError, match="kind='k4' is not supported"):
        kl_penalty(torch.zeros(2), torch.zeros(2), "k4")
    with pytest.raises(ValueError, match=r"ref_logprobs.shape=\(3,\) does not match"):
        kl_penalty(torch.zeros(2), torch.zeros(3), "k1")


def test_entropy_from_logits() -> None:
    logits = torch.tensor(
        [[0.0, 0.0], [0.0, -float("inf")], [1000.0, 1000.0], [0.0, math.log(3.0)]]
    )
    # uniform over 2 -> ln 2; one-hot -> 0; large logits stay finite;
    # p = [1/4, 3/4] -> -(0.25 ln 0.25 + 0.75 ln 0.75)
    h = entropy_from_logits(logits)
    p = [0.25, 0.75]
    close(h, [math.log(2), 0.0, math.log(2), -sum(x * math.log(x) for x in p)])
    assert entropy_from_logits(logits.half()).dtype == torch.float32
    with pytest.raises(ValueError, match="has no class dim"):
        entropy_from_logits(torch.tensor(1.0))


def test_entropy_of_masked_vocabulary_is_finite_and_exact_with_finite_gradients() -> None:
    """``-inf`` logits (masked classes, p = 0) add 0 to the entropy and to its gradient."""
    inf = float("inf")
    logits = torch.tensor(
        [
            [0.0, math.log(3.0), -inf, -inf],  # p = [1/4, 3/4, 0, 0]
            [-inf, 2.0, 2.0, -inf],  # uniform over 2
            [-inf, -inf, 5.0, -inf],  # one class left: 0
            [1.0, 1.0, 1.0, 1.0],  # nothing masked: ln 4
        ],
        requires_grad=True,
    )
    h = entropy_from_logits(logits)
    h14 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # 0.5623351446...
    close(h, [h14, math.log(2), 0.0, math.log(4)], atol=1e-6)
    # dH/dx_j = -p_j (ln p_j + H): finite where p_j > 0, exactly 0 on masked classes.
    h.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    g = -0.25 * (math.log(0.25) + h14)
    close(logits.grad[0], [g, -g, 0.0, 0.0], atol=1e-6)
    close(logits.grad[1:], [[0.0] * 4] * 3, atol=1e-6)
    assert (logits.grad[logits.isinf()] == 0).all()


def test_entropy_of_masked_btv_logits_matches_the_unmasked_subset() -> None:
    """[B, T, V] logits with a masked vocabulary tail, as a policy with padded vocab gives."""
    gen = torch.Generator().manual_seed(0)
    b, t, v, kept = 2, 3, 11, 7
    raw = torch.randn(b, t, v, generator=gen) * 3
    masked = raw.clone()
    masked[..., kept:] = -float("inf")
    masked.requires_grad_()
    h = entropy_from_logits(masked)
    assert h.shape == (b, t) and torch.isfinite(h).all()
    p = torch.softmax(raw[..., :kept].double(), dim=-1)
    torch.testing.assert_close(h.double(), -(p * p.log()).sum(-1), atol=1e-5, rtol=0)
    # An entropy bonus backpropagates through it: finite, 0 on the masked vocabulary.
    (-0.01 * h.mean()).backward()
    assert masked.grad is not None and torch.isfinite(masked.grad).all()
    assert (masked.grad[..., kept:] == 0).all()
    # Half-precision input with -inf: computed in float32, still finite.
    h16 = entropy_from_logits(masked.detach().half())
    assert h16.dtype == torch.float32 and torch.isfinite(h16).all()


# ----------------------------------------------------------------------------- masked stats


def test_masked_statistics() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, float("nan")])
    m = torch.tensor([True, True, True, False])
    close(masked_sum(x, m), 6.0)
    close(masked_mean(x, m), 2.0)
    close(masked_var(x, m), 2 / 3)
    close(masked_var(x, m, unbiased=True), 1.0)
    w = masked_whiten(x, m, eps=0.0, unbiased=True)
    close(w[:3], [-1.0, 0.0, 1.0])
    close(masked_whiten(x, m, eps=0.0, unbiased=True, shift_mean=False)[:3], [1.0, 2.0, 3.0])
    x2 = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    close(masked_mean(x2, torch.tensor([[True, False], [True, True]]), dim=1), [1.0, 6.0])
    close(masked_mean(x2, torch.zeros(2, 2, dtype=torch.bool)), 0.0)
