"""The ``data`` config section of a reasoning run."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from rlinf.core.config import RLinfModel

__all__ = ["DataConfig"]


class DataConfig(RLinfModel):
    """Where the math prompts come from and how they are prepared (``data``).

    Unknown keys are errors. Files are ``.jsonl`` (one JSON object per line),
    ``.json`` (a list of objects, or one object) or ``.parquet`` (one row per record,
    one column per key).
    """

    train_files: list[Path] = Field(
        default_factory=list, description="Training data files (.jsonl, .json or .parquet)."
    )
    val_files: list[Path] = Field(
        default_factory=list, description="Validation data files (.jsonl, .json or .parquet)."
    )
    prompt_key: str = Field(
        "problem",
        min_length=1,
        description="Record key of the prompt: a string, or a list of chat messages.",
    )
    answer_key: str = Field(
        "answer",
        min_length=1,
        description="Record key of the answer: a string, a number or a list of them.",
    )
    max_prompt_length: int = Field(
        1024, ge=1, description="Longest prompt in tokens (after the chat template)."
    )
    apply_chat_template: bool = Field(
        False,
        description="Wrap each prompt with the tokenizer's chat template (generation prompt on).",
    )
    system_prompt: str | None = Field(
        None, description="System message put first when the chat template is applied."
    )
    filter_overlong: bool = Field(
        True,
        description=(
            "Drop prompts longer than max_prompt_length (the count is logged); "
            "false makes such a prompt an error."
        ),
    )
    shuffle: bool = Field(True, description="Shuffle the training order each epoch.")
    seed: int = Field(42, ge=0, description="Seed of the shuffling.")

    @model_validator(mode="after")
    def _check_system_prompt(self) -> DataConfig:
        if self.system_prompt is not None and not self.apply_chat_template:
            raise ValueError(
                "data.system_prompt is set but data.apply_chat_template is false, so the "
                "system prompt would be ignored; set data.apply_chat_template=true or "
                "remove data.system_prompt"
            )
        return self
