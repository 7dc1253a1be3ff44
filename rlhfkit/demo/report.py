"""The demo's outputs: summary.json, report.md and the PNG plots."""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

from rlhfkit.demo.reward_carry import ceiling_text, diagnostics_section
from rlhfkit.inference.diagnostics import overoptimisation_curve
from rlhfkit.tasks.support.prompts import customer_message

MODELS = {
    "sft": "SFT",
    "ppo": "PPO (KL on)",
    "ppo_no_kl": "PPO (beta = 0)",
    "dpo": "DPO",
    "iterated": "iterated PPO",
    "online_dpo": "online DPO",
    "ppo_gold": "PPO (gold judge as reward)",
}
# The top line of a --quick run's report (both tasks): its stages ran a few steps, so its numbers are noise.
QUICK_RUN = (
    "**A quick run (`--quick`): every stage ran only a few steps, to check that the stages fit together. Its "
    "numbers mean nothing, and this report draws no conclusions from them.**"
)


def number(value: float, spec: str = ".2f") -> str:
    """``value`` formatted with ``spec``, a value that rounds to zero written as +0: an estimate of -0.0004
    prints as 0.00 (or +0.00), never -0.00."""
    text = format(value, spec)
    return format(0.0, spec) if float(text) == 0 else text


def kl_note(values: list[float], spec: str = ".2f") -> list[str]:
    """A note for a table whose KL column, formatted with ``spec``, shows a negative number; else nothing."""
    if not any(number(v, spec).startswith("-") for v in values):
        return []
    return [
        "",
        "*KL to SFT* is estimated from the sampled replies: the mean over replies of the sum over tokens of "
        "log π(token) − log π_SFT(token). The true KL is never negative, but this estimate can be; a negative "
        "value means the policy is so close to the SFT model that sampling noise outweighs the difference.",
    ]


def flags(options: dict) -> str:
    """A stage's options as the command line would give them (``--max-steps 60 --precompute-ref true``)."""
    return " ".join(
        f"--{name.replace('_', '-')} {str(v).lower() if isinstance(v, bool) else v}" for name, v in options.items()
    )


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

    runs = {name: rows for name in ("ppo", "ppo_no_kl") if (rows := _metrics(out / name))}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, key, title in zip(
        axes, ("reward/score", "kl/ref", "policy/entropy"), ("RM score", "KL to reference", "entropy")
    ):
        for name, rows in runs.items():
            ax.plot(*_series(rows, key), label=MODELS[name])
        ax.set_title(title)
        ax.set_xlabel("PPO step")
        if runs:
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
        if runs:
            ax.legend()
    fig.tight_layout()
    fig.savefig(out / "proxy_vs_gold.png", dpi=110)
    plt.close(fig)

    # the over-optimisation curve: both scores against the KL the policy has moved from the SFT model
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    curves = {name: overoptimisation_curve(rows) for name, rows in runs.items()}
    gold_run = _metrics(out / "ppo_gold")  # its reward is the judge: on the gold panel only
    for ax, key, title in zip(axes, ("score", "gold"), ("reward-model score", "gold judge (held-out prompts)")):
        shown = {**curves, "ppo_gold": overoptimisation_curve(gold_run)} if key == "gold" and gold_run else curves
        for name, curve in shown.items():
            points = [(r["kl"], r[key]) for r in curve if r["kl"] is not None and r[key] is not None]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=MODELS[name])
        ax.set_title(title)
        ax.set_xlabel("KL to SFT (nats)")
        if curves:
            ax.legend()
    fig.tight_layout()
    fig.savefig(out / "scores_against_kl.png", dpi=110)
    plt.close(fig)
    return ["ppo_curves.png", "proxy_vs_gold.png", "scores_against_kl.png"]


def gold_standard_error(samples: list[dict]) -> float:
    """Standard error of the mean gold score of sampled replies (rows with ``"gold"``); NaN below two rows."""
    golds = [row["gold"] for row in samples if row.get("gold") is not None]
    return statistics.stdev(golds) / math.sqrt(len(golds)) if len(golds) > 1 else math.nan


