"""The Megatron model bridge on CPU (gloo): HF checkpoint -> TP/PP shards -> logits, grads, export.

Two spawned 2-process jobs do the distributed work once per module (megatron's
import alone takes seconds on 2 slow cores) and save their numbers; the tests
compare them with Hugging Face's in this process:

* TP job: TP=2 then TP=1 (data parallel 2) on a tied toy Qwen2 and an untied
  one with 4 query heads per key/value head: logits, logprobs, loss, grads and
  the bucketed export.
* PP job: PP=2 then PP=1 on the tied model: Megatron's schedule, DDP wrapper,
  finalize_model_grads and one AdamW step.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from rlinf.reasoning.megatron.hf_config import (
    HFArchitecture,
    UnsupportedConfigError,
    read_hf_architecture,
)
from rlinf.reasoning.megatron.hf_layout import Layout, rule_for, shard, unshard
from rlinf.reasoning.models import position_ids_from_attention_mask, token_logprobs_from_logits
from rlinf.reasoning.toy_task import build_tokenizer, build_toy_model, toy_model_config
from rlinf.sched.worker.group import _free_port  # outside the ephemeral range

# pytest (--import-mode=importlib) imports this file under a name a spawned child
# cannot import; publish it under its file name (see test_channel_multiprocess.py).
_MODULE = Path(__file__).stem
if str(Path(__file__).parent) not in sys.path:
    sys.path.append(str(Path(__file__).parent))
sys.modules.setdefault(_MODULE, sys.modules[__name__])

CTX = mp.get_context("spawn")
JOB_TIMEOUT_S = 240.0
MODELS = ("tied", "untied_gqa")


# ----------------------------------------------------------------- checkpoints


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights of order-one logits (HF's 0.02 init makes every logit ~0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.3 * noise)
            else:
                p.copy_(noise / math.sqrt(p.shape[-1]) * (3.0 if "embed" in name else 1.0))


def _save(path: Path, tie: bool, seed: int) -> Path:
    tok = build_tokenizer()
    if tie:
        cfg = toy_model_config(tok)  # 4 query heads, 2 key/value heads, tied
    else:
        cfg = toy_model_config(tok, num_heads=8, num_kv_heads=2, intermediate_size=128)
        cfg.tie_word_embeddings = False
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": 1e6}
    model = build_toy_model(cfg, seed=seed)
    _randomize(model, seed)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("megatron_ckpt")
    return {
        "tied": _save(root / "tied", tie=True, seed=1),
        "untied_gqa": _save(root / "untied_gqa", tie=False, seed=2),
    }


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """``[4, 10]`` ids and mask: no padding, left padding, left and right padding."""
    mask = torch.zeros(4, 10, dtype=torch.long)
    mask[0, :] = 1
    mask[1, 3:] = 1
    mask[2, 2:7] = 1
    mask[3, 4:] = 1
    ids = torch.randint(3, 31, (4, 10), generator=torch.Generator().manual_seed(7))
    return ids * mask, mask


def _loss_mask(mask: torch.Tensor) -> torch.Tensor:
    """Positions whose token and next token are both real."""
    return (mask[:, :-1] * mask[:, 1:]).float()


# ------------------------------------------------------------ spawned children


def _child(fn: Any) -> Any:
    fn.__module__ = _MODULE
    return fn


def _run_job(target: Any, *args: Any) -> None:
    port = _free_port()
    procs = [CTX.Process(target=target, args=(r, port, *args), daemon=True) for r in range(2)]
    # The jobs test the CPU (gloo) path, shims included, on GPU machines too: the
    # children see no GPU (they inherit the environment when they start).
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        for p in procs:
            p.start()
    finally:
        if hidden is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = hidden
    for p in procs:
        p.join(JOB_TIMEOUT_S)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    assert [p.exitcode for p in procs] == [0, 0]


def _init_dist(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)


@_child
def _tp_job(rank: int, port: int, dirs: dict[str, str], out: str) -> None:
    try:
        _tp_job_body(rank, port, dirs, out)
    except BaseException:
        traceback.print_exc()
        raise


def _tp_job_body(rank: int, port: int, dirs: dict[str, str], out: str) -> None:
    _init_dist(rank, port)
    from megatron.core import parallel_state as ps
    from megatron.core.fusions import fused_softmax

    from rlinf.reasoning.megatron import cpu_shims
    from rlinf.reasoning.megatron.forward import (
        gather_vocab_logits,
        gpt_logits,
        vocab_parallel_token_logprobs,
    )
    from rlinf.reasoning.megatron.hf_export import iter_hf_buckets
    from rlinf.reasoning.megatron.model import build_gpt_model, init_model_parallel

    first = cpu_shims.apply_cpu_shims()
    patched = (torch.cuda.current_device, fused_softmax.get_default_causal_mask)
    second = cpu_shims.apply_cpu_shims()
    results: dict[str, Any] = {
        "shims": {
            "applied": [first, second, cpu_shims.cpu_shims_active()],
            "same_patches": patched
            == (torch.cuda.current_device, fused_softmax.get_default_causal_mask),
            "device": str(torch.cuda.current_device()),
        }
    }
    ids, mask = _batch()
    for tp in (2, 1):
        init_model_parallel(tp, 1, seed=0)
        for key, path in dirs.items():
            built = build_gpt_model(path)
            model, vocab = built.model, built.arch.vocab_size
            res: dict[str, Any] = {"padded_vocab": built.padded_vocab}
            if tp == 2:
                buckets = list(
                    iter_hf_buckets(
                        model,
                        built.arch,
                        bucket_bytes=16 << 10,
                        tp_size=tp,
                        tp_group=ps.get_tensor_model_parallel_group(),
                    )
                )
                res["bucket_names"] = [[n for n, _ in b] for b in buckets]
                res["bucket_bytes"] = [
                    sum(t.numel() * t.element_size() for _, t in b) for b in buckets
                ]
                res["export"] = {n: t.clone() for b in buckets for n, t in b}
            logits = gpt_logits(model, ids, mask)
            lp = vocab_parallel_token_logprobs(logits[:, :-1], ids[:, 1:], vocab)
            m = _loss_mask(mask)
            loss = -(lp * m).sum() / m.sum()
            loss.backward()  # type: ignore[no-untyped-call]
            res["logits"] = gather_vocab_logits(logits, vocab).detach()
            res["logprobs"] = lp.detach()
            res["loss"] = loss.item()
            res["grads"] = {
                n: t.clone()
                for b in iter_hf_buckets(
                    model,
                    built.arch,
                    bucket_bytes=1 << 20,
                    tp_size=tp,
                    tp_group=ps.get_tensor_model_parallel_group(),
                    grads=True,
                )
                for n, t in b
            }
            results[f"tp{tp}/{key}"] = res
        ps.destroy_model_parallel()
    if rank == 0:
        torch.save(results, Path(out) / "tp.pt")
    torch.distributed.destroy_process_group()


def _forward_step(vocab: int) -> Any:
    """Megatron's forward_step_func: packed forward, then the masked mean token NLL."""
    from rlinf.reasoning.megatron.forward import (
        pack_left,
        unpack_left,
        vocab_parallel_token_logprobs,
    )

    def forward_step(it: Any, model: Any) -> Any:
        ids, mask = next(it)
        packed = pack_left(ids, mask)
        output = model(packed, torch.arange(ids.shape[1]).expand_as(ids), attention_mask=None)

        def loss_func(logits: torch.Tensor) -> Any:
            lp = vocab_parallel_token_logprobs(unpack_left(logits, mask)[:, :-1], ids[:, 1:], vocab)
            m = _loss_mask(mask)
            loss = -(lp * m).sum() / m.sum()
            return loss, {"loss": loss.detach()}

        return output, loss_func

    return forward_step


