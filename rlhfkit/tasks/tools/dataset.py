"""Data sets of the tools task: SFT conversations, prompts with their answers for RL, the tokenizer corpus and
the tool's file, written with TRL's field names.

An SFT row is a whole conversation (``{"messages": [...]}``). A TOOL_RATE share of the demonstrations calls
``add`` and copies its result:

    user       1234 + 567 + 8910
    assistant  <tool_call>{"name": "add", "arguments": {"numbers": [ 1234, 567, 8910]}}</tool_call>
    tool       10711
    assistant  10711

the others answer at once with a guess (the sum's last two digits wrong), as a person would without a
calculator. A model trained on them calls the tool about as often, so held-out accuracy starts near that
share and an exact-answer reward has one habit to teach: call the tool every time. Prompt rows carry an
extra ``answer`` column that an RL trainer hands to the reward functions.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from rlhfkit.files import write_jsonl, write_text

from .problems import Problem, eval_problems, train_problems

# Share of SFT demonstrations that call the tool; the rest answer directly with a guess.
TOOL_RATE = 0.5

DEFAULT_SIZES = {
    "sft": 4000,
    "sft_eval": 200,
    "prompts_train": 2000,
}

TOOL_FILE = Path(__file__).with_name("calculator.py")


def tool_call(problem: Problem) -> str:
    """The reply that calls ``add`` on the problem's numbers. A space opens the list so that every number is
    written after a space, as in the prompt: the byte-level tokenizer then splits it into the same tokens in
    both places, and copying the numbers is copying tokens."""
    numbers = ", ".join(str(n) for n in problem.numbers)
    return f'<tool_call>{{"name": "add", "arguments": {{"numbers": [ {numbers}]}}}}</tool_call>'


def guess(rng: random.Random, answer: int) -> int:
    """A wrong answer near the sum: its last two digits drawn at random (never the right ones)."""
    while True:
        value = answer - answer % 100 + rng.randrange(100)
        if value != answer:
            return value


def tool_conversation(problem: Problem) -> list[dict]:
    return [
        *problem.prompt,
        {"role": "assistant", "content": tool_call(problem)},
        {"role": "tool", "content": str(problem.answer)},
        {"role": "assistant", "content": str(problem.answer)},
    ]


def direct_conversation(problem: Problem, rng: random.Random) -> list[dict]:
    return [*problem.prompt, {"role": "assistant", "content": str(guess(rng, problem.answer))}]


def make_sft_rows(
    seed: int = 0, n: int | None = None, split: str = "train", tool_rate: float | None = None
) -> list[dict]:
    """`n` demonstrations `{"messages": [...]}`: a `tool_rate` share (default TOOL_RATE) calls the tool, the
    rest guess. The train split draws fresh problems (never a held-out one); the eval split cycles through
    the held-out problems. `n` defaults to DEFAULT_SIZES["sft"] (train) or DEFAULT_SIZES["sft_eval"] (eval)."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    n = DEFAULT_SIZES["sft" if split == "train" else "sft_eval"] if n is None else n
    tool_rate = TOOL_RATE if tool_rate is None else tool_rate
    rng = random.Random(f"tools-sft-{split}-{seed}")
    if split == "train":
        problems = train_problems(rng, n)
    else:
        held_out = eval_problems()
        problems = [held_out[i % len(held_out)] for i in range(n)]
    return [
        {"messages": tool_conversation(p) if rng.random() < tool_rate else direct_conversation(p, rng)}
        for p in problems
    ]


def make_prompt_rows(seed: int = 0, n: int | None = None, split: str = "train") -> list[dict]:
    """Prompts `{"prompt": [user message], "answer": sum}`: `n` fresh training problems (default
    DEFAULT_SIZES["prompts_train"]), or every held-out problem once (split "eval"; `n` ignored)."""
    if split == "eval":
        problems = list(eval_problems())
    elif split == "train":
        n = DEFAULT_SIZES["prompts_train"] if n is None else n
        problems = train_problems(random.Random(f"tools-prompts-{seed}"), n)
    else:
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    return [{"prompt": p.prompt, "answer": p.answer} for p in problems]


def corpus_text() -> str:
    """Text to train the BPE tokenizer on: demonstrations written as the plain template writes them (both
    kinds), so the tool call's fixed text becomes a few tokens and the numbers split as they will in use."""
    lines = []
    for row in make_sft_rows(seed=-1, n=3000, tool_rate=0.7):
        names = {"user": "User", "assistant": "Assistant", "tool": "Tool"}
        lines.extend(f"{names[m['role']]}: {m['content']}" for m in row["messages"])
    return "\n".join(lines) + "\n"


def write_task_data(out_dir: str | Path, seed: int = 0, sizes: dict[str, int] | None = None) -> dict[str, Path]:
    """Write the task's files into `out_dir` and return `{name: path}`.

    Names: sft, sft_eval (JSONL conversations), prompts_train and prompts_eval (`{"prompt", "answer"}` rows;
    the eval file holds every held-out problem once), corpus (text) and tool (``calculator.py``, whose
    ``add`` is the tool: ``--tool DIR/calculator.py:add``). `sizes` overrides DEFAULT_SIZES entries.
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
        "prompts_train": write_jsonl(out / "prompts_train.jsonl", make_prompt_rows(seed, size["prompts_train"])),
        "prompts_eval": write_jsonl(out / "prompts_eval.jsonl", make_prompt_rows(seed, split="eval")),
    }
    corpus = out / "corpus.txt"
    write_text(corpus, corpus_text())
    files["corpus"] = corpus
    files["tool"] = Path(shutil.copyfile(TOOL_FILE, out / TOOL_FILE.name))
    return files
