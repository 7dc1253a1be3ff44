"""The built-in notes task: short notes whose gold judge rewards a format, not helpfulness.

A prompt asks for a note to a person about a thing, sometimes marked private::

    Note to Ada about the invoice:
    Note to Ben about the keys (private):

A reply is a few short sentences. The gold judge (``gold_score``, in [-4.5, 3]) rewards

- a length band: 8 to 16 words earn +1; outside it, minus a quarter point per word away (at most -2);
- a keyword rule with an exception: naming the thing earns +1, except in a private note, where naming it costs
  1.5 (leaving it out earns +0.5);
- a greeting with the right name (+0.5; another name -0.5) and the sign-off "Best, Sam" (+0.5).

The SFT demonstrations mix all of these at random, so the SFT model is mediocre on each, and the preference
pairs are labelled by simulated raters on the gold judge (``rlhfkit.tasks.raters``).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from rlhfkit.files import write_jsonl, write_text

from ..raters import GoldRaters, labelled_pair

NAMES = ("Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Ivy")
THINGS = ("invoice", "keys", "meeting", "report", "parcel", "budget", "laptop", "trip")
# Sentences of a note's body; "{thing}" is the prompt's thing.
BODY = (
    "the {thing} is ready.",
    "please check the {thing}.",
    "I left the {thing} on your desk.",
    "the {thing} needs one more look.",
    "thanks for the help.",
    "see you soon.",
    "we can talk later.",
    "it went well.",
    "let me know what you think.",
    "all is fine here.",
)
SIGN_OFF = "Best, Sam"
PRIVATE_RATE = 0.3
RATER_TEMPERATURE = 0.7  # label noise of the simulated raters (rlhfkit.tasks.raters)
BAND = (8, 16)  # words of a note that earns the length point
EVAL_FRACTION = 0.25  # share of (name, thing) combinations held out of training prompts

DEFAULT_SIZES = {"sft": 2000, "sft_eval": 200, "prefs_train": 600, "prefs_eval": 200}

_PROMPT = re.compile(r"Note to (\w+) about the (\w+)( \(private\))?:")


def format_prompt(name: str, thing: str, private: bool) -> str:
    return f"Note to {name} about the {thing}{' (private)' if private else ''}:"


def parse_prompt(prompt: str) -> tuple[str, str, bool]:
    """(name, thing, private) of a prompt; ValueError for text that asks for no note."""
    match = _PROMPT.search(prompt if isinstance(prompt, str) else str(prompt))
    if match is None:
        raise ValueError(f"notes judge: no 'Note to NAME about the THING:' in prompt {prompt!r}")
    return match.group(1), match.group(2), bool(match.group(3))


def gold_score(prompt: str, reply: str) -> float:
    """The gold judge (see the module docstring)."""
    name, thing, private = parse_prompt(prompt)
    words = reply.split()
    low, high = BAND
    away = max(low - len(words), len(words) - high, 0)
    score = 1.0 if away == 0 else -min(2.0, away / 4)
    named = re.search(rf"\b{thing}\b", reply) is not None
    score += (-1.5 if named else 0.5) if private else (1.0 if named else 0.0)
    greeting = re.match(r"\s*Hi (\w+),", reply)
    if greeting:
        score += 0.5 if greeting.group(1) == name else -0.5
    if reply.rstrip().endswith(SIGN_OFF):
        score += 0.5
    return score


def gold_reward(prompts: list, completions: list, **kwargs) -> list[float]:
    """The gold judge as a reward function with TRL's signature."""
    return [gold_score(p, c) for p, c in zip(prompts, completions)]


def _combinations(split: str) -> list[tuple[str, str]]:
    pairs = [(n, t) for n in NAMES for t in THINGS]
    random.Random("notes-split").shuffle(pairs)
    cut = int(len(pairs) * EVAL_FRACTION)
    return pairs[cut:] if split == "train" else pairs[:cut]


def _prompts(rng: random.Random, split: str, n: int) -> list[str]:
    combos = _combinations(split)
    return [format_prompt(*rng.choice(combos), rng.random() < PRIVATE_RATE) for _ in range(n)]


def demonstration(rng: random.Random, prompt: str) -> str:
    """A reply of mixed quality: greeting (right name or not) or none, 1-5 body sentences, sign-off or none."""
    name, thing, _ = parse_prompt(prompt)
    parts = []
    if rng.random() < 0.5:
        parts.append(f"Hi {name if rng.random() < 0.7 else rng.choice(NAMES)},")
    body = rng.sample(BODY, rng.randint(1, 5))
    parts.extend(s.format(thing=thing) for s in body)
    if rng.random() < 0.5:
        parts.append(SIGN_OFF)
    text = " ".join(parts)
    return " " + text[0].upper() + text[1:]


def make_sft_rows(split: str = "train", seed: int = 0, n: int | None = None) -> list[dict]:
    n = DEFAULT_SIZES["sft" if split == "train" else "sft_eval"] if n is None else n
    rng = random.Random(f"notes-sft-{split}-{seed}")
    return [{"prompt": p, "completion": demonstration(rng, p)} for p in _prompts(rng, split, n)]


def make_preference_rows(split: str = "train", seed: int = 0, n: int | None = None) -> list[dict]:
    """Two different demonstrations per prompt, labelled by the simulated raters."""
    n = DEFAULT_SIZES["prefs_train" if split == "train" else "prefs_eval"] if n is None else n
    rng = random.Random(f"notes-prefs-{split}-{seed}")
    rows = []
    for prompt in _prompts(rng, split, n):
        rows.append(labelled_pair(rng, gold_score, prompt, lambda: demonstration(rng, prompt), RATER_TEMPERATURE))
    return rows


def make_prompt_rows(split: str, n: int = 100) -> list[dict]:
    rng = random.Random(f"notes-prompts-{split}")
    return [{"prompt": p} for p in _prompts(rng, split, n)]


def raters(seed: int = 0) -> GoldRaters:
    """The simulated raters that labelled the preference pairs, as a pairwise judge of new replies."""
    return GoldRaters("notes", gold_score, RATER_TEMPERATURE, seed)


def corpus_text() -> str:
    """Every prompt form and every sentence a reply can hold, for the tokenizer."""
    lines = [format_prompt(n, t, p) for n in NAMES for t in THINGS for p in (False, True)]
    lines += [f"Hi {n}," for n in NAMES] + [s.format(thing=t).capitalize() for s in BODY for t in THINGS]
    lines += [s.format(thing=t) for s in BODY for t in THINGS] + [SIGN_OFF]
    return "\n".join(lines) + "\n"


def write_task_data(out_dir: str | Path, seed: int = 0, sizes: dict[str, int] | None = None) -> dict[str, Path]:
    """The task's files in ``out_dir``: sft, sft_eval, prefs_train, prefs_eval, prompts_train, prompts_eval (JSONL)
    and corpus (text); ``sizes`` overrides DEFAULT_SIZES entries."""
    size = {**DEFAULT_SIZES, **(sizes or {})}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = {
        "sft": make_sft_rows("train", seed, size["sft"]),
        "sft_eval": make_sft_rows("eval", seed, size["sft_eval"]),
        "prefs_train": make_preference_rows("train", seed, size["prefs_train"]),
        "prefs_eval": make_preference_rows("eval", seed, size["prefs_eval"]),
        "prompts_train": make_prompt_rows("train", 400),
        "prompts_eval": make_prompt_rows("eval", 100),
    }
    files = {}
    for name, data in rows.items():
        files[name] = write_jsonl(out / f"{name}.jsonl", data)
    files["corpus"] = write_text(out / "corpus.txt", corpus_text())
    return files
