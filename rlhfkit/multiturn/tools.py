"""Tools the policy may call during a rollout: plain Python functions with type hints and a docstring.

A tool's JSON schema (name, description, parameters) is what the chat template shows the model. A call is
parsed from the model's reply, run with a timeout, and its result (text; other values as JSON) goes back as a
``tool`` message. Everything that can go wrong with a call — a reply that does not parse, an unknown tool,
bad arguments, an exception, a timeout, a result that cannot be written as text — becomes an error message
to the model instead, and the rollout goes on; the trainer counts them in ``rollout/tool_errors``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import multiprocessing
import os
import pickle
import re
import signal
import sys
import threading
import time
import typing
import weakref
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
    spec: str = ""
    """The ``FILE.py:NAME`` it was loaded from ("" for a callable given in Python)."""

    @classmethod
    def from_function(cls, fn: Callable, spec: str = "") -> Tool:
        return cls(getattr(fn, "__name__", type(fn).__name__), fn, function_schema(fn), spec)


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
            tools.append(Tool.from_function(load_object("tool", spec, Path(path), name), spec))
        else:
            tools.append(Tool.from_function(spec))
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
    """``ToolRunner.run`` in a runner of its own, stopped afterwards (a rollout keeps one runner for the run)."""
    runner = ToolRunner(tools)
    try:
        return runner.run(calls, timeout)
    finally:
        runner.close()


class ToolRunner:
    """Runs tool calls in a worker process, which a call that runs past its timeout takes down with it.

    Python cannot stop a thread, so a tool that hangs in the training process would keep running (and holding
    whatever it holds) for the rest of the run; a process can be killed. One worker serves call after call (the
    round trip costs far less than starting a process); when a call times out the worker is killed, with any
    process its tools started (its process group, on POSIX), and the next call starts a new one. A tool's
    module-level state therefore lives in the worker: it lasts from call to call, but not past a timeout.

    Where ``fork`` is safe (Linux and other POSIX systems but macOS) the worker is a fork of this process and takes
    the tools as they are: any callable, lambdas included. Elsewhere it is a fresh interpreter: a tool from
    ``FILE.py:NAME`` is loaded again there, and a callable given in Python must be picklable (a function at the
    top level of a module). The worker is daemonic, so a tool cannot start ``multiprocessing`` processes of its
    own (``subprocess`` is fine).
    """

    def __init__(self, tools: dict[str, Tool], start_method: str | None = None):
        self.tools = tools
        self.signatures = {name: inspect.signature(tool.fn) for name, tool in tools.items()}
        self.method = start_method or ("fork" if _fork_is_safe() else "spawn")
        self.context = multiprocessing.get_context(self.method)
        # what the worker is given: the tools themselves for a fork, else what loads them in a new interpreter
        forked = self.method == "fork"
        self.payload = {name: tool.spec if tool.spec and not forked else tool.fn for name, tool in tools.items()}
        if not forked:
            for name, source in self.payload.items():
                try:
                    pickle.dumps(source)
                except Exception as exc:
                    raise UserError(
                        f"{option('tool')}: the tool '{name}' cannot be sent to the process tools run in "
                        f"({type(exc).__name__}: {exc}); give it as FILE.py:NAME, or as a function defined at the "
                        "top level of a module"
                    ) from None
        self._worker: list = [None]  # (process, connection) of the running worker, or None
        weakref.finalize(self, _stop, self._worker)  # when the runner is dropped, and at exit

    def run(self, calls: list[ToolCall], timeout: float) -> list[ToolResult]:
        """Run the calls at the same time (threads of the worker), given ``timeout`` seconds together from when
        the worker has them; returns one result per call, in order. Calls still running then are reported as
        timed out and the worker is killed."""
        results: list[ToolResult | None] = [None] * len(calls)
        jobs = []
        for i, call in enumerate(calls):
            if call.error:
                results[i] = ToolResult(f"error: {call.error}", True)
            elif call.name not in self.tools:
                known = ", ".join(sorted(self.tools)) or "none"
                results[i] = ToolResult(f"error: there is no tool '{call.name}' (the tools are: {known})", True)
            else:
                try:
                    self.signatures[call.name].bind(**call.arguments)
                except TypeError as exc:
                    results[i] = ToolResult(f"error: bad arguments for '{call.name}': {exc}", True)
                    continue
                jobs.append((i, call.name, call.arguments))
        if not jobs:
            return results
        ended = False  # the worker died (a tool took the process down) before answering every call
        if self._worker[0] is None or not self._worker[0][0].is_alive():
            _stop(self._worker)  # a worker killed from outside between calls is replaced, not sent to
            self._start()
        conn = self._worker[0][1]
        try:
            conn.send(jobs)
        except OSError:
            ended = True
        deadline = time.monotonic() + timeout
        pending = {i for i, _, _ in jobs}
        while pending and not ended:
            left = deadline - time.monotonic()
            if left <= 0 or not conn.poll(left):
                break
            try:
                i, content, error = conn.recv()
            except (EOFError, OSError):
                ended = True
                break
            results[i] = ToolResult(content, error)
            pending.discard(i)
        if pending:
            _stop(self._worker)
            for i in sorted(pending):
                name = calls[i].name
                if ended:
                    results[i] = ToolResult(f"error: the process running '{name}' ended before it returned", True)
                else:
                    results[i] = ToolResult(f"error: the tool '{name}' did not finish within {timeout:g} s", True)
        return results

    def close(self) -> None:
        """Stop the worker (and whatever its tools started); a later call starts a new one."""
        _stop(self._worker)

    def _start(self) -> None:
        parent_end, child_end = self.context.Pipe()
        inherited = parent_end if self.method == "fork" else None  # a forked worker has a copy to close
        process = self.context.Process(
            target=_serve, args=(child_end, inherited, self.payload), name="rlhfkit-tools", daemon=True
        )
        process.start()
        child_end.close()  # the worker's end lives in the worker only: its death reads here as the end of the pipe
        try:
            ready = parent_end.recv()
        except (EOFError, OSError):
            ready = "the process tools run in ended while it started"
        if ready is not True:
            _stop([(process, parent_end)])
            raise UserError(f"{option('tool')}: {ready}")
        self._worker[0] = (process, parent_end)


def _fork_is_safe() -> bool:
    # macOS's system libraries are not fork-safe (Python spawns there by default); Windows has no fork
    return "fork" in multiprocessing.get_all_start_methods() and sys.platform != "darwin"


def _stop(worker: list) -> None:
    """Kill the worker in ``worker[0]`` (its process group where there are groups) and reap it."""
    if worker[0] is None:
        return
    (process, conn), worker[0] = worker[0], None
    conn.close()
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (AttributeError, OSError):  # no process groups (Windows), or the worker had not made its own yet
        process.kill()
    process.join()
    process.close()


def _serve(conn, parent_end, payload: dict) -> None:
    """The worker: load the tools, then answer each list of ``(index, name, arguments)`` with one
    ``(index, content, error)`` per call, the calls run in threads at the same time."""
    if parent_end is not None:
        parent_end.close()  # a forked worker's copy: closed, so that the parent's exit ends the pipe for it
    if hasattr(os, "setpgid"):
        with contextlib.suppress(OSError):  # without a group of its own, a timeout kills the worker alone
            os.setpgid(0, 0)  # its own process group, which a timeout kills whole: the processes its tools start too
    # a forked worker has the trainer's handlers (SIGTERM and SIGINT ask it to save a checkpoint); not its job
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        tools = {name: _loaded(source) for name, source in payload.items()}
    except Exception as exc:
        conn.send(f"cannot load the tools in the process they run in ({type(exc).__name__}: {exc})")
        return
    conn.send(True)
    sending = threading.Lock()

    def answer(i: int, name: str, arguments: dict) -> None:
        content, error = _call(tools[name], name, arguments)
        with sending:
            conn.send((i, content, error))

    while True:
        try:
            jobs = conn.recv()
        except (EOFError, OSError):  # the training process closed the pipe or is gone
            return
        threads = [threading.Thread(target=answer, args=job) for job in jobs[1:]]
        for thread in threads:
            thread.start()
        answer(*jobs[0])
        for thread in threads:
            thread.join()


def _loaded(source) -> Callable:
    if not isinstance(source, str):
        return source
    path, name = split_spec("tool", source)
    return load_object("tool", source, Path(path), name)


def _call(fn: Callable, name: str, arguments: dict) -> tuple[str, bool]:
    """A call's message and whether it is an error."""
    try:
        value = fn(**arguments)
    except BaseException as exc:  # the user's tool (sys.exit too): its failure is a message to the model
        detail = str(exc).splitlines()[0] if str(exc) else ""
        return f"error: '{name}' raised {type(exc).__name__}" + (f": {detail}" if detail else ""), True
    try:
        return result_text(value), False
    except (TypeError, ValueError):
        return f"error: '{name}' returned a {type(value).__name__}, which is not text or JSON", True
