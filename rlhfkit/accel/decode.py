"""A lean one-token decode step for the sampler (``rlhfkit.models.sampling``), for GPT-2 and Llama / Qwen2.

A decode step of a small model on CPU is mostly Python: Hugging Face's forward checks its arguments, builds
a 4-D attention mask from the 2-D one (``create_causal_mask``), grows a ``DynamicCache`` by concatenation
(each step copies every layer's whole key and value cache) and wraps outputs in dataclasses, around matmuls
that take a fraction of that time. ``LeanDecoder.step`` runs the same math for one new token per row by
calling the model's own submodules (embeddings, layer norms, projections, MLPs, LM head, so kernel swaps and
LoRA layers apply) in the order its forward does, with:

- a preallocated key / value buffer per layer ``[B, heads, capacity, head_dim]`` that each step writes one
  column of (no concatenation), filled once from the prompt's prefill cache;
- the attention mask given as a ready boolean ``[B, 1, 1, L]`` view of one preallocated ``[B, capacity]``
  mask (no per-step mask construction);
- ``F.scaled_dot_product_attention`` over the first ``L`` columns of the buffers.

The logits equal those of the model's forward up to float rounding (the tests compare them per
architecture). The prompt itself is still run by the model's own forward. Models this step does not cover
(other architectures, sliding-window attention, forward hooks or a replaced forward on the model,
prompt-learning PEFT) get None from ``lean_decoder``, and the sampler calls the model's forward as usual;
``RLHFKIT_ACCEL=0`` turns the lean step off everywhere.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from rlhfkit.accel import enabled, forward_intercepted
from rlhfkit.models.unwrap import base_model, without_ddp

LEAN_MODEL_TYPES = frozenset({"gpt2", "llama", "qwen2"})


def _body(base) -> torch.nn.Module | None:
    """The transformer stack under the LM head (``transformer`` for GPT-2, ``model`` for Llama / Qwen2)."""
    return getattr(base, "transformer", None) if base.config.model_type == "gpt2" else getattr(base, "model", None)


def _supported(model) -> bool:
    wrapper = without_ddp(model)
    base = base_model(model)
    config = base.config
    if (
        not enabled()
        or config.model_type not in LEAN_MODEL_TYPES
        or config.is_encoder_decoder
        or getattr(config, "_attn_implementation", None) not in ("sdpa", "eager")
    ):
        return False
    peft_configs = getattr(wrapper, "peft_config", None) or {}
    if any(getattr(c, "is_prompt_learning", False) for c in peft_configs.values()):
        return False  # prompt tuning changes the inputs, not only the layers
    body = _body(base)
    if body is None or not hasattr(base, "lm_head"):
        return False
    if forward_intercepted(wrapper, base, body):
        return False
    if config.model_type == "gpt2":
        attn = body.h[0].attn
        return (
            not getattr(config, "add_cross_attention", False)
            and not getattr(config, "reorder_and_upcast_attn", False)
            and all(hasattr(attn, name) for name in ("scaling", "split_size", "num_heads", "head_dim"))
        )
    layers = getattr(body, "layers", None)
    if layers is None or not hasattr(body, "rotary_emb") or not hasattr(body, "norm"):
        return False
    rope = getattr(sys.modules.get(type(layers[0].self_attn).__module__), "apply_rotary_pos_emb", None)
    return rope is not None and all(
        getattr(layer.self_attn, "sliding_window", None) is None
        and not hasattr(layer.self_attn, "q_norm")
        and all(hasattr(layer.self_attn, n) for n in ("scaling", "head_dim", "q_proj", "k_proj", "v_proj", "o_proj"))
        for layer in layers
    )


def _prefill_kv(cache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values ``[rows, kv_heads, P, head_dim]`` of ``layer`` in a Hugging Face cache after a prefill."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]  # transformers before 4.56


class LeanDecoder:
    """One-token decode steps against preallocated key / value buffers (see the module docstring).

    ``prefill_cache``: the Hugging Face cache after the model's forward on ``[U, P]`` prompts; ``index`` ``[B]``:
    the prefill row each decoded row continues (several rows may share one prompt's prefill); ``capacity``:
    ``P`` plus the most tokens that will be decoded.
    """

    def __init__(self, model, prefill_cache, index: torch.Tensor, capacity: int):
        self.base = base_model(model)
        self.body = _body(self.base)
        self.gpt2 = self.base.config.model_type == "gpt2"
        layers = self.body.h if self.gpt2 else self.body.layers[: self.base.config.num_hidden_layers]
        self.layers = list(layers)
        if not self.gpt2:
            self.rope = sys.modules[type(self.layers[0].self_attn).__module__].apply_rotary_pos_emb
        self.keys, self.values = [], []
        self.length = _prefill_kv(prefill_cache, 0)[0].shape[2]  # columns filled: the prompt's P
        for i, layer in enumerate(self.layers):
            k, v = _prefill_kv(prefill_cache, i)  # [U, kv_heads, P, D]
            groups = 1 if self.gpt2 else layer.self_attn.num_key_value_groups
            self.keys.append(self._buffer(k, index, groups, capacity))
            self.values.append(self._buffer(v, index, groups, capacity))

    @staticmethod
    def _buffer(kv: torch.Tensor, index: torch.Tensor, groups: int, capacity: int) -> torch.Tensor:
        """``[B, heads, capacity, D]`` with the prefill's columns in front; grouped-query heads are stored
        repeated (as ``repeat_kv`` does), so attention needs no per-step expansion."""
        kv = kv.index_select(0, index)
        if groups > 1:
            kv = kv.repeat_interleave(groups, dim=1)
        out = kv.new_empty(kv.shape[0], kv.shape[1], capacity, kv.shape[3])
        out[:, :, : kv.shape[2]] = kv
        return out

    def _attend(self, i: int, q, k, v, mask, scale: float) -> torch.Tensor:
        """Append column ``self.length`` of layer ``i`` and attend over the first ``length + 1`` columns.
        q, k, v: ``[B, heads, 1, D]``; mask: ``[B, 1, 1, length + 1]`` bool. Returns ``[B, 1, heads * D]``."""
        end = self.length + 1
        self.keys[i][:, :, self.length] = k[:, :, 0]
        self.values[i][:, :, self.length] = v[:, :, 0]
        out = F.scaled_dot_product_attention(
            q, self.keys[i][:, :, :end], self.values[i][:, :, :end], attn_mask=mask, scale=scale
        )  # [B, heads, 1, D]
        return out.transpose(1, 2).reshape(q.shape[0], 1, -1)

    def step(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, V]`` after feeding ``ids [B, 1]`` at ``positions [B, 1]``; ``mask [B, length + 1]`` bool,
        True where a row attends (its real prompt tokens and everything decoded)."""
        if self.length + 1 > self.keys[0].shape[2]:
            raise RuntimeError("LeanDecoder: more steps than the capacity it was built with")
        mask = mask[:, None, None, :]  # [B, 1, 1, L]
        hidden = self._gpt2_layers(ids, positions, mask) if self.gpt2 else self._llama_layers(ids, positions, mask)
        self.length += 1
        return self.base.lm_head(hidden)[:, -1]

    def _gpt2_layers(self, ids, positions, mask) -> torch.Tensor:
        body = self.body
        x = body.wte(ids) + body.wpe(positions)  # [B, 1, H]
        batch = ids.shape[0]
        for i, block in enumerate(self.layers):
            attn = block.attn
            q, k, v = attn.c_attn(block.ln_1(x)).split(attn.split_size, dim=2)
            q, k, v = (t.view(batch, 1, attn.num_heads, attn.head_dim).transpose(1, 2) for t in (q, k, v))
            x = attn.c_proj(self._attend(i, q, k, v, mask, attn.scaling)) + x
            x = x + block.mlp(block.ln_2(x))
        return body.ln_f(x)

    def _llama_layers(self, ids, positions, mask) -> torch.Tensor:
        body = self.body
        x = body.embed_tokens(ids)  # [B, 1, H]
        cos, sin = body.rotary_emb(x, positions)
        batch = ids.shape[0]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(batch, 1, -1, attn.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(batch, 1, -1, attn.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(batch, 1, -1, attn.head_dim).transpose(1, 2)
            q, k = self.rope(q, k, cos, sin)
            if attn.num_key_value_groups > 1:
                k = k.repeat_interleave(attn.num_key_value_groups, dim=1)
                v = v.repeat_interleave(attn.num_key_value_groups, dim=1)
            x = x + attn.o_proj(self._attend(i, q, k, v, mask, attn.scaling))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return body.norm(x)


def lean_decoder(model, prefill_cache, index: torch.Tensor, capacity: int) -> LeanDecoder | None:
    """A ``LeanDecoder`` continuing ``prefill_cache`` when ``model`` is one it covers, else None."""
    return LeanDecoder(model, prefill_cache, index, capacity) if _supported(model) else None
