"""MathDataset, collate_left_padded and DataConfig, with a tiny locally built tokenizer."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from torch.utils.data import DataLoader
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from rlinf.reasoning.data import (
    DataConfig,
    DatasetError,
    MathDataset,
    MathItem,
    ResumableSampler,
    collate_left_padded,
)

WORDS = "what is one plus two three four five six times compute the sum of system user assistant"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant{% endif %}"
)


def build_tokenizer(path: Path, *, pad: bool = True, chat: bool = True) -> PreTrainedTokenizerBase:
    """A word-level tokenizer that prepends <s>, saved to ``path`` and loaded back."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "<s>", "</s>"])
    tok.train_from_iterator([WORDS], trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    extra: dict[str, Any] = {"pad_token": "[PAD]"} if pad else {}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="[UNK]", **extra
    )
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerBase:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


ROWS = [
    {"problem": "what is one plus one", "answer": "2"},
    {"problem": "compute two times three", "answer": 6},
    {"problem": "what is the sum of four and five", "answer": ["9", "nine"]},
]


def test_loads_jsonl_and_json_with_answers_as_lists(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    jsonl = write_jsonl(tmp_path / "a.jsonl", ROWS[:2])
    js = tmp_path / "b.json"
    js.write_text(json.dumps([ROWS[2]]), encoding="utf-8")
    cfg = DataConfig(train_files=[jsonl, js], max_prompt_length=32)
    ds = MathDataset.from_config(cfg, tokenizer)
    assert len(ds) == 3
    items = [ds[i] for i in range(3)]
    assert [it.answers for it in items] == [["2"], ["6"], ["9", "nine"]]
    assert [it.index for it in items] == [0, 1, 2]
    assert items[0].prompt == "what is one plus one"
    bos = tokenizer.bos_token_id
    assert items[0].prompt_ids[0] == bos  # default special tokens on raw prompts
    assert items[0].prompt_ids == tokenizer.encode("what is one plus one")
    assert ds.source(0) == f"{jsonl}:1"
    assert ds.source(2) == f"{js} record 0"
    with pytest.raises(IndexError):
        ds[3]


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_parquet_loads_like_jsonl(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    """A parquet file (the hubs' format) gives the same items as the same rows in jsonl;
    an answer column of lists works as in json."""
    rows = [
        {"problem": "what is one plus one", "answer": ["2"]},
        {"problem": "compute two times three", "answer": ["6"]},
        {"problem": "what is four plus five", "answer": ["9", "nine"]},
    ]
    parquet = write_parquet(tmp_path / "train.parquet", rows)
    jsonl = write_jsonl(tmp_path / "train.jsonl", rows)
    cfg = DataConfig(max_prompt_length=32)
    from_parquet = MathDataset([parquet], tokenizer, cfg)
    from_jsonl = MathDataset([jsonl], tokenizer, cfg)
    assert len(from_parquet) == 3
    for i in range(3):
        a, b = from_parquet[i], from_jsonl[i]
        assert (a.prompt, a.answers, a.prompt_ids) == (b.prompt, b.answers, b.prompt_ids)
    assert from_parquet.source(2) == f"{parquet} row 2"


def test_parquet_errors_name_the_row_and_the_key(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    path = write_parquet(tmp_path / "q.parquet", [{"question": "what is one", "solution": "1"}])
    with pytest.raises(DatasetError) as info:
        MathDataset([path], tokenizer, DataConfig())
    msg = str(info.value)
    assert f"{path} row 0" in msg and "data.prompt_key" in msg
    assert "['question', 'solution']" in msg
    mapped = MathDataset(
        [path], tokenizer, DataConfig(prompt_key="question", answer_key="solution")
    )
    assert mapped[0].answers == ["1"]
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match=r"broken\.parquet: not a readable parquet file"):
        MathDataset([broken], tokenizer, DataConfig())


def test_custom_keys(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [{"question": "what is one", "solutions": ["1"]}])
    cfg = DataConfig(prompt_key="question", answer_key="solutions")
    ds = MathDataset([path], tokenizer, cfg)
    assert ds[0].prompt == "what is one" and ds[0].answers == ["1"]


def test_chat_template_with_system_prompt(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    rows = [
        {"problem": "what is one plus one", "answer": "2"},
        {"problem": [{"role": "user", "content": "compute two times three"}], "answer": "6"},
    ]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    cfg = DataConfig(apply_chat_template=True, system_prompt="the sum")
    ds = MathDataset([path], tokenizer, cfg)
    assert ds[0].prompt == "<s>system the sum user what is one plus one assistant"
    assert ds[1].prompt == "<s>system the sum user compute two times three assistant"
    ids = ds[0].prompt_ids
    # the template writes the BOS; encoding must not add a second one
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id


def test_chat_messages_need_the_template(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    path = write_jsonl(
        tmp_path / "m.jsonl", [{"problem": [{"role": "user", "content": "x"}], "answer": "1"}]
    )
    with pytest.raises(DatasetError, match="apply_chat_template=true"):
        MathDataset([path], tokenizer, DataConfig())


def test_tokenizer_without_chat_template(tmp_path: Path) -> None:
    tok = build_tokenizer(tmp_path / "tok", chat=False)
    path = write_jsonl(tmp_path / "a.jsonl", ROWS)
    with pytest.raises(ValueError, match="no chat_template"):
        MathDataset([path], tok, DataConfig(apply_chat_template=True))


def test_filter_overlong_drops_and_logs(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", ROWS)
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("rlinf.reasoning.data")
    handler = Keep(level=logging.WARNING)
    logger.addHandler(handler)
    try:
        # "what is one plus one" is 6 tokens with <s>; the 9-token prompt is dropped
        ds = MathDataset([path], tokenizer, DataConfig(max_prompt_length=6, filter_overlong=True))
    finally:
        logger.removeHandler(handler)
    assert len(ds) == 2 and ds.num_filtered == 1
    assert [ds[i].answers for i in range(2)] == [["2"], ["6"]]
    assert [ds[i].index for i in range(2)] == [0, 1]
    assert any("dropped 1 of 3" in r.getMessage() for r in records)


def test_all_filtered_is_an_error(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", ROWS)
    with pytest.raises(DatasetError, match="all 3 prompts"):
        MathDataset([path], tokenizer, DataConfig(max_prompt_length=2))


def test_overlong_without_filter_names_index_length_limit_and_fix(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", ROWS)
    with pytest.raises(DatasetError) as info:
        MathDataset([path], tokenizer, DataConfig(max_prompt_length=6, filter_overlong=False))
    msg = str(info.value)
    assert "prompt 2" in msg and f"{path}:3" in msg
    assert "9 tokens" in msg and "max_prompt_length=6" in msg
    assert "filter_overlong=true" in msg


def test_missing_answer_key_names_file_line_key_and_available_keys(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    rows = [ROWS[0], {"problem": "what is two", "solution": "2", "level": 1}]
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DatasetError) as info:
        MathDataset([path], tokenizer, DataConfig())
    msg = str(info.value)
    assert f"{path}:2" in msg
    assert "'answer'" in msg and "data.answer_key" in msg
    assert "['level', 'problem', 'solution']" in msg


def test_missing_prompt_key(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"question": "x", "answer": "1"}])
    with pytest.raises(DatasetError, match=r"no prompt key 'problem'.*\['answer', 'question'\]"):
        MathDataset([path], tokenizer, DataConfig())


def test_bad_values_and_json(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"problem": "x", "answer": {"v": 1}}])
    with pytest.raises(DatasetError, match="must be a string, a number or a list"):
        MathDataset([path], tokenizer, DataConfig())
    path = write_jsonl(tmp_path / "b.jsonl", [{"problem": "x", "answer": []}])
    with pytest.raises(DatasetError, match="empty list"):
        MathDataset([path], tokenizer, DataConfig())
    broken = tmp_path / "c.jsonl"
    broken.write_text('{"problem": "x", "answer": "1"}\n{"problem": \n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"c\.jsonl:2: invalid JSON"):
        MathDataset([broken], tokenizer, DataConfig())
    with pytest.raises(DatasetError, match=r"use \.jsonl .*\.parquet"):
        MathDataset([tmp_path / "data.csv"], tokenizer, DataConfig())


def test_missing_file(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl.*does not exist"):
        MathDataset([missing], tokenizer, DataConfig())
    with pytest.raises(ValueError, match="no data files"):
        MathDataset([], tokenizer, DataConfig())
    with pytest.raises(ValueError, match=r"data\.val_files is empty"):
        MathDataset.from_config(DataConfig(train_files=[missing]), tokenizer, split="val")


def test_tokenizer_without_pad_token(tmp_path: Path) -> None:
    tok = build_tokenizer(tmp_path / "tok", pad=False)
    assert tok.pad_token_id is None
    path = write_jsonl(tmp_path / "a.jsonl", ROWS)
    with pytest.raises(
        ValueError, match=r"no pad token.*tokenizer\.pad_token = tokenizer\.eos_token"
    ):
        MathDataset([path], tok, DataConfig())


def test_config_validation() -> None:
    with pytest.raises(ValidationError, match="extra"):
        DataConfig.model_validate({"train_files": [], "max_prompt_len": 5})
    with pytest.raises(ValidationError, match="apply_chat_template"):
        DataConfig(system_prompt="be brief")
    with pytest.raises(ValidationError):
        DataConfig(max_prompt_length=0)
    cfg = DataConfig()
    assert (cfg.prompt_key, cfg.answer_key, cfg.filter_overlong) == ("problem", "answer", True)


def test_collate_left_padded() -> None:
    items = [
        MathItem("a", [5, 6, 7], ["1"], 0),
        MathItem("b", [8], ["2", "two"], 4),
    ]
    batch = collate_left_padded(items, pad_token_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch["input_ids"].dtype == torch.long
    assert batch["prompt_lengths"].tolist() == [3, 1]
    assert batch["answers"] == [["1"], ["2", "two"]] and batch["indices"] == [0, 4]
    padded = collate_left_padded(items, pad_token_id=9, pad_to=5)
    assert padded["input_ids"].tolist() == [[9, 9, 5, 6, 7], [9, 9, 9, 9, 8]]
    with pytest.raises(ValueError, match="pad_to=2"):
        collate_left_padded(items, pad_token_id=0, pad_to=2)
    with pytest.raises(ValueError, match="empty"):
        collate_left_padded([], pad_token_id=0)


def test_dataloader_with_resumable_sampler(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    rows = [{"problem": "one plus " + " ".join(["two"] * k), "answer": str(k)} for k in range(1, 8)]
    path = write_jsonl(tmp_path / "a.jsonl", rows)
    cfg = DataConfig(train_files=[path], seed=3)
    ds = MathDataset.from_config(cfg, tokenizer)

    def loader(sampler: ResumableSampler) -> DataLoader[MathItem]:
        return DataLoader(ds, batch_size=2, sampler=sampler, collate_fn=ds.collate)

    uninterrupted = ResumableSampler(len(ds), seed=cfg.seed)
    full = [b["indices"] for _ in range(2) for b in loader(uninterrupted)]
    sampler = ResumableSampler(len(ds), seed=cfg.seed)
    seen = []
    for i, batch in enumerate(loader(sampler)):
        seen.append(batch["indices"])
        mask = batch["attention_mask"]
        assert (batch["input_ids"][mask == 0] == ds.pad_token_id).all()
        assert (mask[:, -1] == 1).all()  # left padded: the last column is always a token
        if i == 1:
            break
    state = sampler.state_dict()
    resumed = ResumableSampler(len(ds), seed=cfg.seed)
    resumed.load_state_dict(state)
    seen += [b["indices"] for b in loader(resumed)]
    seen += [b["indices"] for b in loader(resumed)]
    flat = [i for b in seen for i in b]
    assert flat[: 2 * len(ds)] == [i for b in full for i in b][: 2 * len(ds)]
