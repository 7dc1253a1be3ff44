"""Fixtures of the reward-model tests (tiny models and data built once per test process)."""

from __future__ import annotations

import pytest
import torch

from .rm_helpers import preference_rows, save_tiny_bert, save_tiny_gpt2, write_jsonl


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tests run two at a time on two cores (pytest -n 2): more threads per test only contend.

    Module scope, so it is in force before the module-scoped training fixtures run."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory) -> str:
    """A tiny random GPT-2 causal LM whose pad token differs from EOS."""
    return str(save_tiny_gpt2(tmp_path_factory.mktemp("tiny-lm")))


@pytest.fixture(scope="session")
def tiny_lm_pad_eos(tmp_path_factory) -> str:
    """The same, but its pad token IS its EOS token."""
    return str(save_tiny_gpt2(tmp_path_factory.mktemp("tiny-lm-pad-eos"), pad_is_eos=True))


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> str:
    """A tiny random BERT encoder with a word-piece vocabulary of the task's words."""
    return str(save_tiny_bert(tmp_path_factory.mktemp("tiny-bert")))


@pytest.fixture(scope="session")
def task_data(tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("task-data")
    return {
        "train": str(write_jsonl(out / "train.jsonl", preference_rows(320, seed=1))),
        "eval": str(write_jsonl(out / "eval.jsonl", preference_rows(100, seed=2))),
    }
