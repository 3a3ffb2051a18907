"""Math prompts from jsonl, json or parquet files, tokenized once, and left-padded batches.

A record is a JSON object (or a parquet row, one column per key) with a prompt under
``cfg.prompt_key`` and an answer under ``cfg.answer_key``:

* the prompt is a string, or (with ``apply_chat_template``) a string or a list of chat
  messages ``[{"role": ..., "content": ...}]``;
* the answer is a string, a number, or a list of them; it becomes a list of strings.

At load time every prompt is (optionally) wrapped in the tokenizer's chat template
with the generation prompt, tokenized, and checked against ``max_prompt_length``: too
long prompts are dropped and counted (``filter_overlong``) or are an error. A raw prompt
is encoded with the tokenizer's default special tokens (so a tokenizer that adds a BOS
adds it); a chat-templated prompt is encoded without them, because the template already
writes the special tokens it wants (encoding it with them would double the BOS).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase

from rlinf.core.logging import get_logger
from rlinf.reasoning.data.config import DataConfig

__all__ = ["DatasetError", "MathBatch", "MathDataset", "MathItem", "collate_left_padded"]

_log = get_logger("rlinf.reasoning.data")
_ENCODE_CHUNK = 1024


class DatasetError(ValueError):
    """A data file or record cannot be used; the message names the file, the record and the fix."""


@dataclass(frozen=True)
class MathItem:
    """One prompt of a :class:`MathDataset`.

    Attributes:
        prompt: The prompt text, after the chat template when one is applied.
        prompt_ids: Its token ids (no padding), at most ``max_prompt_length`` long.
        answers: The reference answers (at least one).
        index: Position of the item in the dataset (``dataset[index]``).
    """

    prompt: str
    prompt_ids: list[int]
    answers: list[str]
    index: int


class MathBatch(TypedDict):
    """A left-padded batch from :func:`collate_left_padded`.

    Keys:
        input_ids: ``[B, L]`` int64, prompts right-aligned, ``pad_token_id`` on the left.
        attention_mask: ``[B, L]`` int64, 1 on prompt tokens and 0 on padding.
        prompt_lengths: ``[B]`` int64, the unpadded lengths.
        prompts: The prompt texts.
        answers: The reference answers of each prompt.
        indices: The dataset indices.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_lengths: torch.Tensor
    prompts: list[str]
    answers: list[list[str]]
    indices: list[int]


def collate_left_padded(
    items: Sequence[MathItem], pad_token_id: int, pad_to: int | None = None
) -> MathBatch:
    """Stack items into a left-padded batch.

    Args:
        items: The items (at least one).
        pad_token_id: Token id used for padding.
        pad_to: Pad every row to this length instead of the longest prompt in the batch.

    Returns:
        The batch; see :class:`MathBatch`.

    Raises:
        ValueError: If ``items`` is empty or a prompt is longer than ``pad_to``.
    """
    if not items:
        raise ValueError("cannot collate an empty list of items")
    longest = max(len(item.prompt_ids) for item in items)
    if pad_to is not None and longest > pad_to:
        raise ValueError(
            f"a prompt has {longest} tokens, more than pad_to={pad_to}; raise pad_to "
            "or leave it None to pad to the longest prompt"
        )
    width = pad_to if pad_to is not None else longest
    input_ids = torch.full((len(items), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(items), width), dtype=torch.long)
    for row, item in enumerate(items):
        n = len(item.prompt_ids)
        if n:
            input_ids[row, width - n :] = torch.tensor(item.prompt_ids, dtype=torch.long)
            attention_mask[row, width - n :] = 1
    return MathBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        prompt_lengths=torch.tensor([len(item.prompt_ids) for item in items], dtype=torch.long),
        prompts=[item.prompt for item in items],
        answers=[list(item.answers) for item in items],
        indices=[item.index for item in items],
    )


