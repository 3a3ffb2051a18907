"""GRPO step time of the Megatron actor (TP=2) against the FSDP actor (DP=2), same run.

Issue 17 asks for the ratio, with no floor: an info row. Both actors train on
the same rollout groups (generated once by the HF engine from the toy task's
warm-start checkpoint), in 2 spawned CPU processes each (gloo, no Ray), with
the toy GRPO recipe's loss options (recomputed logprobs, PPO clip,
token-mean). Each job takes one warm-up step, then ``STEPS`` timed steps of
``run_training``; the jobs alternate (FSDP, Megatron, FSDP, Megatron) and each
side's median step time is reported. Higher is better for the row: FSDP's step
time over Megatron's (above 1: Megatron is faster).

On 2 CPU cores TP=2 splits every matrix product of a 64-wide model in two and
adds two all-reduces per layer, while DP=2 splits the batch: TP is not
expected to win here. The row is there to see what the tensor-parallel path
costs, not to pick a backend on CPU.
"""

from __future__ import annotations

import copy
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("megatron.core", reason="needs the rlinf-reasoning[megatron] extra")

import torch

from rlinf.core.config import validate_config
from rlinf.core.protocols.reasoning import RolloutResult
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.engines import HFEngine, SamplingParams
from rlinf.reasoning.toy_task import ToyTaskConfig, build_tokenizer, make_toy_task

_MODULE = Path(__file__).stem
if str(Path(__file__).parent) not in sys.path:
    sys.path.append(str(Path(__file__).parent))
sys.modules.setdefault(_MODULE, sys.modules[__name__])

CTX = mp.get_context("spawn")
STEPS = 3
ROUNDS = 2
PROMPTS = 8
GROUP = 8
JOB_TIMEOUT_S = 600.0


def _raw_cfg(toy: Path, backend: str) -> dict[str, Any]:
    return {
        "cluster": {"component_placement": {"actor": "0-1", "rollout": "0-1", "reward": "0-1"}},
        "runner": {"val_before_train": False, "logger": {"logger_backends": []}},
        "data": {
            "train_files": [str(toy / "train.jsonl")],
            "prompt_key": "problem",
            "answer_key": "answer",
            "max_prompt_length": 16,
        },
        "algorithm": {
            "group_size": GROUP,
            "rollout_batch_size": PROMPTS,
            "n_minibatches": 2,
            "sampling_params": {"max_new_tokens": 8},
        },
        "actor": {
            "training_backend": backend,
            "model": {"tensor_model_parallel_size": 2 if backend == "megatron" else 1},
            "model_path": str(toy / "warmstart"),
            "micro_batch_size": 16,
            "optim": {"lr": 2e-4},
        },
    }


def _groups(toy: Path) -> list[RolloutResult]:
    tok = build_tokenizer()
    engine = HFEngine(toy / "warmstart", dtype="float32", device="cpu")
    rows = (toy / "train.jsonl").read_text().splitlines()[:PROMPTS]
    prompts = [tok.encode(json.loads(row)["problem"]) for row in rows]
    outs = engine.generate(prompts, GROUP, SamplingParams(max_new_tokens=8, seed=0))
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
                rewards=[float(k % 2) for k in range(GROUP)],
            )
        )
    return groups


class _ListChannel:
    """The channel method the actor uses, over a list."""

    def __init__(self, items: list[RolloutResult]) -> None:
        self.items = list(items)

    def get(self, timeout: float | None = None) -> RolloutResult:
        return self.items.pop(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _job(rank: int, port: int, backend: str, data: str) -> None:
    try:
        _job_body(rank, port, backend, data)
    except BaseException:
        traceback.print_exc()
        raise


_job.__module__ = _MODULE


def _job_body(rank: int, port: int, backend: str, data: str) -> None:
    import rlinf.sched.worker.worker as worker_module
    from rlinf.reasoning.workers import FSDPActor, MegatronActor

    torch.set_num_threads(1)
    setattr(worker_module, "install_resolver", lambda *a, **k: None)  # no Ray  # noqa: B010
    os.environ.update(
        GROUP_NAME=f"Bench{backend}",
        RANK=str(rank),
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    inputs = torch.load(Path(data) / "inputs.pt", weights_only=False)
    groups: list[RolloutResult] = inputs["groups"]
    if backend == "fsdp":  # each data-parallel rank gets its half of the step's groups
        groups = groups[rank * PROMPTS // 2 : (rank + 1) * PROMPTS // 2]
    cls = MegatronActor if backend == "megatron" else FSDPActor
    actor = cls(inputs["cfgs"][backend])
    actor.init_worker(STEPS + 1)
    seconds = []
    for step in range(STEPS + 1):
        start = time.perf_counter()
        actor.run_training(_ListChannel(copy.deepcopy(groups)), step)  # type: ignore[arg-type]
        if step:  # the first step warms up
            seconds.append(time.perf_counter() - start)
    actor.teardown()
    if rank == 0:
        (Path(data) / f"{backend}.txt").write_text(str(statistics.median(seconds)))


def _run(backend: str, data: Path) -> float:
    port = _free_port()
    procs = [CTX.Process(target=_job, args=(r, port, backend, str(data))) for r in range(2)]
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, on GPU machines too
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
    assert [p.exitcode for p in procs] == [0, 0], backend
    return float((data / f"{backend}.txt").read_text())


def test_megatron_tp2_vs_fsdp_dp2_step_time(
    tmp_path: Path, record_ratio: Callable[..., object]
) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    toy = tmp_path / "toy"
    make_toy_task(
        toy, ToyTaskConfig(num_train=200, num_test=20, max_operand=29, sft_steps=20, batch_size=64)
    )
    groups = _groups(toy)
    torch.set_num_threads(before)
    cfgs = {b: validate_config(_raw_cfg(toy, b), ReasoningConfig) for b in ("fsdp", "megatron")}
    torch.save({"groups": groups, "cfgs": cfgs}, tmp_path / "inputs.pt")
    times: dict[str, list[float]] = {"fsdp": [], "megatron": []}
    for _ in range(ROUNDS):
        for backend in ("fsdp", "megatron"):
            times[backend].append(_run(backend, tmp_path))
    megatron, fsdp = statistics.median(times["megatron"]), statistics.median(times["fsdp"])
    print(f"\nstep seconds: megatron TP=2 {times['megatron']}, fsdp DP=2 {times['fsdp']}")
    record_ratio(
        f"Megatron TP=2 vs FSDP DP=2, GRPO step on the toy model ({PROMPTS}x{GROUP} responses)",
        1.0 / megatron,
        1.0 / fsdp,
        unit="steps/s",
        baseline_name="FSDP DP=2",
        target=None,
        floor=None,
    )
