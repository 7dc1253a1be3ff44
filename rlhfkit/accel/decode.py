"""A lean one-token decode step for the sampler (``rlhfkit.models.sampling``), for GPT-2 and Llama / Qwen2.

A decode step of a small model on CPU is mostly Python: Hugging Face's forward checks its arguments, builds
a 4-D attention mask from the 2-D one (``create_causal_mask``), grows a ``DynamicCache`` by concatenation
(each step copies every layer's whole key and value cache) and wraps outputs in dataclasses, around matmuls
that take a fraction of that time. ``LeanDecoder.step`` runs the same math for one new token per row by
calling the model's own submodules (embeddings, layer norms, projections, MLPs, LM head, so kernel swaps and
LoRA layers apply) in the order its forward does, with:

- a preallocated key / value buffer per layer ``[B, kv_heads, capacity, head_dim]`` that each step writes one
  column of (no concatenation), filled once from the prompt's prefill cache;
- grouped-query attention against those buffers as they are: the query heads that share a key / value head
  attend as that head's rows of queries, so the keys and values are never repeated per query head (a decode
  step reads every cached key and value, and repeating them would multiply that traffic by the group size);
- the attention mask given as a ready boolean ``[B, 1, 1, L]`` view of one preallocated ``[B, capacity]``
  mask (no per-step mask construction);
- attention over the first ``L`` columns of the buffers: written out (matmul, masked softmax, matmul) on the
  CPU, where the fused kernel's set-up costs more than the arithmetic at one query per row, and
  ``F.scaled_dot_product_attention`` on other devices;
- (Llama / Qwen2) a projection carrying LoRA adapters computed as its base layer plus ``(x A^T)(s B)^T``, the
  scaling ``s`` folded into ``B`` once per sampling call (``lean_projection``): the same math as PEFT's layer,
  without its per-call checks, casts and the separate scaling product, which at one token per row cost about as
  much as the adapters' own matmuls. In fp32 on the CPU the adapters are folded into a copy of the base weight
  instead, ``W + s B A``, once per sampling call: each step then runs one product per projection, as the model
  without adapters does (the copies, the size of the adapted layers' weights, live for the sampling call).

The logits equal those of the model's forward up to float rounding (the tests compare them per
architecture). The prompt itself is still run by the model's own forward. Models this step does not cover
(other architectures, sliding-window attention, forward hooks or a replaced forward on the model,
prompt-learning PEFT) get None from ``lean_decoder``, and the sampler calls the model's forward as usual;
``--accel off`` (``RLHFKIT_ACCEL=0``) turns the lean step off everywhere.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from rlhfkit.accel import onednn
from rlhfkit.accel.base import choices, forward_intercepted
from rlhfkit.models.unwrap import base_model, without_ddp

LEAN_MODEL_TYPES = frozenset({"gpt2", "llama", "qwen2"})


def _body(base) -> torch.nn.Module | None:
    """The transformer stack under the LM head (``transformer`` for GPT-2, ``model`` for Llama / Qwen2)."""
    return getattr(base, "transformer", None) if base.config.model_type == "gpt2" else getattr(base, "model", None)


def _supported(model) -> bool:
    wrapper = without_ddp(model)
    base = base_model(model)
    config = base.config
    weight = next(base.parameters(), None)
    if (
        weight is None
        or not choices(weight.device).lean_decode
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
            and all(hasattr(attn, name) for name in ("split_size", "num_heads", "head_dim"))
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


def gpt2_scaling(attn) -> float:
    """The factor GPT-2's attention scores are multiplied by: ``attn.scaling`` where transformers keeps it (5.x),
    else from the config flags it is made of (4.x): 1/sqrt(head_dim) when ``scale_attn_weights``, divided by
    the layer's number when ``scale_attn_by_inverse_layer_idx``."""
    scaling = getattr(attn, "scaling", None)
    if scaling is not None:
        return scaling
    scaling = attn.head_dim**-0.5 if attn.scale_attn_weights else 1.0
    return scaling / (attn.layer_idx + 1) if attn.scale_attn_by_inverse_layer_idx else scaling


