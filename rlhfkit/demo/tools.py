"""`rlhfkit demo --task tools`: a policy learns to call a tool it cannot do without.

init-model -> SFT on conversations, half of which call the ``add`` tool and copy its result while the other
half guess the sum -> GRPO with the tool and the exact-answer reward -> both policies play the held-out
prompts as conversations with the tool -> a report: accuracy, the share of answers that used the tool, tool
errors, sample conversations. A three-number sum of 3- and 4-digit numbers is out of reach of the tiny model
by itself, so every right answer comes through the tool, and GRPO has one habit to teach: call it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from rlhfkit.config.commands import DemoConfig
from rlhfkit.config.online import MultiTurnArgs
from rlhfkit.config.parts import GenerationArgs
from rlhfkit.data.templates import render_prompt
from rlhfkit.demo.report import QUICK_RUN
from rlhfkit.demo.stages import announce_report, begin, run_stage
from rlhfkit.models.loading import load_causal_lm, load_tokenizer
from rlhfkit.multiturn.rollout import MultiTurn, conversation_metrics
from rlhfkit.tasks.tools import judge, write_task_data

# Stage settings for a ~0.24M-parameter GPT-2 on 2 CPU cores. SFT runs long because copying the three numbers
# from the prompt into the tool call is learnt late, and it needs many different demonstrations (DATA_SIZES):
# a few thousand, each seen several times, leave most calls wrong where the same steps over many more get most
# right. GRPO's steps leave room past the point where the policy calls the tool every time.
SETTINGS = {
    "sft": dict(max_steps=2000, learning_rate=6e-3, batch_size=16, eval_steps=1000),
    "grpo": dict(
        max_steps=60,
        learning_rate=5e-4,
        batch_size=64,
        num_generations=8,
        temperature=1.0,
        kl_coef=0.0,
        log_ref_kl=True,
        gold_steps=10,
        sample_steps=20,
    ),
}
QUICK = {"sft": dict(max_steps=4, batch_size=8), "grpo": dict(max_steps=2, batch_size=16, num_generations=4)}
DATA_SIZES = {"sft": 20000}
QUICK_SIZES = {"sft": 200, "sft_eval": 20, "prompts_train": 64}
# A turn is one tool call (about 30 tokens) or the answer; three turns leave room for a second call.
MAX_NEW_TOKENS, MAX_TURNS = 48, 3
TURNS = {"max_new_tokens": MAX_NEW_TOKENS, "max_turns": MAX_TURNS}
EVAL_SAMPLES_PER_PROMPT = 4
POLICIES = {"sft": "SFT", "grpo": "GRPO"}


def run(cfg: DemoConfig) -> dict:
    settings = QUICK if cfg.quick else SETTINGS
    start = time.perf_counter()
    out, data, stages = begin(cfg, write_task_data, total=5, sizes=QUICK_SIZES if cfg.quick else DATA_SIZES)
    common = {"seed": cfg.seed, "progress": cfg.progress, "overwrite_output_dir": True}
    tool = f"{data['tool']}:add"
    sft = {"model": f"{out}/base", "data": data["sft"], "eval_data": data["sft_eval"], "output_dir": f"{out}/sft"}
    stages.run("SFT", lambda: run_stage("sft", {**sft, **settings["sft"], **common}))
    grpo = {
        "model": f"{out}/sft",
        "data": data["prompts_train"],
        "eval_data": data["prompts_eval"],
        "tool": [tool],
        **TURNS,
        "reward_fn": ["tools:exact_answer"],
        "gold_judge": "tools",
        "output_dir": f"{out}/grpo",
    }
    stages.run(
        "GRPO (the add tool, exact-answer reward)", lambda: run_stage("grpo", {**grpo, **settings["grpo"], **common})
    )

    def evaluate_both() -> dict:
        rows = [json.loads(line) for line in Path(data["prompts_eval"]).read_text().splitlines() if line]
        prompts = [row["prompt"] for row in rows] * (1 if cfg.quick else EVAL_SAMPLES_PER_PROMPT)
        return {name: evaluate_conversations(str(out / name), prompts, tool, seed=cfg.seed) for name in POLICIES}

    results = stages.run("evaluation on held-out sums", evaluate_both, keep=False)
    summary = write_report(out, results, stages, time.perf_counter() - start + stages.earlier_seconds, cfg.quick)
    announce_report(out)
    return summary


def evaluate_conversations(policy_dir: str, prompts: list, tool: str, seed: int = 0) -> dict:
    """Play one conversation with the tool per prompt (sampled at temperature 1, as GRPO samples) and judge
    each final reply with the task's gold judge. Returns ``{"metrics": ..., "samples": [...]}``, one sample
    per conversation: its prompt text, messages, gold score, tool calls and tool errors."""
    args = MultiTurnArgs(tool=[tool], max_turns=MAX_TURNS)
    generation = GenerationArgs(max_new_tokens=MAX_NEW_TOKENS, temperature=1.0)
    tokenizer = load_tokenizer(policy_dir)
    model = load_causal_lm(policy_dir, False, tokenizer).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        convs = MultiTurn(args, tokenizer).rollout(model, prompts, list(range(len(prompts))), {}, generation, "cpu")
    samples = [
        {
            "prompt": c.messages[0]["content"],
            "messages": c.messages,
            "gold": judge(render_prompt(tokenizer, p), c.reply),
            "tool_calls": c.tool_calls,
            "tool_errors": c.tool_errors,
        }
        for p, c in zip(prompts, convs)
    ]
    return {"metrics": conversation_summary(samples) | conversation_metrics(convs), "samples": samples}


def conversation_summary(samples: list[dict]) -> dict[str, float]:
    """``accuracy`` (mean gold), ``tool_use`` (the share of conversations with a tool call), the accuracy of
    the conversations with and without one (NaN when there are none), ``tool_errors`` (their count) and
    ``n``."""

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else float("nan")

    used = [s for s in samples if s["tool_calls"] > 0]
    unused = [s for s in samples if s["tool_calls"] == 0]
    return {
        "n": float(len(samples)),
        "accuracy": mean([s["gold"] for s in samples]),
        "tool_use": len(used) / len(samples),
        "accuracy/with_tool": mean([s["gold"] for s in used]),
        "accuracy/without_tool": mean([s["gold"] for s in unused]),
        "tool_errors": float(sum(s["tool_errors"] for s in samples)),
    }


def _metrics(path: Path) -> list[dict]:
    f = path / "metrics.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines() if line] if f.exists() else []


def plot(out: Path) -> str:
    """grpo_curves.png: the exact-answer reward of the training conversations with held-out accuracy, and tool
    calls and tool errors per training conversation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _metrics(out / "grpo")

    def series(key: str) -> tuple[list[int], list[float]]:
        points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        return [p[0] for p in points], [p[1] for p in points]

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    axes[0].plot(*series("reward/tools_exact_answer"), label="exact-answer reward (training)")
    axes[0].plot(*series("reward/gold"), marker="o", label="accuracy (held-out)")
    axes[0].set_title("right answers")
    axes[1].plot(*series("rollout/tool_calls"), label="tool calls")
    axes[1].plot(*series("rollout/tool_errors"), label="tool errors")
    axes[1].set_title("per training conversation")
    for ax in axes:
        ax.set_xlabel("GRPO step")
        ax.set_ylim(0, max(1.05, ax.get_ylim()[1]))
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "grpo_curves.png", dpi=110)
    plt.close(fig)
    return "grpo_curves.png"


