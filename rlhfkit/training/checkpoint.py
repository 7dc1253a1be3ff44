"""Checkpoints that a kill can never leave half-written, and the newest one for ``--resume``.

A checkpoint is written into ``checkpoints/.tmp-step-N`` and renamed to ``checkpoints/step-N`` once
every file is on disk; a rename within one directory is atomic, so any ``step-N`` folder is complete.
Weights go to safetensors; the small trainer state (optimizer, scheduler, RNG, data position,
controllers) goes through ``torch.save`` and is read back with ``weights_only=True``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from rlhfkit.errors import UserError

STATE_FILE = "trainer_state.pt"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def assert_finite(models: dict[str, torch.nn.Module]) -> None:
    for name, model in models.items():
        for pname, p in model.state_dict().items():
            if p.is_floating_point() and not torch.isfinite(p).all():
                raise FloatingPointError(f"refusing to save {name}: parameter {pname} is not finite")


class Checkpointer:
    def __init__(self, output_dir: str | Path, limit: int = 2):
        self.root = Path(output_dir) / "checkpoints"
        self.limit = limit

    def complete(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.glob("step-*") if p.is_dir() and (p / "meta.json").is_file()]
        return sorted(found, key=lambda p: int(p.name.split("-")[1]))

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    def save(self, step: int, models: dict[str, torch.nn.Module], state: dict) -> Path:
        assert_finite(models)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp, final = self.root / f".tmp-step-{step}", self.root / f"step-{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name, model in models.items():
            save_model(model, str(tmp / f"{name}.safetensors"))
        torch.save(state, tmp / STATE_FILE)
        (tmp / "meta.json").write_text(json.dumps({"step": step}))
        for f in tmp.iterdir():
            with open(f, "rb") as handle:
                os.fsync(handle.fileno())
        _fsync_dir(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        for old in self.complete()[: -self.limit]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def load(self, path: Path, models: dict[str, torch.nn.Module]) -> tuple[int, dict]:
        for name, model in models.items():
            load_model(model, str(path / f"{name}.safetensors"), strict=True)
        state = torch.load(path / STATE_FILE, weights_only=True, map_location="cpu")
        return json.loads((path / "meta.json").read_text())["step"], state

    def resume_point(self) -> Path:
        path = self.latest()
        if path is None:
            raise UserError(f"{self.root}: --resume given but there is no complete checkpoint")
        return path


def rng_state() -> dict:
    """RNG states in plain types (lists, ints, tensors) so ``weights_only`` loading accepts them."""
    version, keys, pos, has_gauss, cached = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    state = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [version, keys.tolist(), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    py_version, py_state, py_gauss = state["python"]
    random.setstate((py_version, tuple(py_state), py_gauss))
    version, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((version, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
