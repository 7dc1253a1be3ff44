"""`rlhfkit judge`: a local model labels pairs (RLAIF).

OUT/prefs.jsonl       the judged pairs as preference rows (prompt, chosen, rejected, confidence), for rm / dpo
OUT/judgments.jsonl   every pair: both orders' probabilities, the answer, the confidence
OUT/report.json       pairs, ties, order consistency, confidence; with --reference the agreement with people
"""

from __future__ import annotations

import io
import logging
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tqdm.auto import tqdm

from rlhfkit.config.judging import JudgeConfig
from rlhfkit.errors import UserError, option
from rlhfkit.files import write_json, write_jsonl
from rlhfkit.judging.agreement import judge_summary, reference_agreement, reference_from_rows
from rlhfkit.judging.model import ModelJudge
from rlhfkit.judging.pairs import load_pairs, load_reference
from rlhfkit.judging.prompts import read_principles

COMMAND = "rlhfkit judge"
logger = logging.getLogger(__name__)


def run(cfg: JudgeConfig) -> dict:
    """Entry point of `rlhfkit judge`; returns the report (also OUT/report.json)."""
    j = cfg.judge
    # 1. Every input checked before the model loads.
    pairs = load_pairs(j.data, COMMAND)
    principles = read_principles(j.principles)
    reference = reference_from_rows(load_reference(j.reference, COMMAND)) if j.reference else None
    out = Path(j.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{out}: cannot create {option('output_dir')} ({exc.strerror})") from None

    # 2. Both orders of every pair asked.
    judge = ModelJudge(
        cfg.model.model,
        principles,
        min_confidence=j.min_confidence,
        batch_size=j.batch_size,
        max_length=j.max_length,
        cpu=j.cpu,
        trust_remote_code=cfg.model.trust_remote_code,
        use_vllm=j.use_vllm,
        seed=j.seed,
    )
    tokenizer = judge.tokenizer()
    start = time.perf_counter()
    with tqdm(total=2 * len(pairs), desc="judge", unit="prompt", dynamic_ncols=True, disable=not j.progress) as bar:
        verdicts = judge.verdicts(pairs, bar.update, tokenizer)
    seconds = time.perf_counter() - start
    answers = [v.answer(j.min_confidence) for v in verdicts]

    # 3. The judged pairs, every verdict, the report.
    prefs, judgments = [], []
    for pair, verdict, answer in zip(pairs, verdicts, answers):
        if answer != -1:
            chosen, rejected = (pair.a, pair.b) if answer == 0 else (pair.b, pair.a)
            prefs.append(
                {"prompt": pair.prompt, "chosen": chosen, "rejected": rejected, "confidence": verdict.confidence}
            )
        outcome = "judged" if answer != -1 else "tie" if not verdict.consistent else "low_confidence"
        judgments.append(
            {
                "prompt": pair.prompt,
                "responses": [pair.a, pair.b],
                "p_first": verdict.p_first,
                "p_second": verdict.p_second,
                "score_first": verdict.score_a,
                "confidence": verdict.confidence,
                "answer": answer,
                "outcome": outcome,
            }
        )
    report = {
        "model": cfg.model.model,
        "data": j.data,
        "principles": list(principles),
        "min_confidence": j.min_confidence,
        **judge_summary(verdicts, j.min_confidence),
        "seconds": round(seconds, 2),
        "pairs_per_second": len(pairs) / seconds if seconds > 0 else None,
    }
    if reference is not None:
        report["reference"] = {
            "file": j.reference,
            **reference_agreement(pairs, answers, verdicts, reference, j.confident_at),
        }
    write_jsonl(out / "prefs.jsonl", prefs)
    write_jsonl(out / "judgments.jsonl", judgments)
    write_json(out / "report.json", report)
    logger.info(report_text(report))
    logger.info(f"wrote {len(prefs)} judged pairs to {out / 'prefs.jsonl'}")
    return report


def _number(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def report_text(report: dict) -> str:
    """The report as one table, the principles above it."""
    console = Console(file=io.StringIO(), width=100, highlight=False, color_system=None)
    console.print("principles:\n" + "\n".join(f"  - {p}" for p in report["principles"]), markup=False)
    table = Table(title=f"judge: {report['model']}", title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("pairs", report["pairs"]),
        ("judged (kept)", report["judged"]),
        ("ties (answer flipped with the order)", report["ties"]),
        (f"below --min-confidence {report['min_confidence']}", report["low_confidence"]),
        ("order-consistent", report["order_consistent"]),
        ("mean confidence", report["mean_confidence"]),
        ("first-slot answers", report["first_slot_rate"]),
        ("pairs per second", report["pairs_per_second"]),
    ]
    ref = report.get("reference")
    if ref is not None:
        rows += [
            ("reference labels", ref["labels"]),
            ("compared with people", ref["compared"]),
            ("agreement with people", ref["agreement"]),
            ("Cohen's kappa", ref["kappa"]),
            (f"agreement, confidence >= {ref['confident']['at']}", ref["confident"]["agreement"]),
            (f"compared, confidence >= {ref['confident']['at']}", ref["confident"]["compared"]),
        ]
    for name, value in rows:
        table.add_row(name, _number(value))
    console.print(table)
    return console.file.getvalue().rstrip("\n")
