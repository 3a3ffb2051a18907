"""Tool calls: parsing the Hermes format, and every bad call becoming an observation.

The tools run for real (a pebble process per call; the ``python`` tool in the
sandbox). The tool functions are module level so they pickle into the call's
process.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from rlinf.reasoning.tools.parsing import MalformedCall, ToolCall, parse_tool_calls
from rlinf.reasoning.tools.registry import Tool, ToolRegistry, python_tool
from rlinf.reasoning.tools.sandbox import SandboxUnavailable, check_sandbox

ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


def add(a: int, b: int) -> str:
    return str(a + b)


def explode() -> str:
    raise ValueError("the tool broke")


def hang(pid_file: str) -> str:
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(3600)
    return "never"


def registry() -> ToolRegistry:
    return ToolRegistry(
        [
            Tool("add", "Adds two integers.", ADD_SCHEMA, add),
            Tool("explode", "Raises.", {"type": "object"}, explode),
            Tool(
                "hang",
                "Never answers.",
                {"type": "object", "properties": {"pid_file": {"type": "string"}}},
                hang,
                timeout_s=5.0,  # room for the process to start and write its pid
            ),
        ]
    )


def test_parse_finds_every_call_in_order() -> None:
    text = (
        "Let me add. <tool_call>\n"
        '{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call> and '
        '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}</tool_call>'
    )
    assert parse_tool_calls(text) == [
        ToolCall("add", {"a": 2, "b": 3}),
        ToolCall("search", {"query": "x"}),
    ]
    assert parse_tool_calls("no calls here") == []


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ("<tool_call>[1, 2]</tool_call>", "must be a JSON object, got list"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name" string'),
        ('<tool_call>{"name": "add", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "add", "arguments": "{x"}</tool_call>', "string that is not JSON"),
        ('<tool_call>{"name": "add"', "never closed"),
    ],
)
def test_malformed_calls_say_why(text: str, reason: str) -> None:
    (call,) = parse_tool_calls(text)
    assert isinstance(call, MalformedCall) and reason in call.reason


def test_a_good_call_answers_and_the_schemas_are_for_the_chat_template() -> None:
    tools = registry()
    result = tools.call(ToolCall("add", {"a": 2, "b": 40}))
    assert (result.content, result.error) == ("42", None)
    schema = tools.schemas()[0]
    assert schema["type"] == "function" and schema["function"]["name"] == "add"
    assert schema["function"]["parameters"] == ADD_SCHEMA


def test_every_bad_call_becomes_an_error_observation(tmp_path: Path) -> None:
    tools = registry()
    malformed = tools.call(parse_tool_calls("<tool_call>{oops}</tool_call>")[0])
    assert malformed.error == "malformed" and "not valid JSON" in malformed.content
    unknown = tools.call(ToolCall("multiply", {"a": 1}))
    assert unknown.error == "unknown_tool"
    assert "'multiply'" in unknown.content and "['add', 'explode', 'hang']" in unknown.content
    wrong = tools.call(ToolCall("add", {"a": 1, "b": "two"}))
    assert wrong.error == "bad_arguments" and "(b)" in wrong.content and "integer" in wrong.content
    missing = tools.call(ToolCall("add", {"a": 1}))
    assert missing.error == "bad_arguments" and "'b' is a required property" in missing.content
    raised = tools.call(ToolCall("explode", {}))
    assert raised.error == "raised" and "ValueError: the tool broke" in raised.content


def test_a_hung_tool_times_out_and_its_process_is_gone(tmp_path: Path) -> None:
    pid_file = f"{tmp_path}/pid"
    result = registry().call(ToolCall("hang", {"pid_file": pid_file}))
    assert result.error == "timeout" and "within 5 s" in result.content
    with open(pid_file) as f:
        pid = int(f.read())
    deadline = time.monotonic() + 60  # a poll for the kill, not a speed check
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}"), "the hung tool's process is still running"


def test_a_bad_schema_or_a_second_tool_of_a_name_is_refused() -> None:
    tools = registry()
    with pytest.raises(ValueError, match="already registered"):
        tools.register(Tool("add", "again", ADD_SCHEMA, add))
    with pytest.raises(Exception, match=r"is not valid under any of the given schemas|not of type"):
        ToolRegistry([Tool("bad", "bad schema", {"type": 12}, add)])


def test_the_python_tool_runs_code_in_the_sandbox() -> None:
    try:
        check_sandbox()
    except SandboxUnavailable as exc:
        pytest.skip(f"the sandbox cannot run here: {exc}")
    tools = ToolRegistry([python_tool()])
    result = tools.call(ToolCall("python", {"code": "print(123456789 * 987654321)"}))
    assert (result.content, result.error) == ("121932631112635269", None)
    failing = tools.call(ToolCall("python", {"code": "1/0"}))
    assert failing.error is None  # the program failed, the tool did not
    assert "ZeroDivisionError" in failing.content and "(exit status 1)" in failing.content
    extra = tools.call(ToolCall("python", {"code": "print(1)", "shell": True}))
    assert extra.error == "bad_arguments"


CORPUS = [
    {"title": "Zorbia", "text": "The capital of Zorbia is Quellport, a city on the Amber Sea."},
    {"title": "Quellport", "text": "Quellport has a harbour and a lighthouse built in 1811."},
    {"title": "Cats", "text": "Cats are small carnivorous mammals kept as pets."},
    {"text": "The Amber Sea freezes every winter."},
]


def test_the_search_tool_finds_the_passage_that_answers(tmp_path: Path) -> None:
    from rlinf.reasoning.tools.search import build_search_index, main, search_tool

    index = build_search_index(CORPUS, f"{tmp_path}/index")
    tools = ToolRegistry([search_tool(index, top_k=2)])
    result = tools.call(ToolCall("search", {"query": "What is the capital of Zorbia?"}))
    assert result.error is None
    first = result.content.splitlines()[0]
    assert first == "Doc 1 (Title: Zorbia) " + CORPUS[0]["text"]
    frozen = tools.call(ToolCall("search", {"query": "when does the amber sea freeze"}))
    assert frozen.content.splitlines()[0] == "Doc 1 " + CORPUS[3]["text"]
    assert tools.call(ToolCall("search", {"query": "the of a"})).content.startswith("No results")
    assert tools.call(ToolCall("search", {"query": ""})).error == "bad_arguments"

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in CORPUS), encoding="utf-8")
    assert main(["--corpus", str(corpus), "--out", f"{tmp_path}/cli_index"]) == 0
    assert search_tool(f"{tmp_path}/cli_index").name == "search"
    with pytest.raises(FileNotFoundError, match=r"no search index in .*build one with"):
        search_tool(f"{tmp_path}/missing")
    with pytest.raises(ValueError, match="corpus record 1 has no 'text' string"):
        build_search_index([{"text": "a"}, {"title": "no text"}], f"{tmp_path}/bad")
