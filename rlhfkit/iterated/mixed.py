"""People and a model judge sharing a round (`rlhfkit iterate --judge human+model:PATH --human-share S`).

A share S of the round's usable pairs, drawn at random (seeded by the run's seed and the round), goes to the
labelling page; the model judges every pair. The round's labels are people's on their share and the model's on
the rest, so people's time goes further; the model's answers on people's share measure how far it can be
trusted on the rest: its agreement with people, Cohen's kappa, and the agreement on the pairs it was confident
about, in the round's record (``round.json``, ``summary.json``).
"""

from __future__ import annotations

import random
from pathlib import Path

from rlhfkit.files import write_jsonl
from rlhfkit.iterated.judges import Judge
from rlhfkit.judging.agreement import judge_summary, reference_agreement, reference_from_rows
from rlhfkit.judging.pairs import Pair

CONFIDENT_AT = 0.8  # the confidence from which a pair counts as one the model was sure of


def people_share(n: int, share: float, seed: str) -> list[int]:
    """The indices (sorted) of the pairs people label: round(share x n) of n, at least one when n > 0."""
    k = min(n, max(1, round(share * n))) if n else 0
    return sorted(random.Random(seed).sample(range(n), k))


def mixed_labels(
    round_dir: Path, rows: list[dict], judge: Judge, human, share: float, seed: int, min_labels: int
) -> tuple[list[dict], dict]:
    """The round's preference rows over its usable candidate ``rows`` and the counts for its record."""
    ours = people_share(len(rows), share, f"{seed}-{round_dir.name}")
    to_label = round_dir / "to_label.jsonl"
    if not to_label.is_file():
        write_jsonl(to_label, [rows[i] for i in ours])
    # the model first: people's labels, once in, are compared with its answers on their pairs
    answers = judge([r["prompt"] for r in rows], [list(r["responses"]) for r in rows])
    verdicts = judge.fn.last_verdicts
    people = human.label(round_dir, to_label, min_labels) if ours else []  # no usable pair: nothing to ask
    mine = set(ours)
    model_prefs = []
    for i, (r, answer) in enumerate(zip(rows, answers)):
        if i in mine or answer == -1:
            continue
        a, b = r["responses"]
        chosen, rejected = (a, b) if answer == 0 else (b, a)
        model_prefs.append({"prompt": r["prompt"], "chosen": chosen, "rejected": rejected})
    overlap = [Pair(rows[i]["prompt"], *rows[i]["responses"], f"pair {i + 1}") for i in ours]
    agreement = reference_agreement(
        overlap, [answers[i] for i in ours], [verdicts[i] for i in ours], reference_from_rows(people), CONFIDENT_AT
    )
    counts = {
        "human_pairs": len(ours),
        "human_labels": len(people),
        "model_labels": len(model_prefs),
        "model_no_preference": sum(answers[i] == -1 for i in range(len(rows)) if i not in mine),
        "model_judge": judge_summary(verdicts, judge.fn.min_confidence),
        "model_agreement_with_people": agreement,
    }
    return people + model_prefs, counts
