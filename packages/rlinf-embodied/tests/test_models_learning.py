"""The policies learn: behaviour cloning, a value fit and a policy-gradient bandit.

Each test trains through the same calls the workers make (``predict_action_batch``
for acting, ``policy(forward_inputs, ...)`` for the loss) and asserts a threshold
that an untrained policy misses.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import torch

from rlinf.core.protocols.embodied import EnvSpec
from rlinf.embodied.models import ActorCriticPolicy, GaussianActionHead, PolicyConfig, build_policy

STATE_DIM = 4


class Adam:
    """Adam by hand (same update as torch.optim.Adam, no weight decay).

    ``torch.optim.Optimizer.__init__`` imports ``torch._dynamo``, which costs seconds
    per process on machines that do not cache bytecode; these tests stay fast without it.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr, (self.b1, self.b2), self.eps, self.t = lr, betas, 1e-8, 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is None:
                continue
            m.mul_(self.b1).add_(p.grad, alpha=1 - self.b1)
            v.mul_(self.b2).addcmul_(p.grad, p.grad, value=1 - self.b2)
            m_hat = m / (1 - self.b1**self.t)
            v_hat = v / (1 - self.b2**self.t)
            p.sub_(self.lr * m_hat / (v_hat.sqrt() + self.eps))


pytestmark = pytest.mark.usefixtures("single_torch_thread")


def test_mlp_behaviour_cloning_and_value_fit() -> None:
    torch.manual_seed(0)
    chunks, action_dim = 2, 2
    spec = EnvSpec(state_dim=STATE_DIM, image_shape=None, action_dim=action_dim)
    cfg = PolicyConfig(hidden_dims=[64, 64], num_action_chunks=chunks, value_type="chunk_level")
    policy = build_policy(cfg, spec)
    assert isinstance(policy, ActorCriticPolicy)
    w = torch.randn(STATE_DIM, chunks * action_dim)
    v = torch.randn(STATE_DIM, 1)

    def expert(states: torch.Tensor) -> torch.Tensor:
        return torch.tanh(states @ w).view(-1, chunks, action_dim)

    def value_target(states: torch.Tensor) -> torch.Tensor:
        return torch.sin(states @ v)

    test_states = torch.randn(512, STATE_DIM)

    def errors() -> tuple[float, float]:
        out = policy.predict_action_batch({"states": test_states}, mode="eval")
        action_err = (out.actions - expert(test_states)).abs().mean().item()
        value_err = policy.get_value({"states": test_states}) - value_target(test_states)
        return action_err, value_err.abs().mean().item()

    before = errors()
    optim = Adam(policy.parameters(), lr=3e-3)
    for _ in range(300):
        states = torch.randn(256, STATE_DIM)
        res = policy({"states": states, "action": expert(states)}, compute_values=True)
        bc_loss = -res["logprobs"].sum(-1).mean()
        value_loss = (res["values"] - value_target(states)).pow(2).mean()
        optim.zero_grad()
        (bc_loss + value_loss).backward()
        optim.step()
    action_err, value_err = errors()
    assert before[0] > 0.3 and before[1] > 0.3, before
    assert action_err < 0.06, action_err
    assert value_err < 0.1, value_err
    # Maximum likelihood also shrinks the std towards the residual error.
    head = policy.action_head
    assert isinstance(head, GaussianActionHead)
    assert head.log_std.max().item() < -1.2


def test_mlp_policy_gradient_on_a_contextual_bandit() -> None:
    """REINFORCE with the rollout/train calls: reward 1 when action == argmax(states[:K])."""
    torch.manual_seed(0)
    num_actions, chunks = 3, 2
    spec = EnvSpec(state_dim=STATE_DIM, image_shape=None, action_dim=1, num_actions=num_actions)
    cfg = PolicyConfig(hidden_dims=[64, 64], num_action_chunks=chunks)
    policy = build_policy(cfg, spec)
    optim = Adam(policy.parameters(), lr=1e-2)

    def correct(states: torch.Tensor) -> torch.Tensor:
        best = states[:, :num_actions].argmax(-1)  # [n]
        return torch.stack([best, (best + 1) % num_actions], dim=-1)  # sub-step k: shift k

    def accuracy() -> float:
        states = torch.randn(1024, STATE_DIM)
        out = policy.predict_action_batch({"states": states}, mode="eval")
        return (out.actions.squeeze(-1).long() == correct(states)).float().mean().item()

    before = accuracy()
    for _ in range(150):
        states = torch.randn(256, STATE_DIM)
        out = policy.predict_action_batch({"states": states}, mode="train")
        reward = (out.actions.squeeze(-1).long() == correct(states)).float()  # [n, C]
        advantage = reward - reward.mean(0)
        res = policy(out.forward_inputs, compute_entropy=True)
        loss = -(advantage * res["logprobs"]).mean() - 1e-3 * res["entropy"].mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
    after = accuracy()
    assert before < 0.6, before
    assert after > 0.9, after


def test_cnn_behaviour_cloning_from_pixels() -> None:
    """The action is the mean red intensity of the image: only the conv encoder can see it."""
    torch.manual_seed(0)
    size = 36
    spec = EnvSpec(state_dim=None, image_shape=(size, size, 3), action_dim=1)
    cfg = PolicyConfig(
        model_type="cnn", hidden_dims=[32], cnn_channels=[8, 8, 8], cnn_feature_dim=32
    )
    policy = build_policy(cfg, spec)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        level = torch.rand(n)
        noise = torch.randint(0, 40, (n, size, size, 3))
        images = noise.clone()
        images[..., 0] += (level * 215).round().long().view(n, 1, 1)
        return images.to(torch.uint8), (2 * level - 1).view(n, 1, 1)

    test_images, test_target = batch(256)

    def error() -> float:
        out = policy.predict_action_batch({"main_images": test_images}, mode="eval")
        return (out.actions - test_target).abs().mean().item()

    before = error()
    optim = Adam(policy.parameters(), lr=3e-3)
    for _ in range(150):
        images, target = batch(64)
        res = policy({"main_images": images, "action": target})
        optim.zero_grad()
        (-res["logprobs"].mean()).backward()
        optim.step()
    after = error()
    assert before > 0.3, before
    assert after < 0.1, after
