"""The built-in arithmetic task: a reward that can be checked.

A prompt asks a small sum or difference ("Q: 7+5=\\nA:"); the completion is the answer
after a space (" 12") and then EOS. Rewards compare the completion with the answer: the
`answer` column of the prompt data (`exact_answer`), the shape of the completion
(`format_reward`), or the problem parsed out of the prompt itself (`judge`, the gold
judge). Problems have a fixed train/eval split, so held-out accuracy measures more than
memorised answers.
"""

from .dataset import DEFAULT_SIZES, completion, corpus_text, make_prompt_rows, make_sft_rows, write_task_data
from .problems import MAX_OPERAND, OPERATORS, Problem, all_problems, format_prompt, make_problems, parse_prompt
from .rewards import accuracy, completion_text, exact_answer, format_reward, judge, parse_answer

REWARD_FUNCTIONS = {"exact_answer": exact_answer, "format": format_reward}

__all__ = [
    "DEFAULT_SIZES",
    "MAX_OPERAND",
    "OPERATORS",
    "REWARD_FUNCTIONS",
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
    "make_prompt_rows",
    "make_sft_rows",
    "parse_answer",
    "parse_prompt",
    "write_task_data",
]
