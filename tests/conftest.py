"""Shared fixtures. ``tiny_model_dir``: a tiny random GPT-2 + BPE tokenizer, built once per test session.

Nothing comes from a hub: the tokenizer is trained on ``tiny_corpus_lines()`` and the model is built by
``rlhfkit.models.init_model`` (the code behind `rlhfkit init-model`).
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

# The suite runs on the CPU, also on a machine with a GPU: its invariance tests compare two paths in fp32 to
# 1e-5 (a GPU's default bf16 autocast moves them by 1e-3), and its several-process tests start two processes
# on one machine (gloo on the CPU; NCCL wants a GPU per process). RLHFKIT_TEST_GPU=1 leaves the GPUs visible.
# The GPU is measured by bench/speed/real_model_gpu.py. Set before torch is imported, so no process sees a GPU.
if os.environ.get("RLHFKIT_TEST_GPU", "").strip().lower() not in ("1", "true", "yes"):
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import pytest  # noqa: E402
import torch  # noqa: E402

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
