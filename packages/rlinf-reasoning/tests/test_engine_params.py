"""SamplingParams validation, top-k/top-p filtering and the engine registry."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from rlinf.core.algorithms import entropy_from_logits
from rlinf.reasoning.engines import (
    SamplingParams,
    available_engines,
    filter_logits,
    get_engine_class,
    register_engine,
)
from rlinf.reasoning.engines.hf import HFEngine
from rlinf.reasoning.models import token_logprobs_from_logits


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_p": -0.1}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"stop_token_ids": [1, -3]}, "stop_token_ids"),
        ({"stop_token_ids": "12"}, "stop_token_ids"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_invalid_sampling_params_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_sampling_params_defaults_and_normalisation() -> None:
    p = SamplingParams(temperature=1, top_p=1, top_k=0, stop_token_ids=[5, 6], seed=3)
    assert p.temperature == 1.0 and isinstance(p.temperature, float)
    assert p.stop_token_ids == (5, 6)
    assert not p.top_k_enabled and not p.is_greedy
    assert SamplingParams(top_k=1).is_greedy
    assert SamplingParams(top_k=4).top_k_enabled
    with pytest.raises(AttributeError):
        p.temperature = 2.0  # type: ignore[misc]


def test_filter_logits_top_k_and_top_p() -> None:
    probs = torch.tensor([[0.5, 0.25, 0.15, 0.07, 0.03]])
    logits = probs.log()

    def kept(x: torch.Tensor) -> list[bool]:
        return [bool(v) for v in torch.isfinite(x)[0]]

    assert kept(filter_logits(logits, top_k=2, top_p=1.0)) == [True, True, False, False, False]
    # Nucleus: smallest prefix whose mass reaches top_p.
    assert kept(filter_logits(logits, top_k=-1, top_p=0.5)) == [True, False, False, False, False]
    assert kept(filter_logits(logits, top_k=-1, top_p=0.6)) == [True, True, False, False, False]
    assert kept(filter_logits(logits, top_k=-1, top_p=0.9)) == [True, True, True, False, False]
    assert kept(filter_logits(logits, top_k=-1, top_p=1e-6)) == [True] + [False] * 4
    # top-k first, then top-p over the renormalised remainder (0.5/0.9 = 0.56 < 0.6).
    assert kept(filter_logits(logits, top_k=3, top_p=0.6)) == [True, True, False, False, False]
    # Disabled filters return the input untouched; order within a row does not matter.
    assert filter_logits(logits, top_k=0, top_p=1.0) is logits
    shuffled = logits[:, [3, 0, 4, 2, 1]]
    assert kept(filter_logits(shuffled, top_k=-1, top_p=0.6)) == [False, True, False, False, True]


def test_logprob_and_entropy_helpers() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.bfloat16)
    lp = token_logprobs_from_logits(logits, torch.tensor([0]), temperature=0.5)
    assert lp.dtype == torch.float32
    expected = torch.log_softmax(torch.tensor([4.0, 2.0, 0.0]), -1)[0]
    assert lp.item() == pytest.approx(expected.item(), abs=1e-6)
    uniform = entropy_from_logits(torch.zeros(2, 4))
    assert torch.allclose(uniform, torch.full((2,), math.log(4)))


def test_registry_names_and_errors() -> None:
    assert {"hf", "sglang", "vllm"} <= set(available_engines())
    assert get_engine_class("hf") is HFEngine
    with pytest.raises(ValueError, match=r"unknown rollout engine 'nope'.*hf"):
        get_engine_class("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_engine("hf", lambda: HFEngine)


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this environment"
)
def test_vllm_without_vllm_installed_names_the_extra_and_the_test_command(tmp_path: Path) -> None:
    # The engine class imports lazily; building one without vLLM says what to install.
    from rlinf.reasoning.engines.vllm_engine import VLLMEngine

    assert get_engine_class("vllm") is VLLMEngine
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ImportError) as info:
        VLLMEngine(tmp_path)
    assert "rlinf-reasoning[vllm]" in str(info.value)
    assert "uv run --project tests/engines/vllm pytest tests/engines/vllm" in str(info.value)
    with pytest.raises(FileNotFoundError, match=r"rollout\.model_path"):
        VLLMEngine(tmp_path / "missing")


def _samplings(train: dict[str, Any], val: dict[str, Any] | None = None) -> dict[str, Any]:
    from rlinf.reasoning.config import AlgorithmConfig

    algorithm = AlgorithmConfig.model_validate(
        {"sampling_params": train, **({"val_sampling_params": val} if val is not None else {})}
    )
    return algorithm.sampling_by_key


@pytest.mark.parametrize(
    ("train", "val", "mode"),
    [
        ({}, None, "raw_logprobs"),  # temperature 1, greedy eval
        ({"top_k": 8, "top_p": 0.9}, None, "raw_logprobs"),  # T = 1 with filtering
        ({"temperature": 0.7}, {"temperature": 1.2}, "processed_logprobs"),
        ({"temperature": 0.7}, {"temperature": 1.0}, "processed_logprobs"),
        ({"temperature": 0.7}, {"temperature": 1.0, "top_k": 1}, "processed_logprobs"),
    ],
)
def test_vllm_logprobs_mode_is_the_one_that_reports_the_actors_value(
    train: dict[str, Any], val: dict[str, Any] | None, mode: str
) -> None:
    from rlinf.reasoning.engines.vllm_engine import vllm_logprobs_mode

    assert vllm_logprobs_mode(_samplings(train, val)) == mode


@pytest.mark.parametrize(
    ("train", "val", "names"),
    [
        (
            {"temperature": 0.7, "top_p": 0.9},
            {"temperature": 0.7},
            ["algorithm.sampling_params (temperature=0.7, top_k=-1, top_p=0.9)", "top_p: 1.0"],
        ),
        (
            {"temperature": 0.7},
            {"temperature": 0.7, "top_k": 20},
            ["algorithm.val_sampling_params (temperature=0.7, top_k=20", "top_k: -1"],
        ),
        (  # each fits a different mode: no single engine serves both
            {"top_k": 8},
            {"temperature": 0.5},
            [
                "temperature other than 1 in algorithm.val_sampling_params",
                "top-k/top-p filtering in algorithm.sampling_params",
                "rollout.engine: hf",
            ],
        ),
        (  # the default evaluation: greedy at the training temperature
            {"temperature": 0.7},
            None,
            [
                "algorithm.val_sampling_params (temperature=0.7, top_k=1, top_p=1.0)",
                "for greedy decoding in algorithm.val_sampling_params set temperature: 1.0",
            ],
        ),
        (
            {"top_p": 0.9},
            {"temperature": 0.5, "top_k": 1},
            ["for greedy decoding in algorithm.val_sampling_params set temperature: 1.0"],
        ),
    ],
)
def test_vllm_logprobs_mode_refuses_what_vllm_cannot_report(
    train: dict[str, Any], val: dict[str, Any] | None, names: list[str]
) -> None:
    from rlinf.reasoning.engines.vllm_engine import vllm_logprobs_mode

    with pytest.raises(ValueError) as info:
        vllm_logprobs_mode(_samplings(train, val))
    for name in names:
        assert name in str(info.value)
