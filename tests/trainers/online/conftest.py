"""A tiny SFT policy on a two-kind task, and a reward that is a known function of the text."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import pytest
import torch

from rlhfkit.cli.main import COMMANDS
from rlhfkit.config.commands import InitModelConfig
from rlhfkit.config.parse import parse_config
from rlhfkit.models.init_model import init_model

PROMPTS = [
    f"Customer: my {w} is {v}\nAgent:"
    for w in "order app phone card box lamp".split()
    for v in "late broken lost wrong".split()
]
GOOD = [" thanks a lot for asking", " thanks we will help"]
BAD = [" go away now", " we will not help you"]


@dataclass
class ScoreOut:
    mean: torch.Tensor
    std: torch.Tensor | None = None


class ThanksScorer:
    """Reward +1 for a response containing 'thanks', -1 otherwise."""

    stats = None
    conservative_k = 1.0

    def score(self, prompts, responses, batch_size=32, finished=None):
        return ScoreOut(torch.tensor([1.0 if "thanks" in r else -1.0 for r in responses]))


def parse(command: str, argv: str):
    return parse_config("test", COMMANDS[command].config, argv.split())[0]


@pytest.fixture(scope="session")
def thanks_task(tmp_path_factory):
    """(sft policy dir, prompts file): the policy says 'thanks ...' about 30% of the time."""
    from rlhfkit.trainers import sft

    d = tmp_path_factory.mktemp("thanks")
    rng = random.Random(0)
    (d / "corpus.txt").write_text("\n".join(PROMPTS + GOOD + BAD) * 3)
    with open(d / "sft.jsonl", "w") as f:
        for _ in range(400):
            completion = rng.choice(GOOD if rng.random() < 0.3 else BAD)
            f.write(json.dumps({"prompt": rng.choice(PROMPTS), "completion": completion}) + "\n")
    with open(d / "prompts.jsonl", "w") as f:
        f.writelines(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)
    init_model(InitModelConfig(output_dir=str(d / "base"), corpus=str(d / "corpus.txt")))
    sft.train(
        parse(
            "sft",
            f"--model {d}/base --data {d}/sft.jsonl --output-dir {d}/sft --max-steps 80 "
            "--learning-rate 3e-3 --batch-size 16 --progress false",
        )
    )
    return d / "sft", d / "prompts.jsonl"


def read_metrics(path) -> list[dict]:
    return [json.loads(line) for line in open(path / "metrics.jsonl")]
