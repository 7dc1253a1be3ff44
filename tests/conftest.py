"""Shared fixtures. ``tiny_model_dir``: a tiny random GPT-2 + BPE tokenizer, built once per test session.

Nothing comes from a hub: the tokenizer is trained on ``tiny_corpus_lines()`` and the model is built by
``rlhfkit.models.init_model`` (the code behind `rlhfkit init-model`).
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

import pytest
import torch

NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
ITEMS = ["apple", "book", "car", "door", "egg", "fish", "glass", "hat", "lamp", "map"]


def tiny_corpus_lines() -> list[str]:
    """A few hundred short English lines (names, objects, chat role words) for tokenizer training."""
    lines = []
    for name, item in itertools.product(NAMES, ITEMS):
        lines.append(f"Question: what does {name} want? Answer: {name} wants the {item} today.")
        lines.append(f"User: please give {name} the {item}\nAssistant: Sure, here is the {item} for {name}.")
    lines += ["System: you are a helpful assistant. Thanks, ok, yes, no, sorry, hello, goodbye."] * 3
    return lines


# Tiny models gain nothing from intra-op threads, and with `pytest -n 2` (or anything else running)
# two spinning OpenMP threads per process on 2 cores make a run 5-10x slower.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")  # for the CLI subprocesses some tests start
# The kernel timings' verdicts (rlhfkit.accel) go to a folder of the test run's, not the user's cache.
os.environ.setdefault("RLHFKIT_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"rlhfkit-tests-{os.getuid()}"))


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(tiny_corpus_lines()) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_corpus) -> Path:
    """A tiny (~0.2M parameter) random gpt2 model directory with its tokenizer; treat it as read-only."""
    from rlhfkit.config.commands import InitModelConfig
    from rlhfkit.models.init_model import init_model

    out = tmp_path_factory.mktemp("tiny_gpt2")
    init_model(InitModelConfig(output_dir=str(out), corpus=str(tiny_corpus), arch="gpt2", size="tiny", seed=0))
    return out


@pytest.fixture(scope="session")
def browser():
    """A headless Chromium (Selenium WebDriver), shared by a test process; skips when none can run here."""
    from tests.web.browser import start_browser

    driver = start_browser()
    yield driver
    driver.quit()
