"""`rlhfkit merge`: a LoRA adapter merged into its base model, written as training writes a merged model.

The adapter is a PEFT folder (``adapter_config.json`` + ``adapter_model.safetensors``). Its task type says
what the base becomes: a causal LM (sft, dpo, ppo, grpo, rloo) or a one-output sequence classifier (a reward
model from ``rlhfkit rm --lora-r``, whose score head was trained in full and is saved with the adapter). The
merged weights are W + (lora_alpha / r)·B·A, as the training run's own merged save.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from rlhfkit.config.commands import MergeConfig
from rlhfkit.errors import UserError, option
from rlhfkit.models.loading import load_causal_lm, load_tokenizer
from rlhfkit.models.lora import save_pretrained
from rlhfkit.models.reward import build_reward_model

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
KEPT_FILES = ("reward_stats.json",)  # a reward model's score statistics travel with it


def adapter_config(path: str) -> dict:
    """The adapter's ``adapter_config.json``; a UserError when ``path`` is not an adapter folder."""
    folder = Path(path)
    if not folder.is_dir():
        raise UserError(f"{path}: {option('adapter')} folder does not exist")
    file = folder / ADAPTER_CONFIG
    if not file.is_file():
        hint = " (a merged model: nothing to merge)" if (folder / "config.json").is_file() else ""
        raise UserError(f"{path}: not a LoRA adapter folder (no {ADAPTER_CONFIG}){hint}")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{file}: not valid JSON") from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise UserError(f"{file}: not a LoRA adapter (peft_type {config.get('peft_type')!r})")
    return config


def merge(adapter: str, output_dir: str, model: str = "", trust_remote_code: bool = False) -> Path:
    """Merge the LoRA adapter at ``adapter`` into ``model`` (default: the base its config names) and write the
    result to ``output_dir``; returns that folder."""
    from peft import PeftModel

    config = adapter_config(adapter)
    base = model or config.get("base_model_name_or_path") or ""
    if not base:
        raise UserError(f"{adapter}/{ADAPTER_CONFIG} names no base model: give it with {option('model')}")
    if not model and not Path(base).exists():
        raise UserError(
            f"{adapter}/{ADAPTER_CONFIG}: its base model {base} is not a folder here; give it with {option('model')}"
        )
    tokenizer = load_tokenizer(base, trust_remote_code, what="base model")
    if (Path(adapter) / "tokenizer_config.json").is_file():  # the run's own tokenizer, saved beside its adapter
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(adapter, trust_remote_code=trust_remote_code, local_files_only=True)
    if config.get("task_type") == "SEQ_CLS":
        backbone = build_reward_model(base, tokenizer, trust_remote_code)
    else:
        backbone = load_causal_lm(base, trust_remote_code, tokenizer)
    try:
        wrapped = PeftModel.from_pretrained(backbone, adapter)
    except (ValueError, RuntimeError, KeyError) as exc:
        raise UserError(f"{adapter}: cannot apply the adapter to {base} ({str(exc).splitlines()[0]})") from None
    out = save_pretrained(wrapped, tokenizer, output_dir)
    for name in KEPT_FILES:
        if (Path(adapter) / name).is_file():
            shutil.copyfile(Path(adapter) / name, out / name)
    return out


def run(cfg: MergeConfig) -> Path:
    out = merge(cfg.adapter, cfg.output_dir, cfg.model, cfg.trust_remote_code)
    logger.info("merged model saved to %s", out.resolve())
    return out
