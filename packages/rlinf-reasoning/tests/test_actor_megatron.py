"""The Megatron actor on CPU (gloo, no Ray): one GRPO step = FSDP's, weight sync, resume.

The same rollout groups (generated once by the HF engine from the toy task's
warm-start checkpoint) train:

* the FSDP actor in this process (world size 1), the reference;
* a spawned 2-process job: ``MegatronActor`` with TP=2 (DP=1), then TP=1
  (DP=2); each takes one step, saves a checkpoint and takes a second step; a
  fresh TP=2 actor resumes from its checkpoint and repeats the second step;
* a spawned 1-process job: TP=1 (DP=1) resumes the DP=2 checkpoint (a
  different data-parallel size) and repeats the second step.

Every algorithm option of the FSDP actor that has backend-specific code is on:
recomputed logprobs, KL to a reference model, the entropy bonus (a
vocab-parallel entropy under TP), the truncated IS fix, early stop (not
triggered) and the valid-token scale (which all-reduces over DP).
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch

from rlinf.core.config import ConfigError, validate_config
from rlinf.core.protocols.reasoning import RolloutResult
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.engines import HFEngine, SamplingParams
from rlinf.reasoning.toy_task import ToyTaskConfig, build_tokenizer, make_toy_task
from rlinf.sched.worker.group import _free_port  # outside the ephemeral range

# pytest (--import-mode=importlib) imports this file under a name a spawned child
# cannot import; publish it under its file name (see test_megatron_model.py).
_MODULE = Path(__file__).stem
if str(Path(__file__).parent) not in sys.path:
    sys.path.append(str(Path(__file__).parent))
sys.modules.setdefault(_MODULE, sys.modules[__name__])

CTX = mp.get_context("spawn")
JOB_TIMEOUT_S = 420.0
PROMPTS = ["12+7=", "3-28=", "1+1=", "29-29=", "7+15="]
WEIGHT_TOL = 1e-4
"""Weights after an AdamW step (lr 1e-3) of two backends whose gradients agree to ~1e-7."""
METRICS = ("actor/final_loss", "actor/policy_loss", "actor/grad_norm", "actor/kl_loss")


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("toy")
    cfg = ToyTaskConfig(num_train=400, num_test=50, max_operand=29, sft_steps=60, batch_size=64)
    make_toy_task(out, cfg)
    torch.set_num_threads(before)
    return out


def _raw_cfg(toy: Path, backend: str, tp: int = 1, pp: int = 1) -> dict[str, Any]:
    return {
        "cluster": {"component_placement": {"actor": 0, "rollout": 0, "reward": 0}},
        "runner": {"val_before_train": False, "logger": {"logger_backends": []}},
        "data": {
            "train_files": [str(toy / "train.jsonl")],
            "prompt_key": "problem",
            "answer_key": "answer",
            "max_prompt_length": 16,
        },
        "algorithm": {
            "group_size": 4,
            "rollout_batch_size": 4,
            "n_minibatches": 1,
            "sampling_params": {"max_new_tokens": 8},
            "kl_beta": 0.1,
            "kl_penalty": "k3",
            "entropy_bonus": 0.01,
            "importance_sampling_fix": True,
            "early_stop_imp_ratio": 5.0,
            "use_valid_token_scale": True,
        },
        "actor": {
            "training_backend": backend,
            "model": {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp},
            "model_path": str(toy / "warmstart"),
            "micro_batch_size": 8,
            "sync_bucket_mb": 0.05,
            "optim": {"lr": 1e-3},
        },
    }


def _cfg(toy: Path, backend: str, tp: int = 1, pp: int = 1) -> ReasoningConfig:
    return validate_config(_raw_cfg(toy, backend, tp, pp), ReasoningConfig)


def _groups(toy: Path) -> list[RolloutResult]:
    tok = build_tokenizer()
    engine = HFEngine(toy / "warmstart", dtype="float32", device="cpu")
    prompts = [tok.encode(p) for p in PROMPTS[:4]]
    outs = engine.generate(prompts, 4, SamplingParams(temperature=1.0, max_new_tokens=8, seed=0))
    groups = []
    for i, prompt in enumerate(prompts):
        g = sorted((o for o in outs if o.prompt_index == i), key=lambda o: o.sample_index)
        groups.append(
            RolloutResult(
                prompt_ids=prompt,
                answers=["0"],
                response_ids=[o.output_ids for o in g],
                rollout_logprobs=[o.logprobs for o in g],
                is_end=[o.is_end for o in g],
                version=0,
                index=i,
                rewards=[float(k % 2) for k in range(4)],
            )
        )
    return groups


class _ListChannel:
    """The channel method the actor uses, over a list."""

    def __init__(self, items: list[RolloutResult]) -> None:
        self.items = list(items)

    def get(self, timeout: float | None = None) -> RolloutResult:
        return self.items.pop(0)


# ------------------------------------------------------------ spawned children


def _child(fn: Any) -> Any:
    fn.__module__ = _MODULE
    return fn


def _run_job(target: Any, nprocs: int, *args: Any) -> None:
    # Not daemonic: Megatron's checkpoint writer forks writer processes.
    procs = [
        CTX.Process(target=target, args=(r, nprocs, *args), daemon=False) for r in range(nprocs)
    ]
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU (gloo) path, on GPU machines too
    try:
        for p in procs:
            p.start()
    finally:
        if hidden is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = hidden
    # A rank that fails leaves its peers waiting in a collective: stop them at once.
    deadline = time.monotonic() + JOB_TIMEOUT_S
    running = list(procs)
    while running and time.monotonic() < deadline:
        mp_connection.wait([p.sentinel for p in running], deadline - time.monotonic())
        running = [p for p in running if p.exitcode is None]
        if any(p.exitcode not in (None, 0) for p in procs):
            break
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    assert [p.exitcode for p in procs] == [0] * nprocs


def _make_actor(rank: int, world: int, cfg: ReasoningConfig, total_steps: int = 4) -> Any:
    """A MegatronActor of a ``world``-rank group in this process (the scheduler's env, no Ray)."""
    import rlinf.sched.worker.worker as worker_module
    from rlinf.reasoning.workers import MegatronActor

    setattr(worker_module, "install_resolver", lambda *a, **k: None)  # no Ray  # noqa: B010
    os.environ.update(
        GROUP_NAME="MegatronActor",
        RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port() if world == 1 else os.environ["TEST_PORT"]),
    )
    actor = MegatronActor(cfg)
    actor.init_worker(total_steps)
    return actor


