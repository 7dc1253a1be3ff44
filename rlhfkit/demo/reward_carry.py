"""The demo report's account of how far the reward model carries PPO: against the gold judge on the held-out pairs
and on each policy's own replies, best-of-N on the SFT model (``rlhfkit.inference.diagnostics``), and against PPO
with the judge itself as its reward."""

from __future__ import annotations

import math


def _share(value) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.0%}"


def _gold(value) -> str:
    return "—" if value is None else f"{value:.2f}"


def diagnostics_section(diagnostics: dict, models: dict[str, str]) -> list[str]:
    """The report's section on how far the reward model carries, from ``diagnostics`` ({"held_out": the
    reward model on the held-out pairs (``pair_agreement``), "policies": {name: ``sample_diagnostics`` of the
    policy's own replies}}); empty without them."""
    held, policies = diagnostics.get("held_out") or {}, diagnostics.get("policies") or {}
    if not held and not policies:
        return []
    lines = [
        "## How far the reward model carries",
        "",
        "RL can only climb what the reward model sees. These numbers set it against the gold judge on the "
        "held-out pairs and on pairs of each policy's own replies (its samples of the same prompt), where the "
        "judge's ranking is what RL should follow.",
        "",
    ]
    if held:
        lines += [
            f"- Held-out pairs: the reward model agrees with the labels on {_share(held.get('rm/pairs_accuracy'))} "
            f"(the judge itself on {_share(held.get('judge/pairs_accuracy'))}: the labels' noise ceiling), and with "
            f"the judge's ranking on {_share(held.get('rm_judge/pairs_agreement'))} of the pairs the judge ranks.",
        ]
    rows = [(n, policies[n]) for n in models if policies.get(n)]
    if rows:
        lines += [
            "",
            "| policy | RM agrees with the judge on its own pairs | pairs |",
            "|---|---|---|",
        ]
        lines += [
            f"| {models[n]} | {_share(d.get('rm_judge/on_policy_agreement'))} "
            f"| {int(d.get('rm_judge/on_policy_pairs', 0))} |"
            for n, d in rows
        ]
    sft = policies.get("sft") or {}
    if sft.get("best_of_n/n"):
        captured = sft.get("best_of_n/captured")
        lines += [
            "",
            f"Best-of-{int(sft['best_of_n/n'])} on the SFT model ({int(sft['best_of_n/prompts'])} held-out prompts): "
            f"a random reply scores {_gold(sft['best_of_n/random'])} gold, the reply the reward model picks "
            f"{_gold(sft['best_of_n/rm_pick'])}, the judge's own pick {_gold(sft['best_of_n/judge_pick'])}. The "
            f"reward model's choice takes **{_share(captured)}** of the gain the judge can reach by choosing "
            "among the same replies: the share of the headroom that optimising this reward model can capture.",
        ]
    lines += [
        "",
        "![scores against KL](scores_against_kl.png)",
        "",
        "Both scores against the KL each PPO run has moved from the SFT model, at the steps that logged the gold "
        "judge: a reward model that is over-optimised keeps rising while the gold score levels off or falls.",
        "",
    ]
    return lines


def ceiling_text(gold: dict, moved) -> str:
    """What PPO with the gold judge as its reward reached, and the share of it the reward model's PPO took."""
    reach = gold["ppo_gold"] - gold["sft"]
    share = (gold["ppo"] - gold["sft"]) / reach if reach > 0 else None
    if share is None:
        took = "; at this budget it gained nothing to measure the reward model's run against."
    elif share <= 1:
        took = f": what RL reaches at this budget when the reward is right; PPO on the reward model took {share:.0%}."
    else:
        took = ". PPO on the reward model gained more at these settings, so the judge's run is no ceiling here."
    return (
        f"With the gold judge itself as PPO's reward instead of the reward model (every other setting the same), PPO "
        f"{moved('ppo_gold')}, to {gold['ppo_gold']:.2f}{took}"
    )