def paired_standard_errors(samples: dict[str, list[dict]]) -> dict[str, float]:
    """``"A-B"``: the standard error of policy A's mean gold score minus B's, for each pair of policies, from the
    differences reply by reply. Every policy answered the same list of held-out prompts in the same order, so
    the pairing takes out how hard each prompt is. NaN below two pairs."""
    names, out = list(samples), {}
    for i, a in enumerate(names):
        for b in names[:i]:
            diffs = [
                x["gold"] - y["gold"]
                for x, y in zip(samples[a], samples[b], strict=True)
                if x.get("gold") is not None and y.get("gold") is not None
            ]
            out[f"{a}-{b}"] = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
    return out


def plus_minus(se: float) -> str:
    return "" if math.isnan(se) else f" ± {se:.3f}"


def gold_peak(rows: list[dict]) -> tuple[int, float] | None:
    """(step, gold) of the highest held-out gold score a PPO run logged (``--gold-steps``), or None."""
    steps, golds = _series(rows, "reward/gold")
    if not golds:
        return None
    i = max(range(len(golds)), key=golds.__getitem__)
    return steps[i], golds[i]


# The report's first paragraph: what the demo trains and how it is judged (no numbers).
PRETRAINED_ABOUT = (
    "**What this is.** A pretrained language model (`{model}`) learns to reply to customer-support messages in "
    "its own chat format. First it imitates example replies of mixed quality (SFT). Then it learns from "
    "preference pairs (which of two replies a simulated rater liked better) in two ways: PPO, which optimises a "
    "reward model trained on the pairs while a KL penalty keeps it near the SFT model, and DPO, which learns "
    "from the pairs directly. A hidden gold judge, the rule the raters follow, scores every reply to customer "
    "messages none of the models trained on; no training step sees it, except a PPO run that takes it as its "
    "reward (when it runs) to show the ceiling."
)
ABOUT = (
    "**What this is.** A small language model, trained from scratch on this machine, learns to reply to "
    "customer-support messages. First it imitates example replies of mixed quality (SFT). Then it learns from "
    "preference pairs (which of two replies a simulated rater liked better) in two ways: PPO, which optimises a "
    "reward model trained on the pairs while a KL penalty keeps it near the SFT model, and DPO, which learns "
    "from the pairs directly. A hidden gold judge, the rule the raters follow, scores every reply to customer "
    "messages none of the models trained on; no training step sees it, except a PPO run that takes it as its "
    "reward (when it runs) to show the ceiling."
)


def headline(
    m: dict,
    rm_acc: float,
    ceiling: float,
    no_kl_peak: tuple[int, float] | None = None,
    rounds: list[float | None] | None = None,
    diff_se: dict[str, float] | None = None,
) -> list[str]:
    """The report's opening in plain words: what was trained (``ABOUT``), and what the numbers show.
    ``no_kl_peak``: the (step, gold) at which the beta = 0 run's logged gold score peaked; ``rounds``: iterated
    PPO's reward-model accuracy on each round's new pairs before its update; ``diff_se``: the paired standard
    errors of the gold differences (``paired_standard_errors``), else the two errors in quadrature. Without a
    beta = 0 run (``ppo_no_kl`` not in ``m``) its paragraph is left out."""
    gold = {n: m[n]["reward/gold"] for n in MODELS if n in m}
    diff_se = diff_se or {}

    def moved(name: str) -> str:
        delta = gold[name] - gold["sft"]
        text = f"raised it by {number(delta, '+.2f')}" if delta > 0 else f"changed it by {number(delta, '+.2f')}"
        se = diff_se.get(f"{name}-sft")
        if se is None:
            se = math.hypot(m[name].get("reward/gold_se", math.nan), m["sft"].get("reward/gold_se", math.nan))
        return text if math.isnan(se) else f"{text} (± {se:.2f})"

    no_kl = _no_kl_text(m, gold, no_kl_peak) if "ppo_no_kl" in m else ""
    shows = (
        f"**What it shows.** The SFT model's replies score {gold['sft']:.2f} with the gold judge (out of 5). "
        f"PPO with the KL penalty {moved('ppo')}, to {gold['ppo']:.2f}; DPO {moved('dpo')}, to {gold['dpo']:.2f}. "
        + (
            "(± is one standard error of the difference, from the reply-by-reply differences on the same prompts.) "
            if not math.isnan(m["sft"].get("reward/gold_se", math.nan))
            else ""
        )
        + no_kl
        + (" " if no_kl else "")
        + f"The reward model ranks {rm_acc:.0%} of held-out pairs as the raters did; a perfect judge would "
        f"reach {ceiling:.0%}, since the raters are noisy."
    )
    if "iterated" in m:
        shows += (
            f" Iterated PPO, trained on as many labels (half of the offline pairs, then the raters' labels of its "
            f"own replies round by round), {moved('iterated')}, to {gold['iterated']:.2f}."
        )
        if "online_dpo" in m:
            shows += (
                f" Online DPO, on the same labels (DPO on that half, then continued on the raters' labels of its "
                f"own pairs), {moved('online_dpo')}, to {gold['online_dpo']:.2f}."
            )
        if rounds:
            accuracies = ", ".join("—" if a is None else f"{a:.0%}" for a in rounds)
            shows += (
                f" Before each round's update the reward model ranked the policy's new pairs as the raters did "
                f"{accuracies} of the time, round by round."
            )
    if "ppo_gold" in m:
        shows += " " + ceiling_text(gold, moved)
    return [ABOUT, "", shows]


