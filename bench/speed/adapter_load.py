"""Loading a LoRA adapter folder as its merged model: rlhfkit's direct merge against PEFT's, time and weights.

    python -m bench adapter_load --models runs/smol/sft,runs/smol/rm,runs/smol/iterated/final [--repeats 3]
    python -m bench adapter_load --report bench/reported/adapter_load.json

Each folder (a causal LM or a reward model saved as an adapter on its base, which may itself be an adapter: a
chain) is loaded ``--repeats`` times each way in this process: with the direct merge (``rlhfkit.models.plain_lora``)
and with PEFT's (``PeftModel.from_pretrained`` then ``merge_and_unload``), alternating. Per folder: the adapters in
its chain, the median seconds of each way (after one untimed load of the first folder), and the largest weight
difference between the two (0: the same weights). Merged into --out under the machine and commit.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from bench import results_file
from bench.harness.runs import BENCH, Results, log
from bench.stamp import Stamp, summary
from rlhfkit.models import loading


def load(path: str, direct: bool):
    """The model at ``path`` (a reward model when it is one), merged the chosen way, and the seconds it took."""
    original = loading.merge_plain_lora
    if not direct:
        loading.merge_plain_lora = lambda *a: False
    try:
        start = time.perf_counter()
        tokenizer = loading.load_tokenizer(path)
        if loading.classifier_class(path) is not None:
            model = loading.load_reward_model(path, False, tokenizer)
        else:
            model = loading.load_causal_lm(path, False, tokenizer)
        return model, time.perf_counter() - start
    finally:
        loading.merge_plain_lora = original


def print_table(run: dict) -> None:
    print(
        "| model | adapters in its chain | seconds: direct merge | seconds: PEFT's merge | largest weight difference |"
    )
    print("|---|---|---|---|---|")
    for got in run["models"].values():
        print(
            f"| {got['model']} | {got['adapters']} | {got['direct_s']:.1f} | {got['peft_s']:.1f} | "
            f"{got['max_difference']:.1g} |"
        )
    print(summary(run.get("stamp")))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="runs/demo/sft", help="comma-separated model folders (LoRA adapter folders)")
    ap.add_argument("--repeats", type=int, default=3, help="loads each way per folder (the median is reported)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--out", default=str(BENCH / "results" / "adapter_load.json"), help="the result file to merge into")
    args = results_file.parse_or_report(ap, argv, print_table)
    if args is None:
        return
    torch.set_num_threads(args.threads)
    defaults = vars(ap.parse_args([]))
    results = Results(Path(args.out), Stamp(), "adapter_load", defaults, args=vars(args), models={})
    paths = [p.strip() for p in args.models.split(",") if p.strip()]
    load(paths[0], True)  # untimed: the imports and the first read of the files from disk
    for path in paths:
        times: dict[bool, list[float]] = {True: [], False: []}
        weights = {}
        for _ in range(args.repeats):
            for direct in (True, False):
                model, seconds = load(path, direct)
                times[direct].append(seconds)
                weights[direct] = model.state_dict()
        difference = max(float((weights[True][k] - weights[False][k]).abs().max()) for k in weights[True])
        got = {
            "model": path,
            "adapters": len(loading.adapter_chain(path)) - 1,
            "direct_s": round(statistics.median(times[True]), 2),
            "peft_s": round(statistics.median(times[False]), 2),
            "max_difference": difference,
        }
        results["models"][path] = got
        log(f"{path}: {got['direct_s']:.1f}s direct, {got['peft_s']:.1f}s with PEFT, difference {difference:g}")
        results.save()
    results.close()
    print_table(results)
    print(f"saved to {results.where()}")


if __name__ == "__main__":
    main()