def share(value: float) -> str:
    """A share for the report's table; a dash where there were no conversations to take it over (NaN)."""
    return "—" if value != value else f"{value:.3f}"


def _turn(message: dict) -> str:
    text = " ".join(message["content"].split())
    return f"{message['role']}: `{text}`" if text else f"{message['role']}: (empty)"


def write_report(out: Path, results: dict, stages, seconds: float, quick: bool = False) -> dict:
    """summary.json, grpo_curves.png and report.md. ``stages``: the stage runner (``seconds`` and ``load`` per
    stage). ``quick``: the stages ran a few steps (``--quick``); the report then says so first and draws no
    conclusions."""
    m = {name: results[name]["metrics"] for name in POLICIES}
    summary: dict = {"quick": quick}
    for key in ("accuracy", "tool_use", "accuracy/with_tool", "accuracy/without_tool", "tool_errors"):
        summary.update({f"{key}/{name}": m[name][key] for name in POLICIES})
    summary.update({f"turns/{name}": m[name]["rollout/turns"] for name in POLICIES})
    summary.update({f"truncated/{name}": m[name]["rollout/truncated"] for name in POLICIES})
    summary.update(
        {
            "conversations": int(m["sft"]["n"]),
            "seconds": seconds,
            "stage_seconds": stages.seconds,
            "stage_load_average": stages.load,
            "stage_code": dict(getattr(stages, "code", {})),
        }
    )
    summary = {k: None if isinstance(v, float) and v != v else v for k, v in summary.items()}  # NaN: no such rows
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    summary["plots"] = [plot(out)]
    before, after = m["sft"], m["grpo"]
    about = (
        "A tiny GPT-2, trained from scratch on this machine, is asked sums of three 3- or 4-digit numbers, which "
        "it cannot work out itself, and may call an `add` tool. Its SFT demonstrations call the tool and copy "
        "its result half of the time and guess the other half; GRPO then trains it with the tool on a reward "
        "that is a program: 1 for the exact sum, else 0."
    )
    measured = (
        f"{int(before['n'])} conversations on held-out sums per policy; whole pipeline: {seconds / 60:.1f} minutes"
    )
    if quick:
        shows = f"The table gives each policy's numbers ({measured})."
    else:
        shows = (
            f"Accuracy on held-out sums went from **{before['accuracy']:.3f}** after SFT to "
            f"**{after['accuracy']:.3f}** after GRPO, and the share of answers that used the tool from "
            f"**{before['tool_use']:.2f}** to **{after['tool_use']:.2f}** ({measured})."
        )
    lines = [
        "# rlhfkit demo: learning to use a tool",
        "",
        *([QUICK_RUN, ""] if quick else []),
        f"{about} {shows}",
        "",
        "| policy | accuracy | used the tool | accuracy with the tool | accuracy without | tool errors | model turns |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in POLICIES.items():
        x = m[name]
        lines.append(
            f"| {label} | {x['accuracy']:.3f} | {x['tool_use']:.2f} | {share(x['accuracy/with_tool'])} "
            f"| {share(x['accuracy/without_tool'])} | {x['tool_errors']:.0f} | {x['rollout/turns']:.2f} |"
        )
    lines += [
        "",
        "*used the tool*: the share of conversations with at least one tool call. *tool errors*: calls that "
        "failed (a call that is not valid JSON, a wrong argument), counted over all conversations; the error "
        "goes back to the model as the tool's message. A dash: no conversation of that kind.",
        "",
        "![GRPO curves](grpo_curves.png)",
        "",
        "## Sample conversations (same held-out sums)",
        "",
    ]
    for a, b in list(zip(results["sft"]["samples"], results["grpo"]["samples"]))[:6]:
        lines += [f"**{a['prompt']}**", ""]
        for label, s in zip(POLICIES.values(), (a, b)):
            verdict = "right" if s["gold"] == 1 else "wrong"
            lines.append(f"- *{label}* ({verdict}): " + " → ".join(_turn(msg) for msg in s["messages"][1:]))
        lines.append("")
    lines += ["## Stage times", "", "| stage | seconds | load average |", "|---|---|---|"]
    lines += [f"| {k} | {v:.0f} | {stages.load.get(k, float('nan')):.1f} |" for k, v in stages.seconds.items()]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return summary
