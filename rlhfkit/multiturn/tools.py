"""Tools the policy may call during a rollout: plain Python functions with type hints and a docstring.

A tool's JSON schema (name, description, parameters) is what the chat template shows the model. A call is
parsed from the model's reply, run with a timeout, and its result (text; other values as JSON) goes back as a
``tool`` message. Everything that can go wrong with a call — a reply that does not parse, an unknown tool,
bad arguments, an exception, a timeout, a result that cannot be written as text — becomes an error message
to the model instead, and the rollout goes on; the trainer counts them in ``rollout/tool_errors``.
"""

from __future__ import annotations

import inspect
import json
import re
import threading
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlhfkit.errors import UserError, option
from rlhfkit.userfiles import load_object, split_spec

JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}
TAG_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


@dataclass
class Tool:
    """A callable and its schema (the ``{"type": "function", "function": {...}}`` form chat templates take)."""

    name: str
    fn: Callable
    schema: dict

    @classmethod
    def from_function(cls, fn: Callable) -> Tool:
        return cls(getattr(fn, "__name__", type(fn).__name__), fn, function_schema(fn))


def function_schema(fn: Callable) -> dict:
    """The JSON schema of ``fn`` from its signature, type hints and docstring: the description is the
    docstring's first paragraph, and an ``Args:`` section (Google style) describes the parameters."""
    name = getattr(fn, "__name__", type(fn).__name__)
    doc = inspect.getdoc(fn) or ""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations: the schema goes without types
        hints = {}
    described = _arg_descriptions(doc)
    properties, required = {}, []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        prop = _json_type(hints.get(param.name))
        if param.name in described:
            prop["description"] = described[param.name]
        properties[param.name] = prop
        if param.default is param.empty:
            required.append(param.name)
    description = doc.split("\n\n")[0].replace("\n", " ").strip()
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def _json_type(hint) -> dict:
    if hint is None:
        return {}
    origin = typing.get_origin(hint) or hint
    if origin in JSON_TYPES:
        out = {"type": JSON_TYPES[origin]}
        args = typing.get_args(hint)
        if origin is list and args and args[0] in JSON_TYPES:
            out["items"] = {"type": JSON_TYPES[args[0]]}
        return out
    if origin is typing.Union:
        kinds = [JSON_TYPES[a] for a in typing.get_args(hint) if a in JSON_TYPES]
        return {"type": kinds} if kinds else {}
    return {}


def _arg_descriptions(doc: str) -> dict[str, str]:
    """``name: description`` lines of a docstring's ``Args:`` section."""
    out: dict[str, str] = {}
    section = re.split(r"^\s*(?:Args|Arguments|Parameters):\s*$", doc, maxsplit=1, flags=re.MULTILINE)
    if len(section) < 2:
        return out
    for line in section[1].splitlines():
        if not line.strip():
            continue
        if re.match(r"^\S", line) and not re.match(r"^\w+\s*(\(.*\))?:", line):
            break  # the next section
        match = re.match(r"^\s*(\w+)\s*(?:\(.*?\))?:\s*(.*)$", line)
        if match:
            out[match.group(1)] = match.group(2).strip()
    return out


def load_tools(specs: list) -> list[Tool]:
    """The tools of ``--tool`` (``FILE.py:NAME`` strings, or callables through the Python API)."""
    tools = []
    for spec in specs:
        if isinstance(spec, str):
            path, name = split_spec("tool", spec)
            fn = load_object("tool", spec, Path(path), name)
        else:
            fn = spec
        tools.append(Tool.from_function(fn))
    names = [t.name for t in tools]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"{option('tool')}: two tools are named {', '.join(twice)}")
    return tools


@dataclass
class ToolCall:
    """A parsed call, or the error message that stands for one that did not parse (``name`` then empty)."""

    name: str = ""
    arguments: dict | None = None
    error: str = ""


def parse_tool_calls(text: str, tool_format: str = "tags") -> list[ToolCall]:
    """The tool calls of a reply (empty: the reply is a final answer).

    tags: each ``<tool_call>...</tool_call>`` holds one JSON object ``{"name", "arguments"}`` or a list of
    them (an unclosed last tag counts: a reply may stop at the end-of-turn token before it). json: the first
    JSON object in the reply that has a "name" key, anywhere in the text.
    """
    if tool_format == "json":
        found = _first_json_object(text)
        return [_call_from(found)] if found is not None else []
    calls = []
    for body in TAG_CALL.findall(text):
        try:
            value = json.loads(body.strip())
        except ValueError as exc:
            calls.append(ToolCall(error=f"the tool call is not valid JSON ({exc.msg} at character {exc.pos})"))
            continue
        for item in value if isinstance(value, list) else [value]:
            calls.append(_call_from(item))
    return calls


def _first_json_object(text: str):
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict) and "name" in value:
            return value
    return None


def _call_from(item) -> ToolCall:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return ToolCall(error='a tool call needs a "name" (and an "arguments" object)')
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return ToolCall(name=item["name"], error=f"the arguments of '{item['name']}' are not a JSON object")
    if not isinstance(arguments, dict):
        return ToolCall(name=item["name"], error=f"the arguments of '{item['name']}' are not a JSON object")
    return ToolCall(name=item["name"], arguments=arguments)


@dataclass
class ToolResult:
    content: str
    error: bool


def result_text(value) -> str:
    """A tool's return value as the text of its message: strings as they are, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value)


def run_tool_calls(calls: list[ToolCall], tools: dict[str, Tool], timeout: float) -> list[ToolResult]:
    """Run the calls concurrently, each in a daemon thread given ``timeout`` seconds; returns one result per
    call, in order. A call still running after its time is abandoned (Python cannot stop a thread; as a
    daemon it does not keep the process alive) and reported as timed out."""
    results: list[ToolResult | None] = [None] * len(calls)
    threads = []
    for i, call in enumerate(calls):
        if call.error:
            results[i] = ToolResult(f"error: {call.error}", True)
        elif call.name not in tools:
            known = ", ".join(sorted(tools)) or "none"
            results[i] = ToolResult(f"error: there is no tool '{call.name}' (the tools are: {known})", True)
        else:
            thread = threading.Thread(target=_run_one, args=(tools[call.name], call, results, i), daemon=True)
            thread.start()
            threads.append((i, thread))
    deadline = time.monotonic() + timeout
    for i, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive() or results[i] is None:
            results[i] = ToolResult(f"error: the tool '{calls[i].name}' did not finish within {timeout:g} s", True)
    return list(results)  # a copy: an abandoned thread that finishes later writes into the old list only


def _run_one(tool: Tool, call: ToolCall, results: list, i: int) -> None:
    try:
        inspect.signature(tool.fn).bind(**call.arguments)
    except TypeError as exc:
        results[i] = ToolResult(f"error: bad arguments for '{tool.name}': {exc}", True)
        return
    try:
        value = tool.fn(**call.arguments)
    except Exception as exc:  # the user's tool: its failure is a message to the model
        detail = str(exc).splitlines()[0] if str(exc) else ""
        message = f"error: '{tool.name}' raised {type(exc).__name__}" + (f": {detail}" if detail else "")
        results[i] = ToolResult(message, True)
        return
    try:
        results[i] = ToolResult(result_text(value), False)
    except (TypeError, ValueError):
        kind = type(value).__name__
        results[i] = ToolResult(f"error: '{tool.name}' returned a {kind}, which is not text or JSON", True)
