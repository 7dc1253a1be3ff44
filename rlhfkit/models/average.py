"""Weight-averaged reward models (WARM, Ramé et al. 2024): one model whose weights are the mean of several reward
models fine-tuned from the same start, scored at the cost of one.

Members in full weights (``model.safetensors``, or its shards) are averaged tensor by tensor. Members that are
LoRA adapters on one base are averaged exactly without merging: the mean of the updates
``scale x B_k A_k`` over K members is one adapter of rank K x r, ``B = [B_1 ... B_K]`` and ``A = [A_1; ...; A_K]``,
whose scale ``lora_alpha / (K x r)`` carries the 1/K. Tensors that are not LoRA factors (a score head trained in
full beside the adapters) are averaged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rlhfkit.errors import UserError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# What a training run leaves beside its model that the averaged model does not share with member 0.
NOT_COPIED = {"metrics.jsonl", "reward_stats.json", "ensemble.json", "config.yaml", "README.md", "tensorboard"}
LORA_A = (".lora_A.", ".lora_embedding_A")
LORA_B = (".lora_B.", ".lora_embedding_B")
# LoRA settings under which the scale is lora_alpha / r for every module, so a K x r adapter carries the mean.
PLAIN_LORA = {"use_rslora": False, "use_dora": False, "rank_pattern": {}, "alpha_pattern": {}}


def weight_average(members: list[Path], out: Path) -> Path:
    """Write into ``out`` the reward model whose weights are the mean of ``members``' (each a reward-model folder
    of the same architecture and start: all in full weights, or all LoRA adapters on the same base) and the
    files member 0 carries beside its weights (config, tokenizer). Returns ``out``."""
    if len(members) < 2:
        raise UserError(f"a weight average needs at least 2 reward models, got {len(members)}")
    adapters = [(m / ADAPTER_CONFIG).is_file() and not _full_weights(m) for m in members]
    if any(adapters) and not all(adapters):
        raise UserError("average reward models of one kind: all LoRA adapters or all in full weights")
    out.mkdir(parents=True, exist_ok=True)
    _copy_files(members[0], out, skip=set(_weight_files(members[0])) | {ADAPTER_CONFIG, ADAPTER_WEIGHTS})
    if all(adapters):
        _average_adapters(members, out)
    else:
        for name in _weight_files(members[0]):
            save_file(_mean([load_file(str(_need(m / name))) for m in members], name), str(out / name))
    return out


def _full_weights(folder: Path) -> bool:
    return bool(_weight_files(folder))


def _weight_files(folder: Path) -> list[str]:
    """The safetensors files of a folder's full weights (one file or the shards its index lists)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    return ["model.safetensors"] if (folder / "model.safetensors").is_file() else []


def _need(path: Path) -> Path:
    if not path.is_file():
        raise UserError(f"{path}: missing; the reward models to average must have the same files")
    return path


def _copy_files(src: Path, out: Path, skip: set[str]) -> None:
    for f in src.iterdir():
        if f.is_file() and f.name not in skip and f.name not in NOT_COPIED:
            shutil.copy2(f, out / f.name)


def _mean(states: list[dict[str, torch.Tensor]], what: str) -> dict[str, torch.Tensor]:
    keys = set(states[0])
    if any(set(s) != keys for s in states[1:]):
        raise UserError(f"{what}: the reward models to average hold different tensors")
    return {k: torch.stack([s[k].float() for s in states]).mean(0).to(states[0][k].dtype) for k in sorted(keys)}


def _average_adapters(members: list[Path], out: Path) -> None:
    configs = [json.loads(_need(m / ADAPTER_CONFIG).read_text(encoding="utf-8")) for m in members]
    first = configs[0]
    for key in ("base_model_name_or_path", "r", "lora_alpha", "target_modules", "modules_to_save", "task_type"):
        values = [c.get(key) for c in configs]
        if any(_same(v) != _same(values[0]) for v in values[1:]):
            raise UserError(f"the adapters to average differ in {key!r}: {values}")
    for key, plain in PLAIN_LORA.items():
        if any((c.get(key) or plain) != plain for c in configs):
            raise UserError(f"adapters with {key!r} set cannot be averaged into one adapter")
    states = [load_file(str(_need(m / ADAPTER_WEIGHTS))) for m in members]
    keys = set(states[0])
    if any(set(s) != keys for s in states[1:]):
        raise UserError(f"{ADAPTER_WEIGHTS}: the adapters to average hold different tensors")
    merged: dict[str, torch.Tensor] = {}
    for k in sorted(keys):
        tensors = [s[k] for s in states]
        if any(part in k for part in LORA_A):
            merged[k] = torch.cat(tensors, dim=0).contiguous()  # [K r, in]
        elif any(part in k for part in LORA_B):
            merged[k] = torch.cat(tensors, dim=1).contiguous()  # [out, K r]
        else:
            merged[k] = torch.stack([t.float() for t in tensors]).mean(0).to(tensors[0].dtype)
    k = len(members)
    config = {**first, "r": first["r"] * k, "lora_alpha": first["lora_alpha"]}  # scale alpha/(K r): the 1/K
    save_file(merged, str(out / ADAPTER_WEIGHTS))
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _same(value):
    return sorted(value) if isinstance(value, list) else value
