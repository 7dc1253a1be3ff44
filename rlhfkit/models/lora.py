"""LoRA adapters (via ``peft``) and saving a trained policy in Hugging Face format.

With LoRA the frozen reference is the same backbone with the adapters switched off, so policy and
reference share one copy of the weights.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch

from rlhfkit.errors import UserError, option
from rlhfkit.models.fastpath import replaceable
from rlhfkit.models.loading import adapter_base, check_model_dir


def apply_lora(model, lora, task_type: str = "CAUSAL_LM"):
    """Wrap ``model`` with LoRA adapters of rank ``lora.lora_r``; only the adapters are trainable."""
    from peft import LoraConfig, get_peft_model

    targets = lora.lora_target_modules
    target_modules = "all-linear" if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    config = LoraConfig(
        r=lora.lora_r,
        lora_alpha=lora.lora_alpha,
        lora_dropout=lora.lora_dropout,
        target_modules=target_modules,
        task_type=task_type,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GPT-2's Conv1D fan_in_fan_out notice
        try:
            wrapped = get_peft_model(model, config)
        except ValueError as exc:  # e.g. no module matches --lora-target-modules
            raise UserError(f"{option('lora_target_modules', targets)}: {str(exc).splitlines()[0]}") from None
    prepare_adapters(wrapped)
    return wrapped


def adapter_on(model: str, base: str) -> bool:
    """Whether the folder ``model`` is a LoRA adapter trained on ``base`` (a round of `rlhfkit iterate` continuing
    the last one's adapter on the SFT model)."""
    found = adapter_base(str(check_model_dir(model)))
    return found is not None and Path(found).resolve() == Path(base).resolve()


def continue_lora(model, adapter: str):
    """``model`` wrapped with the trainable LoRA adapter saved in the folder ``adapter`` (its rank, targets and
    weights; PEFT's own initial draw of the adapters on a forked generator, as ``merge_adapter``'s)."""
    from peft import PeftModel

    with torch.random.fork_rng(devices=[]):
        wrapped = PeftModel.from_pretrained(model, adapter, is_trainable=True)
    prepare_adapters(wrapped)
    return wrapped


@replaceable
def prepare_adapters(model) -> None:
    """Called on each model ``apply_lora`` wraps; in the plain code, nothing (a faster implementation may change
    how its adapter layers compute, never what: ``rlhfkit.models.fastpath``)."""


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def adapters_off(model):
    """Context manager: the base model (= the frozen reference) for LoRA models; a no-op otherwise."""
    return model.disable_adapter() if is_lora(model) else contextlib.nullcontext()


def save_pretrained(
    model, tokenizer, output_dir: str | Path, state_dict: dict | None = None, merged: bool = True
) -> Path:
    """Save the final model (LoRA merged into the root, the adapter also under ``adapter/``) + tokenizer.
    ``merged=False`` (``--save-merged false``): a LoRA model's adapter alone in the root (what
    ``PeftModel.from_pretrained(base, output_dir)`` loads, and ``rlhfkit merge`` merges) + tokenizer.

    The LoRA merge happens in place (W += scale·B·A, saved, then subtracted again) rather than on a deep
    copy, so saving never holds a second copy of the model: at the end of a long run that copy is what
    would run out of memory. The in-memory weights come back to within float rounding.

    ``state_dict``: the weights to write instead of the model's own (gathered from the shards of a sharding
    engine; a LoRA model's are merged here from its adapter tensors).
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if is_lora(model) and not merged:
        weights = state_dict if state_dict is not None else model.state_dict()
        _check_finite({k: v for k, v in weights.items() if ".lora_" in k or ".modules_to_save." in k})
        with warnings.catch_warnings():
            # PEFT looks for a config.json at the base to see whether the vocabulary grew; a base that is itself an
            # adapter folder has none (the vocabulary is the tokenizer saved beside the adapter)
            warnings.filterwarnings("ignore", message="Could not find a config file")
            model.save_pretrained(out, state_dict=state_dict, safe_serialization=True)
    elif state_dict is not None:
        if is_lora(model):
            state_dict = merged_lora_weights(model, state_dict)
            model = model.get_base_model()
        _check_finite(state_dict)
        model.save_pretrained(out, state_dict=state_dict, safe_serialization=True)
    elif is_lora(model):
        assert_finite({"model": model})
        model.save_pretrained(out / "adapter", safe_serialization=True)
        base = model.get_base_model()
        model.merge_adapter()
        try:
            base.save_pretrained(out, state_dict=_without_lora(base.state_dict()), safe_serialization=True)
        finally:
            model.unmerge_adapter()
    else:
        assert_finite({"model": model})
        model.save_pretrained(out, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def assert_finite(models: dict[str, torch.nn.Module]) -> None:
    """Raise FloatingPointError when a floating-point parameter or buffer of one of ``models`` is not finite."""
    for name, model in models.items():
        for pname, p in model.state_dict().items():
            if p.is_floating_point() and not torch.isfinite(p).all():
                raise FloatingPointError(f"refusing to save {name}: parameter {pname} is not finite")


def _check_finite(state: dict) -> None:
    for name, tensor in state.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise FloatingPointError(f"refusing to save the model: parameter {name} is not finite")


def merged_lora_weights(model, state: dict) -> dict:
    """A LoRA model's full state dict (PEFT names) -> the plain model's, each adapted weight W + s·B·A.

    s = lora_alpha / r; for layers stored transposed (GPT-2's Conv1D, ``fan_in_fan_out``) the update is
    transposed too."""
    config = model.peft_config[model.active_adapter]
    scale = config.lora_alpha / config.r
    out = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        if key.endswith(".base_layer.weight"):
            stem = key[: -len(".base_layer.weight")]
            a = state[f"{stem}.lora_A.{model.active_adapter}.weight"]  # [r, in]
            b = state[f"{stem}.lora_B.{model.active_adapter}.weight"]  # [out, r]
            delta = (b.float() @ a.float()) * scale
            value = value + (delta.T if config.fan_in_fan_out else delta).to(value.dtype)
        out[key] = value
    prefix = "base_model.model."
    return {k.removeprefix(prefix).replace(".base_layer.", "."): v for k, v in _without_lora(out).items()}


def _without_lora(state: dict) -> dict:
    """A LoRA-wrapped model's state dict under the plain model's names: adapter tensors dropped, each
    wrapped layer's ``base_layer`` (holding the merged weight) under the original layer name, and a module
    trained in full beside the adapters (``modules_to_save``, e.g. a reward model's score head) as its
    trained copy, not the original."""
    out = {}
    for key, value in state.items():
        if ".lora_" in key or ".original_module." in key:
            continue
        key = key.replace(".base_layer.", ".")
        if ".modules_to_save." in key:
            stem, _, rest = key.partition(".modules_to_save.")
            key = f"{stem}.{rest.partition('.')[2]}"  # drop the adapter's name
        out[key] = value
    return out
