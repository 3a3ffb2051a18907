"""The toy arithmetic task: data, tokenizer, warm start, CLI."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlinf.reasoning.engines import HFEngine, SamplingParams
from rlinf.reasoning.toy_task import (
    SPECIAL_TOKENS,
    ToyTaskConfig,
    build_tokenizer,
    extract_answer,
    is_correct,
    make_problems,
    make_toy_task,
    read_jsonl,
)

SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "reasoning" / "make_toy_task.py"


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_toy_task", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_problems_are_correct_disjoint_and_seeded() -> None:
    train, test = make_problems(300, 100, max_operand=20, seed=1)
    assert len(train) == 300 and len(test) == 100
    assert not {r["problem"] for r in train} & {r["problem"] for r in test}
    assert len({r["problem"] for r in train}) == 300
    for row in train + test:
        problem = row["problem"]
        assert problem.endswith("=")
        op = "+" if "+" in problem else "-"
        a, b = (int(x) for x in problem[:-1].split(op))
        assert int(row["answer"]) == (a + b if op == "+" else a - b)
    assert {r["problem"][:-1].strip("0123456789")[-1] for r in train} == {"+", "-"}
    assert make_problems(300, 100, max_operand=20, seed=1) == (train, test)
    assert make_problems(300, 100, max_operand=20, seed=2) != (train, test)
    plus_only, _ = make_problems(50, 0, ops=("+",), max_operand=9)
    assert all("+" in r["problem"] for r in plus_only)
    with pytest.raises(ValueError, match="exceeds"):
        make_problems(101, 100, max_operand=9)
    with pytest.raises(ValueError, match="ops"):
        make_problems(1, 1, ops=("*",))


def test_answer_extraction_and_grading() -> None:
    assert extract_answer("19") == "19"
    assert extract_answer("-38") == "-38"
    assert extract_answer("\\boxed{-3}") == "-3"
    assert extract_answer("12+7=19") == "19"
    assert extract_answer("") is None
    assert is_correct("19", "19") and is_correct(" 019 ", "19") and is_correct("-5", "-5")
    assert not is_correct("18", "19") and not is_correct("", "19") and not is_correct("5", "-5")


def test_tokenizer_is_char_level_with_bos_eos_and_left_padding() -> None:
    tok = build_tokenizer()
    assert [tok.convert_ids_to_tokens(i) for i in range(4)] == list(SPECIAL_TOKENS)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    ids = tok.encode("12+7=")
    assert ids[0] == tok.bos_token_id and len(ids) == 6
    assert tok.decode([*ids, tok.eos_token_id], skip_special_tokens=True) == "12+7="
    assert tok.decode(tok.encode("-38", add_special_tokens=False)) == "-38"
    batch = tok(["1+1=", "12+13="], padding=True)
    assert batch["attention_mask"][0][:2] == [0, 0]  # left padding
    assert len(tok) <= 40


@pytest.mark.skipif(not SCRIPT.is_file(), reason="examples/ not present (installed package)")
def test_small_task_via_cli_writes_loadable_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _load_script()
    with pytest.raises(SystemExit) as help_exit:
        script.parse_args(["--help"])
    assert help_exit.value.code == 0
    assert "--out" in capsys.readouterr().out

    out = tmp_path / "toy"
    argv = ["--out", str(out), "--seed", "3", "--num-train", "200", "--num-test", "20"]
    argv += ["--sft-steps", "5", "--batch-size", "8", "--threads", "0"]
    assert script.main(argv) == 0
    printed = capsys.readouterr().out
    assert "held-out greedy accuracy" in printed

    train, test = read_jsonl(out / "train.jsonl"), read_jsonl(out / "test.jsonl")
    assert len(train) == 200 and len(test) == 20
    assert set(train[0]) == {"problem", "answer"}
    record = json.loads((out / "toy_task.json").read_text())
    assert record["config"]["sft_steps"] == 5 and 0.0 <= record["accuracy"] <= 1.0

    model_dir = out / "warmstart"
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert tok.padding_side == "left"
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<pad>", "<bos>", "<eos>")
    assert tok.decode(tok.encode("45-9="), skip_special_tokens=True) == "45-9="
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.vocab_size == len(tok)
    assert model.config.eos_token_id == tok.eos_token_id

    engine = HFEngine(model_dir)
    assert engine.eos_token_ids == (tok.eos_token_id,)
    assert engine.weights_max_abs_diff(model.state_dict().items()) == 0.0
    outs = engine.generate(
        [tok.encode(r["problem"]) for r in test[:3]], 2, SamplingParams(max_new_tokens=6, seed=0)
    )
    assert len(outs) == 6


def test_medium_warm_start_learns(tmp_path: Path) -> None:
    # Measured on the 2-core box: accuracy 0.207 on the 300 held-out problems in
    # ~14 s of SFT (1 thread, under load); the floor leaves a 2x margin.
    cfg = ToyTaskConfig(
        seed=0, num_train=1500, num_test=300, max_operand=29, sft_steps=300, batch_size=64
    )
    result = make_toy_task(tmp_path, cfg)
    assert result.sft.final_loss < 0.8
    assert result.sft.losses[0] > 2.0 * result.sft.final_loss
    assert result.accuracy >= 0.10


@pytest.mark.slow
def test_default_warm_start_is_partial(tmp_path: Path) -> None:
    # The standard task (python examples/reasoning/make_toy_task.py defaults):
    # measured 0.354 held-out accuracy, ~20-45 s of SFT on 2 shared cores.
    result = make_toy_task(tmp_path, ToyTaskConfig())
    assert 0.2 <= result.accuracy <= 0.5
