"""Built-in tasks: synthetic RLHF problems with a hidden gold judge.

A task provides its data files (`write_data`), a tokenizer corpus and a gold judge
`judge(prompt, reply) -> float` that the demo reports as `reward/gold`. A task may
also name reward functions with TRL's signature `(prompts, completions, **columns) ->
list[float | None]` for critic-free RL: the support task's gold judge (a reward to
train on only when the point is to optimise the gold itself), the arithmetic and tools tasks'
exact-answer checks. A task with preference data also has simulated raters, a pairwise judge
(``rlhfkit iterate --judge NAME``). Look tasks up by name:

    from rlhfkit.tasks import get_judge, get_task
    judge = get_judge("support")
    exact = get_task("arithmetic").reward_functions["exact_answer"]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import arithmetic, notes, support, tools

RewardFunction = Callable[..., list[float | None]]


@dataclass(frozen=True)
class Task:
    """A built-in task.

    judge: hidden gold score of a reply to a prompt (prompt text, reply text) -> float.
    write_data: `write_data(out_dir, seed=0, sizes=None) -> {name: path}`; names include
        sft, sft_eval, prompts_train, prompts_eval and corpus, plus prefs_train and
        prefs_eval for a task with preference data.
    corpus_text: text to train the task's tokenizer on.
    score_range: (lowest, highest) gold score.
    reward_functions: named rewards `fn(prompts, completions, **columns) -> list[float |
        None]`, each column of the prompt data a keyword list aligned with the prompts.
    raters: for a task with preference data, `raters(seed)` -> a pairwise judge `prefer(prompts,
        completions) -> list[int]` (TRL's convention) that labels like the task's simulated raters.
    """

    name: str
    description: str
    judge: Callable[[str, str], float]
    write_data: Callable[..., dict[str, Path]]
    corpus_text: Callable[[], str]
    score_range: tuple[float, float]
    reward_functions: dict[str, RewardFunction] = field(default_factory=dict)
    raters: Callable[[int], Callable[..., list[int]]] | None = None


TASKS: dict[str, Task] = {
    "support": Task(
        name="support",
        description="customer-support replies: empathy, the right action per issue, concise",
        judge=support.gold_score,
        write_data=support.write_task_data,
        corpus_text=support.corpus_text,
        score_range=(-3.0, 5.0),
        reward_functions={"gold": support.gold_reward},
        raters=support.SimulatedRaters,
    ),
    "arithmetic": Task(
        name="arithmetic",
        description="small sums and differences with a checkable answer: a number, then stop",
        judge=arithmetic.judge,
        write_data=arithmetic.write_task_data,
        corpus_text=arithmetic.corpus_text,
        score_range=(0.0, 1.0),
        reward_functions={"exact_answer": arithmetic.exact_answer, "format": arithmetic.format_reward},
        raters=arithmetic.raters,
    ),
    "notes": Task(
        name="notes",
        description="short notes judged on form: a length band, a keyword rule with an exception, greeting, sign-off",
        judge=notes.gold_score,
        write_data=notes.write_task_data,
        corpus_text=notes.corpus_text,
        score_range=(-4.5, 3.0),
        reward_functions={"gold": notes.gold_reward},
        raters=notes.raters,
    ),
    "tools": Task(
        name="tools",
        description="sums of three 3-4 digit numbers, right only with the add tool: call it, then the number",
        judge=tools.judge,
        write_data=tools.write_task_data,
        corpus_text=tools.corpus_text,
        score_range=(0.0, 1.0),
        reward_functions={"exact_answer": tools.exact_answer},
    ),
}


def get_task(name: str) -> Task:
    """The task registered under `name`; ValueError naming the known tasks otherwise."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}") from None


def get_judge(name: str) -> Callable[[str, str], float]:
    """The gold judge `(prompt, reply) -> float` of the task registered under `name`."""
    return get_task(name).judge


def rater_tasks() -> list[str]:
    """The tasks whose simulated raters can judge pairs (``rlhfkit iterate --judge NAME``)."""
    return sorted(name for name, task in TASKS.items() if task.raters is not None)


__all__ = ["TASKS", "RewardFunction", "Task", "get_judge", "get_task", "rater_tasks"]
