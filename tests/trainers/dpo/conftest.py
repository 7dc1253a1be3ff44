"""Fixtures of the DPO tests: the tiny yes/no task (see dpo_task.py), built once per session."""

from __future__ import annotations

import random

import pytest
import torch

from rlhfkit.config.commands import DPOConfig, SFTConfig
from rlhfkit.config.parse import parse_config

from .dpo_task import HELD_OUT_ITEMS, TRAIN_ITEMS, Task, bad, good, preference_rows, prompt, write_rows


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread; several threads per process on a busy 2-core
    machine mostly spin. Restored afterwards, so other test folders keep their setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def task(tmp_path_factory) -> Task:
    from rlhfkit.models.init_model import build_model, train_tokenizer
    from rlhfkit.trainers import sft

    root = tmp_path_factory.mktemp("dpo_task")
    items = TRAIN_ITEMS + HELD_OUT_ITEMS
    lines = [prompt(i) + good(i) for i in items] + [prompt(i) + bad(i) for i in items]
    tokenizer = train_tokenizer(lines * 4, vocab_size=512)
    init = root / "init"
    build_model("gpt2", "tiny", tokenizer, seed=0).save_pretrained(init, safe_serialization=True)
    tokenizer.save_pretrained(init)

    # SFT on both kinds of reply, for every item (held-out ones too: the model knows the words).
    rng = random.Random(0)
    sft_rows = [{"prompt": prompt(i), "completion": reply(i)} for i in items for reply in (good, bad)]
    rng.shuffle(sft_rows)
    sft_path = write_rows(root / "sft.jsonl", sft_rows)
    base = root / "base"
    cfg, _ = parse_config(
        "rlhfkit sft",
        SFTConfig,
        [
            "--model",
            str(init),
            "--data",
            sft_path,
            "--output-dir",
            str(base),
            "--max-steps",
            "300",
            "--learning-rate",
            "5e-3",
            "--batch-size",
            "16",
            "--progress",
            "false",
            "--logging-steps",
            "300",
        ],
    )
    sft.train(cfg)

    return Task(
        root,
        str(base),
        write_rows(root / "prefs_train.jsonl", preference_rows(TRAIN_ITEMS)),
        write_rows(root / "prefs_eval.jsonl", preference_rows(HELD_OUT_ITEMS)),
        sft_path,
    )


@pytest.fixture
def dpo_config(task, tmp_path):
    """``dpo_config(name, *flags)`` -> a DPOConfig parsed like the command line, writing to tmp_path/name."""

    def make(name: str, *flags: str) -> DPOConfig:
        argv = [
            "--model",
            task.base,
            "--data",
            task.prefs_train,
            "--output-dir",
            str(tmp_path / name),
            "--batch-size",
            "4",
            "--max-steps",
            "6",
            "--learning-rate",
            "3e-3",
            "--progress",
            "false",
            *flags,
        ]
        return parse_config("rlhfkit dpo", DPOConfig, argv)[0]

    return make
