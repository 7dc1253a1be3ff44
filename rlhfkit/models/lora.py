"""LoRA adapters (via ``peft``) and saving a trained policy in Hugging Face format.

With LoRA the frozen reference is the same backbone with the adapters switched off, so policy and
reference share one copy of the weights.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch

from rlhfkit.errors import UserError
from rlhfkit.training.checkpoint import assert_finite


def apply_lora(model, lora, task_type: str = "CAUSAL_LM"):
    """Wrap ``model`` with LoRA adapters of rank ``lora.lora_r``; only the adapters are trainable."""
    from peft import LoraConfig, get_peft_model

    targets = lora.lora_target_modules
    target_modules = "all-linear" if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    config = LoraConfig(r=lora.lora_r, lora_alpha=lora.lora_alpha, lora_dropout=lora.lora_dropout,
                        target_modules=target_modules, task_type=task_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GPT-2's Conv1D fan_in_fan_out notice
        try:
            return get_peft_model(model, config)
        except ValueError as exc:  # e.g. no module matches --lora-target-modules
            raise UserError(f"--lora-target-modules {targets}: {str(exc).splitlines()[0]}") from None


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def adapters_off(model):
    """Context manager: the base model (= the frozen reference) for LoRA models; a no-op otherwise."""
    return model.disable_adapter() if is_lora(model) else contextlib.nullcontext()


def save_pretrained(model, tokenizer, output_dir: str | Path) -> Path:
    """Save the final model (LoRA merged into the root, the adapter also under ``adapter/``) + tokenizer."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    assert_finite({"model": model})
    if is_lora(model):
        model.save_pretrained(out / "adapter", safe_serialization=True)
        import copy

        merged = copy.deepcopy(model).merge_and_unload()
        merged.save_pretrained(out, safe_serialization=True)
    else:
        model.save_pretrained(out, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad), total