@dataclass(frozen=True)
class _Record:
    location: str  # "file.jsonl:12", "file.json record 3" or "file.parquet row 3"
    data: dict[str, Any]


def _read_records(path: Path) -> list[_Record]:
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".json", ".parquet"):
        raise DatasetError(
            f"data file {str(path)!r} has suffix {path.suffix!r}; use .jsonl (one JSON "
            "object per line), .json (a list of objects) or .parquet (one row per record)"
        )
    if not path.is_file():
        raise FileNotFoundError(
            f"data file {str(path)!r} does not exist"
            + (" (it is a directory)" if path.is_dir() else "")
            + "; check data.train_files / data.val_files (relative paths are resolved "
            f"against the working directory {str(Path.cwd())!r})"
        )
    if suffix == ".parquet":
        return _read_parquet(path)
    records: list[_Record] = []
    with path.open(encoding="utf-8") as f:
        if suffix == ".jsonl":
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                location = f"{path}:{line_no}"
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{location}: invalid JSON ({exc.msg})") from exc
                if not isinstance(obj, dict):
                    raise DatasetError(
                        f"{location}: expected a JSON object, got {type(obj).__name__}"
                    )
                records.append(_Record(location, obj))
            return records
        try:
            loaded = json.load(f)
        except json.JSONDecodeError as exc:
            raise DatasetError(
                f"{path}:{exc.lineno}: invalid JSON ({exc.msg}); a .jsonl file needs the "
                ".jsonl suffix"
            ) from exc
    objects = loaded if isinstance(loaded, list) else [loaded]
    for i, obj in enumerate(objects):
        location = f"{path} record {i}"
        if not isinstance(obj, dict):
            raise DatasetError(f"{location}: expected a JSON object, got {type(obj).__name__}")
        records.append(_Record(location, obj))
    return records


def _read_parquet(path: Path) -> list[_Record]:
    """The rows of a parquet file (as the hubs publish RL datasets), read with pyarrow.

    Columns become keys; list columns become lists, so an answer column of
    lists works as in json.
    """
    import pyarrow.parquet as pq  # only parquet files need it

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several error types for bad files
        raise DatasetError(f"{path}: not a readable parquet file ({exc})") from exc
    return [_Record(f"{path} row {i}", row) for i, row in enumerate(rows)]


def _field(record: _Record, key: str, what: str) -> Any:
    """``record.data[key]``, the record's ``what`` (``"prompt"`` or ``"answer"``)."""
    if key not in record.data:
        raise DatasetError(
            f"{record.location}: record has no {what} key {key!r} (data.{what}_key); "
            f"available keys: {sorted(record.data)}. Set data.{what}_key to the key that "
            f"holds the {what}"
        )
    return record.data[key]


def _answers_of(record: _Record, key: str) -> list[str]:
    value = _field(record, key, "answer")
    values = value if isinstance(value, list) else [value]
    answers: list[str] = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise DatasetError(
                f"{record.location}: answer {key!r} must be a string, a number or a list "
                f"of them, got {type(v).__name__}: {v!r:.60}"
            )
        answers.append(str(v))
    if not answers:
        raise DatasetError(f"{record.location}: answer {key!r} is an empty list")
    return answers


def _check_inputs(
    files: Sequence[str | Path], tokenizer: PreTrainedTokenizerBase, cfg: DataConfig
) -> None:
    """Refuses an empty file list and a tokenizer the config cannot use.

    Raises:
        ValueError: No files, no pad token, or a chat template asked for but missing.
    """
    if not files:
        raise ValueError(
            "no data files given; set data.train_files (and data.val_files) to a list "
            "of .jsonl/.json files"
        )
    if tokenizer.pad_token_id is None:
        raise ValueError(
            f"tokenizer {type(tokenizer).__name__} has no pad token, which left padding "
            "needs; set one before building the dataset, e.g. "
            "tokenizer.pad_token = tokenizer.eos_token"
        )
    if cfg.apply_chat_template and not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "data.apply_chat_template is true but the tokenizer has no chat_template; "
            "use a tokenizer (model) with a chat template, or set "
            "data.apply_chat_template=false and put ready-to-tokenize prompts in the data"
        )


