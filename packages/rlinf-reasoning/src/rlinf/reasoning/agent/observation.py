"""Tool answers as observation tokens, in the model's chat template.

The text that follows a tool call is whatever the chat template renders
between an assistant turn and the next assistant turn when a ``tool`` message
sits between them (for Qwen2.5: ``<|im_end|>`` closing the assistant turn, a
``user`` turn holding ``<tool_response>...</tool_response>``, and the
generation prompt of the next assistant turn). :func:`template_from_chat`
reads that text off the template once, by rendering a conversation with
marker strings and cutting at them; ``agent.observation_template`` overrides
it for templates without a tool role.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ObservationFormatter", "template_from_chat"]

_TURN = "\ue000RLINF_TURN\ue000"
_OBS = "\ue001RLINF_OBSERVATION\ue001"
_KEY = "agent.observation_template"


def template_from_chat(tokenizer: Any) -> str:
    """The observation text around ``{content}``, read off ``tokenizer``'s chat template.

    Raises:
        ValueError: The tokenizer has no chat template, or it cannot render a
            ``tool`` message after an assistant turn (names the key to set instead).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{_KEY} is null and the tokenizer has no chat_template to format tool answers; "
            f"set {_KEY}, e.g. '<tool_response>{{content}}</tool_response>'"
        )
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": _TURN},
        {"role": "tool", "content": _OBS},
    ]
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # jinja errors of templates without a tool role
        raise ValueError(
            f"the chat template cannot render a tool message ({type(exc).__name__}: {exc}); "
            f"set {_KEY}, e.g. '<tool_response>{{content}}</tool_response>'"
        ) from exc
    if not isinstance(text, str) or _TURN not in text or _OBS not in text.split(_TURN, 1)[1]:
        raise ValueError(
            "the chat template drops the assistant turn or the tool message; "
            f"set {_KEY}, e.g. '<tool_response>{{content}}</tool_response>'"
        )
    after = text.split(_TURN, 1)[1]
    prefix, suffix = after.split(_OBS, 1)
    return prefix + "{content}" + suffix


class ObservationFormatter:
    """Encodes a tool's answer as the observation tokens that follow a tool call.

    Args:
        tokenizer: The run's tokenizer.
        template: Text around ``{content}``; None reads it off the chat template.
        max_chars: The answer is cut to this many characters first.
    """

    def __init__(self, tokenizer: Any, template: str | None, max_chars: int) -> None:
        self.tokenizer = tokenizer
        self.template = template if template is not None else template_from_chat(tokenizer)
        self.prefix, self.suffix = self.template.split("{content}", 1)
        self.max_chars = max_chars

    def __call__(self, content: str) -> list[int]:
        """The observation token ids of ``content``."""
        if len(content) > self.max_chars:
            content = content[: self.max_chars] + "...(truncated)"
        text = self.prefix + content + self.suffix
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return [int(i) for i in ids]
