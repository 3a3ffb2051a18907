"""Tools by name, with JSON-schema arguments, called so that no failure escapes.

A :class:`Tool` is a name, a description, a JSON schema of its arguments and
a Python callable returning text. :class:`ToolRegistry` holds the tools of a
run: :meth:`ToolRegistry.schemas` is what a chat template's ``tools``
argument renders into the prompt, and :meth:`ToolRegistry.call` runs one call
and always returns a :class:`ToolResult`. An unknown tool, arguments that do
not match the schema (checked with ``jsonschema``), a tool that raises and a
tool that runs past its ``timeout_s`` all become an ``error`` the model reads
as the observation, never an exception in the rollout.

A tool runs in a pebble process of its own (a fresh process per call, so a
hung tool is killed at its timeout with nothing left running); its callable
and arguments must therefore be picklable (a module-level function). The
``python`` tool (:func:`python_tool`) runs model-written code in the sandbox
of :mod:`rlinf.reasoning.tools.sandbox`.

Writing a tool::

    def add(a: int, b: int) -> str:
        return str(a + b)

    registry = ToolRegistry([
        Tool("add", "Adds two integers.", {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        }, add),
    ])
    registry.call(ToolCall("add", {"a": 2, "b": 3})).content  # "5"
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import pebble

from rlinf.reasoning.tools.parsing import MalformedCall, ToolCall
from rlinf.reasoning.tools.sandbox import SandboxLimits, check_sandbox, run_python

__all__ = ["Tool", "ToolRegistry", "ToolResult", "python_tool"]


@dataclass(frozen=True)
class Tool:
    """One tool.

    Attributes:
        name: What the model writes in ``{"name": ...}``.
        description: One or two sentences for the prompt.
        parameters: JSON schema of the arguments object.
        fn: Called as ``fn(**arguments)``; returns the observation text. Module level
            (it is pickled into the call's process).
        timeout_s: Seconds before the call is killed and reported as timed out.
        in_thread: Call ``fn`` in the caller's thread instead of a process of its
            own: for tools that bound their own work (the ``python`` tool runs its
            program in the sandbox, with its own timeout; ``search`` is a quick
            lookup). Process calls are forked from a threaded executor, which the
            rare library does not survive: prefer this where the tool allows it.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., str]
    timeout_s: float = 10.0
    in_thread: bool = False

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema chat templates render (``tools=[...]``)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True)
class ToolResult:
    """What one call gave: ``content`` for the model, ``error`` set when it failed.

    Attributes:
        name: The tool called (as written by the model; ``""`` for a malformed call).
        content: The observation text (the error message when the call failed).
        error: None on success, else a short kind: ``malformed``, ``unknown_tool``,
            ``bad_arguments``, ``raised`` or ``timeout``.
        seconds: Wall time of the call.
    """

    name: str
    content: str
    error: str | None = None
    seconds: float = 0.0


@dataclass
class ToolRegistry:
    """The tools of a run, by name (see the module docstring)."""

    tools: Iterable[Tool] = ()
    _by_name: dict[str, Tool] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        for tool in self.tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        """Adds ``tool``; its schema must be a valid JSON schema and its name unique."""
        if tool.name in self._by_name:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        jsonschema.Draft202012Validator.check_schema(tool.parameters)
        self._by_name[tool.name] = tool

    @property
    def names(self) -> list[str]:
        """The registered tool names, sorted."""
        return sorted(self._by_name)

    def schemas(self) -> list[dict[str, Any]]:
        """Every tool's function schema, for the chat template's ``tools`` argument."""
        return [self._by_name[name].schema() for name in self.names]

    def call(self, call: ToolCall | MalformedCall) -> ToolResult:
        """Runs one call; every failure is a :class:`ToolResult` with ``error`` set."""
        if isinstance(call, MalformedCall):
            return ToolResult("", f"Error: malformed tool call: {call.reason}.", "malformed")
        tool = self._by_name.get(call.name)
        if tool is None:
            return ToolResult(
                call.name,
                f"Error: unknown tool {call.name!r}; the tools are {self.names}.",
                "unknown_tool",
            )
        try:
            jsonschema.validate(call.arguments, tool.parameters)
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "arguments"
            return ToolResult(
                call.name,
                f"Error: bad arguments for {call.name} ({where}): {exc.message}.",
                "bad_arguments",
            )
        if tool.in_thread:
            return _run_here(tool, call.arguments)
        return _run(tool, call.arguments)


def _raised(tool: Tool, exc: BaseException, started: float) -> ToolResult:
    """The tool's own failure, reported to the model."""
    message = f"Error: {tool.name} raised {type(exc).__name__}: {exc}"
    return ToolResult(tool.name, message, "raised", time.monotonic() - started)


def _run_here(tool: Tool, arguments: dict[str, Any]) -> ToolResult:
    """Runs ``tool`` in this thread (it bounds its own time)."""
    started = time.monotonic()
    try:
        content = tool.fn(**arguments)
    except Exception as exc:
        return _raised(tool, exc, started)
    return ToolResult(tool.name, str(content), None, time.monotonic() - started)


def _run(tool: Tool, arguments: dict[str, Any]) -> ToolResult:
    """Runs ``tool`` in a fresh process (killed at its timeout)."""
    started = time.monotonic()
    with pebble.ProcessPool(max_workers=1, max_tasks=1) as pool:
        future = pool.schedule(tool.fn, kwargs=arguments, timeout=tool.timeout_s)
        try:
            content = future.result()
        except FutureTimeout:
            return ToolResult(
                tool.name,
                f"Error: {tool.name} did not answer within {tool.timeout_s:g} s.",
                "timeout",
                time.monotonic() - started,
            )
        except Exception as exc:
            return _raised(tool, exc, started)
    return ToolResult(tool.name, str(content), None, time.monotonic() - started)


def _python(code: str, timeout_s: float) -> str:
    result = run_python(code, SandboxLimits(timeout_s=timeout_s))
    parts = [result.stdout]
    if result.stderr:
        parts.append(result.stderr)
    if result.timed_out:
        parts.append("(killed: the program ran past its time limit)")
    elif result.exit_code != 0:
        parts.append(f"(exit status {result.exit_code})")
    if result.truncated:
        parts.append("(output truncated)")
    return "\n".join(p for p in parts if p).strip() or "(no output)"


def python_tool(timeout_s: float = 15.0) -> Tool:
    """The ``python`` tool: runs ``code`` in the sandbox, returns what it printed.

    Raises:
        SandboxUnavailable: The sandbox cannot run here (at construction, so a run
            fails at start-up rather than at its first tool call).
    """
    check_sandbox()
    return Tool(
        "python",
        "Runs a Python 3 program (standard library only, no network, a few seconds) "
        "and returns what it printed. Print the values you need.",
        {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The program."}},
            "required": ["code"],
            "additionalProperties": False,
        },
        functools.partial(_python, timeout_s=timeout_s),
        timeout_s,
        in_thread=True,  # the sandbox kills the program at timeout_s
    )
