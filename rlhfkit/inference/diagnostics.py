"""How far a reward model carries a policy, measured against a judge (a gold function, or people's labels).

Pure Python over rows that ``rlhfkit.inference.evaluate`` writes (``{"prompt", "response", "score", "gold"}``):

- **agreement** of the reward model with the judge on pairs of replies: on held-out labelled pairs, and on pairs
  of the *policy's own* samples (two or more replies to the same prompt). A reward model can rank the offline
  pairs well and still be blind to the differences between the replies the policy actually writes; RL only
  sees the latter. A pair the judge scores equal is left out; a pair the reward model scores equal counts half.
- **best-of-N headroom** on a policy: of N sampled replies to a prompt, the one the reward model picks, the one the
  judge picks, and one at random (its expected judge score: the mean of the N), each scored by the judge.
  ``captured = (rm_pick − random) / (judge_pick − random)`` is the share of the judge's reachable gain that the
  reward model's choice takes (Gao et al. 2022 use the same selection to measure over-optimisation).
- **the over-optimisation curve** of a run: the reward model's score and the judge's against KL to the
  reference, step by step (``metrics.jsonl``'s ``reward/score``, ``reward/gold``, ``kl/ref``).
"""

from __future__ import annotations

import json
import math
from itertools import combinations


def prompt_key(prompt) -> str:
    """One string per distinct prompt (a chat prompt is a list of messages)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def by_prompt(rows: list[dict]) -> list[list[dict]]:
    """The rows grouped by prompt, groups in the order their prompt first appears, rows in their order."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(prompt_key(row["prompt"]), []).append(row)
    return list(groups.values())


def agreement(pairs: list[tuple[float, float, float, float]], tie: float = 1e-9) -> dict:
    """The share of pairs the reward model orders as the judge does. ``pairs``: (score a, score b, gold a, gold b).
    Pairs whose golds differ by at most ``tie`` are left out (the judge has no preference); a reward-model tie
    counts half. Returns ``{"pairs": compared, "agreement": share or None}``."""
    hits, n = 0.0, 0
    for score_a, score_b, gold_a, gold_b in pairs:
        if abs(gold_a - gold_b) <= tie:
            continue
        n += 1
        if abs(score_a - score_b) <= tie:
            hits += 0.5
        elif (score_a > score_b) == (gold_a > gold_b):
            hits += 1.0
    return {"pairs": n, "agreement": hits / n if n else None}


def on_policy_agreement(rows: list[dict]) -> dict:
    """``agreement`` over every pair of replies to the same prompt (rows with ``score`` and ``gold``)."""
    pairs = [
        (a["score"], b["score"], a["gold"], b["gold"])
        for group in by_prompt(rows)
        for a, b in combinations(group, 2)
        if "score" in a and "score" in b and "gold" in a and "gold" in b
    ]
    return agreement(pairs)


def best_of_n(rows: list[dict]) -> dict:
    """Best-of-N on the rows' prompts, N the fewest replies any prompt has (its first N taken), from rows with
    ``score`` and ``gold``. ``random``: the mean gold of the N (a random pick's expected gold); ``rm_pick``: the
    gold of the reply the reward model scores highest (its first, on a tie); ``judge_pick``: the highest gold;
    ``captured``: (rm_pick − random) / (judge_pick − random), None when the judge sees no headroom. Each a mean
    over prompts; ``n`` 0 (and the rest None) when a prompt has fewer than two replies."""
    groups = [[r for r in g if "score" in r and "gold" in r] for g in by_prompt(rows)]
    n = min((len(g) for g in groups), default=0)
    empty = {"n": 0, "prompts": 0, "random": None, "rm_pick": None, "judge_pick": None, "captured": None}
    if n < 2:
        return empty
    random = rm_pick = judge_pick = 0.0
    for group in groups:
        group = group[:n]
        golds = [r["gold"] for r in group]
        random += sum(golds) / n
        rm_pick += max(group, key=lambda r: r["score"])["gold"]
        judge_pick += max(golds)
    k = len(groups)
    random, rm_pick, judge_pick = random / k, rm_pick / k, judge_pick / k
    headroom = judge_pick - random
    captured = (rm_pick - random) / headroom if headroom > 1e-12 else None
    return {"n": n, "prompts": k, "random": random, "rm_pick": rm_pick, "judge_pick": judge_pick, "captured": captured}


def overoptimisation_curve(metrics: list[dict]) -> list[dict]:
    """The steps of a run's ``metrics.jsonl`` rows that logged the judge's score: ``{"step", "kl", "score",
    "gold"}`` each (``kl``/``score`` None where the row has none), in step order."""
    out = []
    for row in metrics:
        gold = row.get("reward/gold")
        if gold is None or (isinstance(gold, float) and math.isnan(gold)):
            continue
        out.append({"step": row.get("step"), "kl": row.get("kl/ref"), "score": row.get("reward/score"), "gold": gold})
    return sorted(out, key=lambda r: (r["step"] is None, r["step"] or 0))


def gold_peak_before_end(curve: list[dict]) -> dict | None:
    """Where the judge's score peaked on a curve, and how far it fell by the end while the reward model's score
    rose: ``{"peak_step", "peak_gold", "end_gold", "fall", "score_rise"}``; None for an empty curve. A run that
    over-optimises its reward model has ``fall > 0`` with ``score_rise > 0``."""
    if not curve:
        return None
    peak = max(curve, key=lambda r: r["gold"])
    end = curve[-1]
    rise = None
    if peak.get("score") is not None and end.get("score") is not None:
        rise = end["score"] - peak["score"]
    return {
        "peak_step": peak["step"],
        "peak_gold": peak["gold"],
        "end_gold": end["gold"],
        "fall": peak["gold"] - end["gold"],
        "score_rise": rise,
    }
