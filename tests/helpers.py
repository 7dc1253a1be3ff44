"""Helpers shared by the tests: data files, running the CLI in-process, reading outputs."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

from rlhfkit.cli.main import main

NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
ITEMS = ["apple", "book", "car", "door", "egg", "fish", "glass", "hat", "lamp", "map"]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def sft_rows(n: int = 48, seed: int = 0) -> list[dict]:
    """Prompt/completion rows of varied lengths with a learnable pattern (the name repeats in the answer)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        filler = " please" * rng.randint(0, 4)
        rows.append(
            {
                "prompt": f"Question: what does {name} want{filler}? Answer:",
                "completion": f" {name} wants the {item} today." + " ok" * rng.randint(0, 3),
            }
        )
    return rows


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """``rlhfkit ARGS`` in this process; returns (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def sft_args(model, data, out, **flags) -> list[str]:
    args = ["sft", "--model", model, "--data", data, "--output-dir", out, "--progress", "false"]
    for key, value in flags.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return [str(a) for a in args]


def metrics(out_dir: Path) -> list[dict]:
    return read_jsonl(Path(out_dir) / "metrics.jsonl")


def weights(model_dir: Path) -> dict:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    assert files, f"no safetensors in {model_dir}"
    out = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def max_weight_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def update_apart(a: dict, b: dict, start: dict, key=lambda k: k) -> tuple[float, float]:
    """How far apart two runs' final weights are, and how far training moved them from ``start``: the norms
    over all weights of ``a - b`` and of ``a - start`` (``key`` maps a name of ``a`` to its name in ``start``).

    Runs that must train the same up to float reordering (packed against padded rows, one joint pass against
    two) are compared by these norms, not element by element: where a gradient is near zero, Adam's first steps
    are ~lr*sign(g), so float noise alone can move that one weight by up to the learning rate either way, by an
    amount that depends on the CPU's kernels. The norm over all weights stays a small fraction of the move."""
    assert a.keys() == b.keys()
    apart = sum(float((a[k].float() - b[k].float()).square().sum()) for k in a) ** 0.5
    moved = sum(float((a[k].float() - start[key(k)].float()).square().sum()) for k in a if key(k) in start) ** 0.5
    return apart, moved


def launcher(nproc: int = 2, *extra: str) -> list[str]:
    """``torchrun --standalone --nproc-per-node N`` as this interpreter runs it (a free port is picked)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *extra]


def launch(args, nproc: int = 2, timeout: float = 300) -> subprocess.CompletedProcess:
    """``torchrun ... -m rlhfkit ARGS`` with one thread per process; returns the finished process."""
    cmd = launcher(nproc) + ["-m", "rlhfkit", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=one_thread_env())


def one_thread_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def pref_rows(n: int = 32, seed: int = 0) -> list[dict]:
    """Preference pairs built from ``sft_rows``: the row's completion is chosen, another row's rejected."""
    rows = sft_rows(n, seed)
    rng = random.Random(seed + 1)
    return [
        {"prompt": r["prompt"], "chosen": r["completion"], "rejected": rng.choice(rows)["completion"] + " no"}
        for r in rows
    ]