def _step(actor: Any, groups: list[RolloutResult], step: int) -> dict[str, Any]:
    out = actor.run_training(_ListChannel(copy.deepcopy(groups)), step)
    return {"train": out["train"], "indices": out["indices"], "weights": actor.full_weights()}


@_child
def _job(rank: int, world: int, ports: list[int], data: str) -> None:
    try:
        _job_body(rank, world, ports, data)
    except BaseException:
        traceback.print_exc()
        raise


def _job_body(rank: int, world: int, ports: list[int], data: str) -> None:
    torch.set_num_threads(1)
    inputs = torch.load(Path(data) / "inputs.pt", weights_only=False)
    groups, cfgs = inputs["groups"], inputs["cfgs"]
    results: dict[str, Any] = {}
    if world == 2:
        # TP=2: step 0, the weight sync's buckets, save, step 1.
        os.environ["TEST_PORT"] = str(ports[0])
        actor = _make_actor(rank, world, cfgs["tp2"])
        results["tp2/step0"] = _step(actor, groups, 0)
        sent: list[Any] = []
        info = actor._send_weights(3, 32 << 10, sent.append if rank == 0 else None)
        results["tp2/sync"] = {"buckets": sent, "info": info}
        for _ in range(2):  # saving a step again replaces it
            actor.save_checkpoint(str(Path(data) / "ckpt_tp2" / "global_step_1"), 1)
        results["tp2/step1"] = _step(actor, groups, 1)
        actor.teardown()
        # A fresh TP=2 actor resumes and repeats step 1.
        os.environ["TEST_PORT"] = str(ports[1])
        actor = _make_actor(rank, world, cfgs["tp2"])
        results["tp2/resumed_step"] = actor.load_checkpoint(
            str(Path(data) / "ckpt_tp2" / "global_step_1")
        )
        results["tp2/resumed_step1"] = _step(actor, groups, 1)
        actor.teardown()
        # TP=1, DP=2: step 0, save, step 1.
        os.environ["TEST_PORT"] = str(ports[2])
        actor = _make_actor(rank, world, cfgs["tp1"])
        share = groups[2 * rank : 2 * rank + 2]  # the channel gives each replica its half
        results["dp2/step0"] = _step(actor, share, 0)
        actor.save_checkpoint(str(Path(data) / "ckpt_dp2" / "global_step_1"), 1)
        results["dp2/step1"] = _step(actor, share, 1)
        actor.teardown()
        # TP=1, DP=2 resumes the TP=2 checkpoint (dist_checkpointing reshards).
        os.environ["TEST_PORT"] = str(ports[4])
        actor = _make_actor(rank, world, cfgs["tp1"])
        actor.load_checkpoint(str(Path(data) / "ckpt_tp2" / "global_step_1"))
        results["tp2to1/step1"] = _step(actor, share, 1)
        actor.teardown()
        # PP=2 (TP=1, DP=1): step 0 and the weight sync's buckets.
        os.environ["TEST_PORT"] = str(ports[3])
        actor = _make_actor(rank, world, cfgs["pp2"])
        results["pp2/step0"] = _step(actor, groups, 0)
        sent = []
        info = actor._send_weights(4, 32 << 10, sent.append if rank == 0 else None)
        results["pp2/sync"] = {"buckets": sent, "info": info}
        actor.teardown()
    else:
        # DP=1 resumes the DP=2 checkpoint.
        actor = _make_actor(rank, world, cfgs["tp1"])
        actor.load_checkpoint(str(Path(data) / "ckpt_dp2" / "global_step_1"))
        results["dp1/resumed_step1"] = _step(actor, groups, 1)
        actor.teardown()
    torch.save(results, Path(data) / f"out_w{world}_r{rank}.pt")


