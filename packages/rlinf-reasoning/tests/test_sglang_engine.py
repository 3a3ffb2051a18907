"""The SGLang engine adapter's own logic, with a stand-in for ``sglang.Engine``.

SGLang cannot run without a CUDA GPU (it imports ``sgl_kernel``, which needs
libcuda), and this machine has none. So these tests wrap ``RecordingEngine``,
a **stand-in** for ``sglang.Engine`` that records every call and answers the
way SGLang 0.5.23 does: ``generate`` returns one dict per request shaped as
``TokenizerManager._handle_batch_output`` builds them with
``skip_tokenizer_init`` (``{"output_ids", "meta_info"}``, ``meta_info`` with
``finish_reason`` from ``FINISH_MATCHED_TOKEN.to_json`` / ``FINISH_LENGTH.to_json``
and ``output_token_logprobs`` as ``(logprob, token_id, None)`` tuples from
``detokenize_logprob_tokens``), the weight-update calls return
``(success, message)`` and ``flush_cache`` an object with ``success``. It does
not sample: what SGLang generates is unchecked here. That the adapter's calls
exist in SGLang with these keywords is checked against the installed package
in ``tests/engines/sglang``.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from rlinf.core.config import ConfigError, validate_config
from rlinf.reasoning.config import ReasoningConfig, SGLangOptions
from rlinf.reasoning.engines import RolloutEngine, SamplingParams, get_engine_class
from rlinf.reasoning.engines.sglang_engine import (
    MEMORY_TAGS,
    SGLangEngine,
    engine_kwargs,
    request_sampling_params,
    sample_seed,
)

STOP = 2
WEIGHTS = {
    "model.embed_tokens.weight": (8, 4),
    "model.layers.0.self_attn.q_proj.weight": (4, 4),
    "model.layers.0.self_attn.k_proj.weight": (2, 4),
    "model.layers.0.self_attn.v_proj.weight": (2, 4),
    "model.layers.0.mlp.gate_proj.weight": (6, 4),
    "model.layers.0.mlp.up_proj.weight": (6, 4),
    "model.layers.0.mlp.down_proj.weight": (4, 6),
}


@dataclass
class FlushCacheReqOutput:
    """What ``Engine.flush_cache`` returns (``sglang.srt.managers.io_struct``)."""

    success: bool
    message: str = ""


class RecordingEngine:
    """Stand-in for ``sglang.Engine`` (no GPU here): records calls, answers like SGLang.

    ``generate`` makes request ``r`` emit tokens ``10 + r, 11 + r, ...`` and
    ``STOP`` at position ``stop_at[r]`` when given, so stop and length cases are
    chosen by the test; each token's logprob has more digits than float32 keeps.
    """

    def __init__(self, stop_at: dict[int, int] | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.stop_at = stop_at or {}
        self.fail: dict[str, str] = {}
        self.abort: set[int] = set()

    def _answer(self, name: str) -> tuple[bool, str]:
        if name in self.fail:
            return False, self.fail[name]
        return True, "Success"

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def generate(self, **kwargs: Any) -> list[dict[str, Any]]:
        self.calls.append(("generate", kwargs))
        out = []
        for r, (prompt, sp) in enumerate(
            zip(kwargs["input_ids"], kwargs["sampling_params"], strict=True)
        ):
            ids: list[int] = []
            reason: dict[str, Any] = {"type": "length", "length": sp["max_new_tokens"]}
            for k in range(sp["max_new_tokens"]):
                token = STOP if self.stop_at.get(r) == k else 10 + r + k
                ids.append(token)
                if token in sp["stop_token_ids"]:
                    reason = {"type": "stop", "matched": token}
                    break
            if r in self.abort:
                reason = {"type": "abort", "message": "out of memory", "status_code": 500}
            logprobs = [(-0.1234567890123 * (k + 1), t, None) for k, t in enumerate(ids)]
            out.append(
                {
                    "output_ids": ids,
                    "meta_info": {
                        "id": f"rid{r}",
                        "finish_reason": reason,
                        "prompt_tokens": len(prompt),
                        "weight_version": "default",
                        "num_retractions": 0,
                        "input_token_logprobs": [],
                        "output_token_logprobs": logprobs,
                        "output_token_logprobs_length": len(logprobs),
                        "reasoning_tokens": 0,
                        "completion_tokens": len(ids),
                        "cached_tokens": 0,
                    },
                }
            )
        return out

    def begin_weight_update(self) -> tuple[bool, str]:
        self.calls.append(("begin_weight_update", {}))
        return self._answer("begin_weight_update")

    def update_weights_from_tensor(self, **kwargs: Any) -> tuple[bool, str]:
        self.calls.append(("update_weights_from_tensor", kwargs))
        return self._answer("update_weights_from_tensor")

    def end_weight_update(self) -> tuple[bool, str]:
        self.calls.append(("end_weight_update", {}))
        return self._answer("end_weight_update")

    def flush_cache(self) -> FlushCacheReqOutput:
        self.calls.append(("flush_cache", {}))
        return FlushCacheReqOutput(success="flush_cache" not in self.fail)

    def release_memory_occupation(self, **kwargs: Any) -> None:
        self.calls.append(("release_memory_occupation", kwargs))

    def resume_memory_occupation(self, **kwargs: Any) -> None:
        self.calls.append(("resume_memory_occupation", kwargs))


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    save_file({n: torch.zeros(s) for n, s in WEIGHTS.items()}, str(tmp_path / "model.safetensors"))
    return tmp_path


def _engine(model_dir: Path, fake: RecordingEngine, **kwargs: Any) -> SGLangEngine:
    return SGLangEngine.from_engine(fake, model_dir, "bfloat16", **kwargs)


def _state(scale: float = 1.0) -> list[tuple[str, torch.Tensor]]:
    return [(n, torch.full(s, scale, dtype=torch.float32)) for n, s in WEIGHTS.items()]


# ---------------------------------------------------------------- generation


def test_outputs_are_prompt_major_with_stop_tokens_and_float32_logprobs(model_dir: Path) -> None:
    fake = RecordingEngine(stop_at={1: 2, 4: 0})
    engine = _engine(model_dir, fake)
    assert isinstance(engine, RolloutEngine)
    params = SamplingParams(max_new_tokens=4, stop_token_ids=(STOP,))
    outs = engine.generate([[1, 2], [3]], 3, params)

    ((name, call),) = fake.calls
    assert name == "generate" and call["return_logprob"] is True
    assert call["input_ids"] == [[1, 2]] * 3 + [[3]] * 3  # one request per sample
    assert [(o.prompt_index, o.sample_index) for o in outs] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
        (1, 2),
    ]
    assert outs[1].output_ids == [11, 12, STOP] and outs[1].finish_reason == "stop"
    assert outs[1].is_end
    assert outs[4].output_ids == [STOP] and outs[4].is_end
    assert outs[0].output_ids == [10, 11, 12, 13] and outs[0].finish_reason == "length"
    assert not outs[0].is_end
    for out in outs:
        assert len(out.logprobs) == out.num_tokens
        raw = [-0.1234567890123 * (k + 1) for k in range(out.num_tokens)]
        assert out.logprobs == torch.tensor(raw, dtype=torch.float32).tolist()
        assert out.logprobs != raw  # rounded to float32, not SGLang's float64 values


def test_sampling_parameters_map_to_sglang(model_dir: Path) -> None:
    fake = RecordingEngine()
    engine = _engine(model_dir, fake)
    params = SamplingParams(
        temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=3, stop_token_ids=(STOP, 7)
    )
    engine.generate([[1]], 2, params)
    sampling = fake.calls[0][1]["sampling_params"]
    assert (
        sampling
        == [
            {
                "temperature": 0.7,
                "top_p": 0.9,
                "top_k": 5,
                "max_new_tokens": 3,
                "stop_token_ids": [2, 7],
            }
        ]
        * 2
    )  # no seed: no sampling_seed key
    for disabled in (-1, 0):  # SGLang rejects 0; -1 is its "whole vocabulary"
        (one,) = request_sampling_params(SamplingParams(top_k=disabled), 1, 1)
        assert one["top_k"] == -1


def test_seeds_differ_per_sample_and_repeat_per_call(model_dir: Path) -> None:
    seeded = request_sampling_params(SamplingParams(seed=123), 2, 3)
    seeds = [sp["sampling_seed"] for sp in seeded]
    assert len(set(seeds)) == 6  # SGLang hashes seed and position: equal seeds, equal samples
    assert seeds == [sample_seed(123, r) for r in range(6)]
    assert all(0 <= s < 2**63 for s in seeds)
    assert seeds == [
        sp["sampling_seed"] for sp in request_sampling_params(SamplingParams(seed=123), 2, 3)
    ]
    assert seeds != [
        sp["sampling_seed"] for sp in request_sampling_params(SamplingParams(seed=124), 2, 3)
    ]


def test_greedy_needs_temperature_one(model_dir: Path) -> None:
    engine = _engine(model_dir, RecordingEngine())
    with pytest.raises(ValueError, match=r"algorithm\.val_sampling_params") as info:
        engine.generate([[1]], 1, SamplingParams(temperature=0.6, top_k=1))
    assert "rollout.engine: hf" in str(info.value)
    with pytest.raises(ValueError, match="greedily"):
        engine.generate([[1]], 1, SamplingParams(temperature=1e-7))
    assert len(engine.generate([[1]], 2, SamplingParams(temperature=1.0, top_k=1))) == 2
    assert len(engine.generate([[1]], 1, SamplingParams(temperature=0.6, top_k=2))) == 1


def test_bad_generation_answers_raise(model_dir: Path) -> None:
    fake = RecordingEngine()
    engine = _engine(model_dir, fake)
    fake.abort = {1}
    with pytest.raises(RuntimeError, match="aborted request 1: out of memory"):
        engine.generate([[1], [2]], 1, SamplingParams(max_new_tokens=2))
    fake.abort = set()
    fake.generate = lambda **kw: []  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="0 outputs for 1 prompts x 2 samples"):
        engine.generate([[1]], 2, SamplingParams())
    bad_prompts: list[list[list[int]]] = [[], [[]]]
    for bad in bad_prompts:
        with pytest.raises(ValueError, match="non-empty"):
            engine.generate(bad, 1, SamplingParams())
    with pytest.raises(ValueError, match="n must be"):
        engine.generate([[1]], 0, SamplingParams())


def test_logprobs_that_do_not_match_the_tokens_raise(model_dir: Path) -> None:
    fake = RecordingEngine()
    real = fake.generate

    def shifted(**kwargs: Any) -> list[dict[str, Any]]:
        out = real(**kwargs)
        out[0]["meta_info"]["output_token_logprobs"].pop()
        return out

    fake.generate = shifted  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="do not match"):
        _engine(model_dir, fake).generate([[1]], 1, SamplingParams(max_new_tokens=3))


# ---------------------------------------------------------------- weights


def test_weight_sync_is_one_session_of_buckets(model_dir: Path) -> None:
    fake = RecordingEngine()
    engine = _engine(model_dir, fake)
    assert engine.weights_readable is False
    assert engine.expected_weight_names() == set(WEIGHTS)
    state = _state(0.5)
    # The first bucket ends inside the q/k/v group: SGLang loads each member into
    # its own slice of the fused parameter, so nothing is held back.
    assert engine.load_weights(state[:3], version=4) == 3
    assert engine.version == 4
    assert engine.load_weights(state[3:], version=4) == len(WEIGHTS) - 3
    assert engine.load_weights([], version=4) == 0
    assert fake.names() == [
        "begin_weight_update",
        "update_weights_from_tensor",
        "update_weights_from_tensor",
    ]
    for _, call in fake.calls[1:]:
        assert call["flush_cache"] is False
        assert all(t.dtype == torch.bfloat16 for _, t in call["named_tensors"])
    sent = [n for _, call in fake.calls[1:] for n, _ in call["named_tensors"]]
    assert sent == list(WEIGHTS)
    engine.finish_weight_sync()
    assert fake.names()[-2:] == ["end_weight_update", "flush_cache"]
    engine.finish_weight_sync()  # nothing open: no call
    assert len(fake.calls) == 5
    with pytest.raises(NotImplementedError, match="validate_weight_first_sync"):
        engine.weights_max_abs_diff(state)


def test_generate_closes_an_open_sync_first(model_dir: Path) -> None:
    fake = RecordingEngine()
    engine = _engine(model_dir, fake)
    engine.load_weights(_state()[:2], version=1)
    engine.generate([[1]], 1, SamplingParams(max_new_tokens=1))
    assert fake.names() == [
        "begin_weight_update",
        "update_weights_from_tensor",
        "end_weight_update",
        "flush_cache",
        "generate",
    ]


@pytest.mark.parametrize("call", ["begin_weight_update", "update_weights_from_tensor"])
def test_refused_weight_update_raises_sglangs_message(model_dir: Path, call: str) -> None:
    fake = RecordingEngine()
    fake.fail[call] = "must run between begin_weight_update() and end_weight_update()"
    with pytest.raises(RuntimeError, match=f"SGLang {call} failed: must run between"):
        _engine(model_dir, fake).load_weights(_state())


def test_refused_cache_flush_raises(model_dir: Path) -> None:
    fake = RecordingEngine()
    fake.fail["flush_cache"] = ""
    engine = _engine(model_dir, fake)
    engine.load_weights(_state())
    with pytest.raises(RuntimeError, match="could not flush"):
        engine.finish_weight_sync()


def test_tensors_move_to_the_engine_device(model_dir: Path) -> None:
    fake = RecordingEngine()
    engine = SGLangEngine.from_engine(fake, model_dir, torch.float32, device="meta")
    engine.load_weights(_state())
    assert all(t.device.type == "meta" for _, t in fake.calls[1][1]["named_tensors"])


# ---------------------------------------------------------------- offload


def test_offload_and_onload_release_and_resume_everything(model_dir: Path) -> None:
    fake = RecordingEngine()
    engine = _engine(model_dir, fake, enable_weights_cpu_backup=True)
    engine.offload()
    engine.offload()
    assert engine.is_offloaded
    assert fake.calls == [("release_memory_occupation", {})]
    with pytest.raises(RuntimeError, match="onload"):
        engine.generate([[1]], 1, SamplingParams())
    engine.onload()
    engine.onload()
    assert not engine.is_offloaded
    assert fake.calls[1:] == [("resume_memory_occupation", {"tags": list(MEMORY_TAGS)})]
    engine.generate([[1]], 1, SamplingParams(max_new_tokens=1))  # CPU backup: weights kept


def test_sync_while_offloaded_resumes_the_weights_alone(model_dir: Path) -> None:
    fake = RecordingEngine()
    engine = _engine(model_dir, fake)  # no CPU backup: released weights are discarded
    engine.offload()
    engine.load_weights(_state(), version=1)
    engine.finish_weight_sync()
    engine.onload()
    assert fake.calls[:2] == [
        ("release_memory_occupation", {}),
        ("resume_memory_occupation", {"tags": ["weights"]}),
    ]
    assert fake.calls[-1] == ("resume_memory_occupation", {"tags": ["kv_cache", "cuda_graph"]})
    assert len(engine.generate([[1]], 1, SamplingParams(max_new_tokens=1))) == 1


def test_discarded_weights_need_a_complete_sync(model_dir: Path) -> None:
    fake = RecordingEngine()
    engine = _engine(model_dir, fake)
    engine.offload()
    engine.onload()
    with pytest.raises(RuntimeError, match="enable_weights_cpu_backup"):
        engine.generate([[1]], 1, SamplingParams())
    engine.load_weights(_state()[1:], version=1)
    with pytest.raises(ValueError, match=r"did not send \['model\.embed_tokens\.weight'\]"):
        engine.finish_weight_sync()
    with pytest.raises(RuntimeError, match="no weight sync has sent them"):
        engine.generate([[1]], 1, SamplingParams())
    engine.load_weights(_state(), version=2)
    engine.finish_weight_sync()
    assert len(engine.generate([[1]], 1, SamplingParams(max_new_tokens=1))) == 1


def test_without_memory_saver_offload_is_tracked_only(model_dir: Path) -> None:
    fake = RecordingEngine()
    engine = _engine(model_dir, fake, enable_memory_saver=False)
    engine.offload()
    assert engine.is_offloaded
    engine.onload()
    assert fake.calls == []
    engine.generate([[1]], 1, SamplingParams(max_new_tokens=1))


# ---------------------------------------------------------------- construction


def test_engine_kwargs() -> None:
    kwargs = engine_kwargs("/m", torch.bfloat16, gpu_id=3, seed=7)
    assert kwargs["model_path"] == "/m" and kwargs["dtype"] == "bfloat16"
    assert kwargs["skip_tokenizer_init"] is True  # token ids in and out
    assert kwargs["enable_memory_saver"] is True and kwargs["base_gpu_id"] == 3
    assert kwargs["random_seed"] == 7 and kwargs["tp_size"] == 1
    assert "max_running_requests" not in kwargs and "context_length" not in kwargs
    more = engine_kwargs("/m", torch.float32, max_batch_size=16, max_model_len=512)
    assert more["max_running_requests"] == 16 and more["context_length"] == 512
    assert more["dtype"] == "float32"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_no_gpu_is_refused_before_sglang_is_imported(model_dir: Path) -> None:
    assert get_engine_class("sglang") is SGLangEngine
    with pytest.raises(RuntimeError, match="needs a CUDA GPU") as info:
        SGLangEngine(model_dir)
    assert "rollout.engine: hf" in str(info.value) and "vllm" in str(info.value)
    assert "sglang" not in sys.modules
    with pytest.raises(FileNotFoundError, match=r"rollout\.model_path"):
        SGLangEngine(model_dir / "missing")


def test_a_cpu_device_is_refused(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="device=cpu"):
        SGLangEngine(model_dir, device="cpu")


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="SGLang is installed")
def test_missing_sglang_names_the_extra(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(ImportError) as info:
        SGLangEngine(model_dir)
    assert 'pip install "rlinf-reasoning[sglang]"' in str(info.value)
    assert "rollout.engine: hf" in str(info.value)


def test_raw_logprob_environment_is_refused(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
    with pytest.raises(RuntimeError, match="SGLANG_RETURN_ORIGINAL_LOGPROB is set"):
        SGLangEngine(model_dir)


# ---------------------------------------------------------------- config


def _config(tmp: Path, rollout: dict[str, Any]) -> dict[str, Any]:
    return {
        "cluster": {
            "cpu_slots_per_node": 2,
            "component_placement": {"actor": 0, "rollout": 1, "reward": 1},
        },
        "runner": {"val_check_interval": -1, "val_before_train": False},
        "data": {
            "train_files": [str(tmp / "train.jsonl")],
            "prompt_key": "problem",
            "answer_key": "answer",
            "max_prompt_length": 16,
        },
        "algorithm": {"group_size": 4, "rollout_batch_size": 4},
        "actor": {"model_path": str(tmp / "model"), "micro_batch_size": 4},
        "rollout": rollout,
    }


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="SGLang is installed")
def test_config_without_sglang_names_the_extra(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        validate_config(_config(tmp_path, {"engine": "sglang"}), ReasoningConfig)
    assert "rollout.engine" in [issue.path for issue in info.value.issues]
    assert 'pip install "rlinf-reasoning[sglang]"' in str(info.value)


def test_sglang_options_are_typed(tmp_path: Path) -> None:
    options = {"mem_fraction_static": 0.3, "enable_weights_cpu_backup": True}
    cfg = validate_config(_config(tmp_path, {"sglang": options}), ReasoningConfig)
    assert cfg.rollout.sglang.mem_fraction_static == 0.3
    assert cfg.rollout.sglang.enable_weights_cpu_backup is True
    for bad, path in (
        ({"mem_fraction_static": 1.0}, "rollout.sglang.mem_fraction_static"),
        ({"max_model_len": 4}, "rollout.sglang.max_model_len"),
        ({"tp_size": 2}, "rollout.sglang.tp_size"),
    ):
        with pytest.raises(ConfigError) as info:
            validate_config(_config(tmp_path, {"sglang": bad}), ReasoningConfig)
        assert path in [issue.path for issue in info.value.issues], str(info.value)


def test_every_option_is_an_engine_argument() -> None:
    # The rollout worker passes rollout.sglang's fields as keyword arguments.
    accepted = set(inspect.signature(SGLangEngine).parameters)
    assert set(SGLangOptions.model_fields) <= accepted
    assert {"max_batch_size", "seed"} <= accepted
