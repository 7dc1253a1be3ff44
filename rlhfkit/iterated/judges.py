"""Pairwise judges: a Python function that says which of two replies is better.

The convention is TRL's pairwise judge::

    def prefer(prompts: list, completions: list[list[str]], **kwargs) -> list[int]: ...

``completions[i]`` is the pair ``[a, b]`` for ``prompts[i]``; the answer is 0 (a is better), 1 (b is better)
or -1 (no preference: the pair is dropped). ``kwargs`` holds the prompt rows' other columns, as lists aligned
with ``prompts``, when the function takes them (by name, or with ``**kwargs``). A rule, a program, or another
model (RLAIF) all fit: ``model:PATH`` is a local causal LM asked as `rlhfkit judge` asks it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from rlhfkit.config.iterate import HUMAN_AND_MODEL, MODEL
from rlhfkit.errors import UserError, option
from rlhfkit.judging.agreement import judge_summary
from rlhfkit.judging.model import ModelJudge
from rlhfkit.judging.prompts import read_principles
from rlhfkit.models.loading import check_model_dir
from rlhfkit.tasks import get_task, rater_tasks
from rlhfkit.userfiles import load_object, split_spec

ANSWERS = (0, 1, -1)


@dataclass
class Judge:
    fn: Callable
    spec: str  # as given, for messages

    def __call__(self, prompts: list, pairs: list[list[str]], columns: dict[str, list] | None = None) -> list[int]:
        """The judge's answer for each pair, checked: one of 0, 1, -1 per pair."""
        kwargs = _accepted(self.fn, columns or {})
        try:
            answers = self.fn(prompts, pairs, **kwargs)
        except Exception as exc:  # the user's code: one line naming it
            detail = str(exc).splitlines()[0] if str(exc) else ""
            raise UserError(
                f"{option('judge', self.spec)} raised {type(exc).__name__}" + (f": {detail}" if detail else "")
            ) from None
        if hasattr(answers, "tolist"):
            answers = answers.tolist()
        if not isinstance(answers, (list, tuple)) or len(answers) != len(pairs):
            got = f"{len(answers)} answers" if isinstance(answers, (list, tuple)) else type(answers).__name__
            raise UserError(
                f"{option('judge', self.spec)} returned {got} for {len(pairs)} pairs; expected a list of ints"
            )
        for i, answer in enumerate(answers):
            if isinstance(answer, bool) or answer not in ANSWERS:
                raise UserError(
                    f"{option('judge', self.spec)}: pair {i + 1}: answer {answer!r} is not 0 (first better), "
                    "1 (second better) or -1 (no preference)"
                )
        return [int(a) for a in answers]


def _accepted(fn: Callable, columns: dict[str, list]) -> dict[str, list]:
    """The columns ``fn`` takes: all of them with ``**kwargs``, else those it names."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return dict(columns)
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return dict(columns)
    names = {p.name for p in params}
    return {k: v for k, v in columns.items() if k in names}


def load_judge(spec, seed: int = 0, principles: str = "") -> Judge:
    """The judge ``spec`` names: a function in a Python file, ``FILE.py:NAME``, a built-in task's simulated raters
    by the task's name (``rlhfkit.tasks.rater_tasks``; seeded with ``seed``), a local causal LM (``model:PATH``,
    or the model of ``human+model:PATH``) judging by the ``principles`` file, or (through the Python API) a
    callable; checked to take ``(prompts, completions)``."""
    for prefix in (MODEL, HUMAN_AND_MODEL):
        if isinstance(spec, str) and spec.startswith(prefix):
            path = spec[len(prefix) :]
            check_model_dir(path, "judge model")  # before the first round trains anything
            return Judge(ModelJudge(path, read_principles(principles), seed=seed), spec)
    if isinstance(spec, str) and spec in rater_tasks():
        return Judge(get_task(spec).raters(seed), spec)
    if callable(spec):
        name = getattr(spec, "__name__", type(spec).__name__)
        return _checked(spec, name, f"<python function {name}>")
    path, name = split_spec("judge", spec)
    return _checked(load_object("judge", spec, path, name), name, spec)


def _checked(fn: Callable, name: str, spec: str) -> Judge:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return Judge(fn, spec)
    try:
        signature.bind([], [])
    except TypeError as exc:
        raise UserError(
            f"{option('judge', spec)}: '{name}' must take (prompts, completions, **kwargs) and return a list of "
            f"0 / 1 / -1 ({exc})"
        ) from None
    return Judge(fn, spec)


def judge_record(judge: Judge) -> dict:
    """What a model judge's last call says of itself (ties, order consistency, confidence) for a round's record;
    nothing for other judges."""
    if not isinstance(judge.fn, ModelJudge) or not judge.fn.last_verdicts:
        return {}
    return {"model_judge": judge_summary(judge.fn.last_verdicts, judge.fn.min_confidence)}
