"""Swaps for the models a trainer optimises, applied where it builds them: the tied input embedding's gradient
added as rows (``row_grad_embedding``, from ``build_optimizer``) and LoRA layers that add the adapters' product in
place (``fuse_lora_linears``, from ``rlhfkit.models.lora.apply_lora``). Like the kernel swaps (``kernels.py``)
they change module classes in memory only and compute the same gradients; ``RLHFKIT_ACCEL=0`` turns them off.
"""

from __future__ import annotations

import functools
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from rlhfkit.accel import on
from rlhfkit.accel.kernels import swap_classes
from rlhfkit.accel.onednn import fp32_cpu


# ---- the tied input embedding's gradient, added as rows ---------------------------------------------------------
# Where the input embedding shares its weight with the LM head (e.g. GPT-2, Qwen2.5-0.5B), a training
# backward gives that weight two gradients: the head's, dense ([V, D], every row), and the embedding's, which only
# the looked-up rows have. PyTorch builds the second one dense as well, a fresh zero-filled [V, D] tensor (at a real
# vocabulary as large as the head's weight, filled page by page on its first touch), and adds
# the two into a third (autograd's sum of a dense and a sparse gradient is out of place as well). Here the lookup's
# backward adds its rows into the weight's ``.grad`` in place instead: the head's backward comes first in the
# backward pass and autograd accumulates the weight's gradient as soon as it has it, so the rows land on the
# head's gradient (and had they come first, autograd would add the head's gradient onto them in place: the sum
# is the same either way). This holds where gradients go to ``.grad`` (``loss.backward()``, as every trainer here
# does), so the swap is made on the models a trainer builds its optimizer for (``row_grad_embedding``), and the
# lookup takes the default path in a multi-process run (gradients are reduced when autograd accumulates them),
# off the CPU, and under ``max_norm`` / ``scale_grad_by_freq``.
class _RowsIntoGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, anchor, holder, padding_idx):
        (weight,) = holder  # in a tuple: not an input autograd connects to the weight
        ctx.save_for_backward(ids)
        ctx.holder, ctx.padding_idx = holder, padding_idx
        return F.embedding(ids, weight.detach(), padding_idx)

    @staticmethod
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensors
        (weight,) = ctx.holder
        ids, rows = ids.reshape(-1), grad.reshape(-1, grad.shape[-1])
        if ctx.padding_idx is not None:  # as the default backward: no gradient for the padding row
            keep = ids != ctx.padding_idx
            ids, rows = ids[keep], rows[keep]
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        weight.grad.index_add_(0, ids, rows.to(weight.grad.dtype))
        return None, None, None, None


def _single_process() -> bool:
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


class RowGradEmbedding(nn.Embedding):
    """``nn.Embedding`` tied to an LM head, whose backward adds the looked-up rows' gradient into the weight's
    ``.grad`` in place (see above)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        w = self.weight
        head = self.__dict__.get("_tied_head")
        head = head() if head is not None else None
        if (
            torch.is_grad_enabled()
            and w.requires_grad
            and type(w) is nn.Parameter
            and w.device.type == "cpu"
            and self.max_norm is None
            and not self.scale_grad_by_freq
            and head is not None
            and getattr(head, "weight", None) is w
            and _single_process()
        ):
            anchor = torch.empty(0, requires_grad=True)  # makes the output require grad, so the backward runs
            return _RowsIntoGrad.apply(ids, anchor, (w,), self.padding_idx)
        return super().forward(ids)


def row_grad_embedding(model: nn.Module) -> int:
    """Swap the input embeddings of the causal LMs in ``model`` that are tied to their output head to
    ``RowGradEmbedding``; returns how many. For models whose gradients a trainer takes from ``.grad``."""
    if not on("row_grad_embedding"):
        return 0
    changed = 0
    for module in model.modules():
        try:
            emb, head = module.get_input_embeddings(), module.get_output_embeddings()
        except (AttributeError, NotImplementedError):
            continue
        if type(emb) is nn.Embedding and head is not None and getattr(head, "weight", None) is emb.weight:
            emb.__class__ = RowGradEmbedding
            emb.__dict__["_tied_head"] = weakref.ref(head)
            changed += 1
    return changed


# ---- LoRA layers: the adapters' product added in place ----------------------------------------------------------
# PEFT's LoRA linear computes ``base(x) + lora_B(lora_A(x)) * scaling``: besides the two small products, three
# full-size [rows, out] tensors per call (B's output, its scaled copy, the sum), each a pass over memory and
# each scaled or summed again in the backward. For one plain adapter (no dropout, no variant such as DoRA) the
# same sum is one ``addmm_`` onto the base layer's output: ``y += s * (x A^T) B^T``. The base layer's backward
# does not read its output, so adding in place leaves every gradient as it was (autograd's version check would
# stop a base layer that did).
def _lora_forward(cls: type) -> type:
    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        active = self.active_adapters
        name = active[0] if len(active) == 1 else None
        if (
            args
            or kwargs
            or name not in self.lora_A
            or self.disable_adapters
            or self.merged
            or name in getattr(self, "lora_variant", {})
            or not isinstance(self.lora_dropout[name], nn.Identity)
            or not fp32_cpu(x, self.lora_A[name].weight, self.lora_B[name].weight)
        ):
            return cls.forward(self, x, *args, **kwargs)
        y = self.base_layer(x)
        a, b, scale = self.lora_A[name].weight, self.lora_B[name].weight, self.scaling[name]
        down = F.linear(x, a).reshape(-1, a.shape[0])
        if y._base is not None or not y.is_contiguous():  # a view (the base layer's padded rows): not in place
            return torch.addmm(y.reshape(-1, b.shape[0]), down, b.t(), alpha=scale).view(y.shape)
        y.view(-1, b.shape[0]).addmm_(down, b.t(), alpha=scale)
        return y

    return type(f"Fused{cls.__name__}", (cls,), {"forward": forward, "__module__": __name__})


@functools.cache
def _lora_swaps() -> dict[type, type]:
    try:
        from peft.tuners.lora.layer import Linear
    except ImportError:  # pragma: no cover - peft is a dependency
        return {}
    return {Linear: _lora_forward(Linear)}


def fuse_lora_linears(model: nn.Module) -> int:
    """Give the PEFT LoRA linear layers of ``model`` the in-place adapter sum (fp32 on the CPU, one plain adapter;
    otherwise PEFT's own forward); returns how many. Called by ``rlhfkit.models.lora.apply_lora``."""
    return swap_classes(model, _lora_swaps()) if on("fused_lora") else 0