# ------------------------------------------------------------------ results


@pytest.fixture(scope="module")
def runs(toy: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The FSDP reference (this process) and the Megatron jobs' outputs."""
    import rlinf.sched.worker.worker as worker_module
    from rlinf.reasoning.workers import FSDPActor

    data = tmp_path_factory.mktemp("megatron_actor")
    groups = _groups(toy)
    cfgs = {
        "tp2": _cfg(toy, "megatron", 2),
        "tp1": _cfg(toy, "megatron", 1),
        "pp2": _cfg(toy, "megatron", 1, 2),
    }
    torch.save({"groups": groups, "cfgs": cfgs}, data / "inputs.pt")
    # FSDP, world size 1 (the scheduler's env, no Ray), as test_actor_fsdp.py.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(worker_module, "install_resolver", lambda *a, **k: None)
        env = {"GROUP_NAME": "InProcessActor", "RANK": "0", "WORLD_SIZE": "1"}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        for key, value in env.items():
            patch.setenv(key, value)
        fsdp = FSDPActor(_cfg(toy, "fsdp"))
        fsdp.init_worker(4)
        ref = {"step0": _step(fsdp, groups, 0), "step1": _step(fsdp, groups, 1)}
        fsdp.teardown()
    _run_job(_job, 2, [_free_port() for _ in range(5)], str(data))
    _run_job(_job, 1, [], str(data))
    out: dict[str, Any] = {"fsdp": ref, "groups": groups, "data": data}
    for world, ranks in ((2, (0, 1)), (1, (0,))):
        for r in ranks:
            out[f"w{world}_r{r}"] = torch.load(data / f"out_w{world}_r{r}.pt", weights_only=False)
    return out


def _max_diff(a: list[tuple[str, torch.Tensor]], b: list[tuple[str, torch.Tensor]]) -> float:
    da, db = dict(a), dict(b)
    assert da.keys() == db.keys()
    return max(float((da[k] - db[k]).abs().max()) for k in da)


def _mean_train(parts: list[dict[str, Any]], key: str) -> float:
    return sum(float(p["train"][key]) for p in parts) / len(parts)


# -------------------------------------------------------------------- tests


def test_tp2_step_equals_fsdp(runs: dict[str, Any]) -> None:
    ref = runs["fsdp"]["step0"]
    for rank in (0, 1):
        got = runs[f"w2_r{rank}"]["tp2/step0"]
        for key in METRICS:
            diff = abs(float(got["train"][key]) - float(ref["train"][key]))
            print(f"\nTP=2 rank {rank} {key}: |megatron - fsdp| = {diff:.2e}")
            assert diff < 1e-5, (key, got["train"][key], ref["train"][key])
        assert "actor/entropy_loss" in got["train"]
        # Weights after the step: AdamW's first update is lr * g / (|g| + eps) per element,
        # so a gradient element near eps turns float rounding (~1e-7) into up to lr = 1e-3;
        # measured 1.6e-5. Bound: lr / 10.
        diff = _max_diff(got["weights"], ref["weights"])
        print(f"TP=2 rank {rank}: max |weights megatron - fsdp| after the step = {diff:.2e}")
        assert diff < WEIGHT_TOL
    # The TP peer trains on the same groups; only the first rank reports them.
    assert sorted(runs["w2_r0"]["tp2/step0"]["indices"]) == [0, 1, 2, 3]
    assert runs["w2_r1"]["tp2/step0"]["indices"] == []


def test_dp2_step_equals_fsdp(runs: dict[str, Any]) -> None:
    ref = runs["fsdp"]["step0"]
    parts = [runs[f"w2_r{r}"]["dp2/step0"] for r in (0, 1)]
    for key in METRICS:  # per-rank means of equal-size micro-batches: their mean is FSDP's
        diff = abs(_mean_train(parts, key) - float(ref["train"][key]))
        print(f"\nTP=1 DP=2 {key}: |megatron - fsdp| = {diff:.2e}")
        assert diff < 1e-5, key
    assert sorted(parts[0]["indices"] + parts[1]["indices"]) == [0, 1, 2, 3]
    for part in parts:
        diff = _max_diff(part["weights"], ref["weights"])
        print(f"TP=1 DP=2: max |weights megatron - fsdp| after the step = {diff:.2e}")
        assert diff < WEIGHT_TOL


def test_pp2_step_equals_fsdp_and_syncs_every_stage(runs: dict[str, Any], toy: Path) -> None:
    ref = runs["fsdp"]["step0"]
    for rank in (0, 1):  # both stages report the last stage's metrics
        got = runs[f"w2_r{rank}"]["pp2/step0"]
        for key in METRICS:
            diff = abs(float(got["train"][key]) - float(ref["train"][key]))
            print(f"\nPP=2 stage {rank} {key}: |megatron - fsdp| = {diff:.2e}")
            assert diff < 1e-5, key
        diff = _max_diff(got["weights"], ref["weights"])
        print(f"PP=2 stage {rank}: max |weights megatron - fsdp| after the step = {diff:.2e}")
        assert diff < WEIGHT_TOL
    assert sorted(runs["w2_r0"]["pp2/step0"]["indices"]) == [0, 1, 2, 3]
    assert runs["w2_r1"]["pp2/step0"]["indices"] == []
    buckets = runs["w2_r0"]["pp2/sync"]["buckets"]
    assert [b.index for b in buckets] == list(range(buckets[0].count))
    sent = dict((n, t) for b in buckets for n, t in b.tensors)
    actor = dict(runs["w2_r0"]["pp2/step0"]["weights"])
    assert sent.keys() == actor.keys()  # both stages' layers reach rank 0
    assert all(torch.equal(sent[n], actor[n]) for n in actor)
    engine = HFEngine(toy / "warmstart", dtype="float32", device="cpu")
    for b in buckets:
        engine.load_weights(b.tensors, version=b.version)
    assert engine.weights_max_abs_diff(list(actor.items())) == 0.0


def test_weight_sync_buckets_equal_the_actor_and_load_into_the_engine(
    runs: dict[str, Any], toy: Path
) -> None:
    sync = runs["w2_r0"]["tp2/sync"]
    buckets = sync["buckets"]
    count, _, tensors = sync["info"]
    assert len(buckets) == count > 2 and all(b.count == count for b in buckets)
    assert [b.index for b in buckets] == list(range(count))
    assert all(b.version == 3 for b in buckets)
    assert runs["w2_r1"]["tp2/sync"]["buckets"] == []  # only actor rank 0 sends
    sent = [(n, t) for b in buckets for n, t in b.tensors]
    assert len(sent) == tensors
    actor = dict(runs["w2_r0"]["tp2/step0"]["weights"])
    assert {n for n, _ in sent} == actor.keys()
    for name, tensor in sent:
        assert torch.equal(tensor, actor[name]), name
    engine = HFEngine(toy / "warmstart", dtype="float32", device="cpu")
    before = engine.weights_max_abs_diff(list(actor.items()))
    for b in buckets:
        engine.load_weights(b.tensors, version=b.version)
    assert before > 0.0  # the step moved the weights, so the check has teeth
    assert engine.weights_max_abs_diff(list(actor.items())) == 0.0
    assert {n for n, _ in engine.model.named_parameters()} == actor.keys()


def test_resume_gives_the_uninterrupted_next_step(runs: dict[str, Any]) -> None:
    for rank in (0, 1):
        res = runs[f"w2_r{rank}"]
        assert res["tp2/resumed_step"] == 1
        want, got = res["tp2/step1"], res["tp2/resumed_step1"]
        for key in METRICS:
            assert got["train"][key] == want["train"][key], key
        assert _max_diff(got["weights"], want["weights"]) == 0.0
    # The uninterrupted TP=2 run's second step is FSDP's too.
    ref = runs["fsdp"]["step1"]
    tp2 = runs["w2_r0"]["tp2/step1"]
    for key in METRICS:
        assert abs(float(tp2["train"][key]) - float(ref["train"][key])) < 1e-5, key


def test_resume_at_another_tensor_parallel_size(runs: dict[str, Any]) -> None:
    want = runs["w2_r0"]["tp2/step1"]
    parts = [runs[f"w2_r{r}"]["tp2to1/step1"] for r in (0, 1)]
    for key in METRICS:
        diff = abs(_mean_train(parts, key) - float(want["train"][key]))
        print(f"\nTP=2 -> TP=1 (DP=2) resume, {key}: difference {diff:.2e}")
        assert diff < 1e-5, key
    diff = _max_diff(parts[0]["weights"], want["weights"])
    print(f"TP=2 -> TP=1 resume: max |weights| difference after the step = {diff:.2e}")
    assert diff < WEIGHT_TOL


def test_resume_at_another_data_parallel_size(runs: dict[str, Any]) -> None:
    parts = [runs[f"w2_r{r}"]["dp2/step1"] for r in (0, 1)]
    dp1 = runs["w1_r0"]["dp1/resumed_step1"]
    for key in METRICS:
        diff = abs(_mean_train(parts, key) - float(dp1["train"][key]))
        print(f"\nDP=2 -> DP=1 resume, {key}: difference {diff:.2e}")
        assert diff < 1e-5, key
    diff = _max_diff(parts[0]["weights"], dp1["weights"])
    print(f"DP=2 -> DP=1 resume: max |weights| difference after the step = {diff:.2e}")
    assert diff < WEIGHT_TOL


# ------------------------------------------------------------- config checks


def test_config_errors_name_the_key(toy: Path) -> None:
    raw = _raw_cfg(toy, "megatron")
    raw["actor"]["gradient_checkpointing"] = True
    with pytest.raises(ConfigError, match=r"actor\.gradient_checkpointing=true"):
        validate_config(raw, ReasoningConfig)
    raw = _raw_cfg(toy, "megatron")
    raw["actor"]["training_backend"] = "deepspeed"
    with pytest.raises(ConfigError, match="training_backend"):
        validate_config(raw, ReasoningConfig)
    cfg = _cfg(toy, "megatron", tp=2)
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size \(2\).*3 actor ranks"):
        cfg.check_world_sizes(actor=3, rollout=1, reward=1)
    with pytest.raises(ValueError, match=r"actor data-parallel ranks \(3\)"):
        _cfg(toy, "megatron", tp=1).check_world_sizes(actor=3, rollout=1, reward=1)
    cfg.check_world_sizes(actor=2, rollout=1, reward=1)  # one replica of TP=2
    with pytest.raises(ValueError, match=r"pipeline_model_parallel_size \(2\) = 4"):
        _cfg(toy, "megatron", tp=2, pp=2).check_world_sizes(actor=6, rollout=1, reward=1)
    _cfg(toy, "fsdp", tp=2).check_world_sizes(actor=1, rollout=1, reward=1)  # FSDP ignores it


def test_missing_megatron_names_the_extra(toy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("megatron") else real(name, *a),
    )
    with pytest.raises(ConfigError, match=r'pip install "rlinf-reasoning\[megatron\]"'):
        validate_config(_raw_cfg(toy, "megatron"), ReasoningConfig)


# ------------------------------------------------------------------ CUDA (one GPU)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tp1_step_sync_and_resume_equal_fsdp(
    toy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One GPU, NCCL world of one: the Megatron actor's CUDA path (no CPU shims)."""
    import rlinf.sched.worker.worker as worker_module
    from rlinf.reasoning.workers import FSDPActor, MegatronActor

    monkeypatch.setattr(worker_module, "install_resolver", lambda *a, **k: None)
    if not os.environ.get("CUDA_VISIBLE_DEVICES"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    groups = _groups(toy)
    out: dict[str, Any] = {}
    for backend, cls in (("fsdp", FSDPActor), ("megatron", MegatronActor)):
        monkeypatch.setenv("GROUP_NAME", f"Cuda{backend}")
        monkeypatch.setenv("MASTER_PORT", str(_free_port()))
        actor = cls(_cfg(toy, backend))
        actor.init_worker(4)
        try:
            assert actor.device.type == "cuda"
            if backend == "megatron":  # Megatron's DDP and distributed optimizer, not torch AdamW
                assert actor._gpu is not None
            out[backend] = _step(actor, groups, 0)
            if backend == "megatron":
                sent: list[Any] = []
                actor._send_weights(1, 32 << 10, sent.append)
                weights = dict(out[backend]["weights"])
                for bucket in sent:
                    for name, tensor in bucket.tensors:
                        assert tensor.device.type == "cpu"
                        assert torch.equal(tensor, weights[name]), name
                actor.save_checkpoint(str(tmp_path / "global_step_1"), 1)
                after = _step(actor, groups, 1)
                assert actor.load_checkpoint(str(tmp_path / "global_step_1")) == 1
                again = _step(actor, groups, 1)
                for key in METRICS:
                    assert again["train"][key] == after["train"][key], key
                # the restored AdamW state (moments, step) gives the same update
                assert _max_diff(again["weights"], after["weights"]) < 1e-6
        finally:
            actor.teardown()
    for key in METRICS:
        diff = abs(float(out["megatron"]["train"][key]) - float(out["fsdp"]["train"][key]))
        print(f"\nCUDA TP=1 {key}: |megatron - fsdp| = {diff:.2e}")
        assert diff < 1e-5, key
    diff = _max_diff(out["megatron"]["weights"], out["fsdp"]["weights"])
    print(f"CUDA TP=1: max |weights megatron - fsdp| after the step = {diff:.2e}")
    assert diff < WEIGHT_TOL


def test_distributed_optimizer_on_cpu_names_the_key(
    toy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """use_distributed_optimizer: true without CUDA fails at start-up, before any set-up."""
    import rlinf.sched.worker.worker as worker_module
    from rlinf.reasoning.workers import MegatronActor

    if torch.cuda.is_available():
        pytest.skip("checks the CPU refusal")
    monkeypatch.setattr(worker_module, "install_resolver", lambda *a, **k: None)
    for key, value in {
        "GROUP_NAME": "CpuDistOpt",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
    }.items():
        monkeypatch.setenv(key, value)
    raw = _raw_cfg(toy, "megatron")
    raw["actor"]["model"] = {"use_distributed_optimizer": True}
    actor = MegatronActor(validate_config(raw, ReasoningConfig))
    try:
        with pytest.raises(ValueError, match=r"actor\.model\.use_distributed_optimizer=true"):
            actor.init_worker(4)
    finally:
        actor.teardown()


def test_placement_checks_the_actor_parallel_sizes(toy: Path) -> None:
    """launch_reasoning_groups gives the placement TP * PP and names the keys (no Ray)."""
    from types import SimpleNamespace

    from rlinf.reasoning.runner import launch_reasoning_groups
    from rlinf.sched.cluster_info import ClusterInfo

    raw = _raw_cfg(toy, "megatron", tp=2)
    raw["cluster"] = {
        "cpu_slots_per_node": 4,
        "component_placement": {"actor": "0-2", "rollout": "3", "reward": "3"},
    }
    cfg = validate_config(raw, ReasoningConfig)
    cluster: Any = SimpleNamespace(info=ClusterInfo.fake(1, cpu_slots_per_node=4))
    with pytest.raises(ValueError, match=r"actor\.model\.tensor_model_parallel_size \(2\)"):
        launch_reasoning_groups(cfg, cluster)
