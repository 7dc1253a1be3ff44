"""The built-in arithmetic task: a reward that can be checked.

A prompt asks a small sum or difference ("Q: 7+5=\\nA:"); the completion is the answer
after a space (" 12") and then EOS. Rewards check the completion: against the `answer`
column of the prompt data (`exact_answer`), for its shape (`format_reward`), or against
the problem parsed out of the prompt itself (`judge`, the gold judge). Problems have a
fixed train/eval split, so held-out accuracy measures more than memorised answers. The
SFT demonstrations are imperfect on purpose (see `dataset`), leaving room for RL.
"""

from .dataset import (
    DEFAULT_SIZES,
    RUN_ON_RATE,
    SLIP_RATE,
    completion,
    corpus_text,
    make_preference_rows,
    make_prompt_rows,
    make_sft_rows,
    raters,
    write_task_data,
)
from .problems import MAX_OPERAND, OPERATORS, Problem, all_problems, format_prompt, make_problems, parse_prompt
from .rewards import accuracy, completion_text, exact_answer, format_reward, judge, parse_answer

__all__ = [
    "DEFAULT_SIZES",
    "MAX_OPERAND",
    "OPERATORS",
    "RUN_ON_RATE",
    "SLIP_RATE",
    "Problem",
    "accuracy",
    "all_problems",
    "completion",
    "completion_text",
    "corpus_text",
    "exact_answer",
    "format_prompt",
    "format_reward",
    "judge",
    "make_problems",
    "make_preference_rows",
    "make_prompt_rows",
    "make_sft_rows",
    "parse_answer",
    "parse_prompt",
    "raters",
    "write_task_data",
]
