"""docs/judge.md's table of SmolLM2-135M-Instruct as the judge of the support task's pairs
(bench/learning/judge_smollm2.py, bench/reported/judge.json). Standard library only."""

from __future__ import annotations

from bench.report.parts import select, sources, table


def judge(selection: str) -> list[str]:
    """Per principles set: order consistency, ties, mean confidence, agreement and kappa with the raters,
    agreement on the confident pairs, agreement with the gold ordering, the same for the preference averaged
    over both orders without the tie rule, and pairs per second."""
    (run,) = select(selection)
    fmt = lambda v, spec=".2f": "-" if v is None else format(v, spec)  # noqa: E731
    rows = []
    for r in run["results"]:
        c = r["confident"]
        rows.append(
            [
                r["principles"],
                r["pairs"],
                fmt(r["order_consistent"]),
                r["ties"],
                fmt(r["mean_confidence"]),
                fmt(r["first_slot_rate"]),
                f"{fmt(r['agreement'])} / {fmt(r['kappa'])}",
                f"{fmt(c['agreement'])} ({c['compared']})",
                fmt(r["gold_agreement"]),
                f"{fmt(r['averaged_agreement'])} / {fmt(r['averaged_kappa'])} / {fmt(r['averaged_gold_agreement'])}",
                fmt(r["pairs_per_second"]),
            ]
        )
    header = [
        "principles",
        "pairs",
        "order-consistent",
        "ties",
        "mean confidence",
        "first-slot answers",
        "agreement / κ with raters",
        "agreement, confidence ≥ 0.8 (pairs)",
        "agreement with gold",
        "averaged over both orders, no ties: agreement / κ with raters / with gold",
        "pairs / s",
    ]
    note = (
        f"The raters agree with the gold ordering on {run['raters_gold_agreement']:.2f} of the pairs (gold ties "
        f"count one half); {run['gold_pairs']} pairs have different gold scores."
    )
    return [*table(header, rows), "", note, "", sources(run)]
