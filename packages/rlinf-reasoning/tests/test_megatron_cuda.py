"""The Megatron bridge on a CUDA GPU: Megatron's own paths (no CPU shims), one process.

Skipped without a GPU (CI has none). On a GPU machine:
``uv run pytest packages/rlinf-reasoning/tests/test_megatron_cuda.py``. A world
of one rank (NCCL): it checks that the CPU shims stay off, that the model
built from a Hugging Face checkpoint on the GPU gives Hugging Face's logits,
and that one training step through Megatron's schedule, its DDP wrapper and
its *distributed optimizer* (with Megatron's gradient clipping, both
unavailable on the CPU) reports Hugging Face's gradient norm and leaves the
parameters of a plain torch AdamW step with the same clipping.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

LR = 1e-3
CLIP = 0.5


@pytest.fixture(scope="module")
def nccl_world() -> Iterator[None]:
    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    dist.destroy_process_group()


def _checkpoint(path: Path) -> Path:
    from rlinf.reasoning.toy_task import build_tokenizer, build_toy_model, toy_model_config

    model = build_toy_model(toy_model_config(build_tokenizer()), seed=3)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # order-one logits (HF's 0.02 init makes every logit ~0)
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.3 * noise)
            else:
                p.copy_(noise / math.sqrt(p.shape[-1]))
    model.save_pretrained(path)
    return path


def _batch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 30, (4, 12), generator=gen)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    mask[2, 9:] = 0  # right padding
    mask[3, :2] = 0
    mask[3, 10:] = 0
    return (ids * mask).to(device), mask.to(device)


def _loss_mask(mask: torch.Tensor) -> torch.Tensor:
    return (mask[:, :-1] * mask[:, 1:]).float()


def test_megatron_on_cuda_matches_hf_with_the_distributed_optimizer(
    nccl_world: None, tmp_path: Path
) -> None:
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from transformers import AutoModelForCausalLM

    from rlinf.reasoning.megatron import cpu_shims
    from rlinf.reasoning.megatron.forward import (
        gather_vocab_logits,
        gpt_logits,
        pack_left,
        unpack_left,
        vocab_parallel_token_logprobs,
    )
    from rlinf.reasoning.megatron.hf_export import export_hf_state_dict
    from rlinf.reasoning.megatron.model import build_gpt_model, init_model_parallel
    from rlinf.reasoning.models import position_ids_from_attention_mask, token_logprobs_from_logits

    path = _checkpoint(tmp_path / "ckpt")
    device = torch.device("cuda", 0)
    init_model_parallel(1, 1, seed=0)
    assert not cpu_shims.apply_cpu_shims() and not cpu_shims.cpu_shims_active()
    built = build_gpt_model(path)
    vocab = built.arch.vocab_size
    assert next(built.model.parameters()).device == device

    ids, mask = _batch(device)
    real = mask.bool()
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(device)
    hf_logits = hf(
        input_ids=ids, attention_mask=mask, position_ids=position_ids_from_attention_mask(mask)
    ).logits
    with torch.no_grad():
        logits = gather_vocab_logits(gpt_logits(built.model, ids, mask), vocab)
    assert (logits[real] - hf_logits[real]).abs().max().item() < 1e-4

    m = _loss_mask(mask)
    hf_lp = token_logprobs_from_logits(hf_logits[:, :-1], ids[:, 1:])
    hf_loss = -(hf_lp * m).sum() / m.sum()
    hf_loss.backward()  # type: ignore[no-untyped-call]
    hf_norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in hf.parameters()))
    assert hf_norm > CLIP  # so clipping acts
    ref_opt = torch.optim.AdamW(
        hf.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0
    )
    torch.nn.utils.clip_grad_norm_(hf.parameters(), CLIP)
    ref_opt.step()

    config = built.config
    config.finalize_model_grads_func = finalize_model_grads
    ddp_cfg = DistributedDataParallelConfig(
        use_distributed_optimizer=True, grad_reduce_in_fp32=True
    )
    model = DistributedDataParallel(config, ddp_cfg, built.model)
    opt_cfg = OptimizerConfig(
        optimizer="adam",
        lr=LR,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_eps=1e-8,
        clip_grad=CLIP,
        use_distributed_optimizer=True,
    )
    optimizer = get_megatron_optimizer(opt_cfg, [model])
    assert "Distributed" in type(optimizer).__name__ or any(
        "Distributed" in type(o).__name__ for o in getattr(optimizer, "chained_optimizers", [])
    )

    def forward_step(it: Any, module: Any) -> Any:
        batch_ids, batch_mask = next(it)
        packed = pack_left(batch_ids, batch_mask)
        positions = torch.arange(batch_ids.shape[1], device=device).expand_as(packed)
        output = module(packed, positions, attention_mask=None)

        def loss_func(out: torch.Tensor) -> Any:
            lp = vocab_parallel_token_logprobs(
                unpack_left(out, batch_mask)[:, :-1], batch_ids[:, 1:], vocab
            )
            loss = -(lp * m).sum() / m.sum()
            return loss, {"loss": loss.detach()}

        return output, loss_func

    optimizer.zero_grad()
    losses = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter([(ids, mask)]),
        model=[model],
        num_microbatches=1,
        seq_length=ids.shape[1],
        micro_batch_size=ids.shape[0],
        forward_only=False,
    )
    assert abs(float(losses[0]["loss"]) - hf_loss.item()) < 1e-5
    ok, grad_norm, _ = optimizer.step()
    assert ok
    assert abs(float(grad_norm) - hf_norm) < 1e-4 * max(1.0, hf_norm)

    after = export_hf_state_dict(model, built.arch)
    hf_after = {n: p.detach() for n, p in hf.named_parameters()}
    worst = max((after[n].to(device) - hf_after[n]).abs().max().item() for n in after)
    assert set(after) <= set(hf_after)
    assert worst < 1e-5
