"""A tiny judge trained in seconds to prefer the shorter reply: SFT on judge prompts (``judge_messages``, rendered
as the judge will see them) whose answer is the label of the shorter reply, in both slots equally often."""

from __future__ import annotations

import json
import random

import pytest

import rlhfkit
from rlhfkit.data.templates import render_conversation
from rlhfkit.judging.prompts import LABELS, judge_messages
from tests.trainers.online.conftest import BAD, GOOD, PROMPTS

WORDS = "apple book car door egg fish glass hat lamp map".split()
NAMES = "alice bob carol dave erin frank".split()
PRINCIPLES = ("Prefer the shorter reply.",)


# the iterate tests' policy replies (a customer-support prompt, a few words), for the judge to have seen their kind
THANKS_WORDS = sorted({w for reply in GOOD + BAD for w in reply.split()})


def short_long(rng: random.Random) -> dict:
    """A prompt, a reply of 1-3 words and one of 6-9 (of the thanks task's words, after one of its prompts, in a
    third of them)."""
    if rng.random() < 1 / 3:
        words = lambda n: " ".join(rng.choice(THANKS_WORDS) for _ in range(n))  # noqa: E731
        short, long = words(rng.randint(1, 3)), words(rng.randint(4, 8))
        return {"prompt": rng.choice(PROMPTS), "short": " " + short, "long": " " + long}
    words = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    return {"prompt": f"hi {rng.choice(NAMES)}", "short": words(rng.randint(1, 3)), "long": words(rng.randint(6, 9))}


def candidate_rows(n: int, seed: int) -> list[dict]:
    """Held-out pairs as `rlhfkit generate --num-samples 2` writes them, the shorter reply first in half."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        p = short_long(rng)
        replies = [p["short"], p["long"]] if rng.random() < 0.5 else [p["long"], p["short"]]
        rows.append({"prompt": p["prompt"], "responses": replies})
    return rows


class _Plain:  # renders as a tokenizer without a chat template does (the tiny judge's tokenizer has none)
    chat_template = None


@pytest.fixture(scope="session")
def length_judge(tmp_path_factory) -> dict:
    """{"model": the trained judge's folder, "principles": a file with PRINCIPLES}."""
    d = tmp_path_factory.mktemp("length-judge")
    rng = random.Random(0)
    rows, corpus = [], []
    for _ in range(600):
        p = short_long(rng)
        first = rng.random() < 0.5
        a, b = (p["short"], p["long"]) if first else (p["long"], p["short"])
        label = LABELS[0] if first else LABELS[1]
        messages = judge_messages(p["prompt"], a, b, PRINCIPLES)
        rows.append({"prompt": messages, "completion": [{"role": "assistant", "content": label}]})
        corpus.append(render_conversation(_Plain(), messages, add_generation_prompt=True) + " " + label)
    corpus += PROMPTS + GOOD + BAD  # the iterate tests' policy writes these words
    (d / "corpus.txt").write_text("\n".join(corpus), encoding="utf-8")
    (d / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (d / "principles.txt").write_text("\n".join(PRINCIPLES) + "\n", encoding="utf-8")
    rlhfkit.init_model(output_dir=str(d / "base"), corpus=str(d / "corpus.txt"), threads=1)
    # The loss first settles near ln 2 per label (the format learnt, not the rule) and drops to ~0 once the model
    # compares the lengths: at 3e-3 that drop came on some CPUs and not on others (float order), at 1e-3 it came by
    # step 250 for every seed tried.
    rlhfkit.sft(
        model=str(d / "base"), data=str(d / "sft.jsonl"), output_dir=str(d / "judge"), max_steps=400,
        learning_rate=1e-3, lr_scheduler="constant", batch_size=16, progress=False, threads=1,
    )  # fmt: skip
    return {"model": str(d / "judge"), "principles": str(d / "principles.txt")}