def _no_kl_text(m: dict, gold: dict, no_kl_peak: tuple[int, float] | None) -> str:
    """What the beta = 0 run shows: over-optimisation of the reward model, or that it did not show."""
    hack = m["ppo_no_kl"]
    kl, kl_ppo = hack.get("kl/ref", float("nan")), m["ppo"].get("kl/ref", float("nan"))
    over = hack["reward/score"] > m["ppo"]["reward/score"] and gold["ppo_no_kl"] < gold["ppo"]
    if over:
        where = "below where it started" if gold["ppo_no_kl"] < gold["sft"] else "below PPO's with the penalty"
        peak = (
            f" During training its gold score on the held-out prompts peaked at {no_kl_peak[1]:.2f} "
            f"(step {no_kl_peak[0]}) and then fell while the reward model's score kept rising."
            if no_kl_peak is not None and no_kl_peak[1] > gold["ppo_no_kl"]
            else ""
        )
        return (
            f"Without the KL penalty (beta = 0) PPO pushes the reward model's score higher still "
            f"({hack['reward/score']:.2f} against {m['ppo']['reward/score']:.2f}) while the gold score ends at "
            f"{gold['ppo_no_kl']:.2f}, {where}: the policy has found what the reward model gets wrong (reward "
            f"over-optimisation), drifting far from the SFT model (KL {number(kl, '.0f')} against "
            f"{number(kl_ppo, '.1f')}).{peak}"
        )
    return (
        f"Without the KL penalty (beta = 0) PPO ends at gold {gold['ppo_no_kl']:.2f} with reward-model "
        f"score {hack['reward/score']:.2f}: in this run the drift from the SFT model (KL {number(kl, '.1f')} "
        f"against {number(kl_ppo, '.1f')}) did not cost gold score within its steps, so the over-optimisation "
        "it risks does not show here."
    )


