"""The tools of a run, built from ``agent.tools`` (and the call parser from ``agent``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from rlinf.reasoning.agent.config import AgentConfig
from rlinf.reasoning.tools.parsing import MalformedCall, ToolCall, parse_tool_calls
from rlinf.reasoning.tools.registry import Tool, ToolRegistry, python_tool

__all__ = ["CallParser", "build_registry", "load_parser"]

CallParser = Callable[[str], list[ToolCall | MalformedCall]]
"""Finds the tool calls of one generated turn."""


def _import(spec: str, key: str) -> object:
    module_name, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(
            f"{key}: cannot import {spec!r} ({type(exc).__name__}: {exc}); write "
            "'package.module:function' with the module importable by every worker"
        ) from exc


def build_registry(cfg: AgentConfig) -> ToolRegistry:
    """The registry of ``cfg.tools``.

    Raises:
        ValueError: A tool that cannot be built (names ``agent.tools`` or
            ``agent.search_corpus`` and the fix).
        rlinf.reasoning.tools.sandbox.SandboxUnavailable: ``python`` without a sandbox.
    """
    registry = ToolRegistry()
    for name in cfg.tools:
        if name == "python":
            tool = python_tool(cfg.tool_timeout_s)
        elif name == "search":
            if cfg.search_corpus is None:
                raise ValueError(
                    "agent.tools has search but agent.search_corpus is null; build an index "
                    "with python -m rlinf.reasoning.tools.search --corpus FILE --out DIR and "
                    "set agent.search_corpus: DIR"
                )
            from rlinf.reasoning.tools.search import search_tool  # bm25s: only when used

            tool = search_tool(cfg.search_corpus, timeout_s=cfg.tool_timeout_s)
        else:
            factory = _import(name, "agent.tools")
            built = factory() if callable(factory) else factory
            if not isinstance(built, Tool):
                raise ValueError(
                    f"agent.tools: {name!r} gave {type(built).__name__}, not a "
                    "rlinf.reasoning.tools.Tool; return Tool(name, description, schema, fn)"
                )
            tool = built
        registry.register(tool)
    return registry


def load_parser(spec: str) -> CallParser:
    """``agent.tool_call_parser``: ``hermes`` or a ``module:function``."""
    if spec == "hermes":
        return parse_tool_calls
    parser = _import(spec, "agent.tool_call_parser")
    if not callable(parser):
        raise ValueError(f"agent.tool_call_parser: {spec!r} is not callable")
    return parser