def _prefill_kv(cache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values ``[rows, kv_heads, P, head_dim]`` of ``layer`` in a Hugging Face cache after a prefill."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]  # transformers before 4.56


class LeanDecoder:
    """One-token decode steps against preallocated key / value buffers (see the module docstring).

    ``prefill_cache``: the Hugging Face cache after the model's forward on ``[U, P]`` prompts; ``index`` ``[B]``:
    the prefill row each decoded row continues (several rows may share one prompt's prefill); ``capacity``:
    ``P`` plus the most tokens that will be decoded. ``compiled``: run the step through ``torch.compile`` with
    fixed shapes (see ``compiled_step``).
    """

    def __init__(self, model, prefill_cache, index: torch.Tensor, capacity: int, compiled: bool = False):
        self.base = base_model(model)
        self.body = _body(self.base)
        self.gpt2 = self.base.config.model_type == "gpt2"
        layers = self.body.h if self.gpt2 else self.body.layers[: self.base.config.num_hidden_layers]
        self.layers = tuple(layers)
        self.rope = None if self.gpt2 else sys.modules[type(self.layers[0].self_attn).__module__].apply_rotary_pos_emb
        self.length = _prefill_kv(prefill_cache, 0)[0].shape[2]  # columns filled: the prompt's P
        self.compiled = compiled_step() if compiled else None
        # the compiled step traces the modules themselves (Inductor fuses PEFT's layers as they are); the eager
        # Llama / Qwen2 step runs fp32 CPU weights reordered for its row count (onednn.packed_linear)
        rows = index.shape[0]
        self.projections = (
            None if self.gpt2 or compiled else tuple(_layer_projections(layer, rows) for layer in self.layers)
        )
        self.head = self.base.lm_head if self.projections is None else lean_projection(self.base.lm_head, rows)
        if self.compiled is not None:
            capacity = bucket_capacity(capacity)
            self.mask = torch.zeros(index.shape[0], capacity, dtype=torch.bool, device=index.device)
            self.column = torch.zeros(1, dtype=torch.long, device=index.device)
        keys, values = [], []
        for i in range(len(self.layers)):
            k, v = _prefill_kv(prefill_cache, i)  # [U, kv_heads, P, D]
            keys.append(self._buffer(k, index, capacity))
            values.append(self._buffer(v, index, capacity))
        self.keys, self.values = tuple(keys), tuple(values)

    @staticmethod
    def _buffer(kv: torch.Tensor, index: torch.Tensor, capacity: int) -> torch.Tensor:
        """``[B, kv_heads, capacity, D]`` with the prefill's columns in front."""
        kv = kv.index_select(0, index)
        # zeros, not empty: the compiled step multiplies every column, the masked ones by a weight of 0
        out = kv.new_zeros(kv.shape[0], kv.shape[1], capacity, kv.shape[3])
        out[:, :, : kv.shape[2]] = kv
        return out

    def step(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, V]`` after feeding ``ids [B, 1]`` at ``positions [B, 1]``; ``mask [B, length + 1]`` bool,
        True where a row attends (its real prompt tokens and everything decoded)."""
        end = self.length + 1
        if end > self.keys[0].shape[2]:
            raise RuntimeError("LeanDecoder: more steps than the capacity it was built with")
        parts = (self.body, self.layers, self.head, self.rope, self.keys, self.values)
        if self.compiled is None:
            logits = _forward(*parts, ids, positions, mask[:, None, None, :], self.length, None, self.projections)
        else:
            # fixed shapes: the whole buffer is attended, its columns not yet written masked out
            self.mask[:, :end] = mask
            self.column.fill_(self.length)
            logits = self.compiled(*parts, ids, positions, self.mask[:, None, None, :], None, self.column)
        self.length = end
        return logits


def _attend(keys, values, q, k, v, mask, scale: float, length: int | None, column) -> torch.Tensor:
    """Write this step's ``k``, ``v`` into column ``length`` of a layer's buffers and attend.

    q: ``[B, heads, 1, D]``; k, v: ``[B, kv_heads, 1, D]``, each key / value head serving ``heads / kv_heads``
    consecutive query heads (Llama's ``repeat_kv`` order). The queries are regrouped as ``[B, kv_heads, groups,
    D]``: the heads of a group attend like that many queries of one head. Eager: ``length`` is a number, attention
    runs over the first ``length + 1`` columns, ``mask [B, 1, 1, length + 1]``. Compiled: ``column`` is a
    one-element tensor (so the graph does not change from step to step), attention runs over every column,
    ``mask [B, 1, 1, capacity]``. Returns ``[B, 1, heads * D]``."""
    batch, heads, _, dim = q.shape
    q = q.view(batch, k.shape[1], heads // k.shape[1], dim)  # [B, kv_heads, groups, D]
    if column is None:
        end = length + 1
        keys[:, :, length] = k[:, :, 0]
        values[:, :, length] = v[:, :, 0]
        keys, values = keys[:, :, :end], values[:, :, :end]
        if q.device.type != "cpu":
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)  # [B, kv, groups, D]
            return out.reshape(batch, 1, heads * dim)
    else:
        keys.index_copy_(2, column, k)
        values.index_copy_(2, column, v)
    # written out rather than sdpa: on the CPU the fused kernel's set-up costs more than the arithmetic at one
    # query per row, and in the compiled step Inductor fuses these into its generated code, where sdpa would be a
    # separate call
    scores = (q @ keys.transpose(-1, -2)) * scale  # [B, kv_heads, groups, columns]
    out = scores.masked_fill_(~mask, float("-inf")).softmax(dim=-1) @ values  # [B, kv_heads, groups, D]
    return out.reshape(batch, 1, heads * dim)  # the heads in order: kv head by kv head, a group's heads within


def lean_projection(module, rows: int = 0):
    """``module``, or where it is a PEFT LoRA layer applying plain LoRA (adapters on and not merged, no DoRA or
    other variant, no dropout active) a function giving the same output: the base layer's plus ``(x A^T)(s B)^T``
    for each active adapter, with ``s B`` computed here, once. Read the adapters again after they change.
    ``rows``: the decode steps' row count, for a weight reordered once for it (``onednn.packed_linear``, fp32 on
    the CPU: an ``nn.Linear`` without adapters, or the merged weight of one with adapters); 0 for none."""
    if not hasattr(module, "lora_A") or not hasattr(module, "base_layer"):
        plain = type(module) in _plain_linears() and not forward_intercepted(module)
        packed = _packed(module, module.weight, rows) if plain else None
        return module if packed is None else packed
    active = [a for a in module.active_adapters if a in module.lora_A]
    plain = (
        not module.disable_adapters
        and not module.merged
        and not any(a in getattr(module, "lora_variant", {}) for a in active)
        and all(isinstance(module.lora_dropout[a], torch.nn.Identity) or not module.training for a in active)
    )
    if not plain:
        return module
    base = module.base_layer
    pairs = tuple((module.lora_A[a].weight, module.lora_B[a].weight * module.scaling[a]) for a in active)
    if _merge_here(base, pairs):
        return _merged_projection(base, pairs, rows)

    def projection(x: torch.Tensor) -> torch.Tensor:
        out = base(x)
        for a, scaled_b in pairs:
            out = out + F.linear(F.linear(x.to(a.dtype), a), scaled_b).to(out.dtype)
        return out

    return projection


def _merge_here(base, pairs) -> bool:
    """Whether to run a LoRA projection as one merged weight: a plain ``nn.Linear`` base layer and adapters in fp32
    on the CPU, where each step's two adapter products and their sum cost more in dispatch than the merge does
    once per sampling call."""
    tensors = [base.weight, *(t for pair in pairs for t in pair)]
    return isinstance(base, torch.nn.Linear) and all(
        t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors
    )


def _packed(module, weight: torch.Tensor, rows: int):
    """``onednn.packed_linear`` of ``weight`` with ``module``'s bias for ``rows`` rows, or None (``rows`` 0)."""
    return onednn.packed_linear(weight, module.bias, rows) if rows else None


