"""Tiny VLAs beside the MLP policy: predict and train samples/s, and bytes per chunk step.

The two tiny VLA families (``make_tiny_vla``: ~0.2 M parameters, 32x32 images,
C = 4 actions of A = 2 per call) and an MLP policy of the default size act on
the same batch of 64 lang_reach observations, one thread each, in interleaved
blocks (``interleave``):

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


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, BasePolicy]:
    from rlinf.embodied.models.vla.tiny import make_tiny_vla

    root = tmp_path_factory.mktemp("vlas")
    spec = make_env(EnvConfig(env_type="lang_reach", env_id="fixed", obs_mode="rgb")).spec
    out: dict[str, BasePolicy] = {
        "MLP policy": build_policy(PolicyConfig(model_type="mlp", num_action_chunks=4), spec)
    }
    for kind in ("token", "flow"):
        path = make_tiny_vla(kind, root / kind, state_dim=2, value_type="action_level")  # type: ignore[arg-type]
        cfg = PolicyConfig(model_type=f"{kind}_vla", model_path=path, num_action_chunks=4)
        out[f"tiny {kind} VLA"] = build_policy(cfg, spec)
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


@pytest.mark.parametrize("kind", ["token", "flow"])
def test_vla_cost_beside_the_mlp(  # type: ignore[no-untyped-def]
    kind: str,
    policies: dict[str, BasePolicy],
    observations: dict[str, torch.Tensor],
    interleave,
    record_ratio,
) -> None:
    vla_name, mlp_name = f"tiny {kind} VLA", "MLP policy"
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