class MathDataset(Dataset[MathItem]):
    """Math prompts with their reference answers, tokenized at load time.

    Example:
        >>> cfg = DataConfig(train_files=["train.jsonl"], max_prompt_length=256)  # doctest: +SKIP
        >>> ds = MathDataset(cfg.train_files, tokenizer, cfg)  # doctest: +SKIP
        >>> batch = ds.collate([ds[0], ds[1]])  # doctest: +SKIP
    """

    def __init__(
        self,
        files: Sequence[str | Path],
        tokenizer: PreTrainedTokenizerBase,
        cfg: DataConfig,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        """Load, template, tokenize and length-check every record of ``files``.

        Args:
            files: ``.jsonl``/``.json`` files, read in order and concatenated.
            tokenizer: A Hugging Face tokenizer with a pad token.
            cfg: The ``data`` config (keys, template, length limit, filtering).
            tools: Function schemas the chat template renders into every prompt
                (its ``tools`` argument; agentic runs), or None.

        Raises:
            ValueError: If ``files`` is empty or the tokenizer has no pad token.
            FileNotFoundError: If a file does not exist.
            DatasetError: If a record lacks a key or has a bad value, a prompt is too long
                (with filtering off), or nothing is left after filtering.
        """
        _check_inputs(files, tokenizer, cfg)
        self.cfg = cfg
        self.tools: list[dict[Any, Any] | Callable[..., Any]] | None = (
            list(tools) if tools else None
        )
        self.files = [Path(f) for f in files]
        self.pad_token_id: int = int(tokenizer.pad_token_id)
        records = [rec for path in self.files for rec in _read_records(path)]
        if not records:
            raise DatasetError(f"no records in {[str(p) for p in self.files]}")

        prompts = [self._prompt_text(rec, tokenizer) for rec in records]
        answers = [_answers_of(rec, cfg.answer_key) for rec in records]
        token_ids = self._encode(prompts, tokenizer)

        self._prompts: list[str] = []
        self._ids: list[np.ndarray[Any, np.dtype[np.int32]]] = []
        self._answers: list[list[str]] = []
        self._locations: list[str] = []
        limit = cfg.max_prompt_length
        for i, (rec, ids) in enumerate(zip(records, token_ids, strict=True)):
            if len(ids) == 0:
                raise DatasetError(f"{rec.location}: the prompt is empty after tokenization")
            if len(ids) > limit:
                if cfg.filter_overlong:
                    continue
                raise DatasetError(
                    f"prompt {i} ({rec.location}) has {len(ids)} tokens, more than "
                    f"data.max_prompt_length={limit}; raise data.max_prompt_length or set "
                    "data.filter_overlong=true to drop such prompts"
                )
            self._prompts.append(prompts[i])
            self._ids.append(ids)
            self._answers.append(answers[i])
            self._locations.append(rec.location)
        self.num_filtered = len(records) - len(self._prompts)
        """Prompts dropped for being longer than ``max_prompt_length``."""
        if not self._prompts:
            raise DatasetError(
                f"all {len(records)} prompts are longer than data.max_prompt_length={limit} "
                "tokens; raise data.max_prompt_length"
            )
        if self.num_filtered:
            _log.warning(
                "dropped %d of %d prompts longer than data.max_prompt_length=%d tokens "
                "(data.filter_overlong=true)",
                self.num_filtered,
                len(records),
                limit,
            )
        _log.info("loaded %d math prompts from %d file(s)", len(self._prompts), len(self.files))

    @classmethod
    def from_config(
        cls,
        cfg: DataConfig,
        tokenizer: PreTrainedTokenizerBase,
        split: str = "train",
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> MathDataset:
        """Build the ``train`` or ``val`` dataset named by ``cfg``.

        Args:
            cfg: The ``data`` config.
            tokenizer: A tokenizer with a pad token.
            split: ``"train"`` (``cfg.train_files``) or ``"val"`` (``cfg.val_files``).
            tools: Function schemas for the chat template (see :class:`MathDataset`).

        Returns:
            The dataset.

        Raises:
            ValueError: If ``split`` is unknown, or as :class:`MathDataset` does.
        """
        if split not in ("train", "val"):
            raise ValueError(f"split={split!r} must be 'train' or 'val'")
        files = cfg.train_files if split == "train" else cfg.val_files
        if not files:
            raise ValueError(f"data.{split}_files is empty; list the .jsonl/.json files")
        return cls(files, tokenizer, cfg, tools)

    def _prompt_text(self, record: _Record, tokenizer: PreTrainedTokenizerBase) -> str:
        key = self.cfg.prompt_key
        prompt = _field(record, key, "prompt")
        is_chat = isinstance(prompt, list) and all(
            isinstance(m, dict) and "role" in m and "content" in m for m in prompt
        )
        if not (isinstance(prompt, str) or (is_chat and prompt)):
            raise DatasetError(
                f"{record.location}: prompt {key!r} must be a string or a non-empty list of "
                f"{{'role', 'content'}} messages, got {type(prompt).__name__}: {prompt!r:.60}"
            )
        if not self.cfg.apply_chat_template:
            if not isinstance(prompt, str):
                raise DatasetError(
                    f"{record.location}: prompt {key!r} is a list of chat messages; set "
                    "data.apply_chat_template=true to render it with the chat template"
                )
            return prompt
        messages: list[dict[str, str]] = (
            [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        )
        if self.cfg.system_prompt is not None and messages[0].get("role") != "system":
            messages = [{"role": "system", "content": self.cfg.system_prompt}, *messages]
        text = tokenizer.apply_chat_template(
            messages, tools=self.tools, add_generation_prompt=True, tokenize=False
        )
        if not isinstance(text, str):  # pragma: no cover - tokenize=False returns text
            raise DatasetError(f"{record.location}: the chat template did not return text")
        return text

    def _encode(
        self, prompts: list[str], tokenizer: PreTrainedTokenizerBase
    ) -> list[np.ndarray[Any, np.dtype[np.int32]]]:
        add_special = not self.cfg.apply_chat_template
        out: list[np.ndarray[Any, np.dtype[np.int32]]] = []
        for start in range(0, len(prompts), _ENCODE_CHUNK):
            chunk = prompts[start : start + _ENCODE_CHUNK]
            encoded = tokenizer(chunk, add_special_tokens=add_special)["input_ids"]
            out.extend(np.asarray(ids, dtype=np.int32) for ids in encoded)
        return out

    def __len__(self) -> int:
        return len(self._prompts)

    def __getitem__(self, index: int) -> MathItem:
        """Return item ``index`` (0 <= index < len).

        Args:
            index: The position.

        Returns:
            The prompt, its token ids, its answers and ``index``.

        Raises:
            IndexError: If ``index`` is out of range.
        """
        if not 0 <= index < len(self._prompts):
            raise IndexError(f"index {index} is out of range for {len(self)} prompts")
        return MathItem(
            prompt=self._prompts[index],
            prompt_ids=self._ids[index].tolist(),
            answers=list(self._answers[index]),
            index=index,
        )

    def source(self, index: int) -> str:
        """Where item ``index`` came from: ``"file.jsonl:LINE"`` or ``"file.json record N"``.

        Args:
            index: The position.

        Returns:
            The file and line (or record number).
        """
        return self._locations[index]

    def collate(self, items: Sequence[MathItem]) -> MathBatch:
        """:func:`collate_left_padded` with this dataset's pad token (a DataLoader ``collate_fn``).

        Args:
            items: The items of one batch.

        Returns:
            The left-padded batch.
        """
        return collate_left_padded(items, self.pad_token_id)
