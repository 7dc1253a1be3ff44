"""Where rlhfkit's PPO step time goes, and the physical floor of that step on this machine.

    python bench/profile_ppo.py [--size tiny] [--steps 6] [--threads 0] [--lora-r 0] [--torch-profile] [--out FILE.json]

Runs `rlhfkit ppo` in this process with the settings of bench/ppo_vs_trl.py (same models: run that once, or
this script builds them) and times rlhfkit's own functions by wrapping them (nothing in rlhfkit changes):

  generate            rollout.generate (KV-cache sampling loop)             -> step 1
  score               decode + RewardScorer.score + shaping (time/score_s) -> step 2
    rm forward          RewardScorer.score alone
  rollout forwards    ActorCritic.forward in make_rollout (policy + value) -> steps 3-4
                      (with grad when epoch 1 reuses it: one minibatch)
    value model         SeparateValueModel.forward inside it
  reference forward   response_logprobs                                   -> step 3
  advantages, misc    rest of make_rollout (padding, KL, rewards, GAE, whitening) -> steps 5-6
  train forward       ActorCritic.forward in the PPO epochs                 -> step 7
  loss math           OnlineTrainer.loss minus its forward (ops.*)
  backward            Accelerator.backward                                  -> step 7
    in the rollout      the separate value model's epoch-1 backward, run with the rollout (one minibatch)
  optimizer           updates.step (grad norm, AdamW, schedule, zero_grad)
  update overhead     rest of train_epochs (minibatch select, Python)
  step overhead       rest of OnlineTrainer.step (metrics, KL controller)
  loop overhead       outside OnlineTrainer.step, between steps (logging, TensorBoard, samples)

The floor: the step's matmul FLOPs (formula in `step_flops`) divided by the matmul rate measured here at the
model's shapes (`measure_matmul_rate`, through the path rlhfkit's linear layers take: oneDNN for fp32 on CPU):
decode shapes (B rows) for generation, full-sequence shapes for the rest.
The teacher-forced phases count real tokens only (padding is not work the math needs; packing removes most of it).
The stamp (bench/stamp.py: commit, date, machine, load at the start and at the end) is printed under the tables.
With --out the run (its options, stamp and numbers) is merged into that JSON file under its machine and run key
(bench/results_file.py), beside the other runs the file holds: bench/reported/profile_ppo.json is the reported one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as bench  # noqa: E402  (the benchmark's models and settings)
import results_file  # noqa: E402
from stamp import Stamp, summary  # noqa: E402

BUCKETS = [
    "generate",
    "score",
    "rm forward",
    "rollout forwards",
    "value model",
    "reference forward",
    "advantages, misc",
    "train forward",
    "loss math",
    "backward",
    "rollout backward",
    "optimizer",
    "update overhead",
    "step overhead",
    "loop overhead",
]
CHILDREN = {"rm forward", "value model", "rollout backward"}  # parts of the row above them, not added to the total


class Clock:
    """Per-step totals of named wall-clock intervals."""

    def __init__(self):
        self.steps: list[dict[str, float]] = []
        self.now: dict[str, float] = defaultdict(float)

    def wrap(self, owner, attr: str, name, when=None):
        """Replace ``owner.attr`` by a timed version; ``name`` may be a function of the call's args."""
        original = getattr(owner, attr)

        def timed(*args, **kwargs):
            if when is not None and not when():
                return original(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.now[name] += time.perf_counter() - t0

        setattr(owner, attr, timed)


def instrument(clock: Clock, record: dict) -> None:
    from accelerate import Accelerator

    from rlhfkit.models.reward import RewardScorer
    from rlhfkit.trainers.online import policy, trainer, update
    from rlhfkit.trainers.online import rollout as rollout_module
    from rlhfkit.training import updates

    in_rollout = [False]
    make_rollout = trainer.OnlineTrainer.make_rollout

    def flagged(self, *args, **kwargs):
        in_rollout[0] = True
        try:
            return make_rollout(self, *args, **kwargs)
        finally:
            in_rollout[0] = False

    trainer.OnlineTrainer.make_rollout = flagged
    clock.wrap(rollout_module, "generate", "generate")
    clock.wrap(RewardScorer, "score", "rm forward")
    # the rollout's policy + value pass (with grad when epoch 1 reuses it) vs the PPO epochs' passes
    clock.wrap(policy.ActorCritic, "forward", "rollout forwards", when=lambda: in_rollout[0])
    clock.wrap(policy.ActorCritic, "forward", "train forward", when=lambda: not in_rollout[0])
    clock.wrap(policy.SeparateValueModel, "forward", "value model", when=lambda: in_rollout[0])
    clock.wrap(trainer, "response_logprobs", "reference forward")
    clock.wrap(update.PPOUpdate, "loss", "loss+forward")
    clock.wrap(Accelerator, "backward", "backward")
    clock.wrap(Accelerator, "backward", "rollout backward", when=lambda: in_rollout[0])
    clock.wrap(updates, "step", "optimizer")
    clock.wrap(update.PPOUpdate, "train_epochs", "train_epochs")

    original = trainer.OnlineTrainer.step

    def ppo_step(self, batch):
        t0 = time.perf_counter()
        if record["last_end"] is not None:
            clock.now["loop overhead"] += t0 - record["last_end"]
        result = original(self, batch)
        metrics, rollout = result.metrics, result.rollout
        end = time.perf_counter()
        n = clock.now
        step = {
            k: n.get(k, 0.0)
            for k in (
                "generate",
                "rm forward",
                "rollout forwards",
                "value model",
                "reference forward",
                "train forward",
                "backward",
                "rollout backward",
                "optimizer",
            )
        }
        step["score"] = metrics["time/score_s"]
        step["advantages, misc"] = (
            metrics["time/rollout_s"]
            - step["generate"]
            - step["score"]
            - step["rollout forwards"]
            - step["reference forward"]
            - step["rollout backward"]
        )
        step["loss math"] = n["loss+forward"] - n["train forward"]
        update_backward = n["backward"] - n["rollout backward"]
        step["update overhead"] = n["train_epochs"] - n["loss+forward"] - update_backward - n["optimizer"]
        step["step overhead"] = (end - t0) - metrics["time/rollout_s"] - n["train_epochs"]
        step["loop overhead"] = n.get("loop overhead", 0.0)
        step["_ppo_step"] = end - t0
        step["_tokens"] = int(rollout.response_mask.sum())
        step["_prompt_tokens"] = int(rollout.query_mask.sum())
        step["_shape"] = [int(rollout.query_ids.shape[1]), int(rollout.response_ids.shape[1])]
        clock.steps.append(step)
        clock.now = defaultdict(float)
        record["last_end"] = time.perf_counter()
        return result

    trainer.OnlineTrainer.step = ppo_step


# ---- the floor -----------------------------------------------------------------------------------
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


# ---- main ----------------------------------------------------------------------------------------
def torch_profile_one_step(flags: list[str], top: int) -> None:
    """Run two steps under torch.profiler and print the ops that took most self CPU time in the second."""
    from torch.profiler import ProfilerActivity, profile, schedule

    from rlhfkit.config.commands import PPOConfig
    from rlhfkit.config.parse import parse_config
    from rlhfkit.trainers.online import run, trainer

    cfg, _ = parse_config("rlhfkit ppo", PPOConfig, flags)
    prof = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=1, repeat=1))
    original = trainer.OnlineTrainer.step

    def ppo_step(self, *args):
        out = original(self, *args)
        prof.step()
        return out

    trainer.OnlineTrainer.step = ppo_step
    with prof:
        run.train(cfg)
    trainer.OnlineTrainer.step = original
    events = prof.key_averages()
    total_calls = sum(e.count for e in events)
    print(f"\ntorch.profiler, one step: {total_calls} op calls; top {top} by self CPU time")
    print(events.table(sort_by="self_cpu_time_total", row_limit=top))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--size",
        default="tiny",
        choices=[*bench.PREP, "smollm2"],
        help="a benchmark model, or smollm2: SmolLM2-135M-Instruct with bench/real_model.py's PPO settings",
    )
    ap.add_argument("--steps", type=int, default=6, help="PPO steps; the first (warm-up) is excluded")
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 keeps torch's default")
    ap.add_argument("--lora-r", type=int, default=0, help="profile the one-backbone LoRA mode instead")
    ap.add_argument("--learning-rate", type=float, default=None)
    ap.add_argument("--work-dir", default=str(bench.BENCH / "results" / "work"))
    ap.add_argument("--out", default=None, help="JSON file the run is merged into (under its machine and run key)")
    ap.add_argument("--torch-profile", action="store_true", help="also print torch.profiler's top ops of one step")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be at least 2")
    stamp = Stamp()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    work = Path(args.work_dir).resolve()
    data = bench.task_data(work)
    if args.size == "smollm2":
        models, settings = bench.smollm2_models(work, lambda m: print(m, flush=True)), bench.SMOLLM2_PPO
        lr = args.learning_rate or bench.SMOLLM2_LR["lora" if args.lora_r else "full"]
    else:
        models, settings = bench.build_models(args.size, work, data, lambda m: print(m, flush=True)), bench.SETTINGS
        lr = args.learning_rate or (bench.DEFAULT_LORA_LR if args.lora_r else bench.DEFAULT_LR)[args.size]
    out_dir = work / args.size / "profile"
    flags = bench.rlhfkit_ppo_flags(models, data, out_dir, args.steps, lr, 0, args.lora_r, settings=settings)

    from rlhfkit.cli.main import main as rlhfkit_main

    clock, record = Clock(), {"last_end": None}
    instrument(clock, record)
    if rlhfkit_main(["ppo", *flags]) != 0:
        raise SystemExit("profile: rlhfkit ppo failed")
    steps = clock.steps[1:]  # drop the warm-up step
    med = {k: statistics.median(s[k] for s in steps) for k in BUCKETS}
    step_s = statistics.median(s["_ppo_step"] + s["loop overhead"] for s in steps)
    tokens = statistics.mean(s["_tokens"] for s in steps)
    P, T = steps[-1]["_shape"]
    B, E = settings["batch_size"], settings["ppo_epochs"]

    shapes = model_shapes(models["sft"])
    real = (statistics.mean(s["_prompt_tokens"] for s in steps), tokens)
    flops = step_flops(shapes, B, P, T, E, separate_value=not args.lora_r, lora=bool(args.lora_r), real=real)
    padded = sum(step_flops(shapes, B, P, T, E, separate_value=not args.lora_r, lora=bool(args.lora_r)).values())
    rate_full = measure_matmul_rate(shapes, B * (P + T))
    rate_decode = measure_matmul_rate(shapes, B)
    floor = {k: v / ((rate_decode if k == "generate" else rate_full) * 1e9) for k, v in flops.items()}
    phase_of = {
        "generate": "generate",
        "score": "score",
        "rollout forwards": "rollout forwards",
        "reference forward": "reference forward",
    }
    measured_phase = {
        **{k: med[k] for k in phase_of},
        "update": sum(med[k] for k in ("train forward", "loss math", "backward", "optimizer", "update overhead")),
    }

    print(
        f"\nrlhfkit PPO step, {args.size} ({models['params'] / 1e6:.2f}M params), batch {B}, prompt {P} + response {T} "
        f"positions, {E} epochs, {'LoRA r=%d, value head' % args.lora_r if args.lora_r else 'separate value model'}, "
        f"threads {torch.get_num_threads()}, median of {len(steps)} steps"
    )
    print(f"{'part':<22} {'seconds':>9} {'share':>7}")
    for k in BUCKETS:
        label = ("  " + k) if k in CHILDREN else k
        print(f"{label:<22} {med[k]:>9.4f} {med[k] / step_s:>7.1%}")
    print(f"{'step (wall)':<22} {step_s:>9.4f} {'':>7}   {tokens / step_s:.0f} generated tokens/s")
    rate_default = measure_matmul_rate(shapes, B * (P + T), default_path=True)
    print(
        f"\nfloor: matmul rate here {rate_full:.1f} GFLOP/s at {B * (P + T)} rows, {rate_decode:.1f} GFLOP/s at {B} rows (decode); "
        f"torch.matmul's default path {rate_default:.1f} GFLOP/s at {B * (P + T)} rows"
    )
    print(f"{'phase':<22} {'GFLOP':>9} {'floor s':>9} {'measured s':>11} {'x floor':>8}")
    for k in flops:
        print(
            f"{k:<22} {flops[k] / 1e9:>9.3f} {floor[k]:>9.4f} {measured_phase[k]:>11.4f} {measured_phase[k] / floor[k]:>8.1f}"
        )
    total_floor = sum(floor.values())
    print(
        f"{'step':<22} {sum(flops.values()) / 1e9:>9.3f} {total_floor:>9.4f} {step_s:>11.4f} {step_s / total_floor:>8.1f}"
    )
    print(
        f"(teacher-forced phases count the {sum(real):.0f} real tokens of the {B * (P + T)} padded positions; "
        f"on every padded position the step would be {padded / 1e9:.1f} GFLOP)"
    )
    record = stamp.record()
    print(summary(record))
    if args.out:
        results_file.merge(
            Path(args.out),
            "profile_ppo",
            results_file.machine_key(record),
            results_file.run_key(record["commit"], vars(args), vars(ap.parse_args([]))),
            {
                "stamp": record,
                "args": vars(args),
                "size": args.size,
                "lora_r": args.lora_r,
                "threads": torch.get_num_threads(),
                "median_s": med,
                "step_s": step_s,
                "tokens_per_s": tokens / step_s,
                "flops": flops,
                "padded_flops": padded,
                "matmul_gflops": {"full": rate_full, "decode": rate_decode, "full_default_path": rate_default},
                "floor_s": floor,
                "steps": clock.steps,
                "shapes": shapes,
            },
        )
    if args.torch_profile:
        torch_profile_one_step(
            bench.rlhfkit_ppo_flags(
                models, data, work / args.size / "profile-torch", 2, lr, 0, args.lora_r, settings=settings
            ),
            top=25,
        )


if __name__ == "__main__":
    main()