@_child
def _pp_job(rank: int, port: int, path: str, out: str) -> None:
    try:
        _pp_job_body(rank, port, path, out)
    except BaseException:
        traceback.print_exc()
        raise


def _pp_job_body(rank: int, port: int, path: str, out: str) -> None:
    _init_dist(rank, port)
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from rlinf.reasoning.megatron.hf_export import export_hf_state_dict
    from rlinf.reasoning.megatron.model import build_gpt_model, init_model_parallel

    ids, mask = _batch()
    micro = [(ids[:2], mask[:2]), (ids[2:], mask[2:])]  # PP needs equal micro-batches
    results: dict[str, Any] = {}
    for pp in (2, 1):
        init_model_parallel(1, pp, seed=0)
        built = build_gpt_model(path)
        config, vocab = built.config, built.arch.vocab_size
        config.finalize_model_grads_func = finalize_model_grads
        model = DistributedDataParallel(config, DistributedDataParallelConfig(), built.model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        losses = get_forward_backward_func()(
            forward_step_func=_forward_step(vocab),
            data_iterator=iter(micro),
            model=model,
            num_microbatches=len(micro),
            seq_length=ids.shape[1],
            micro_batch_size=2,
            forward_only=False,
        )
        grads = {
            k: v.clone() for k, v in export_hf_state_dict(model, built.arch, grads=True).items()
        }
        for p in model.parameters():
            p.grad = p.main_grad
        opt.step()
        params = {k: v.clone() for k, v in export_hf_state_dict(model, built.arch).items()}
        results[f"pp{pp}"] = {
            "losses": [float(d["loss"]) for d in losses],
            "grads": grads,
            "params": params,
            "stage": ps.get_pipeline_model_parallel_rank(),
        }
        ps.destroy_model_parallel()
    torch.save(results, Path(out) / f"pp_rank{rank}.pt")
    torch.distributed.destroy_process_group()


# ------------------------------------------------------------------ results


@pytest.fixture(scope="module")
def tp_results(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("tp_out")
    _run_job(_tp_job, {k: str(v) for k, v in checkpoints.items()}, str(out))
    return torch.load(out / "tp.pt", weights_only=False)


@pytest.fixture(scope="module")
def pp_results(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("pp_out")
    _run_job(_pp_job, str(checkpoints["tied"]), str(out))
    return [torch.load(out / f"pp_rank{r}.pt", weights_only=False) for r in range(2)]


def _hf(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


def _hf_loss_and_grads(path: Path) -> tuple[torch.Tensor, torch.Tensor, float, dict[str, Any]]:
    """HF logits, logprobs, loss and grads on :func:`_batch`, the convention of logprobs.py."""
    model = _hf(path)
    ids, mask = _batch()
    logits = model(
        input_ids=ids, attention_mask=mask, position_ids=position_ids_from_attention_mask(mask)
    ).logits
    lp = token_logprobs_from_logits(logits[:, :-1], ids[:, 1:])
    m = _loss_mask(mask)
    loss = -(lp * m).sum() / m.sum()
    loss.backward()  # type: ignore[no-untyped-call]
    grads = {n: p.grad for n, p in model.named_parameters()}
    return logits.detach(), lp.detach(), loss.item(), grads


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max())


# -------------------------------------------------------------------- tests


def test_cpu_shims_idempotent_and_active_without_cuda(tp_results: Any) -> None:
    shims = tp_results["shims"]
    assert shims["applied"] == [True, True, True]
    assert shims["same_patches"]  # a second apply wraps nothing again
    assert shims["device"] == "cpu"


def test_cpu_shims_do_nothing_when_cuda_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlinf.reasoning.megatron import cpu_shims

    current, sync = torch.cuda.current_device, torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cpu_shims.apply_cpu_shims() is False
    assert not cpu_shims.cpu_shims_active()
    assert (torch.cuda.current_device, torch.cuda.synchronize) == (current, sync)


@pytest.mark.parametrize("key", MODELS)
def test_tp2_logits_equal_hf(tp_results: Any, checkpoints: dict[str, Path], key: str) -> None:
    hf_logits, hf_lp, _, _ = _hf_loss_and_grads(checkpoints[key])
    _, mask = _batch()
    res = tp_results[f"tp2/{key}"]
    assert res["padded_vocab"] == 32  # 31 rounded up to split over 2 ranks
    real = mask.bool()
    assert _max_diff(res["logits"][real], hf_logits[real]) < 1e-5
    m = _loss_mask(mask).bool()
    assert _max_diff(res["logprobs"][m], hf_lp[m]) < 1e-5


@pytest.mark.parametrize("key", MODELS)
def test_tp2_loss_and_grads_equal_tp1_and_hf(
    tp_results: Any, checkpoints: dict[str, Path], key: str
) -> None:
    _, _, hf_loss, hf_grads = _hf_loss_and_grads(checkpoints[key])
    tp2, tp1 = tp_results[f"tp2/{key}"], tp_results[f"tp1/{key}"]
    assert abs(tp2["loss"] - tp1["loss"]) < 1e-5
    assert abs(tp1["loss"] - hf_loss) < 1e-5
    assert tp2["grads"].keys() == tp1["grads"].keys()
    assert tp1["grads"].keys() == {n for n, g in hf_grads.items() if g is not None}
    for name, grad in tp2["grads"].items():
        assert _max_diff(grad, tp1["grads"][name]) < 1e-5, name
        assert _max_diff(grad, hf_grads[name]) < 1e-5, name


@pytest.mark.parametrize("key", MODELS)
def test_tp2_export_is_the_checkpoint(
    tp_results: Any, checkpoints: dict[str, Path], key: str
) -> None:
    res = tp_results[f"tp2/{key}"]
    saved = load_file(checkpoints[key] / "model.safetensors")
    assert res["export"].keys() == saved.keys()
    for name, tensor in saved.items():
        assert torch.equal(res["export"][name], tensor), name
    # Buckets: each within the bound unless one Megatron parameter (q/k/v or gate/up
    # fused) alone exceeds it.
    assert len(res["bucket_names"]) > 2
    for names, nbytes in zip(res["bucket_names"], res["bucket_bytes"], strict=True):
        fused = {re.sub(r"\b(q|k|v|gate|up)_proj", "fused", n) for n in names}
        assert nbytes <= 16 << 10 or len(fused) == 1, names


def test_pp2_step_equals_pp1(pp_results: Any) -> None:
    stage = {r["pp2"]["stage"]: r for r in pp_results}
    assert set(stage) == {0, 1}
    pp1 = pp_results[0]["pp1"]
    # The loss is reported by the last stage only.
    assert stage[0]["pp2"]["losses"] == []
    assert len(pp1["losses"]) == 2
    for a, b in zip(stage[1]["pp2"]["losses"], pp1["losses"], strict=True):
        assert abs(a - b) < 1e-5
    # The two stages hold disjoint layers with global HF names that add up to the model.
    g0, g1 = stage[0]["pp2"]["grads"], stage[1]["pp2"]["grads"]
    assert not g0.keys() & g1.keys()
    assert "model.layers.1.mlp.down_proj.weight" in g1
    assert g0.keys() | g1.keys() == pp1["grads"].keys()
    for name, grad in {**g0, **g1}.items():
        assert _max_diff(grad, pp1["grads"][name]) < 1e-5, name
    params = {**stage[0]["pp2"]["params"], **stage[1]["pp2"]["params"]}
    for name, value in params.items():
        assert _max_diff(value, pp1["params"][name]) < 1e-5, name


# ------------------------------------------------------ config and layout (no processes)


def _arch(**kw: Any) -> HFArchitecture:
    base = dict(
        vocab_size=31,
        hidden_size=64,
        num_layers=2,
        num_heads=8,
        num_kv_heads=2,
        head_dim=8,
        ffn_hidden_size=128,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        attention_dropout=0.0,
    )
    base.update(kw)
    return HFArchitecture(**base)  # type: ignore[arg-type]


def test_reads_both_rope_layouts(checkpoints: dict[str, Path]) -> None:
    arch = read_hf_architecture(checkpoints["untied_gqa"])
    assert (arch.num_heads, arch.num_kv_heads, arch.head_dim) == (8, 2, 8)
    assert arch.rope_theta == 1e6 and not arch.tie_word_embeddings
    old = json.loads((checkpoints["tied"] / "config.json").read_text())
    old.pop("rope_parameters")
    old.update(rope_theta=5e5, rope_scaling=None)
    assert read_hf_architecture(old).rope_theta == 5e5
    assert read_hf_architecture(checkpoints["tied"]).tie_word_embeddings


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "llama"}, "model_type='llama'"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling="),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_type='yarn'"),
        ({"use_sliding_window": True}, "use_sliding_window=True"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types[1]='sliding"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ],
)
def test_unsupported_config_names_key_and_value(
    checkpoints: dict[str, Path], change: dict[str, Any], message: str
) -> None:
    cfg = json.loads((checkpoints["tied"] / "config.json").read_text())
    cfg.update(change)
    with pytest.raises(UnsupportedConfigError, match=message.replace("[", r"\[")):
        read_hf_architecture(cfg)


def test_shard_unshard_round_trip() -> None:
    arch = _arch()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n * 8, 64, generator=gen) for n in (8, 2, 2))
    emb = torch.randn(31, 64, generator=gen)
    gate, up, down = torch.randn(128, 64), torch.randn(128, 64), torch.randn(64, 128)
    cases: list[tuple[Layout, list[torch.Tensor]]] = [
        ("qkv", [q, k, v]),
        ("qkv", [q[:, 0], k[:, 0], v[:, 0]]),  # the biases
        ("vocab", [emb]),
        ("gate_up", [gate, up]),
        ("row", [down]),
    ]
    for layout, full in cases:
        pieces = [shard(layout, full, arch, r, 2, padded_vocab=32) for r in range(2)]
        for got, want in zip(unshard(layout, pieces, arch), full, strict=True):
            assert torch.equal(got, want), layout
    # Rank 0's fused qkv holds group 0: its 4 query heads, then its key, then its value head.
    piece = shard("qkv", [q, k, v], arch, 0, 2, padded_vocab=32)
    assert torch.equal(piece[:48], torch.cat([q[:32], k[:8], v[:8]]))
    assert rule_for("decoder.layers.0.mlp.linear_fc2.weight", 3, tied=False).hf_names == (
        "model.layers.3.mlp.down_proj.weight",
    )


def test_transformer_engine_names_map_like_the_local_norms() -> None:
    """TE's spec fuses each norm into the next linear layer; both namings map to one HF name.

    (The TE spec itself needs CUDA and transformer-engine: unchecked, neither is here.)
    """
    from rlinf.reasoning.megatron.hf_config import transformer_engine_usable
    from rlinf.reasoning.megatron.hf_layout import rule_for

    pairs = {
        "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
        "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
    }
    for te_name, local_name in pairs.items():
        te = rule_for(f"decoder.layers.1.{te_name}", layer_offset=2, tied=False)
        local = rule_for(f"decoder.layers.1.{local_name}", layer_offset=2, tied=False)
        assert te == local
        assert te.layout == "full" and te.hf_names[0].startswith("model.layers.3.")
    if not torch.cuda.is_available():
        assert not transformer_engine_usable()
