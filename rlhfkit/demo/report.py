"""The demo's outputs: summary.json, report.md and the PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

MODELS = {"sft": "SFT", "ppo": "PPO (KL on)", "ppo_no_kl": "PPO (beta = 0)", "dpo": "DPO"}


def _metrics(path: Path) -> list[dict]:
    f = path / "metrics.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines() if line] if f.exists() else []


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot(out: Path) -> list[str]:
    """ppo_curves.png (reward, KL, entropy per step) and proxy_vs_gold.png (over-optimisation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {name: _metrics(out / name) for name in ("ppo", "ppo_no_kl")}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, key, title in zip(
        axes, ("reward/score", "kl/ref", "policy/entropy"), ("RM score", "KL to reference", "entropy")
    ):
        for name, rows in runs.items():
            ax.plot(*_series(rows, key), label=MODELS[name])
        ax.set_title(title)
        ax.set_xlabel("PPO step")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "ppo_curves.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=False)
    for ax, key, title in zip(
        axes, ("reward/score", "reward/gold"), ("proxy: reward-model score", "gold judge (held-out prompts)")
    ):
        for name, rows in runs.items():
            ax.plot(*_series(rows, key), marker="o" if key == "reward/gold" else None, label=MODELS[name])
        ax.set_title(title)
        ax.set_xlabel("PPO step")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "proxy_vs_gold.png", dpi=110)
    plt.close(fig)
    return ["ppo_curves.png", "proxy_vs_gold.png"]


def write_report(out: Path, results: dict, ceiling: float, stage_seconds: dict, seconds: float) -> dict:
    rm_rows = [r for r in _metrics(out / "rm") if r.get("eval/accuracy") is not None]
    rm_acc = rm_rows[-1]["eval/accuracy"] if rm_rows else float("nan")
    m = {name: r["metrics"] for name, r in results.items()}
    summary = {f"gold/{n}": m[n].get("reward/gold") for n in MODELS}
    summary.update({f"rm_score/{n}": m[n].get("reward/score") for n in MODELS})
    summary.update({f"kl/{n}": m[n].get("kl/ref") for n in MODELS if n != "sft"})
    summary.update({f"length/{n}": m[n].get("response/length") for n in MODELS})
    summary.update({f"distinct2/{n}": m[n].get("response/distinct_2") for n in MODELS})
    summary.update(
        {
            "rm/eval_accuracy": rm_acc,
            "rm/label_noise_ceiling": ceiling,
            "seconds": seconds,
            "stage_seconds": stage_seconds,
        }
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plots = plot(out)

    lines = [
        "# rlhfkit demo: customer-support replies",
        "",
        f"Whole pipeline in {seconds / 60:.1f} minutes. Scores are means over {int(m['sft'].get('n', 0))} sampled "
        "replies to held-out prompts; the gold judge is never used for training.",
        "",
        "| model | gold | RM score | KL to SFT | length (words) | distinct-2 | repetition |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, label in MODELS.items():
        x = m[n]
        kl = "—" if n == "sft" else f"{x.get('kl/ref', float('nan')):.2f}"
        lines.append(
            f"| {label} | {x['reward/gold']:.3f} | {x['reward/score']:.3f} | {kl} | {x['response/length']:.1f} "
            f"| {x['response/distinct_2']:.3f} | {x['response/repetition']:.3f} |"
        )
    lines += [
        "",
        f"Reward model held-out accuracy: **{rm_acc:.3f}**, next to the label-noise ceiling **{ceiling:.3f}** "
        "(the accuracy of the raters' own rule, the gold judge, on the same noisy labels).",
        "",
        "## Over-optimisation",
        "",
        "![PPO curves](ppo_curves.png)",
        "",
        "![proxy vs gold](proxy_vs_gold.png)",
        "",
        "The gold judge is also a reward function (`rlhfkit grpo --reward-fn support`), but optimising it "
        "directly is a different experiment: no learned reward model stands between the policy and the judge, "
        "so there is no proxy to over-optimise. That measures an optimiser on a known reward; RLHF is about "
        "what survives when human preferences are first learned by a reward model and then optimised.",
        "",
        "## Sample replies (same held-out prompts)",
        "",
    ]
    for i in range(min(5, len(results["sft"]["samples"]))):
        prompt = " ".join(str(results["sft"]["samples"][i]["prompt"]).split())
        lines.append(f"**{prompt}**")
        lines.append("")
        for n, label in MODELS.items():
            s = results[n]["samples"][i]
            lines.append(f"- *{label}* (gold {s.get('gold', float('nan')):.2f}): {s['response'].strip()}")
        lines.append("")
    lines += ["## Stage times", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in stage_seconds.items()]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    summary["plots"] = plots
    return summary