def _merged_projection(base, pairs, rows: int = 0):
    """``x -> x (W + Σ s B A)^T + bias``: the adapters folded into a copy of the base weight (the model's own
    weights untouched), reordered for ``rows`` rows where that applies (``_packed``), else run through the base
    layer's kernel (oneDNN where the layer was swapped to it). Equal to the base output plus the adapters'
    products up to float rounding."""
    with torch.no_grad():
        # the first adapter's sum makes the copy (one pass over the weight); the model's weight stays as it is
        weight = base.weight.detach()
        for i, (a, scaled_b) in enumerate(pairs):
            if i == 0:
                weight = torch.addmm(weight, scaled_b.detach(), a.detach())
            else:
                weight.addmm_(scaled_b.detach(), a.detach())
    packed = _packed(base, weight, rows)
    if packed is not None:
        return packed  # (the merged copy is not kept)
    bias = None if base.bias is None else base.bias.detach()
    through_onednn = isinstance(base, onednn.OneDNNLinear) and base.onednn_forward  # sampling: no gradients

    def projection(x: torch.Tensor) -> torch.Tensor:
        y = onednn.linear_matmul(x, weight.t(), bias) if through_onednn else None
        return F.linear(x, weight, bias) if y is None else y

    return projection


def _plain_linears() -> tuple[type, ...]:
    return (torch.nn.Linear, onednn.OneDNNLinear)


