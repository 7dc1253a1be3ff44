"""Turn the stored answers into training data and a report on the labels.

- ``prefs.jsonl``: preference rows ``{"prompt", "chosen", "rejected"}`` (plus ``"margin"`` when a strength
  was given), which `rlhfkit rm` and `rlhfkit dpo` read as they are. One row per A/B answer, or with
  ``aggregate="majority"`` one per pair, the response most annotators preferred as ``chosen``.
- ``ties.jsonl``: the pairs answered "tie" or "both bad" (and, by majority, pairs whose vote split evenly),
  as ``{"prompt", "responses": [r1, r2], "label"}``.
- ``agreement.json``: agreement between annotators (per pair, Cohen's kappa per annotator pair, Fleiss'
  kappa), the position bias (how often the left response won), labels and time per label per annotator.

Skipped pairs and withdrawn (undone) answers are left out of all three.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter, defaultdict
from pathlib import Path

from rlhfkit.files import write_json, write_jsonl
from rlhfkit.labelling.agreement import cohen_kappa, fleiss_kappa, pair_agreement, wilson_interval
from rlhfkit.labelling.items import Pair
from rlhfkit.labelling.store import Judgment, Store


def _texts(pair: Pair, winner: str) -> tuple:
    return (pair.x, pair.y) if winner == "x" else (pair.y, pair.x)


def preference_rows(
    items: dict[int, Pair], judgments: list[Judgment], margins: dict[str, float], aggregate: str
) -> tuple[list[dict], list[dict]]:
    """(prefs rows, ties rows) from live answers; see the module docstring."""
    prefs: list[dict] = []
    ties: list[dict] = []
    answered = [j for j in judgments if j.choice != "skip"]
    if aggregate == "none":
        for j in answered:
            pair = items[j.item_id]
            if j.winner is None:
                ties.append(
                    {"prompt": pair.prompt, "responses": [pair.x, pair.y], "label": j.choice, "annotator": j.annotator}
                )
                continue
            chosen, rejected = _texts(pair, j.winner)
            row = {"prompt": pair.prompt, "chosen": chosen, "rejected": rejected}
            if j.strength is not None:
                row["margin"] = margins[j.strength]
            row.update(annotator=j.annotator, source=pair.source)
            prefs.append(row)
        return prefs, ties
    by_item: dict[int, list[Judgment]] = defaultdict(list)
    for j in answered:
        by_item[j.item_id].append(j)
    for item_id, votes in sorted(by_item.items()):
        pair = items[item_id]
        counts = Counter(j.outcome for j in votes)
        (top, n_top), *rest = counts.most_common()
        if rest and rest[0][1] == n_top:
            top = "split"
        if top in ("x", "y"):
            chosen, rejected = _texts(pair, top)
            row = {"prompt": pair.prompt, "chosen": chosen, "rejected": rejected}
            strengths = [margins[j.strength] for j in votes if j.outcome == top and j.strength is not None]
            if strengths:
                row["margin"] = sum(strengths) / len(strengths)
            row.update(votes=dict(counts), source=pair.source)
            prefs.append(row)
        else:
            ties.append({"prompt": pair.prompt, "responses": [pair.x, pair.y], "label": top, "votes": dict(counts)})
    return prefs, ties


def _seconds(judgments: list[Judgment]) -> dict:
    times = [max(0.0, j.answered_at - j.shown_at) for j in judgments]
    if not times:
        return {"median": None, "mean": None}
    return {"median": round(statistics.median(times), 3), "mean": round(statistics.fmean(times), 3)}


def _left_wins(judgments: list[Judgment]) -> dict:
    decided = [j for j in judgments if j.choice in ("a", "b")]
    left = sum(j.choice == "a" for j in decided)
    interval = wilson_interval(left, len(decided))
    return {
        "left_wins": left,
        "right_wins": len(decided) - left,
        "left_win_rate": round(left / len(decided), 4) if decided else None,
        "left_win_rate_95ci": None if interval is None else [round(v, 4) for v in interval],
    }


def agreement_report(items: dict[int, Pair], judgments: list[Judgment], labels_per_item: int) -> dict:
    answered = [j for j in judgments if j.choice != "skip"]
    by_item: dict[int, dict[str, str]] = defaultdict(dict)
    for j in answered:
        by_item[j.item_id][j.annotator] = j.outcome
    multi = {i: labels for i, labels in by_item.items() if len(labels) >= 2}
    per_pair = []
    for item_id, labels in sorted(multi.items()):
        per_pair.append(
            {
                "item": item_id,
                "source": items[item_id].source,
                "labels": dict(sorted(labels.items())),
                "agreement": round(pair_agreement(list(labels.values())), 4),
            }
        )
    cohen = {}
    names = sorted({j.annotator for j in answered})
    for a, b in itertools.combinations(names, 2):
        shared = [i for i, labels in by_item.items() if a in labels and b in labels]
        if shared:
            kappa = cohen_kappa([by_item[i][a] for i in shared], [by_item[i][b] for i in shared])
            cohen[f"{a}/{b}"] = {"kappa": None if kappa is None else round(kappa, 4), "shared_pairs": len(shared)}
    fleiss = fleiss_kappa([Counter(labels.values()) for labels in multi.values()])
    annotators = {}
    for name in sorted({j.annotator for j in judgments}):
        mine = [j for j in judgments if j.annotator == name]
        counts = Counter(j.choice for j in mine)
        annotators[name] = {
            "labels": len(mine) - counts["skip"],
            "a_or_b": counts["a"] + counts["b"],
            "tie": counts["tie"],
            "both_bad": counts["both_bad"],
            "skip": counts["skip"],
            "left_win_rate": _left_wins(mine)["left_win_rate"],
            "seconds_per_label": _seconds(mine),
        }
    return {
        "pairs": len(items),
        "labels_per_item": labels_per_item,
        "labelled_pairs": len(by_item),
        "complete_pairs": sum(len(labels) >= labels_per_item for labels in by_item.values()),
        "judgments": len(answered),
        "choices": {c: sum(j.choice == c for j in judgments) for c in ("a", "b", "tie", "both_bad", "skip")},
        "agreement": {
            "pairs_with_2_or_more_labels": len(multi),
            "mean_pair_agreement": round(sum(p["agreement"] for p in per_pair) / len(per_pair), 4)
            if per_pair
            else None,
            "fleiss_kappa": None if fleiss is None else round(fleiss, 4),
            "cohen_kappa": cohen,
            "per_pair": per_pair,
        },
        "position_bias": _left_wins(judgments),
        "annotators": annotators,
        "seconds_per_label": _seconds(judgments),
    }


def export(store: Store, out_dir: Path, margins: dict[str, float], aggregate: str = "none") -> dict[str, Path]:
    """Write prefs.jsonl, ties.jsonl and agreement.json into ``out_dir``; returns their paths by name."""
    items, judgments = store.items(), store.judgments()
    prefs, ties = preference_rows(items, judgments, margins, aggregate)
    paths = {name: out_dir / name for name in ("prefs.jsonl", "ties.jsonl", "agreement.json")}
    write_jsonl(paths["prefs.jsonl"], prefs)
    write_jsonl(paths["ties.jsonl"], ties)
    report = agreement_report(items, judgments, store.labels_per_item)
    report["exported"] = {"aggregate": aggregate, "prefs": len(prefs), "ties": len(ties), "margins": margins}
    write_json(paths["agreement.json"], report)
    return paths
