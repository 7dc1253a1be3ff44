"""The docs name only commands and options that exist.

Every `rlhfkit COMMAND --flag ...` written in README.md and docs/*.md, in code blocks and in inline code, must
name a command of ``COMMANDS`` and options of that command's parser (the one `rlhfkit COMMAND --help` prints,
generated from the config dataclasses). In the same way, the README's command table names each command's own
options; every `rlhfkit.FUNCTION(keyword=...)` of the docs uses options of that function's command; and
docs/python-api.md's tables (function -> command -> required options; config class -> parts) and its config
object examples match the config classes.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlhfkit.cli.main import COMMANDS, main
from rlhfkit.config.parse import build_parser, leaves
from rlhfkit.errors import KEYWORDS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.M | re.S)
INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
# `rlhfkit` as a program name: not part of a path or module name (rlhfkit/ops, rlhfkit.grpo), then a word,
# and what follows, up to the next invocation on the line
INVOCATION = re.compile(r"(?<![\w.-])rlhfkit[ \t]+(\S+)((?:(?!(?<![\w.-])rlhfkit[ \t]).)*)")
SEPARATORS = {"|", "||", "&&", ";", "#"}


@dataclass(frozen=True)
class Invocation:
    page: str
    line: int
    command: str  # the word after `rlhfkit`
    flags: tuple[str, ...]  # the --options given to it, without their values

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: rlhfkit {self.command} {' '.join(self.flags)}".rstrip()


def _flags(rest: str) -> tuple[str, ...]:
    flags = []
    for token in rest.split():
        if token in SEPARATORS or token.startswith("#"):
            break
        token = token.strip("[]()`,.;:")
        if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", token):
            flags.append(token.split("=")[0])
    return tuple(flags)


def _invocations_in(text: str, page: str, first_line: int) -> list[Invocation]:
    """Invocations in a piece of shell-like text; a line ending in a backslash goes on to the next."""
    found, pending, start = [], "", first_line
    for number, line in enumerate(text.split("\n"), start=first_line):
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        for match in INVOCATION.finditer(pending + line):
            command, rest = match.groups()
            found.append(Invocation(page, start, command.strip("`,.;:()"), _flags(rest)))
        pending = ""
    return found


def invocations(path: Path) -> list[Invocation]:
    """Every `rlhfkit ...` of a Markdown page's code blocks and inline code spans; an inline span that starts
    with a command's name and a flag (`ppo --gold-judge support`) counts as one too."""
    text = path.read_text(encoding="utf-8")
    page = path.relative_to(ROOT).as_posix()
    found = []
    for block in FENCE.finditer(text):
        code = re.sub(r"(^|[ \t])#.*", "", block.group(2), flags=re.M)  # shell, YAML and Python comments
        found += _invocations_in(code, page, text.count("\n", 0, block.start(2)) + 1)
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # the same lines, without the blocks
    for span in INLINE.finditer(prose):
        code = " ".join(span.group(1).split())
        if code.split(" ")[0] in COMMANDS and re.match(r"\S+ --?\w", code):
            code = "rlhfkit " + code
        found += _invocations_in(code, page, prose.count("\n", 0, span.start(1)) + 1)
    return found


def options_of(command: str) -> set[str]:
    """Every option string `rlhfkit COMMAND` accepts (both spellings, -h/--help, --config, --debug)."""
    cmd = COMMANDS[command]
    parser = build_parser(f"rlhfkit {command}", cmd.config(), cmd.summary)
    return set(parser._option_string_actions)


def is_program_flag(flag: str, capsys) -> bool:
    """A flag `rlhfkit` takes in place of a command (--help, --version)."""
    code = main([flag])
    capsys.readouterr()
    return code == 0


ALL = [inv for page in PAGES for inv in invocations(page)]


def test_the_docs_are_scanned():
    commands = {inv.command for inv in ALL}
    assert len(ALL) > 100 and {"sft", "ppo", "grpo", "label", "view", "demo"} <= commands
    # the parser of the scan itself: a wrapped inline span and a continued code line are read whole
    wrapped = _invocations_in("x\nrlhfkit ppo --model out/sft \\\n  --kl-coef 0.05 | tee log\nrlhfkit rm", "x.md", 1)
    assert wrapped == [Invocation("x.md", 2, "ppo", ("--model", "--kl-coef")), Invocation("x.md", 4, "rm", ())]
    assert _invocations_in("import rlhfkit\nrlhfkit.grpo(x)", "x.md", 1) == []
    two = _invocations_in("rlhfkit sft --max-steps 5 && rlhfkit rm --ensemble 3", "x.md", 1)
    assert two == [Invocation("x.md", 1, "sft", ("--max-steps",)), Invocation("x.md", 1, "rm", ("--ensemble",))]


