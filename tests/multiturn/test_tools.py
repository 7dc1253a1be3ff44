"""Tools: schemas from type hints and docstrings, parsing calls from replies, and running them: every way a
call can fail becomes an error message to the model, and a call that runs past its timeout is stopped, leaving no
thread or process behind."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading
import time
from multiprocessing import resource_tracker
from pathlib import Path

import pytest

from rlhfkit.errors import UserError
from rlhfkit.multiturn.tools import Tool, ToolRunner, function_schema, load_tools, parse_tool_calls, run_tool_calls
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


def _children() -> set[int]:
    """This process's child processes, zombies included (Linux: read from /proc; elsewhere multiprocessing's), but
    multiprocessing's resource tracker, which a spawned process starts once for the rest of the session."""
    if not Path("/proc/self/stat").is_file():
        return {p.pid for p in multiprocessing.active_children()}
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # after the name: state, parent pid, ...
        except (OSError, IndexError, ValueError):
            continue
        if parent == os.getpid() and int(stat.parent.name) != tracker:
            found.add(int(stat.parent.name))
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_calls_that_time_out_leave_no_thread_or_process_running(tool_file):
    tools = {t.name: t for t in load_tools([f"{tool_file}:slow"])}
    calls = parse_tool_calls('<tool_call>{"name": "slow", "arguments": {"a": 1}}</tool_call>')
    threads, children = set(threading.enumerate()), _children()
    for _ in range(50):
        [result] = run_tool_calls(calls, tools, timeout=0.02)
        assert "did not finish within 0.02 s" in result.content
    assert set(threading.enumerate()) - threads == set()
    assert _children() - children == set()


WORKER_TOOLS = '''
import os, subprocess, sys

calls = 0

def count() -> int:
    """How many calls this process has answered, and its id."""
    global calls
    calls += 1
    return [calls, os.getpid()]

def spawn_and_hang(path: str) -> str:
    """Starts a process that would run for a minute, writes its id to path, and waits for it."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(path, "w") as f:
        f.write(str(child.pid))
    child.wait()
    return "done"

def leave(code: int) -> str:
    """Ends the process it runs in."""
    os._exit(code)
'''


@pytest.fixture
def worker_tools(tmp_path):
    (tmp_path / "worker_tools.py").write_text(WORKER_TOOLS)
    names = ("count", "spawn_and_hang", "leave")
    return {t.name: t for t in load_tools([f"{tmp_path}/worker_tools.py:{n}" for n in names])}


def test_one_worker_serves_call_after_call_and_a_timeout_replaces_it(worker_tools, tmp_path):
    children = _children()
    runner = ToolRunner(worker_tools)
    count = parse_tool_calls('<tool_call>{"name": "count", "arguments": {}}</tool_call>')
    answers = [json.loads(runner.run(count, timeout=5)[0].content) for _ in range(3)]
    assert [n for n, _ in answers] == [1, 2, 3] and len({pid for _, pid in answers}) == 1  # one process, its state
    first = answers[0][1]
    assert first != os.getpid() and _children() - children == {first}

    call = {"name": "spawn_and_hang", "arguments": {"path": str(tmp_path / "pid")}}
    [result] = runner.run(parse_tool_calls(f"<tool_call>{json.dumps(call)}</tool_call>"), timeout=2)
    assert "did not finish within 2 s" in result.content and _children() - children == set()  # killed, reaped
    if sys.platform.startswith("linux"):  # the process the tool started went with it (its process group)
        started, deadline = int((tmp_path / "pid").read_text()), time.monotonic() + 10
        while _running(started) and time.monotonic() < deadline:  # a kill takes effect soon, not at once
            time.sleep(0.01)
        assert not _running(started)

    n, pid = json.loads(runner.run(count, timeout=5)[0].content)
    assert n == 1 and pid != first  # a new worker, its state fresh

    gone = parse_tool_calls('<tool_call>[{"name": "leave", "arguments": {"code": 3}}]</tool_call>')
    assert "ended before it returned" in runner.run(gone, timeout=5)[0].content
    assert json.loads(runner.run(count, timeout=5)[0].content)[0] == 1
    runner.close()
    assert _children() - children == set()


def test_a_spawned_worker_loads_file_tools_again_and_refuses_what_it_cannot_receive(worker_tools):
    children = _children()
    runner = ToolRunner(worker_tools, start_method="spawn")
    [result] = runner.run(parse_tool_calls('<tool_call>{"name": "count", "arguments": {}}</tool_call>'), 60)
    assert json.loads(result.content)[0] == 1 and not result.error
    runner.close()
    assert _children() - children == set()
    with pytest.raises(UserError, match="the tool '<lambda>' cannot be sent to the process tools run in"):
        ToolRunner({"<lambda>": Tool.from_function(lambda: 1)}, start_method="spawn")
