"""Data sets of the support task: SFT demonstrations, noisy preference pairs, prompts
for PPO, and the tokenizer corpus, written as JSONL files with TRL's field names.

Rows never carry gold scores, so a trainer cannot see the hidden judge.
"""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

from rlhfkit.files import write_jsonl, write_text

from .categories import PRODUCTS
from .judge import gold_score
from .prompts import make_prompts, parse_prompt
from .replies import (
    ACKNOWLEDGEMENTS,
    ACTIONS,
    CLOSINGS,
    EMPATHY,
    FILLERS,
    GENERIC_ACTIONS,
    GREETINGS,
    VAGUE_ACKNOWLEDGEMENTS,
    ideal_reply,
    sample_reply,
    sample_wide_reply,
)

# Bradley-Terry temperature of the simulated rater: P(A preferred) =
# sigmoid((gold(A) - gold(B)) / RATER_TEMPERATURE). Chosen so that a perfect judge of
# the gold agrees with ~80% of the labels.
RATER_TEMPERATURE = 0.8
P_WIDE = 0.15  # chance that a candidate reply comes from the wide generator

DEFAULT_SIZES = {
    "sft": 2000,
    "sft_eval": 200,
    "prefs_train": 2000,
    "prefs_eval": 400,
    "prompts_eval": 100,
}


def _check_split(split: str) -> None:
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")


def _prompt_cycle(rng: random.Random, split: str, n: int) -> list[dict]:
    """`n` prompts of a split: whole shuffled passes, so every prompt is used evenly."""
    prompts = make_prompts(split)
    out: list[dict] = []
    while len(out) < n:
        order = prompts[:]
        rng.shuffle(order)
        out.extend(order)
    return out[:n]


def make_sft_rows(seed: int = 0, n: int | None = None, split: str = "train") -> list[dict]:
    """Mixed-quality demonstrations `{"prompt", "completion"}` over a split's prompts.

    Each completion starts with a space and is 8..35 words built from optional segments
    (opener, acknowledgement, action, closing); the action is right, generic or for
    another category (see `replies.sample_reply`). `n` defaults to DEFAULT_SIZES.
    """
    _check_split(split)
    n = DEFAULT_SIZES["sft" if split == "train" else "sft_eval"] if n is None else n
    rng = random.Random(f"support-sft-{split}-{seed}")
    rows = []
    for row in _prompt_cycle(rng, split, n):
        _, product = parse_prompt(row["prompt"])
        rows.append({"prompt": row["prompt"], "completion": " " + sample_reply(rng, row["category"], product)})
    return rows


def _candidate(rng: random.Random, category: str, product: str | None) -> str:
    if rng.random() < P_WIDE:
        return sample_wide_reply(rng, category, product)
    return sample_reply(rng, category, product)


def make_preference_rows(split: str, seed: int = 0, n: int | None = None) -> list[dict]:
    """Noisy preference pairs `{"prompt", "chosen", "rejected"}` over a split's prompts.

    Two different candidate replies per prompt (mostly mixed-quality, sometimes from the
    wide generator), labelled by a simulated rater who prefers A with probability
    sigmoid((gold(A) - gold(B)) / RATER_TEMPERATURE). `n` defaults to DEFAULT_SIZES.
    """
    _check_split(split)
    n = DEFAULT_SIZES["prefs_train" if split == "train" else "prefs_eval"] if n is None else n
    rng = random.Random(f"support-prefs-{split}-{seed}")
    rows = []
    for row in _prompt_cycle(rng, split, n):
        prompt, category = row["prompt"], row["category"]
        _, product = parse_prompt(prompt)
        a = _candidate(rng, category, product)
        b = _candidate(rng, category, product)
        while b == a:
            b = _candidate(rng, category, product)
        margin = (gold_score(prompt, a) - gold_score(prompt, b)) / RATER_TEMPERATURE
        a_wins = rng.random() < 1.0 / (1.0 + math.exp(-margin))
        chosen, rejected = (a, b) if a_wins else (b, a)
        rows.append({"prompt": prompt, "chosen": " " + chosen, "rejected": " " + rejected})
    return rows


