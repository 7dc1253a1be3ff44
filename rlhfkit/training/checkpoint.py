"""Checkpoints that a kill can never leave half-written, that say when they are damaged, and the newest
intact one for ``--resume``.

A checkpoint is written into ``checkpoints/.tmp-step-N`` and renamed to ``checkpoints/step-N`` once every
file is on disk; a rename within one directory is atomic, so any ``step-N`` folder is complete. Its
``meta.json`` is written last and records the step, the number of processes, and the size and SHA-256 of
every file; ``--resume`` checks them and skips a damaged checkpoint (a truncated or missing file) for the
newest intact one. Weights go to safetensors; the small trainer state (optimizer, scheduler, data position,
controllers) and each process's RNG state go through ``torch.save`` and are read back with
``weights_only=True``.

With several processes, every rank writes its own part (``rank-R.pt``: its RNG) into the temporary folder,
then, after a barrier, rank 0 writes the shared files and the marker and renames the folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_file, save_model

from rlhfkit.errors import UserError, option
from rlhfkit.models.lora import assert_finite

STATE_FILE = "trainer_state.pt"
SHARDS = "shards"  # a sharding engine's models and optimizer, one file per rank
META_FILE = "meta.json"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def rank_file(rank: int) -> str:
    return f"rank-{rank}.pt"


def damage(path: Path) -> str | None:
    """Why the checkpoint at ``path`` cannot be trusted (a file missing, cut short or changed), or None."""
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError):
        return f"{META_FILE} unreadable"
    for name, want in meta.get("files", {}).items():
        file = path / name
        if not file.is_file():
            return f"{name} missing"
        if file.stat().st_size != want["bytes"]:
            return f"{name} has {file.stat().st_size} bytes, expected {want['bytes']}"
        if sha256(file) != want["sha256"]:
            return f"{name} checksum mismatch"
    return None


TRAINED_ONLY = "trained_only"  # a weights file's metadata: the frozen parameters were left out


def frozen_names(model: torch.nn.Module) -> set[str]:
    """The names of ``model``'s parameters that do not train (a LoRA model's backbone), tied ones included."""
    return {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """A checkpoint's weights of ``model``: all of them, or when part of it is frozen (LoRA) only what trains and
    its buffers; the run that resumes rebuilds the frozen part from the model it started from, as the first
    run did. A LoRA run's checkpoint is then a few megabytes rather than the whole model."""
    frozen = frozen_names(model)
    if not frozen or len(frozen) == len(dict(model.named_parameters(remove_duplicate=False))):
        save_model(model, str(path))
        return
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k not in frozen}
    save_file(weights, str(path), metadata={TRAINED_ONLY: "1"})


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Weights written by ``save_weights`` into ``model`` (strictly: a file of trained weights alone must name
    every weight of ``model`` but its frozen ones)."""
    with safe_open(str(path), framework="pt") as f:
        trained_only = (f.metadata() or {}).get(TRAINED_ONLY) == "1"
    if not trained_only:
        load_model(model, str(path), strict=True)
        return
    missing, unexpected = model.load_state_dict(load_file(str(path)), strict=False)
    left = set(missing) - frozen_names(model)
    if left or unexpected:
        raise UserError(
            f"{path}: the checkpoint's weights do not fit the model (missing {sorted(left)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}): was the run started again with another {option('lora_r')} or "
            f"{option('lora_target_modules')}?"
        )


class Checkpointer:
    def __init__(self, output_dir: str | Path, limit: int = 2, warn=None):
        self.root = Path(output_dir) / "checkpoints"
        self.limit = limit
        self.warn = warn or (lambda message: None)

    def complete(self) -> list[Path]:
        """Checkpoint folders that were renamed into place (their marker written), oldest first."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.glob("step-*") if p.is_dir() and (p / META_FILE).is_file()]
        return sorted(found, key=lambda p: int(p.name.split("-")[1]))

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    def tmp_dir(self, step: int) -> Path:
        return self.root / f".tmp-step-{step}"

    def begin(self, step: int) -> Path:
        """A fresh temporary folder for step ``step`` (rank 0, before the other ranks write their parts)."""
        tmp = self.tmp_dir(step)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        except OSError as exc:
            raise self._failed(step, exc) from None
        return tmp

    def write_rank(self, step: int, rank: int, state: dict) -> None:
        """This process's own part of checkpoint ``step`` (its RNG state)."""
        path = self.tmp_dir(step) / rank_file(rank)
        try:
            torch.save(state, path)
            _fsync(path)
        except OSError as exc:
            raise self._failed(step, exc) from None

    def save(self, step: int, models: dict[str, torch.nn.Module], state: dict, world: int = 1) -> Path:
        """Write the shared files of checkpoint ``step`` and publish it. With one process this is the whole
        save (``begin`` is called here when the caller did not); with several, rank 0 calls it after every
        rank's ``write_rank``."""
        assert_finite(models)
        tmp, final = self.tmp_dir(step), self.root / f"step-{step}"
        if not tmp.is_dir():
            self.begin(step)
        try:
            for name, model in models.items():
                save_weights(model, tmp / f"{name}.safetensors")
            torch.save(state, tmp / STATE_FILE)
            files = sorted(f for f in tmp.rglob("*") if f.is_file())
            for f in files:
                _fsync(f)
            meta = {
                "step": step,
                "world_size": world,
                "files": {str(f.relative_to(tmp)): {"bytes": f.stat().st_size, "sha256": sha256(f)} for f in files},
            }
            (tmp / META_FILE).write_text(json.dumps(meta, indent=1))
            _fsync(tmp / META_FILE)
            _fsync_dir(tmp)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            _fsync_dir(self.root)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)  # the previous checkpoint stays the newest
            raise self._failed(step, exc) from None
        for old in self.complete()[: -self.limit]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def _failed(self, step: int, exc: OSError) -> UserError:
        previous = self.latest()
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
        return UserError(f"{self.root}: cannot write the checkpoint of step {step} ({exc.strerror or exc}); {kept}")

    def load(self, path: Path, models: dict[str, torch.nn.Module], rank: int = 0) -> tuple[int, dict]:
        """Weights into ``models``; returns (step, shared state with this rank's part under ``"rank"``)."""
        for name, model in models.items():
            load_weights(model, path / f"{name}.safetensors")
        state = torch.load(path / STATE_FILE, weights_only=True, map_location="cpu")
        part = path / rank_file(rank)
        if part.is_file():
            state["rank"] = torch.load(part, weights_only=True, map_location="cpu")
        return json.loads((path / META_FILE).read_text())["step"], state

    def resume_point(self, world: int = 1) -> Path:
        """The newest intact checkpoint; a damaged newer one is reported (one line) and skipped. Stops when
        there is none, or when it was written by a different number of processes."""
        for path in reversed(self.complete()):
            problem = damage(path)
            if problem is not None:
                self.warn(f"checkpoint {path} is damaged ({problem}); trying the one before it")
                continue
            saved_world = json.loads((path / META_FILE).read_text()).get("world_size", 1)
            if saved_world != world:
                raise UserError(
                    f"{path}: written by {saved_world} process(es); resume it with {saved_world} "
                    f"(this run has {world}): each process's sampling randomness is part of the checkpoint"
                )
            return path
        if self.complete():
            raise UserError(f"{self.root}: {option('resume', True)} given but every checkpoint is damaged")
        raise UserError(f"{self.root}: {option('resume', True)} given but there is no complete checkpoint")


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
