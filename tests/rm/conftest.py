"""Fixtures of the reward-model tests: a tiny GPT-2 (and variants) built locally, a synthetic task.

The synthetic task: replies to customer messages; the chosen reply always contains "thanks", the
rejected one never does, so a working reward model ranks held-out pairs (almost) perfectly.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from rlhfkit.config.commands import RMConfig
from rlhfkit.config.parse import parse_config
from rlhfkit.models.init_model import build_model, train_tokenizer

WORDS = "the order item box phone app card refund help please today we will send check your account soon sorry about issue".split()
PROMPTS = ["Customer: my order is late.\nAgent:", "Customer: the app crashed.\nAgent:",
           "Customer: I was charged twice.\nAgent:", "Customer: my box was damaged.\nAgent:"]


def reply(rng: random.Random, good: bool) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 7))]
    if good:
        words.insert(rng.randint(0, len(words)), "thanks")
    return " " + " ".join(words)


def preference_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt": rng.choice(PROMPTS), "chosen": reply(rng, True), "rejected": reply(rng, False)} for _ in range(n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rm_config(argv: list[str]) -> RMConfig:
    cfg, _ = parse_config("rlhfkit rm", RMConfig, argv + ["--progress", "false"])
    return cfg


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tests run two at a time on two cores (pytest -n 2): more threads per test only contend.

    Module scope, so it is in force before the module-scoped training fixtures run."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _save_tiny(out: Path, pad_is_eos: bool = False) -> Path:
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


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory) -> str:
    """A tiny random GPT-2 causal LM whose pad token differs from EOS."""
    return str(_save_tiny(tmp_path_factory.mktemp("tiny-lm")))


@pytest.fixture(scope="session")
def tiny_lm_pad_eos(tmp_path_factory) -> str:
    """The same, but its pad token IS its EOS token."""
    return str(_save_tiny(tmp_path_factory.mktemp("tiny-lm-pad-eos"), pad_is_eos=True))


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> str:
    """A tiny random BERT encoder with a word-piece vocabulary of the task's words."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    out = tmp_path_factory.mktemp("tiny-bert")
    words = sorted({w.strip(".:").lower() for p in PROMPTS for w in p.split()} | set(WORDS) | {"thanks", ".", ":"})
    (out / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(out / "vocab.txt"))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, pad_token_id=0)
    BertModel(config).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def task_data(tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("task-data")
    return {"train": str(write_jsonl(out / "train.jsonl", preference_rows(320, seed=1))),
            "eval": str(write_jsonl(out / "eval.jsonl", preference_rows(100, seed=2)))}
