"""Helpers of the reward-model tests: a synthetic preference task and tiny models built locally.

The synthetic task: replies to customer messages; the chosen reply always contains "thanks", the
rejected one never does, so a working reward model ranks held-out pairs (almost) perfectly.
(A uniquely named module rather than conftest.py, so ``import`` cannot pick another folder's conftest.)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from rlhfkit.config.commands import RMConfig
from rlhfkit.config.parse import parse_config
from rlhfkit.models.init_model import build_model, train_tokenizer

WORDS = (
    "the order item box phone app card refund help please today we will send check your account soon sorry about issue"
).split()
PROMPTS = [
    "Customer: my order is late.\nAgent:",
    "Customer: the app crashed.\nAgent:",
    "Customer: I was charged twice.\nAgent:",
    "Customer: my box was damaged.\nAgent:",
]


def reply(rng: random.Random, good: bool) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 7))]
    if good:
        words.insert(rng.randint(0, len(words)), "thanks")
    return " " + " ".join(words)


def preference_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"prompt": rng.choice(PROMPTS), "chosen": reply(rng, True), "rejected": reply(rng, False)} for _ in range(n)
    ]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def reply_scores(scorer, rows: list[dict]) -> torch.Tensor:
    """``[2N]`` (mean) scores of the N rows' chosen replies, then their rejected ones: the replies the reward
    statistics are taken over."""
    prompts = [r["prompt"] for r in rows] * 2
    return scorer.score(prompts, [r["chosen"] for r in rows] + [r["rejected"] for r in rows]).mean


def rm_config(argv: list[str]) -> RMConfig:
    cfg, _ = parse_config("rlhfkit rm", RMConfig, argv + ["--progress", "false"])
    return cfg


def save_tiny_gpt2(out: Path, pad_is_eos: bool = False) -> Path:
    rows = preference_rows(300, seed=123)
    lines = [r["prompt"] + r[k] for r in rows for k in ("chosen", "rejected")]
    tokenizer = train_tokenizer(lines, 300)
    if pad_is_eos:  # as for tokenizers without a pad token, which loading maps to EOS
        tokenizer.pad_token = tokenizer.eos_token
    model = build_model("gpt2", "tiny", tokenizer, seed=0)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def save_tiny_bert(out: Path) -> Path:
    from transformers import BertConfig, BertModel, BertTokenizerFast

    words = sorted({w.strip(".:").lower() for p in PROMPTS for w in p.split()} | set(WORDS) | {"thanks", ".", ":"})
    (out / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
    tokenizer = BertTokenizerFast.from_pretrained(str(out))  # reads vocab.txt
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    BertModel(config).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
