"""The matmul-FLOP floor of a training step: the FLOPs of one step's matmuls, by phase, and the matmul rate this
machine reaches at the model's shapes. A phase's floor is its FLOPs over that rate: the time the arithmetic alone
would take, a lower bound for the phase (bench/speed/profile_ppo.py; bench/experiments/grpo_floor.py)."""

from __future__ import annotations

import statistics
import time

import torch


def model_shapes(path: str) -> dict:
    """Layer sizes of a GPT-2/Llama-like decoder, read from its config."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(path).to_dict()
    d = c.get("n_embd") or c.get("hidden_size")
    return {
        "d": d,
        "layers": c.get("n_layer") or c.get("num_hidden_layers"),
        "ff": c.get("n_inner") or c.get("intermediate_size") or 4 * d,
        # a gated MLP (Llama, Qwen2: gate, up and down projections) has three d x ff matrices, GPT-2's two
        "mlp_mats": 3 if c.get("model_type") in ("llama", "qwen2", "mistral") else 2,
        "vocab": c["vocab_size"],
        "kv": d
        * (c.get("num_key_value_heads") or c.get("n_head") or 1)
        // (c.get("n_head") or c.get("num_attention_heads") or 1),
    }


def per_token_flops(s: dict, context: float, head: bool = True) -> float:
    """Forward FLOPs of one token: 2 x (matmul weights) + attention over ``context`` positions.

    weights per layer = d*(d + 2*kv) (q, k, v) + d*d (out) + mlp_mats*d*ff (MLP: 2 matrices, 3 when gated)
    attention per layer = 2 * 2 * d * context (scores QK^T and the weighted sum of V)
    head = d * vocab (the LM head; the value/reward head is d*1)
    """
    layer = s["d"] * (s["d"] + 2 * s["kv"]) + s["d"] * s["d"] + s.get("mlp_mats", 2) * s["d"] * s["ff"]
    return (
        2 * s["layers"] * layer + 4 * s["layers"] * s["d"] * context + (2 * s["d"] * s["vocab"] if head else 2 * s["d"])
    )


def step_flops(
    s: dict,
    B: int,
    P: int,
    T: int,
    epochs: int,
    separate_value: bool,
    lora: bool,
    reuse_first_pass: bool = True,
    real: tuple[float, float] | None = None,
) -> dict:
    """Matmul FLOPs of one PPO step, by phase. B rows, P prompt positions (padded), T response positions.
    ``real``: (prompt tokens, response tokens) of the batch without padding; then the teacher-forced phases
    (score, rollout, reference, update) count only real tokens: the work the math needs, however laid out.

    generate:  prefill B*P tokens + B*T decode tokens, each with the KV cache (context = its position)
    score:     the reward model over B*(P+T) tokens (score head)
    rollout:   policy over B*(P+T) (LM head on T+1 positions only: logits_to_keep), value model (if separate)
               over B*(P+T), reference over B*(P+T) (LM head on T+1)
    update:    epochs x 3 x (policy + value) forward  (backward ~ 2x forward: grads of inputs and weights;
               with LoRA the frozen base weights need no weight gradients, so ~2x instead of 3x), less the
               one forward that the rollout pass already did when epoch 1 reuses it (one minibatch)
    """
    tokens, responses = (B * (P + T), B * T) if real is None else (real[0] + real[1], real[1])
    mean_ctx = tokens / B / 2  # causal attention: the average position attends to half its sequence
    body = tokens * per_token_flops(s, mean_ctx, head=False)  # a forward over the sequences without the LM head
    lm_head = (responses + B) * 2 * s["d"] * s["vocab"]  # the positions that predict response tokens
    prefill = B * P * per_token_flops(s, P / 2)
    decode = sum(B * per_token_flops(s, P + t) for t in range(T))
    policy_fwd = body + lm_head
    value_fwd = body if separate_value else 0.0
    backward_factor = 2.0 if lora else 3.0
    return {
        "generate": prefill + decode,
        "score": body,
        "rollout forwards": policy_fwd + value_fwd,
        "reference forward": policy_fwd,
        "update": (epochs * backward_factor - (1 if reuse_first_pass else 0)) * (policy_fwd + value_fwd),
    }


def measure_matmul_rate(s: dict, rows: int, repeats: int = 20, default_path: bool = False) -> float:
    """GFLOP/s of the model's matmuls (qkv, out, MLP up/down, LM head) on ``rows`` token rows, current threads,
    through the path rlhfkit's linear layers take (oneDNN for fp32 on CPU where available: models/kernels.py),
    or with ``default_path`` through torch.matmul (MKL on x86)."""
    from rlhfkit.accel.onednn import linear_matmul

    def product(a, b):
        out = None if default_path else linear_matmul(a, b, None)
        return torch.matmul(a, b) if out is None else out

    d, ff, v = s["d"], s["ff"], s["vocab"]
    shapes = [(d, d + 2 * s["kv"]), (d, d), *[(d, ff)] * (s.get("mlp_mats", 2) - 1), (ff, d), (d, v)]
    mats = [(torch.randn(rows, k), torch.randn(k, n)) for k, n in shapes]
    flops = sum(2 * rows * k * n for k, n in shapes)
    for a, b in mats:  # warm-up
        product(a, b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for a, b in mats:
            product(a, b)
        times.append(time.perf_counter() - t0)
    return flops / statistics.median(times) / 1e9