def label_noise_ceiling(rows: list[dict]) -> float:
    """Share of pairs whose label agrees with the gold ordering (ties count 0.5).

    This is the accuracy a perfect judge of the gold would reach on these noisy labels,
    i.e. the ceiling for a reward model's preference accuracy.
    """
    if not rows:
        raise ValueError("label_noise_ceiling needs at least one row")
    agree = 0.0
    for row in rows:
        g_c = gold_score(row["prompt"], row["chosen"])
        g_r = gold_score(row["prompt"], row["rejected"])
        agree += 1.0 if g_c > g_r else 0.5 if g_c == g_r else 0.0
    return agree / len(rows)


def corpus_text() -> str:
    """Text to train the BPE tokenizer on: every prompt with sample replies, plus every
    reply segment with every product, so each word the task uses is seen."""
    rng = random.Random("support-corpus")
    lines: list[str] = []
    for split in ("train", "eval"):
        for row in make_prompts(split):
            _, product = parse_prompt(row["prompt"])
            lines.append(row["prompt"] + " " + ideal_reply(rng, row["category"], product))
            for _ in range(2):
                lines.append(row["prompt"] + " " + sample_reply(rng, row["category"], product))
            lines.append(row["prompt"] + " " + sample_wide_reply(rng, row["category"], product))
    segments = list(EMPATHY + GREETINGS + VAGUE_ACKNOWLEDGEMENTS + GENERIC_ACTIONS + CLOSINGS + FILLERS)
    for group in ACKNOWLEDGEMENTS.values():
        segments.extend(s.format(p=p) for s in group for p in PRODUCTS)
    for group in ACTIONS.values():
        segments.extend(group)
    lines.extend(segments)
    return "\n".join(lines) + "\n"


def _balanced(rows: list[dict], n: int) -> list[dict]:
    """The first `n` rows taking categories in turn (rows keep their split order)."""
    by_category: dict[str, list[dict]] = {}
    for row in rows:
        by_category.setdefault(row["category"], []).append(row)
    turns = itertools.zip_longest(*by_category.values())
    return [row for turn in turns for row in turn if row is not None][:n]


def write_task_data(out_dir: str | Path, seed: int = 0, sizes: dict[str, int] | None = None) -> dict[str, Path]:
    """Write the task's files into `out_dir` and return `{name: path}`.

    Names: sft, sft_eval, prefs_train, prefs_eval (JSONL), prompts_train (every train
    prompt), prompts_eval (a category-balanced subset of eval prompts), corpus (text).
    Prompt files hold `{"prompt"}` rows only. `sizes` overrides DEFAULT_SIZES entries.
    """
    size = {**DEFAULT_SIZES, **(sizes or {})}
    unknown = set(size) - set(DEFAULT_SIZES)
    if unknown:
        raise ValueError(f"unknown size names {sorted(unknown)}; known: {sorted(DEFAULT_SIZES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    eval_prompts = _balanced(make_prompts("eval"), size["prompts_eval"])
    files = {
        "sft": write_jsonl(out / "sft.jsonl", make_sft_rows(seed, size["sft"], "train")),
        "sft_eval": write_jsonl(out / "sft_eval.jsonl", make_sft_rows(seed, size["sft_eval"], "eval")),
        "prefs_train": write_jsonl(out / "prefs_train.jsonl", make_preference_rows("train", seed, size["prefs_train"])),
        "prefs_eval": write_jsonl(out / "prefs_eval.jsonl", make_preference_rows("eval", seed, size["prefs_eval"])),
        "prompts_train": write_jsonl(
            out / "prompts_train.jsonl", [{"prompt": r["prompt"]} for r in make_prompts("train")]
        ),
        "prompts_eval": write_jsonl(out / "prompts_eval.jsonl", [{"prompt": r["prompt"]} for r in eval_prompts]),
    }
    corpus = out / "corpus.txt"
    write_text(corpus, corpus_text())
    files["corpus"] = corpus
    return files
