"""How a model judge did: its own consistency and confidence, and its agreement with people's labels of the same
pairs. Pure Python, no I/O.

A pair's two replies are put in one fixed order (by their text) before labels are compared, so which reply a
file happened to list first (or as "chosen") shapes neither the agreement nor Cohen's kappa.
"""

from __future__ import annotations

import json

from rlhfkit.data.schema import Text
from rlhfkit.judging.model import Verdict
from rlhfkit.judging.pairs import Pair, pair_key
from rlhfkit.labelling.agreement import cohen_kappa


def judge_summary(verdicts: list[Verdict], min_confidence: float) -> dict:
    """pairs; judged (kept: both orders agree, confidence >= ``min_confidence``); ties (the answer flipped with the
    order); low_confidence (consistent but dropped); order_consistent (share of pairs whose answer held in both
    orders); mean_confidence (over those); first_slot_rate (share of the 2 x pairs single-order answers that
    picked slot A: 0.5 for a judge without position bias)."""
    n = len(verdicts)
    consistent = [v for v in verdicts if v.consistent]
    judged = sum(v.answer(min_confidence) != -1 for v in verdicts)
    first = sum((v.p_first > 0.5) + (v.p_second > 0.5) for v in verdicts)
    return {
        "pairs": n,
        "judged": judged,
        "ties": n - len(consistent),
        "low_confidence": len(consistent) - judged,
        "order_consistent": len(consistent) / n if n else None,
        "mean_confidence": sum(v.confidence for v in consistent) / len(consistent) if consistent else None,
        "first_slot_rate": first / (2 * n) if n else None,
    }


def _side(preferred: Text, a: Text, b: Text) -> str:
    """'first' or 'second': where ``preferred`` stands in the pair's fixed order."""
    canon = [json.dumps(t, ensure_ascii=False, sort_keys=True) for t in (a, b)]
    return "first" if json.dumps(preferred, ensure_ascii=False, sort_keys=True) == min(canon) else "second"


def reference_agreement(
    pairs: list[Pair],
    answers: list[int],
    verdicts: list[Verdict],
    reference: dict[str, list[Text]],
    confident_at: float,
) -> dict:
    """The judge's answers against people's labels (``reference``: pair key -> the reply each label preferred):

    labels        people's labels of the judged file's pairs (a pair labelled by three people counts three)
    compared      those the judge answered (its ties and dropped pairs are left out)
    agreement     share of the compared labels the judge agrees with
    kappa         Cohen's kappa of judge and people over the compared labels (None when undefined)
    confident     compared and agreement over the pairs with confidence >= ``confident_at``
    """
    judge_side, people_side, confident = [], [], []
    labels = 0
    for pair, answer, verdict in zip(pairs, answers, verdicts):
        preferred = reference.get(pair_key(pair.prompt, pair.a, pair.b), [])
        labels += len(preferred)
        if answer == -1:
            continue
        mine = _side(pair.a if answer == 0 else pair.b, pair.a, pair.b)
        for reply in preferred:
            judge_side.append(mine)
            people_side.append(_side(reply, pair.a, pair.b))
            confident.append(verdict.confidence >= confident_at)
    agree = [j == p for j, p in zip(judge_side, people_side)]
    sure = [a for a, c in zip(agree, confident) if c]
    return {
        "labels": labels,
        "compared": len(agree),
        "agreement": sum(agree) / len(agree) if agree else None,
        "kappa": cohen_kappa(judge_side, people_side) if agree else None,
        "confident": {
            "at": confident_at,
            "compared": len(sure),
            "agreement": sum(sure) / len(sure) if sure else None,
        },
    }


def reference_from_rows(rows: list[dict]) -> dict[str, list[Text]]:
    """People's preference rows (prompt, chosen, rejected) as ``reference_agreement`` reads them."""
    out: dict[str, list[Text]] = {}
    for r in rows:
        out.setdefault(pair_key(r["prompt"], r["chosen"], r["rejected"]), []).append(r["chosen"])
    return out
