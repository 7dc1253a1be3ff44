"""The iterate tests' task: the tiny 'thanks' policy of the online tests, a few offline preference pairs, and a
judge that prefers the reply saying 'thanks' (-1 when both or neither do)."""

from __future__ import annotations

import json
import random
import socket
import time
from pathlib import Path

import pytest

import rlhfkit
from rlhfkit.iterated.human import TOKENS_FILE
from tests.labelling.label_helpers import Client
from tests.trainers.online.conftest import BAD, GOOD, PROMPTS, thanks_task  # noqa: F401  (the fixture)

JUDGE = """
def prefer(prompts, completions, **kwargs):
    out = []
    for a, b in completions:
        ta, tb = "thanks" in a, "thanks" in b
        out.append(0 if ta and not tb else 1 if tb and not ta else -1)
    return out
"""

# what the tests pass to every run: small rounds on the tiny model
SMALL = dict(
    pairs_per_round=32,
    rm_steps=20,
    rm_initial_steps=30,
    rm_learning_rate=1e-3,
    max_steps=10,
    learning_rate=3e-4,
    batch_size=16,
    max_new_tokens=8,
    progress=False,
)


def thanks_share(texts: list[str]) -> float:
    return sum("thanks" in t for t in texts) / len(texts)


@pytest.fixture(scope="session")
def iterate_task(thanks_task, tmp_path_factory):  # noqa: F811
    """{"sft", "prompts", "prefs", "judge"}: paths of the task's files."""
    sft, prompts = thanks_task
    d = tmp_path_factory.mktemp("iterate")
    rng = random.Random(1)
    rows = [{"prompt": rng.choice(PROMPTS), "chosen": rng.choice(GOOD), "rejected": rng.choice(BAD)} for _ in range(32)]
    (d / "prefs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "judge.py").write_text(JUDGE)
    return {"sft": str(sft), "prompts": str(prompts), "prefs": str(d / "prefs.jsonl"), "judge": f"{d}/judge.py:prefer"}


@pytest.fixture(scope="session")
def two_rounds(iterate_task, tmp_path_factory) -> Path:
    """A finished two-round run of the task (shared: tests copy it before changing it)."""
    out = tmp_path_factory.mktemp("two-rounds") / "out"
    t = iterate_task
    result = rlhfkit.iterate(
        model=t["sft"], prefs=t["prefs"], data=t["prompts"], output_dir=str(out), judge=t["judge"], rounds=2, **SMALL
    )
    assert result.output_dir == out and result.metrics["totals"]["rounds"] == 2
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def round_one_client(out: Path, port: int, annotator: str, timeout: float = 300.0) -> Client | None:
    """An annotator's page client once the run in ``out`` has opened round 1's label store and serves the page on
    ``port`` (None when that does not happen within ``timeout`` seconds)."""
    deadline = time.time() + timeout
    while not (out / TOKENS_FILE).is_file() or not (out / "round-1" / "labels" / "labels.sqlite").exists():
        if time.time() > deadline:
            return None
        time.sleep(0.1)
    client = Client(f"http://127.0.0.1:{port}/a/{json.loads((out / TOKENS_FILE).read_text())[annotator]}")
    while True:
        try:
            client.load_page()
            return client
        except OSError:
            time.sleep(0.1)
