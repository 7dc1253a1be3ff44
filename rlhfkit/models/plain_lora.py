"""Merge a saved LoRA adapter into a float32 model's weights directly: ``W += (B @ A) * lora_alpha / r`` per
adapted module (transposed for GPT-2's ``Conv1D``), the modules it saved whole (a reward model's score head)
copied in. These are the operations PEFT's ``merge_and_unload`` performs, in the same order and precision, so
the merged weights are the same bit for bit; PEFT wraps every module of the model first, which costs about a
second an adapter on a model of 135M parameters, where these few matrix products take a fraction of one.

Only the plain case is handled here: a float32 model and an adapter of LoRA weights on ``Linear``/``Conv1D``
modules without DoRA, bias terms, rank or alpha patterns or any other variant. For anything else
``merge_plain_lora`` changes nothing and returns False, and the caller merges with PEFT.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

PREFIX = "base_model.model."  # PEFT's prefix of every saved key
LORA_KEYS = (".lora_A.weight", ".lora_B.weight")
# adapter_config.json settings that make an adapter something other than plain LoRA when set (truthy)
VARIANTS = (
    "use_dora",
    "use_qalora",
    "lora_bias",
    "rank_pattern",
    "alpha_pattern",
    "layer_replication",
    "trainable_token_indices",
    "target_parameters",
    "alora_invocation_tokens",
    "arrow_config",
    "use_bdlora",
    "velora_config",
    "monteclora_config",
    "kasa_config",
)


def merge_plan(model, settings: dict, tensors: dict[str, torch.Tensor]) -> tuple[list, list] | None:
    """(LoRA merges [(weight, B, A, transposed)], whole tensors [(parameter, tensor)]) for ``tensors`` saved by
    an adapter with ``settings``; None unless every tensor has its place in ``model`` and the adapter is plain."""
    from transformers.pytorch_utils import Conv1D

    if settings.get("peft_type") != "LORA" or settings.get("bias", "none") != "none":
        return None
    if any(settings.get(key) for key in VARIANTS):
        return None
    rank = settings.get("r")
    whole_modules = set(settings.get("modules_to_save") or [])
    parameters = dict(model.named_parameters())
    if any(p.dtype != torch.float32 for p in parameters.values()):
        return None
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    whole = []
    for key, tensor in tensors.items():
        if not key.startswith(PREFIX):
            return None
        name = key[len(PREFIX) :]
        part = next((k for k in LORA_KEYS if name.endswith(k)), None)
        if part is not None:
            pairs.setdefault(name[: -len(part)], {})[part] = tensor
            continue
        module = name.rsplit(".", 1)[0]
        saved_whole = any(module == m or module.endswith("." + m) for m in whole_modules)
        # LoRA on embeddings, DoRA magnitudes, a tensor of a module the adapter does not save whole: PEFT's to merge
        if ".lora_" in name or not saved_whole or name not in parameters or parameters[name].shape != tensor.shape:
            return None
        whole.append((parameters[name], tensor))
    merges = []
    for path, ab in pairs.items():
        if len(ab) != 2:
            return None
        try:
            module = model.get_submodule(path)
        except AttributeError:
            return None
        a, b = ab[".lora_A.weight"], ab[".lora_B.weight"]
        if type(module) not in (torch.nn.Linear, Conv1D) or a.dim() != 2 or b.dim() != 2 or a.shape[0] != rank:
            return None
        transposed = type(module) is Conv1D
        shape = (b.shape[0], a.shape[1])
        if (tuple(module.weight.shape[::-1]) if transposed else tuple(module.weight.shape)) != shape:
            return None
        merges.append((module.weight, b, a, transposed))
    return merges, whole


def merge_plain_lora(model, adapter: str, settings: dict) -> bool:
    """Merge the LoRA adapter folder ``adapter`` (its ``adapter_config.json`` read as ``settings``) into
    ``model`` in place and put the model in eval mode, as PEFT leaves it; False, ``model`` untouched, when the
    adapter or the model is not the plain case (see the module's docstring)."""
    from safetensors.torch import load_file

    path = Path(adapter) / "adapter_model.safetensors"
    if not path.is_file() or not isinstance(settings.get("r"), int) or settings["r"] <= 0:
        return False
    plan = merge_plan(model, settings, load_file(str(path)))
    if plan is None:
        return False
    merges, whole = plan
    alpha, rank = settings.get("lora_alpha", 8), settings["r"]
    scaling = alpha / math.sqrt(rank) if settings.get("use_rslora") else alpha / rank
    with torch.no_grad():
        for weight, b, a, transposed in merges:
            delta = b.to(torch.float32) @ a.to(torch.float32)
            weight.data += (delta.T if transposed else delta) * scaling
        for parameter, tensor in whole:
            parameter.data.copy_(tensor)
    model.eval()
    return True
