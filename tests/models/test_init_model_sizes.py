"""The parameter counts that `--size`'s help and the docs state are those of the models `rlhfkit init-model`
builds. Counting builds each model on the meta device (no memory, no init), from the same ``model_config`` that
`init-model` uses; one test checks that count against a model really built and saved."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.models.init_model import SIZES, model_config, train_tokenizer

from ..helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
# "tiny has 0.24M parameters (gpt2) or 0.27M (llama), small 8.7M (gpt2) or 10.4M (llama)"
COUNTS = re.compile(
    r"tiny has ([\d.]+)M parameters \(gpt2\) or ([\d.]+)M \(llama\), small ([\d.]+)M \(gpt2\) or ([\d.]+)M \(llama\)"
)


class _Vocabulary:
    """What ``model_config`` reads of a tokenizer: its length and special-token ids."""

    bos_token_id = eos_token_id = 0
    pad_token_id = 1

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def parameter_count(arch: str, size: str, vocabulary: int) -> int:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config(arch, size, _Vocabulary(vocabulary)))
    return sum(p.numel() for p in model.parameters())


def stated_counts(command: str, capsys) -> dict[tuple[str, str], str]:
    """{(size, arch): "0.24"} as `rlhfkit COMMAND --help` writes them for `--size`."""
    code, out, _ = run_cli(capsys, command, "--help")
    assert code == 0
    found = COUNTS.search(" ".join(out.split()))
    assert found, f"rlhfkit {command} --help: no parameter counts in the --size help"
    keys = [("tiny", "gpt2"), ("tiny", "llama"), ("small", "gpt2"), ("small", "llama")]
    return dict(zip(keys, found.groups(), strict=True))


def in_millions(count: int, like: str) -> str:
    """``count`` in millions with as many decimals as ``like`` has."""
    decimals = len(like.split(".")[1]) if "." in like else 0
    return f"{count / 1e6:.{decimals}f}"


def support_vocabulary() -> int:
    from rlhfkit.tasks.support.dataset import corpus_text

    lines = [line for line in corpus_text().splitlines() if line.strip()]
    return len(train_tokenizer(lines, SIZES["tiny"]["vocab"]))


def test_meta_count_is_the_count_of_a_model_init_model_built(tiny_model_dir):
    from transformers import AutoTokenizer

    saved = load_file(str(tiny_model_dir / "model.safetensors"))
    vocabulary = len(AutoTokenizer.from_pretrained(tiny_model_dir))
    # GPT-2 ties its output layer to the token embedding, so the file holds each parameter once
    assert sum(t.numel() for t in saved.values()) == parameter_count("gpt2", "tiny", vocabulary)


def test_init_model_help_states_the_counts_at_the_default_vocabulary(capsys):
    for (size, arch), stated in stated_counts("init-model", capsys).items():
        count = parameter_count(arch, size, SIZES[size]["vocab"])
        assert in_millions(count, stated) == stated, f"init-model --size {size} --arch {arch}: {count:,} parameters"


def test_demo_help_states_the_counts_with_the_task_vocabulary(capsys):
    vocabulary = support_vocabulary()
    for (size, arch), stated in stated_counts("demo", capsys).items():
        count = parameter_count(arch, size, vocabulary)
        assert in_millions(count, stated) == stated, f"demo --size {size} --arch {arch}: {count:,} parameters"


@pytest.mark.parametrize(
    "page,template",
    [
        ("README.md", "builds a ~{tiny}M-parameter GPT-2"),
        ("docs/demo.md", "`--arch gpt2 --size tiny`: {tiny}M parameters with the task's {vocabulary}-token vocabulary"),
        ("docs/demo.md", "the small model ({small}M parameters with the task's vocabulary)"),
    ],
)
def test_docs_state_the_demo_model_counts(page, template):
    vocabulary = support_vocabulary()
    tiny = f"{parameter_count('gpt2', 'tiny', vocabulary) / 1e6:.2f}"
    small = f"{parameter_count('gpt2', 'small', vocabulary) / 1e6:.1f}"
    text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
    expected = template.format(tiny=tiny, small=small, vocabulary=vocabulary)
    assert expected in text, f"{page} should say: {expected}"