def _layer_projections(layer, rows: int = 0) -> tuple:
    """A Llama / Qwen2 layer's q, k, v and o projections as ``lean_projection`` gives them (for ``rows`` rows), and
    its MLP: the module itself, or where its projections are not the modules, its forward over them."""
    attn, mlp = layer.self_attn, layer.mlp
    q, k, v, o = (lean_projection(m, rows) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj))
    gate, up, down = (lean_projection(m, rows) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    if (gate, up, down) == (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
        return q, k, v, o, mlp
    act = mlp.act_fn

    def lean_mlp(y: torch.Tensor) -> torch.Tensor:  # LlamaMLP / Qwen2MLP's forward
        return down(act(gate(y)) * up(y))

    return q, k, v, o, lean_mlp


def _forward(
    body, layers, lm_head, rope, keys, values, ids, positions, mask, length, column, projections=None
) -> torch.Tensor:
    """One decode step's math: logits ``[B, V]`` (``rope`` None: GPT-2, else Llama / Qwen2). ``projections``:
    each Llama / Qwen2 layer's projections and MLP as ``_layer_projections`` gives them, or None to call its
    modules."""
    batch = ids.shape[0]
    if rope is None:
        x = body.wte(ids) + body.wpe(positions)  # [B, 1, H]
        for i, block in enumerate(layers):
            attn = block.attn
            q, k, v = attn.c_attn(block.ln_1(x)).split(attn.split_size, dim=2)
            q, k, v = (t.view(batch, 1, attn.num_heads, attn.head_dim).transpose(1, 2) for t in (q, k, v))
            out = _attend(keys[i], values[i], q, k, v, mask, gpt2_scaling(attn), length, column)
            x = attn.c_proj(out) + x
            x = x + block.mlp(block.ln_2(x))
        x = body.ln_f(x)
    else:
        x = body.embed_tokens(ids)  # [B, 1, H]
        cos, sin = body.rotary_emb(x, positions)
        for i, layer in enumerate(layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q_proj, k_proj, v_proj, o_proj, mlp = (
                (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, layer.mlp)
                if projections is None
                else projections[i]
            )
            q = q_proj(h).view(batch, 1, -1, attn.head_dim).transpose(1, 2)
            k = k_proj(h).view(batch, 1, -1, attn.head_dim).transpose(1, 2)
            v = v_proj(h).view(batch, 1, -1, attn.head_dim).transpose(1, 2)
            q, k = rope(q, k, cos, sin)
            x = x + o_proj(_attend(keys[i], values[i], q, k, v, mask, attn.scaling, length, column))
            x = x + mlp(layer.post_attention_layernorm(x))
        x = body.norm(x)
    return lm_head(x)[:, -1]


# ---- the compiled step -----------------------------------------------------------------------------------------
# A small model's decode step on CPU is a few dozen tiny kernels, each costing more in dispatch than in
# arithmetic. ``torch.compile`` (Inductor) fuses the elementwise work between the matmuls into a few generated
# loops. It compiles for fixed shapes, so the compiled step attends over the whole key / value buffer (unwritten
# columns masked out) and takes the column to write as a tensor; the buffer's capacity is rounded up to a
# multiple of CAPACITY_STEP so that batches of different prompt widths share one compiled graph. Compiling takes
# tens of seconds once per process and shape (Inductor caches the result on disk for later runs); it pays off
# over many decode steps of a small model and not for a large one, whose step is its matmuls.
CAPACITY_STEP = 64
_COMPILED: dict[str, object] = {}


def bucket_capacity(capacity: int) -> int:
    return -(-capacity // CAPACITY_STEP) * CAPACITY_STEP


def compiled_step():
    """``_forward`` through ``torch.compile`` (built once per process)."""
    if "step" not in _COMPILED:
        _COMPILED["step"] = torch.compile(_forward, dynamic=False)
    return _COMPILED["step"]


def lean_decoder(
    model, prefill_cache, index: torch.Tensor, capacity: int, compiled: bool = False
) -> LeanDecoder | None:
    """A ``LeanDecoder`` continuing ``prefill_cache`` when ``model`` is one it covers, else None."""
    return LeanDecoder(model, prefill_cache, index, capacity, compiled) if _supported(model) else None
