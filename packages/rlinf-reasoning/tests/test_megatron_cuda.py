"""The Megatron bridge on a CUDA GPU: Megatron's own paths (no CPU shims), one process.

Skipped without a GPU (CI has none). On a GPU machine:
``uv run pytest packages/rlinf-reasoning/tests/test_megatron_cuda.py``. A world
of one rank (NCCL): it checks that the CPU shims stay off, that the model
built from a Hugging Face checkpoint on the GPU gives Hugging Face's logits,
and that one training step through Megatron's schedule, its DDP wrapper and
its *distributed optimizer* (with Megatron's gradient clipping, both
unavailable on the CPU), as the Megatron actor drives them on GPUs
(:mod:`rlinf.reasoning.megatron.dist_optimizer`), reports Hugging Face's
gradient norm and leaves the parameters of a plain torch AdamW step with the
same clipping; that a non-finite gradient skips the update; that the
optimizer's sharded checkpoint resumes to the uninterrupted next step; and
that bf16 parameters train through fp32 master weights.
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
    from rlinf.reasoning.megatron.model import init_model_parallel

    init_model_parallel(1, 1, seed=0)
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
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from transformers import AutoModelForCausalLM

    from rlinf.reasoning.megatron import cpu_shims
    from rlinf.reasoning.megatron.dist_optimizer import clip_and_step, wrap_for_gpu_training
    from rlinf.reasoning.megatron.forward import (
        gather_vocab_logits,
        gpt_logits,
        pack_left,
        unpack_left,
        vocab_parallel_token_logprobs,
    )
    from rlinf.reasoning.megatron.hf_export import export_hf_state_dict
    from rlinf.reasoning.megatron.model import build_gpt_model
    from rlinf.reasoning.models import position_ids_from_attention_mask, token_logprobs_from_logits

    path = _checkpoint(tmp_path / "ckpt")
    device = torch.device("cuda", 0)
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

    training = wrap_for_gpu_training(
        built.model, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, clip_grad=CLIP
    )
    model, optimizer = training.model, training.optimizer
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
    grad_norm, stepped = clip_and_step(training, CLIP)
    assert stepped
    assert abs(grad_norm - hf_norm) < 1e-4 * max(1.0, hf_norm)

    after = export_hf_state_dict(model, built.arch)
    hf_after = {n: p.detach() for n, p in hf.named_parameters()}
    worst = max((after[n].to(device) - hf_after[n]).abs().max().item() for n in after)
    assert set(after) <= set(hf_after)
    assert worst < 1e-5


def _plain_step(training: Any, ids: torch.Tensor, mask: torch.Tensor, vocab: int) -> float:
    """Forward and backward outside the schedule (the actor's PP=1 path), then the step."""
    from rlinf.reasoning.megatron.dist_optimizer import clip_and_step
    from rlinf.reasoning.megatron.forward import gpt_logits, vocab_parallel_token_logprobs

    logits = gpt_logits(training.model, ids, mask)
    lp = vocab_parallel_token_logprobs(logits[:, :-1], ids[:, 1:], vocab)
    m = _loss_mask(mask)
    (-(lp * m).sum() / m.sum()).backward()  # type: ignore[no-untyped-call]
    norm, stepped = clip_and_step(training, CLIP)
    assert stepped
    return norm


def _wrapped(path: Path, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    from rlinf.reasoning.megatron.dist_optimizer import wrap_for_gpu_training
    from rlinf.reasoning.megatron.model import build_gpt_model

    built = build_gpt_model(path, params_dtype=dtype)
    training = wrap_for_gpu_training(
        built.model, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, clip_grad=CLIP
    )
    return built, training


def _params(built: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().float().clone() for n, p in built.model.named_parameters()}


def test_a_non_finite_gradient_skips_the_update(nccl_world: None, tmp_path: Path) -> None:
    from rlinf.reasoning.megatron.dist_optimizer import clip_and_step
    from rlinf.reasoning.megatron.forward import gpt_logits, vocab_parallel_token_logprobs

    built, training = _wrapped(_checkpoint(tmp_path / "ckpt"))
    ids, mask = _batch(torch.device("cuda", 0))
    before = _params(built)
    logits = gpt_logits(training.model, ids, mask)
    lp = vocab_parallel_token_logprobs(logits[:, :-1], ids[:, 1:], built.arch.vocab_size)
    (lp.sum() * float("nan")).backward()  # type: ignore[no-untyped-call]
    norm, stepped = clip_and_step(training, CLIP)
    assert not stepped and not math.isfinite(norm)
    after = _params(built)
    assert all(torch.equal(before[n], after[n]) for n in before)
    for buffer in training.model.buffers:  # zeroed for the next step
        assert not buffer.grad_data.any()
    assert math.isfinite(_plain_step(training, ids, mask, built.arch.vocab_size))
    assert any(not torch.equal(before[n], p) for n, p in _params(built).items())


def test_sharded_optimizer_checkpoint_resumes_the_next_step(
    nccl_world: None, tmp_path: Path
) -> None:
    from megatron.core import dist_checkpointing

    from rlinf.reasoning.megatron.dist_optimizer import (
        load_optimizer_state,
        sharded_optimizer_state,
    )

    path = _checkpoint(tmp_path / "ckpt")
    ids, mask = _batch(torch.device("cuda", 0))
    built, training = _wrapped(path)
    vocab = built.arch.vocab_size
    _plain_step(training, ids, mask, vocab)
    save_dir = tmp_path / "dist"
    save_dir.mkdir()
    state = {
        "model": built.model.sharded_state_dict(),
        "optimizer": sharded_optimizer_state(
            training, built.model.sharded_state_dict(), is_loading=False
        ),
    }
    dist_checkpointing.save(state, str(save_dir))
    norm = _plain_step(training, ids, mask, vocab)  # the uninterrupted second step
    expected = _params(built)

    fresh, resumed = _wrapped(path)
    template = {
        "model": fresh.model.sharded_state_dict(),
        "optimizer": sharded_optimizer_state(
            resumed, fresh.model.sharded_state_dict(), is_loading=True
        ),
    }
    loaded = dist_checkpointing.load(template, str(save_dir))
    fresh.model.load_state_dict(loaded["model"])
    load_optimizer_state(resumed, loaded["optimizer"])
    again = _plain_step(resumed, ids, mask, vocab)
    assert abs(again - norm) < 1e-6 * max(1.0, norm)
    got = _params(fresh)
    worst = max((got[n] - expected[n]).abs().max().item() for n in expected)
    print(f"\nresumed vs uninterrupted second step: max |dw| = {worst:.2e}")
    assert worst < 1e-6


def test_bf16_parameters_train_through_fp32_master_weights(
    nccl_world: None, tmp_path: Path
) -> None:
    built, training = _wrapped(_checkpoint(tmp_path / "ckpt"), torch.bfloat16)
    dtypes = {n: p.dtype for n, p in built.model.named_parameters()}
    print(f"\nparameters not in bf16: {[n for n, d in dtypes.items() if d != torch.bfloat16]}")
    assert torch.bfloat16 in dtypes.values()
    masters = [p for g in training.torch_optimizer.param_groups for p in g["params"]]
    assert masters and all(p.dtype == torch.float32 for p in masters)
    before = _params(built)
    ids, mask = _batch(torch.device("cuda", 0))
    assert math.isfinite(_plain_step(training, ids, mask, built.arch.vocab_size))
    changed = sum(not torch.equal(before[n], p) for n, p in _params(built).items())
    assert changed == len(before)
