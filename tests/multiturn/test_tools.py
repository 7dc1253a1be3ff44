"""Tools: schemas from type hints and docstrings, parsing calls from replies, and running them: every way a
call can fail becomes an error message to the model, and a hanging tool is abandoned after its timeout."""

from __future__ import annotations

import time

import pytest

from rlhfkit.errors import UserError
from rlhfkit.multiturn.tools import Tool, function_schema, load_tools, parse_tool_calls, run_tool_calls
from tests.multiturn.scripted import TOOLS


@pytest.fixture
def tool_file(tmp_path):
    path = tmp_path / "tools.py"
    path.write_text(TOOLS)
    return path


def test_a_schema_comes_from_the_signature_the_hints_and_the_docstring():
    def lookup(city: str, days: int = 1, units: list[str] | None = None) -> str:
        """Weather forecast for a city.

        More text that is not the description.

        Args:
            city: the city's name
            days (int): how many days ahead
        """
        return ""

    schema = function_schema(lookup)["function"]
    assert schema["name"] == "lookup"
    assert schema["description"] == "Weather forecast for a city."
    props = schema["parameters"]["properties"]
    assert props["city"] == {"type": "string", "description": "the city's name"}
    assert props["days"] == {"type": "integer", "description": "how many days ahead"}
    assert schema["parameters"]["required"] == ["city"]


def test_calls_parse_from_tags_lists_and_bare_json():
    [call] = parse_tool_calls('sure <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    assert (call.name, call.arguments, call.error) == ("add", {"a": 1, "b": 2}, "")
    two = parse_tool_calls('<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": "{}"}]</tool_call>')
    assert [c.name for c in two] == ["a", "b"] and all(not c.error for c in two)
    # a reply may stop at the end-of-turn token before the closing tag
    assert parse_tool_calls('<tool_call>{"name": "a", "arguments": {}}')[0].name == "a"
    assert parse_tool_calls("the answer is 5") == []  # no call: a final answer
    assert "not valid JSON" in parse_tool_calls("<tool_call>{name: add}</tool_call>")[0].error
    assert '"name"' in parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')[0].error
    [bare] = parse_tool_calls('I will call {"name": "add", "arguments": {"a": 1}} now', "json")
    assert bare.arguments == {"a": 1}


def test_every_failing_call_becomes_an_error_message_and_the_others_still_run(tool_file):
    tools = {t.name: t for t in load_tools([f"{tool_file}:{n}" for n in ("add", "broken", "opaque")])}
    calls = parse_tool_calls(
        '<tool_call>[{"name": "add", "arguments": {"a": 2, "b": 3}}, {"name": "broken", "arguments": {"a": 1}},'
        ' {"name": "opaque", "arguments": {"a": 1}}, {"name": "nope", "arguments": {}},'
        ' {"name": "add", "arguments": {"c": 1}}]</tool_call><tool_call>{oops</tool_call>'
    )
    results = run_tool_calls(calls, tools, timeout=5)
    assert [r.error for r in results] == [False, True, True, True, True, True]
    assert results[0].content == "5"
    assert results[1].content == "error: 'broken' raised ValueError: no luck"
    assert "not text or JSON" in results[2].content
    assert "no tool 'nope'" in results[3].content and "add, broken, opaque" in results[3].content
    assert results[4].content.startswith("error: bad arguments for 'add'")
    assert "not valid JSON" in results[5].content


def test_a_hanging_tool_is_abandoned_after_its_timeout(tool_file):
    tools = {t.name: t for t in load_tools([f"{tool_file}:slow", f"{tool_file}:add"])}
    calls = parse_tool_calls(
        '<tool_call>[{"name": "slow", "arguments": {"a": 1}}, {"name": "add", "arguments": {"a": 1, "b": 1}}]'
        "</tool_call>"
    )
    start = time.perf_counter()
    results = run_tool_calls(calls, tools, timeout=0.3)
    assert time.perf_counter() - start < 2
    assert results[0].error and "did not finish within 0.3 s" in results[0].content
    assert results[1].content == "2"


def test_results_that_are_not_strings_go_back_as_json():
    tool = Tool.from_function(lambda: {"temperature": 21.5, "sky": "clear"})
    [result] = run_tool_calls(parse_tool_calls('<tool_call>{"name": "<lambda>"}</tool_call>'), {tool.name: tool}, 1)
    assert result.content == '{"temperature": 21.5, "sky": "clear"}' and not result.error


def test_bad_tool_options_are_one_line_errors(tool_file, tmp_path):
    with pytest.raises(UserError, match="--tool .*: give it as FILE.py:NAME"):
        load_tools([str(tool_file)])
    with pytest.raises(UserError, match="has no 'missing'"):
        load_tools([f"{tool_file}:missing"])
    with pytest.raises(UserError, match="two tools are named add"):
        load_tools([f"{tool_file}:add", f"{tool_file}:add"])
