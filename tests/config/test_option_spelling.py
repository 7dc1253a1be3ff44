"""How error messages name options: ``--kebab-case`` flags by default (the command line), ``snake_case``
keywords inside ``spelling("keyword")`` (the Python API). Messages are written once, with ``option(...)``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import rlhfkit
from rlhfkit.config.commands import DPOConfig
from rlhfkit.config.parse import parse_config
from rlhfkit.errors import UserError, command, invocation, option, spelled, spelling

SOURCE = Path(rlhfkit.__file__).parent


def test_an_option_as_a_flag_and_as_a_keyword():
    assert option("max_steps") == "--max-steps" and option("batch_size", 16) == "--batch-size 16"
    assert option("resume", True) == "--resume" and option("reward_fn") == "--reward-fn"
    assert command("rm") == "rlhfkit rm" and command("eval") == "rlhfkit eval"
    assert invocation("rm", model="m", output_dir="OUT") == "rlhfkit rm --model m --output-dir OUT"
    assert spelled("a", "b") == "a"
    with spelling("keyword"):
        assert option("max_steps") == "max_steps" and option("batch_size", 16) == "batch_size=16"
        assert option("resume", True) == "resume=True" and option("advantage", "gae") == "advantage='gae'"
        assert option("output", Path("a/b.jsonl")) == "output='a/b.jsonl'"
        assert option("reward_fn") == "reward_fns" and option("reward_fn", "f.py:g") == "reward_fns item 'f.py:g'"
        assert command("rm") == "rlhfkit.rm" and command("eval") == "rlhfkit.evaluate"
        assert command("init-model") == "rlhfkit.init_model"
        assert invocation("rm", model="m", output_dir="OUT") == "rlhfkit.rm(model='m', output_dir='OUT')"
        assert spelled("a", "b") == "b"
    assert option("max_steps") == "--max-steps"  # back to flags once the block ends


def test_the_spelling_is_restored_after_an_error():
    with pytest.raises(UserError, match="^beta must be > 0"), spelling("keyword"):
        parse_config("rlhfkit dpo", DPOConfig, ["--model", "m", "--data", "d", "--output-dir", "o", "--beta", "0"])
    with pytest.raises(UserError, match="^--beta must be > 0"):
        parse_config("rlhfkit dpo", DPOConfig, ["--model", "m", "--data", "d", "--output-dir", "o", "--beta", "0"])


# Messages only the command line can raise, by file and a piece of their text: argparse's own errors, and a
# reward function read back from a config file (only the command line reads config files).
FLAG_ONLY = {
    ("config/parse.py", " --help)"),
    ("trainers/online/rewards.py", "records by name only"),
    ("training/runtime.py", "(torchrun --nproc-per-node "),  # the launcher's flag, not one of rlhfkit's
}
FLAG = re.compile(r"(?<![\w-])--[a-z]")


def _literal_text(node):
    """The string literals of a message expression, leaving out those inside calls (``option(...)``,
    ``spelled(...)``), which spell themselves."""
    if isinstance(node, ast.Call):
        return
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
        return
    for child in ast.iter_child_nodes(node):
        yield from _literal_text(child)


def _raised_messages(tree):
    """(line, the message's literal pieces joined by "|") of every ``UserError(...)`` / ``Preempted(...)`` in a
    module."""
    for node in ast.walk(tree):
        func = getattr(node, "func", None)
        if isinstance(node, ast.Call) and getattr(func, "id", getattr(func, "attr", "")) in ("UserError", "Preempted"):
            yield node.lineno, "|".join(text for arg in node.args[:1] for text in _literal_text(arg))


def test_the_scan_sees_a_flag_written_by_hand():
    tree = ast.parse('raise UserError(f"{path}: --output-dir is required")\nraise UserError(f"{option(\'x\')}")')
    assert [text for _, text in _raised_messages(tree)] == [": --output-dir is required", ""]


def test_no_error_message_spells_a_flag_by_hand():
    """A ``--flag`` written into a UserError's text would reach Python callers too; ``option()`` names it."""
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        relative = path.relative_to(SOURCE).as_posix()
        for line, text in _raised_messages(ast.parse(path.read_text(encoding="utf-8"))):
            if FLAG.search(text) and not any(relative == f and piece in text for f, piece in FLAG_ONLY):
                found.append(f"{relative}:{line}: {text!r}")
    assert found == []
