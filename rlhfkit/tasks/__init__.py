"""Built-in tasks: synthetic RLHF problems with a hidden gold judge.

A task provides its data files (`write_data`), a tokenizer corpus and a gold judge
`judge(prompt, reply) -> float` that the demo reports as `reward/gold` but the
trainers never train on. Look tasks up by name:

    from rlhfkit.tasks import get_judge, get_task
    judge = get_judge("support")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import support


@dataclass(frozen=True)
class Task:
    """A built-in task.

    judge: hidden gold score of a reply to a prompt (prompt text, reply text) -> float.
    write_data: `write_data(out_dir, seed=0) -> {name: path}`; names include sft,
        sft_eval, prefs_train, prefs_eval, prompts_train, prompts_eval, corpus.
    corpus_text: text to train the task's tokenizer on.
    score_range: (lowest, highest) gold score.
    """

    name: str
    description: str
    judge: Callable[[str, str], float]
    write_data: Callable[..., dict[str, Path]]
    corpus_text: Callable[[], str]
    score_range: tuple[float, float]


TASKS: dict[str, Task] = {
    "support": Task(
        name="support",
        description="customer-support replies: empathy, the right action per issue, concise",
        judge=support.gold_score,
        write_data=support.write_task_data,
        corpus_text=support.corpus_text,
        score_range=(-3.0, 5.0),
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


__all__ = ["TASKS", "Task", "get_judge", "get_task"]
