"""`rlhfkit demo --task arithmetic`: RL with a reward a program can check.

init-model -> a short SFT on a little data (the policy learns the format and some answers) -> GRPO with the
exact-answer reward (plus a small format reward) -> accuracy on held-out problems before and after, the
reward curve, and a report. No reward model: the reward is the answer check itself.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rlhfkit.config.commands import DemoConfig
from rlhfkit.config.parts import GenerationArgs
from rlhfkit.data.schema import load_examples
from rlhfkit.demo.report import QUICK_RUN, kl_note, number
from rlhfkit.demo.stages import announce_report, begin, run_stage
from rlhfkit.inference.evaluate import evaluate_policy
from rlhfkit.tasks import get_judge
from rlhfkit.tasks.arithmetic import write_task_data

# Stage settings for a ~0.2M-parameter GPT-2 on 2 CPU cores.
SETTINGS = {
    "sft": dict(max_steps=1200, learning_rate=3e-3, batch_size=16),
    "grpo": dict(
        max_steps=600,
        learning_rate=5e-4,
        batch_size=64,
        num_generations=8,
        max_new_tokens=6,
        temperature=1.0,
        kl_coef=0.0,
        log_ref_kl=True,
        gold_steps=50,
        sample_steps=50,
    ),
}
QUICK = {"sft": dict(max_steps=4, batch_size=8), "grpo": dict(max_steps=2, batch_size=16, num_generations=4)}
EVAL_SAMPLES_PER_PROMPT = 4


def run(cfg: DemoConfig) -> dict:
    settings = QUICK if cfg.quick else SETTINGS
    start = time.perf_counter()
    out, data, stages = begin(cfg, write_task_data, total=5)
    common = {"seed": cfg.seed, "progress": cfg.progress, "overwrite_output_dir": True}
    sft = {"model": f"{out}/base", "data": data["sft"], "eval_data": data["sft_eval"], "output_dir": f"{out}/sft"}
    stages.run("SFT", lambda: run_stage("sft", {**sft, **settings["sft"], **common}))
    grpo = {
        "model": f"{out}/sft",
        "data": data["prompts_train"],
        "eval_data": data["prompts_eval"],
        "reward_fn": ["arithmetic:exact_answer", "arithmetic:format"],
        "reward_weights": [1.0, 0.1],
        "gold_judge": "arithmetic",
        "output_dir": f"{out}/grpo",
    }
    stages.run("GRPO (exact-answer reward)", lambda: run_stage("grpo", {**grpo, **settings["grpo"], **common}))

    def evaluate_both() -> dict:
        prompts = [ex.prompt for ex in load_examples(data["prompts_eval"], "prompt", "rlhfkit demo")]
        prompts = prompts * (1 if cfg.quick else EVAL_SAMPLES_PER_PROMPT)
        gen = GenerationArgs(max_new_tokens=6, temperature=1.0)
        results = {}
        for name in ("sft", "grpo"):
            metrics, rows = evaluate_policy(
                str(out / name), prompts, gen, reference=str(out / "sft"), judge=get_judge("arithmetic"), seed=cfg.seed
            )
            results[name] = {"metrics": metrics, "samples": rows}
        return results

    results = stages.run("evaluation on held-out problems", evaluate_both, keep=False)
    seconds = time.perf_counter() - start + stages.earlier_seconds
    summary = write_report(out, results, stages.seconds, seconds, cfg.quick)
    announce_report(out)
    return summary


def _metrics(path: Path) -> list[dict]:
    f = path / "metrics.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines() if line] if f.exists() else []


def plot(out: Path) -> str:
    """grpo_curves.png: the exact-answer reward of the training completions, and held-out accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _metrics(out / "grpo")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, title in zip(
        axes,
        ("reward/arithmetic_exact_answer", "reward/gold"),
        ("exact-answer reward (training completions)", "accuracy on held-out problems"),
    ):
        points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o" if key == "reward/gold" else None)
        ax.set_title(title)
        ax.set_xlabel("GRPO step")
        ax.set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(out / "grpo_curves.png", dpi=110)
    plt.close(fig)
    return "grpo_curves.png"


def write_report(out: Path, results: dict, stage_seconds: dict, seconds: float, quick: bool = False) -> dict:
    """summary.json, grpo_curves.png and report.md. ``quick``: the stages ran a few steps (``--quick``); the
    report then says so first and draws no conclusions."""
    before, after = (results[n]["metrics"] for n in ("sft", "grpo"))
    summary = {
        "quick": quick,
        "accuracy/sft": before.get("reward/gold"),
        "accuracy/grpo": after.get("reward/gold"),
        "kl/grpo": after.get("kl/ref"),
        "length/sft": before.get("response/tokens"),
        "length/grpo": after.get("response/tokens"),
        "seconds": seconds,
        "stage_seconds": stage_seconds,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    summary["plots"] = [plot(out)]
    samples = int(before.get("n", 0))
    about = (
        "A tiny GPT-2, taught the format and some answers by a short SFT on imperfect demonstrations, is trained "
        "with GRPO on a reward that is a program, not a model: 1 for the exact answer (plus 0.1 for a well-formed "
        "reply)."
    )
    measured = f"{samples} sampled replies to held-out sums and differences; whole pipeline: {seconds / 60:.1f} minutes"
    if quick:
        shows = f"The table gives each policy's accuracy ({measured})."
    else:
        shows = (
            f"Accuracy on held-out sums and differences went from **{before['reward/gold']:.3f}** after SFT to "
            f"**{after['reward/gold']:.3f}** after GRPO ({measured})."
        )
    lines = [
        "# rlhfkit demo: arithmetic with a checkable reward",
        "",
        *([QUICK_RUN, ""] if quick else []),
        f"{about} {shows}",
        "",
        "| policy | accuracy (held-out) | KL to SFT | reply length (tokens) |",
        "|---|---|---|---|",
        f"| SFT | {before['reward/gold']:.3f} | — | {before['response/tokens']:.1f} |",
        f"| GRPO | {after['reward/gold']:.3f} | {number(after.get('kl/ref', float('nan')))} | "
        f"{after['response/tokens']:.1f} |",
        *kl_note([after.get("kl/ref", float("nan"))]),
        "",
        "![GRPO curves](grpo_curves.png)",
        "",
        "## Sample replies (same held-out problems)",
        "",
        "| problem | SFT | GRPO |",
        "|---|---|---|",
    ]
    for a, b in list(zip(results["sft"]["samples"], results["grpo"]["samples"]))[:10]:
        prompt = " ".join(str(a["prompt"]).split())
        lines.append(f"| `{prompt}` | `{a['response'].strip()}` ({a['gold']:.0f}) | `{b['response'].strip()}` "
                     f"({b['gold']:.0f}) |")  # fmt: skip
    lines += ["", "## Stage times", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in stage_seconds.items()]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return summary
