"""The tiny synthetic preference task of the DPO tests (fixtures in conftest.py).

Prompts ask "Do you like X?"; a reply is either " yes, I like X." (preferred) or " no, I hate X."
(rejected). The starting model is a tiny GPT-2 fine-tuned (SFT) on both kinds equally, so before
DPO it says yes about half the time. Held-out pairs and prompts use items never seen in the
preference data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

TRAIN_ITEMS = [
    "tea",
    "coffee",
    "rain",
    "snow",
    "music",
    "books",
    "cats",
    "dogs",
    "bread",
    "cheese",
    "trains",
    "boats",
    "apples",
    "pears",
    "jazz",
    "chess",
    "maps",
    "lamps",
    "socks",
    "shoes",
]
HELD_OUT_ITEMS = ["soup", "rice", "kites", "clocks", "birds", "plums", "hats", "bikes"]


def prompt(item: str) -> str:
    return f"Q: Do you like {item}?\nA:"


def good(item: str) -> str:
    return f" yes, I like {item}."


def bad(item: str) -> str:
    return f" no, I hate {item}."


def preference_rows(items: list[str]) -> list[dict]:
    return [{"prompt": prompt(i), "chosen": good(i), "rejected": bad(i)} for i in items]


def write_rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@dataclass
class Task:
    root: Path
    base: str  # SFT model directory: the DPO starting point
    prefs_train: str
    prefs_eval: str
    sft: str


def read_metrics(output_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()]


def reply_rates(model_dir: str, items: list[str], samples: int = 8, seed: int = 0) -> tuple[float, float]:
    """Fractions of sampled replies (temperature 1) to the prompts about ``items`` that start with
    "yes" and with "no"."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")  # generation continues on the right
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    enc = tokenizer([prompt(i) for i in items], return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            max_new_tokens=3,
            num_return_sequences=samples,
            pad_token_id=tokenizer.pad_token_id,
        )
    replies = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    replies = [r.strip() for r in replies]
    return sum(r.startswith("yes") for r in replies) / len(replies), sum(r.startswith("no") for r in replies) / len(
        replies
    )