def _iterated_rounds(run_dir: Path) -> list[dict]:
    """Iterated PPO's rounds from its summary.json (labels, the reward model's accuracy on the new pairs before
    its update and on their held-out share before and after it, reward, KL, gold); empty when it did not run."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return []
    keys = (
        "round",
        "labels",
        "rm_accuracy_new_pairs",
        "rm_accuracy_heldout_before",
        "rm_accuracy_heldout_after",
        "reward",
        "kl",
        "gold",
    )
    return [{k: r.get(k) for k in keys} for r in json.loads(path.read_text())["rounds"]]


def _iterated_table(rounds: list[dict]) -> list[str]:
    if not rounds:
        return []

    def cell(value, spec=".3f") -> str:
        return "—" if value is None else number(value, spec)

    lines = [
        "## Iterated PPO, round by round",
        "",
        "Each round the simulated raters label pairs of the current policy's replies; the reward model's accuracy "
        "on them is measured before it trains on them (how well it predicted the raters on the policy's own "
        "replies), and on a held-out share of them before and after its update (whether the update generalised); "
        "then PPO continues. Reward, KL and gold are the round's PPO at its last step.",
        "",
        "| round | new labels | RM accuracy on them | held-out: before | after | reward | KL to SFT | gold |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rounds:
        lines.append(
            f"| {r['round']} | {r['labels']} | {cell(r['rm_accuracy_new_pairs'])} "
            f"| {cell(r['rm_accuracy_heldout_before'])} | {cell(r['rm_accuracy_heldout_after'])} "
            f"| {cell(r['reward'], '.2f')} "
            f"| {cell(r['kl'], '.2f')} | {cell(r['gold'], '.2f')} |"
        )
    return lines + [""]


def write_report(
    out: Path,
    results: dict,
    ceiling: float,
    stages,
    seconds: float,
    quick: bool = False,
    plan=None,
    model: str = "",
    seed: int | None = None,
    diagnostics: dict | None = None,
) -> dict:
    """``stages``: the stage runner, with ``seconds`` and ``load`` (1-minute load average) per stage. ``quick``:
    the stages ran a few steps (``--quick``); the report then says so first and draws no conclusions. ``plan``:
    the stages' settings (``rlhfkit.demo.plan.Plan``), listed at the end; ``model``: the pretrained model the run
    started from (empty: the built-in one); ``seed``: the run's seed, kept in summary.json; ``diagnostics``: the
    reward model against the judge (``diagnostics_section``), kept in summary.json as ``diagnostics``."""
    stage_seconds = stages.seconds
    rm_rows = [r for r in _metrics(out / "rm") if r.get("eval/accuracy") is not None]
    rm_acc = rm_rows[-1]["eval/accuracy"] if rm_rows else float("nan")
    m = {name: {**r["metrics"], "reward/gold_se": gold_standard_error(r["samples"])} for name, r in results.items()}
    models = {n: label for n, label in MODELS.items() if n in m}
    summary = {"quick": quick, "model": model or "built-in", "seed": seed}
    summary.update({f"gold/{n}": m[n].get("reward/gold") for n in models})
    summary.update({f"gold_se/{n}": m[n]["reward/gold_se"] for n in models})
    summary["gold_diff_se"] = paired_standard_errors({n: results[n]["samples"] for n in models})
    summary.update({f"rm_score/{n}": m[n].get("reward/score") for n in models})
    summary.update({f"kl/{n}": m[n].get("kl/ref") for n in models if n != "sft"})
    summary.update({f"length/{n}": m[n].get("response/length") for n in models})
    summary.update({f"distinct2/{n}": m[n].get("response/distinct_2") for n in models})
    summary.update({f"names_product/{n}": m[n].get("names_product") for n in models})
    summary.update({f"mentions_product/{n}": m[n].get("mentions_product") for n in models})
    iterated = _iterated_rounds(out / "iterated")
    if iterated:
        summary["iterated/rounds"] = iterated
    rounds = [r.get("rm_accuracy_new_pairs") for r in iterated]
    peak = gold_peak(_metrics(out / "ppo_no_kl"))
    if peak is not None:
        summary.update({"gold_peak/ppo_no_kl": peak[1], "gold_peak_step/ppo_no_kl": peak[0]})
    summary.update(
        {
            "rm/eval_accuracy": rm_acc,
            "rm/label_noise_ceiling": ceiling,
            "seconds": seconds,
            "stage_seconds": stage_seconds,
            "stage_load_average": stages.load,
            "stage_code": dict(getattr(stages, "code", {})),
            # the stages that ran in a child process beside the others: {stage: the stages run meanwhile}
            "stage_beside": dict(getattr(stages, "beside", {})),
            "diagnostics": diagnostics or {},
        }
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plots = plot(out)

    lines = [
        "# rlhfkit demo: customer-support replies",
        "",
        *([QUICK_RUN, "", ABOUT] if quick else headline(m, rm_acc, ceiling, peak, rounds, summary["gold_diff_se"])),
        "",
        f"Whole pipeline in {seconds / 60:.1f} minutes. Scores are means over {int(m['sft'].get('n', 0))} sampled "
        "replies to held-out prompts; the gold judge trains nothing but the run that takes it as its reward.",
        "",
        "| model | gold ± s.e. | RM score | KL to SFT | names the product | product named | length (words) "
        "| distinct-2 | repetition |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, label in models.items():
        x = m[n]
        kl = "—" if n == "sft" else number(x.get("kl/ref", float("nan")))
        lines.append(
            f"| {label} | {x['reward/gold']:.3f}{plus_minus(x['reward/gold_se'])} | {x['reward/score']:.3f} | {kl} "
            f"| {x.get('names_product', float('nan')):.2f} | {x.get('mentions_product', float('nan')):.2f} "
            f"| {x['response/length']:.1f} | {x['response/distinct_2']:.3f} | {x['response/repetition']:.3f} |"
        )
    lines += kl_note([m[n].get("kl/ref", float("nan")) for n in models if n != "sft"])
    lines += [
        "",
        "*names the product*: of the replies that name a product (to a customer who named one), the share that "
        "name the customer's and no other. *product named*: the share of replies to such customers that name a "
        "product at all (the example replies it learned from do so about half the time).",
    ]
    lines += [
        "",
        f"Reward model held-out accuracy: **{rm_acc:.3f}**, next to the label-noise ceiling **{ceiling:.3f}** "
        "(the accuracy of the raters' own rule, the gold judge, on the same noisy labels).",
        "",
        *_iterated_table(iterated),
        *diagnostics_section(diagnostics or {}, models),
        "## Over-optimisation" if "ppo_no_kl" in m else "## PPO during training",
        "",
        "![PPO curves](ppo_curves.png)",
        "",
        "![proxy vs gold](proxy_vs_gold.png)",
        "",
        "The gold judge is also a reward function (`rlhfkit ppo --reward-fn support`). Optimised directly (the "
        "*PPO (gold judge as reward)* row, when it ran), no learned reward model stands between the policy and "
        "the judge, so there is no proxy to over-optimise: it measures how far the RL machinery gets at this "
        "budget, the ceiling for PPO on a learned reward model. RLHF is about what survives when preferences are "
        "first learned by a reward model and then optimised.",
        "",
        "## Sample replies (same held-out prompts)",
        "",
    ]
    for i in range(min(5, len(results["sft"]["samples"]))):
        prompt = " ".join(customer_message(results["sft"]["samples"][i]["prompt"]).split())
        lines.append(f"**{prompt}**")
        lines.append("")
        for n, label in models.items():
            s = results[n]["samples"][i]
            lines.append(f"- *{label}* (gold {s.get('gold', float('nan')):.2f}): {' '.join(s['response'].split())}")
        lines.append("")
    lines += [
        "## Stage times",
        "",
        f"On {os.cpu_count()} CPU cores; the load average (1 minute, at the end of each stage) shows how much "
        "else the machine was running.",
        "",
        "| stage | seconds | load average |",
        "|---|---|---|",
    ]
    beside = getattr(stages, "beside", {})
    lines += [
        f"| {k}{f' (beside {beside[k]})' if k in beside else ''} | {v:.0f} | {stages.load.get(k, float('nan')):.1f} |"
        for k, v in stage_seconds.items()
    ]
    code = {stage: c or "not recorded" for stage, c in getattr(stages, "code", {}).items()}
    if len(set(code.values())) == 1:
        lines += ["", f"Code: {next(iter(code.values()))}."]
    elif code:  # a --resume kept stages run by other code
        lines += ["", "Code: " + "; ".join(f"{stage}: {c}" for stage, c in code.items()) + "."]
    if model:  # not the built-in model trained from scratch
        lines = [PRETRAINED_ABOUT.format(model=model) if line == ABOUT else line for line in lines]
    if plan is not None:
        lines += ["", "## Settings", ""]
        lines += [f"- {note}" for note in plan.notes]
        lines += [f"- {stage}: `{flags(options)}`" for stage, options in plan.settings.items()]
        if "ppo_no_kl" in m:
            lines += [f"- PPO without KL: {plan.no_kl_steps} steps"]
        lines += [f"- evaluation: {plan.eval_samples} sample(s) per held-out prompt"]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    summary["plots"] = plots
    return summary
