"""The built-in tools task: sums a small model can only get right with a tool.

A prompt asks the sum of three 3- or 4-digit numbers ("1234 + 567 + 8910"); the model may call the ``add``
tool (``calculator.add``, written beside the task's data so that ``--tool DIR/calculator.py:add`` names it)
and then answers with the number alone. ``exact_answer`` checks the final reply against the `answer` column,
``judge`` (the gold judge) against the sum parsed from the prompt's text. Half of the SFT demonstrations
guess instead of calling the tool (see ``dataset``), so reinforcement learning has a habit to teach.
"""

from .calculator import add
from .dataset import (
    DEFAULT_SIZES,
    TOOL_FILE,
    TOOL_RATE,
    corpus_text,
    guess,
    make_prompt_rows,
    make_sft_rows,
    tool_call,
    write_task_data,
)
from .problems import DIGITS, EVAL_PROBLEMS, TERMS, Problem, eval_problems, parse_prompt, train_problems
from .rewards import exact_answer, judge, parse_answer

__all__ = [
    "DEFAULT_SIZES",
    "DIGITS",
    "EVAL_PROBLEMS",
    "TERMS",
    "TOOL_FILE",
    "TOOL_RATE",
    "Problem",
    "add",
    "corpus_text",
    "eval_problems",
    "exact_answer",
    "guess",
    "judge",
    "make_prompt_rows",
    "make_sft_rows",
    "parse_answer",
    "parse_prompt",
    "tool_call",
    "train_problems",
    "write_task_data",
]