@pytest.mark.parametrize("invocation", ALL, ids=str)
def test_invocation_names_a_real_command_and_its_options(invocation, capsys):
    command = invocation.command
    if command.startswith("-"):
        assert is_program_flag(command, capsys), f"{invocation}: `rlhfkit {command}` is not a flag of rlhfkit"
        return
    if not re.fullmatch(r"[a-z][a-z0-9-]*", command):  # a placeholder: rlhfkit COMMAND, rlhfkit ...
        return
    assert command in COMMANDS, f"{invocation}: no command '{command}' (commands: {', '.join(COMMANDS)})"
    unknown = [flag for flag in invocation.flags if flag not in options_of(command)]
    assert not unknown, f"{invocation}: rlhfkit {command} has no option {', '.join(unknown)}"


def _table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the first table under ``heading`` (header and separator rows left out)."""
    section = text.split(heading, 1)[1]
    rows = []
    for line in section.split("\n"):
        if line.startswith("|"):
            rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
        elif rows:
            break
    return rows[2:]


def test_readme_command_table_lists_every_command_with_its_own_options():
    rows = _table_rows((ROOT / "README.md").read_text(encoding="utf-8"), "## Commands")
    named = [row[0].strip("`") for row in rows]
    assert named == list(COMMANDS), "README's command table should list the commands of COMMANDS, in order"
    for command, row in zip(named, rows, strict=True):
        flags = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", row[1]))
        assert flags <= options_of(command), f"README, command table, {command}: {flags - options_of(command)}"


def test_python_api_lists_each_config_and_its_parts():
    import rlhfkit.config

    rows = _table_rows((ROOT / "docs/python-api.md").read_text(encoding="utf-8"), "config class and its parts")
    documented = {row[0].strip("`"): row for row in rows}
    assert list(documented) == list(COMMANDS)
    for command, (_, cls_cell, parts_cell) in documented.items():
        cls = COMMANDS[command].config
        assert cls_cell == f"`{cls.__name__}`" and getattr(rlhfkit.config, cls.__name__) is cls
        config = cls()
        parts = [f.name for f in dataclasses.fields(config) if dataclasses.is_dataclass(getattr(config, f.name))]
        if parts_cell.startswith("as `"):  # "as `grpo`": the same parts as another command's
            other = COMMANDS[parts_cell.split("`")[1]].config()
            parts_cell = documented[parts_cell.split("`")[1]][2]
            assert [leaf.path[:-1] for leaf in leaves(config)] == [leaf.path[:-1] for leaf in leaves(other)]
        listed = re.findall(r"`(\w+)`", parts_cell.split(";")[0]) if not parts_cell.startswith("none") else []
        assert listed == parts, f"docs/python-api.md, {command}: parts {listed}, the config has {parts}"


# The Python API: `rlhfkit.NAME(keyword=...)` takes the options of one command, snake_case.
API_COMMANDS = {"evaluate": "eval", "init_model": "init-model"}
# the Python spellings of the repeatable flags (reward_fns for --reward-fn, tools for --tool)
API_ALIASES = {keyword: field for field, keyword in KEYWORDS.items()}
API_CALL = re.compile(r"(?<![\w.])rlhfkit\.(\w+)\(")


def _keywords(call_text: str) -> list[str]:
    """The keyword names of a call written in prose (the text after its opening parenthesis, up to the
    closing one): ``name=`` at the call's own nesting level, outside strings."""
    depth, quote, keywords = 1, "", []
    for i, char in enumerate(call_text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                break
        elif depth == 1 and (i == 0 or char == ","):
            match = re.match(r",?\s*(\w+)\s*=(?!=)", call_text[i:])
            if match:
                keywords.append(match.group(1))
    return keywords


def api_calls(path: Path) -> list[tuple[str, str, list[str]]]:
    """(where, function, keywords) of every `rlhfkit.FUNCTION(...)` call of a page: in its Python code blocks
    (parsed) and in its inline code."""
    text = path.read_text(encoding="utf-8")
    page = path.relative_to(ROOT).as_posix()
    calls = []
    for block in FENCE.finditer(text):
        if not block.group(0).startswith("```python"):
            continue
        first = text.count("\n", 0, block.start(2))
        for node in ast.walk(ast.parse(block.group(2))):
            func = getattr(node, "func", None)
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "rlhfkit":
                keywords = [k.arg for k in node.keywords if k.arg]
                calls.append((f"{page}:{first + node.lineno}", func.attr, keywords))
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for span in INLINE.finditer(prose):
        for match in API_CALL.finditer(span.group(1)):
            where = f"{page}:{prose.count(chr(10), 0, span.start(1)) + 1}"
            calls.append((where, match.group(1), _keywords(" ".join(span.group(1)[match.end() :].split()))))
    return calls


CALLS = [call for page in PAGES for call in api_calls(page)]


def test_api_keywords_are_parsed():
    assert _keywords("model='m', data=[{'a': 1}], f(x=1), s='a, b=c', beta=0.1)") == ["model", "data", "s", "beta"]
    assert len(CALLS) > 10


@pytest.mark.parametrize("where,function,keywords", CALLS, ids=[f"{c[0]}:{c[1]}" for c in CALLS])
def test_api_call_uses_options_of_its_command(where, function, keywords):
    import rlhfkit

    assert function in rlhfkit.__all__, f"{where}: rlhfkit.{function} is not part of the Python API"
    command = API_COMMANDS.get(function, function)
    if command not in COMMANDS:
        return  # not a command (rlhfkit.UserError, ...)
    names = {leaf.name for leaf in leaves(COMMANDS[command].config())}
    unknown = [k for k in keywords if API_ALIASES.get(k, k) not in names]
    assert not unknown, f"{where}: rlhfkit.{function} takes no keyword {', '.join(unknown)}"


def test_python_api_table_names_each_function_its_command_and_required_options():
    import rlhfkit

    rows = _table_rows((ROOT / "docs/python-api.md").read_text(encoding="utf-8"), "# Python API")
    seen = {}
    for function_cell, command_cell, required_cell in rows:
        function = re.fullmatch(r"`rlhfkit\.(\w+)\(\.\.\.\)`", function_cell).group(1)
        command = re.fullmatch(r"`rlhfkit ([\w-]+)`", command_cell).group(1)
        assert function in rlhfkit.__all__ and API_COMMANDS.get(function, function) == command, function_cell
        seen[command] = required_cell
        if required_cell.startswith("as `"):
            required_cell = seen[required_cell.split("`")[1]]
        named = set(re.findall(r"`(\w+)`", required_cell))
        required = {API_ALIASES.get(n, n) for n in getattr(COMMANDS[command].config, "REQUIRED", ())}
        assert required <= {API_ALIASES.get(n, n) for n in named}, f"docs/python-api.md, {function}: {required}"
    assert list(seen) == list(COMMANDS)


def test_python_api_config_objects_have_the_attributes_the_examples_set():
    """`cfg = DPOConfig()` then `cfg.dpo.beta = 0.2`: every attribute path used on a config object exists."""
    import rlhfkit.config

    text = (ROOT / "docs/python-api.md").read_text(encoding="utf-8")
    checked = 0
    for block in FENCE.finditer(text):
        if not block.group(0).startswith("```python"):
            continue
        tree = ast.parse(block.group(2))
        objects = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                func = node.value.func
                if isinstance(func, ast.Name) and func.id.endswith("Config"):
                    objects[node.targets[0].id] = getattr(rlhfkit.config, func.id)()
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                chain, inner = [], node
                while isinstance(inner, ast.Attribute):
                    chain.insert(0, inner.attr)
                    inner = inner.value
                if isinstance(inner, ast.Name) and inner.id in objects:
                    value = objects[inner.id]
                    for attr in chain:
                        assert hasattr(value, attr), f"docs/python-api.md: {inner.id}.{'.'.join(chain)} does not exist"
                        value = getattr(value, attr)
                    checked += 1
    assert checked >= 4


def test_contributing_layout_names_every_package_folder_module_and_test_folder():
    """docs/contributing.md's layout: each folder of rlhfkit/ and tests/ (and each top-level module) by name."""
    text = (ROOT / "docs/contributing.md").read_text(encoding="utf-8")
    layout = text.split("## Layout", 1)[1].split("```")[1]
    package = ROOT / "rlhfkit"
    folders = sorted(
        p.relative_to(package).as_posix() for p in package.rglob("*") if p.is_dir() and p.name != "__pycache__"
    )
    missing = [f for f in folders if f"{f.split('/')[-1]}/" not in layout]
    missing += [m.name for m in package.glob("*.py") if f"  {m.name}" not in layout]
    tests = sorted(
        p.relative_to(ROOT / "tests").as_posix()
        for p in (ROOT / "tests").rglob("*")
        if p.is_dir() and (p / "__init__.py").is_file()
    )
    missing += [f"tests/{t}" for t in tests if t.split("/")[-1] not in re.findall(r"[\w-]+", layout)]
    assert not missing, f"docs/contributing.md's layout does not name {', '.join(missing)}"
