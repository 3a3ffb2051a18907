"""Tool calls in model output: the Hermes/Qwen ``<tool_call>{json}</tool_call>`` format.

:func:`parse_tool_calls` finds every ``<tool_call>...</tool_call>`` block of a
generated turn and returns one :class:`ToolCall` per block, or a
:class:`MalformedCall` that says what is wrong (bad JSON, no ``name``,
``arguments`` not an object, an unclosed tag). Malformed calls are results,
not exceptions: the agent loop turns them into error observations the model
sees, as a tool error would be.

Another format plugs in as any callable ``str -> list[ToolCall | MalformedCall]``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CALL_CLOSE", "CALL_OPEN", "MalformedCall", "ToolCall", "parse_tool_calls"]

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
"""The closing tag; generation stops after it so the tool can answer."""

_BLOCK = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.S)


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: a tool name and its arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MalformedCall:
    """A ``<tool_call>`` block that is not a call; ``reason`` says why, ``text`` is the block."""

    reason: str
    text: str


def parse_tool_calls(text: str) -> list[ToolCall | MalformedCall]:
    """Every tool call in ``text``, in order (empty when the turn calls no tool).

    Args:
        text: One generated turn.

    Returns:
        A :class:`ToolCall` per well-formed block, a :class:`MalformedCall` per other
        block, and a :class:`MalformedCall` for an opening tag that is never closed.
    """
    calls: list[ToolCall | MalformedCall] = [
        _parse_block(m.group(1)) for m in _BLOCK.finditer(text)
    ]
    tail = _BLOCK.sub("", text)
    if CALL_OPEN in tail:
        start = tail.index(CALL_OPEN)
        calls.append(MalformedCall(f"{CALL_OPEN} is never closed by {CALL_CLOSE}", tail[start:]))
    return calls


def _parse_block(body: str) -> ToolCall | MalformedCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return MalformedCall(f"the call is not valid JSON ({exc.msg} at char {exc.pos})", body)
    if not isinstance(obj, dict):
        return MalformedCall(f"the call must be a JSON object, got {type(obj).__name__}", body)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return MalformedCall('the call has no "name" string', body)
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return MalformedCall('"arguments" is a string that is not JSON', body)
    if not isinstance(arguments, dict):
        return MalformedCall(
            f'"arguments" must be a JSON object, got {type(arguments).__name__}', body
        )
    return ToolCall(name, arguments)
