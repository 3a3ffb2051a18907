"""Tiny VLAs beside the MLP policy: predict and train samples/s, and bytes per chunk step.

Two tiny VLAs with random weights, both reading a 32x32 image, the instruction
and the 2 state numbers and giving C = 4 actions of A = 2 per call, beside an
MLP policy of the default size:

- ``tiny pi0`` (``model_type: pi0``): transformers' stock
  ``PI0ForConditionalGeneration`` at a tiny size (``make_tiny_pi0``: 2-layer
  SigLIP, Gemma and Gemma action expert; 4 denoising steps, ``flow_sampler:
  sde``, ``flow_start: zero``), 225,136 parameters (222,632 in the network,
  2,504 in the RL heads: value and noise std);
- ``tiny OpenVLA-OFT`` (``model_type: openvla``, ``decode_mode: parallel``):
  ``make_tiny_openvla`` (DINOv2 + SigLIP towers, a 2-layer Llama of width 64,
  the C x A action tokens of a call in one pass), 300,400 parameters with its
  value head;
- the MLP policy: 267,792 parameters.

Counts: ``sum(p.numel() for p in policy.parameters())`` of the built policies
(the test prints them); every policy has an ``action_level`` value head.

They act on the same batch of 64 lang_reach observations, one thread each, in
interleaved blocks (``interleave``):

- ``predict``: ``predict_action_batch(obs, "train")`` (what a rollout rank
  does per chunk step), samples/s;
- ``train``: ``default_forward`` with logprobs, entropy and values, then
  backward (what an actor micro-batch does), samples/s;
- ``bytes``: the size of the serialised ``PolicyOutput`` the rollout sends
  (``rlinf.core.channel.serialization.dumps``: header plus out-of-band
  buffers), per env.

Rows are informational (no target): they show what a VLA costs next to the
MLP, so later changes to the models or the rollout show their effect.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from rlinf.core.channel.serialization import dumps
from rlinf.embodied.envs import EnvConfig, make_env
from rlinf.embodied.models import BasePolicy, PolicyConfig, build_policy

pytest.importorskip("transformers", reason="VLAs need rlinf-embodied[vla]")

BATCH = 64


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


VLAS = {"pi0": "tiny pi0", "openvla_oft": "tiny OpenVLA-OFT"}
"""Parametrisation id -> the VLA's name in the rows."""


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, BasePolicy]:
    from rlinf.embodied.envs.lang_reach import INSTRUCTIONS
    from rlinf.embodied.models.vla.openvla.tiny import make_tiny_openvla
    from rlinf.embodied.models.vla.pi0.tiny import make_tiny_pi0

    root = tmp_path_factory.mktemp("vlas")
    spec = make_env(EnvConfig(env_type="lang_reach", env_id="fixed", obs_mode="rgb")).spec
    pi0_path = make_tiny_pi0(
        root / "pi0", instructions=INSTRUCTIONS, action_dim=2, chunk_size=4, state_dim=2
    )
    oft_path = make_tiny_openvla(
        root / "openvla_oft",
        decode_mode="parallel",
        action_dim=2,
        num_action_chunks=4,
        instructions=INSTRUCTIONS,
        state_dim=2,
        add_value_head=True,
        value_type="action_level",
    )
    configs = {
        "MLP policy": PolicyConfig(model_type="mlp", num_action_chunks=4),
        VLAS["pi0"]: PolicyConfig(
            model_type="pi0",
            model_path=pi0_path,
            num_action_chunks=4,
            flow_sampler="sde",
            flow_start="zero",
            add_value_head=True,
            value_type="action_level",
        ),
        VLAS["openvla_oft"]: PolicyConfig(
            model_type="openvla",
            model_path=oft_path,
            num_action_chunks=4,
            temperature=1.0,
            top_k=0,
            add_value_head=True,
            value_type="action_level",
        ),
    }
    out = {name: build_policy(cfg, spec) for name, cfg in configs.items()}
    for name, policy in out.items():
        print(f"{name}: {sum(p.numel() for p in policy.parameters()):,} parameters")
    return out


@pytest.fixture(scope="module")
def observations() -> dict[str, torch.Tensor]:
    env = make_env(
        EnvConfig(env_type="lang_reach", env_id="random", num_envs=BATCH, obs_mode="rgb")
    )
    return env.reset(seed=0).obs


def _train_step(policy: BasePolicy, inputs: dict[str, torch.Tensor]) -> Callable[[], object]:
    def step() -> None:
        out = policy(inputs, compute_logprobs=True, compute_entropy=True, compute_values=True)
        loss = out["logprobs"].mean() + out["entropy"].mean() + out["values"].mean()
        loss.backward()  # type: ignore[no-untyped-call]
        policy.zero_grad(set_to_none=True)

    return step


@pytest.mark.parametrize("kind", list(VLAS))
def test_vla_cost_beside_the_mlp(  # type: ignore[no-untyped-def]
    kind: str,
    policies: dict[str, BasePolicy],
    observations: dict[str, torch.Tensor],
    interleave,
    record_ratio,
) -> None:
    vla_name, mlp_name = VLAS[kind], "MLP policy"
    vla, mlp = policies[vla_name], policies[mlp_name]
    vla_inputs = vla.predict_action_batch(observations, "train").forward_inputs
    mlp_inputs = mlp.predict_action_batch(observations, "train").forward_inputs
    phases = {  # label -> (candidates, rounds per block, row title)
        "predict": (
            {
                vla_name: lambda: vla.predict_action_batch(observations, "train"),
                mlp_name: lambda: mlp.predict_action_batch(observations, "train"),
            },
            5,
            f"predict samples/s vs MLP policy (B={BATCH}, C=4)",
        ),
        "train": (
            {vla_name: _train_step(vla, vla_inputs), mlp_name: _train_step(mlp, mlp_inputs)},
            3,
            f"train (fwd+bwd) samples/s vs MLP policy (B={BATCH})",
        ),
    }
    for label, (candidates, rounds, title) in phases.items():
        stats = interleave(candidates, blocks=4, rounds=rounds, warmup_rounds=1, label=f":{label}")
        record_ratio(
            f"{vla_name} {title}",
            BATCH / stats[vla_name].median,
            BATCH / stats[mlp_name].median,
            unit="samples/s",
            baseline_name=mlp_name,
            target=None,
            floor=None,
        )

    def message_bytes(policy: BasePolicy) -> float:
        header, buffers = dumps(policy.predict_action_batch(observations, "train").to_cpu())
        return (len(header) + sum(memoryview(b).nbytes for b in buffers)) / BATCH

    record_ratio(
        f"{vla_name} rollout message bytes per env and chunk step vs MLP policy",
        message_bytes(vla),
        message_bytes(mlp),
        unit="B",
        baseline_name=mlp_name,
        target=None,
        floor=None,
        higher_is_better=False,
    )
