"""Data sets of the arithmetic task: SFT demonstrations, prompts with their answers for RL,
and the tokenizer corpus, written as JSONL files with TRL's field names.

SFT rows hold the prompt and the completion. The demonstrations are of mixed quality
(some answers off by one, some running on into another question), so a model trained on
them answers correctly only part of the time and an exact-answer reward has something to
improve. Prompt rows carry an extra `answer` column that an RL trainer hands to the
reward functions (`exact_answer(..., answer=[...])`).
"""

from __future__ import annotations

import random
from pathlib import Path

from rlhfkit.files import write_jsonl, write_text

from ..raters import GoldRaters, labelled_pair
from .problems import Problem, all_problems, make_problems
from .rewards import judge

# Share of SFT demonstrations whose answer is off by one: the SFT model learns this slip as
# a habit on every problem, which leaves held-out accuracy below 100% for RL to raise.
SLIP_RATE = 0.3
# Share of SFT demonstrations that run on past the answer into another question and its
# answer, as text copied from a worksheet would: the exact-answer reward counts these as
# wrong, so stopping after the number is a habit RL can teach on every problem at once.
RUN_ON_RATE = 0.3

# The simulated raters' temperature (``rlhfkit.tasks.raters``): between a right and a wrong answer they pick
# the right one with probability sigmoid(1 / 0.5), about 88%.
RATER_TEMPERATURE = 0.5

DEFAULT_SIZES = {
    "sft": 2000,
    "sft_eval": 200,
    "prefs_train": 600,
    "prefs_eval": 200,
}


def _check_split(split: str) -> None:
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")


def completion(answer: int) -> str:
    """The completion of a demonstration: the answer after a space, e.g. " 12"."""
    return f" {answer}"


def _problem_cycle(rng: random.Random, split: str, n: int) -> list[Problem]:
    """`n` problems of a split: whole shuffled passes, so every problem is used evenly."""
    problems = make_problems(split)
    out: list[Problem] = []
    while len(out) < n:
        order = problems[:]
        rng.shuffle(order)
        out.extend(order)
    return out[:n]


def slipped_answer(rng: random.Random, answer: int) -> int:
    """An answer off by one, up or down at random (up from 0, so it is never negative)."""
    return answer + 1 if answer == 0 or rng.random() < 0.5 else answer - 1


def make_sft_rows(
    seed: int = 0,
    n: int | None = None,
    split: str = "train",
    slip_rate: float | None = None,
    run_on_rate: float | None = None,
) -> list[dict]:
    """Demonstrations `{"prompt", "completion"}` over a split's problems.

    A `slip_rate` share of them (default SLIP_RATE) answers off by one, and independently a
    `run_on_rate` share (default RUN_ON_RATE) goes on after the answer with another problem
    of the split and its right answer (" 12\\nQ: 3+4=\\nA: 7"). `n` defaults to
    DEFAULT_SIZES["sft"] (train) or DEFAULT_SIZES["sft_eval"] (eval).
    """
    _check_split(split)
    n = DEFAULT_SIZES["sft" if split == "train" else "sft_eval"] if n is None else n
    slip_rate = SLIP_RATE if slip_rate is None else slip_rate
    run_on_rate = RUN_ON_RATE if run_on_rate is None else run_on_rate
    rng = random.Random(f"arithmetic-sft-{split}-{seed}")
    problems = make_problems(split)
    rows = []
    for p in _problem_cycle(rng, split, n):
        rows.append({"prompt": p.prompt, "completion": _demonstration(rng, p, problems, slip_rate, run_on_rate)})
    return rows


def make_preference_rows(split: str, seed: int = 0, n: int | None = None) -> list[dict]:
    """Noisy preference pairs ``{"prompt", "chosen", "rejected"}``: two different demonstrations of the same
    problem (each as ``make_sft_rows`` writes them: right, off by one, or running on), labelled by the task's
    simulated raters on the gold judge. ``n`` defaults to DEFAULT_SIZES."""
    _check_split(split)
    n = DEFAULT_SIZES["prefs_train" if split == "train" else "prefs_eval"] if n is None else n
    rng = random.Random(f"arithmetic-prefs-{split}-{seed}")
    problems = make_problems(split)
    rows = []
    for p in _problem_cycle(rng, split, n):
        reply = lambda: _demonstration(rng, p, problems, SLIP_RATE, RUN_ON_RATE)  # noqa: E731
        rows.append(labelled_pair(rng, judge, p.prompt, reply, RATER_TEMPERATURE))
    return rows


def _demonstration(
    rng: random.Random, p: Problem, problems: list[Problem], slip_rate: float, run_on_rate: float
) -> str:
    """A demonstration's completion of ``p``: off by one with probability ``slip_rate``, and running on into
    another problem of ``problems`` with probability ``run_on_rate``."""
    answer = slipped_answer(rng, p.answer) if rng.random() < slip_rate else p.answer
    text = completion(answer)
    if rng.random() < run_on_rate:
        other = rng.choice(problems)
        text += "\n" + other.prompt + completion(other.answer)
    return text


def raters(seed: int = 0) -> GoldRaters:
    """The simulated raters that labelled the preference pairs, as a pairwise judge of new replies."""
    return GoldRaters("arithmetic", judge, RATER_TEMPERATURE, seed)


def make_prompt_rows(split: str) -> list[dict]:
    """Every problem of a split once, as `{"prompt", "answer"}` with the answer a string."""
    _check_split(split)
    return [{"prompt": p.prompt, "answer": str(p.answer)} for p in make_problems(split)]


def corpus_text() -> str:
    """Text to train the BPE tokenizer on: every problem with its right answer, then with
    each off-by-one answer, so every number and symbol a prompt or demonstration holds is
    seen in the position it takes (each answer " 12" becomes one token)."""
    lines = [p.prompt + completion(p.answer) for p in all_problems()]
    for p in all_problems():
        lines.extend(p.prompt + completion(a) for a in (p.answer - 1, p.answer + 1) if a >= 0)
    return "\n".join(lines) + "\n"


def write_task_data(out_dir: str | Path, seed: int = 0, sizes: dict[str, int] | None = None) -> dict[str, Path]:
    """Write the task's files into `out_dir` and return `{name: path}`.

    Names: sft, sft_eval (JSONL demonstrations), prefs_train and prefs_eval (the raters'
    preference pairs), prompts_train and prompts_eval (every problem of the split once,
    `{"prompt", "answer"}` rows), corpus (text). `sizes` overrides DEFAULT_SIZES entries.
    """
    size = {**DEFAULT_SIZES, **(sizes or {})}
    unknown = set(size) - set(DEFAULT_SIZES)
    if unknown:
        raise ValueError(f"unknown size names {sorted(unknown)}; known: {sorted(DEFAULT_SIZES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "sft": write_jsonl(out / "sft.jsonl", make_sft_rows(seed, size["sft"], "train")),
        "sft_eval": write_jsonl(out / "sft_eval.jsonl", make_sft_rows(seed, size["sft_eval"], "eval")),
        "prefs_train": write_jsonl(out / "prefs_train.jsonl", make_preference_rows("train", seed, size["prefs_train"])),
        "prefs_eval": write_jsonl(out / "prefs_eval.jsonl", make_preference_rows("eval", seed, size["prefs_eval"])),
        "prompts_train": write_jsonl(out / "prompts_train.jsonl", make_prompt_rows("train")),
        "prompts_eval": write_jsonl(out / "prompts_eval.jsonl", make_prompt_rows("eval")),
    }
    corpus = out / "corpus.txt"
    write_text(corpus, corpus_text())
    files["corpus"] = corpus
    return files
