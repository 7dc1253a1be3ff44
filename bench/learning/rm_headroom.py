"""How far the support task's reward model carries a pretrained policy before any RL, measured against the gold
judge: accuracy and agreement on held-out pairs, agreement on the SFT policy's own pairs, best-of-N headroom.

    python -m bench rm_headroom --model SmolLM2-135M-Instruct.Q4_1.gguf --seed 0 --labels 600,1200
    python -m bench rm_headroom --report bench/reported/rm_headroom.json

The demo's SFT for the model (its plan: ``rlhfkit/recipes/demo/``), then one reward model per label count (the
plan's settings, one pass over its labels; the smaller counts are the first rows of the largest count's labels,
so the reward models differ only in how many they learn from). The SFT model samples ``--samples`` replies to
each of ``--prompts`` held-out prompts once, judged by the gold judge; every reward model scores the same replies
(``rlhfkit.inference.diagnostics``). Models and the judged replies already in ``--work-dir`` are kept (a rerun
measures again).

``--variants`` adds reward models at the plan's label count that change one thing against its row (VARIANTS):
the centring loss, up to three epochs keeping the weights of the lowest held-out loss (with patience), a
3-member ensemble (seeds s, s+1, s+2; its mean score), and a 3-member ensemble sharing one initialisation (seed s,
data orders s, s+1, s+2) scored by its mean and by its weight average (WARM). Member 0 of each ensemble is the
plan's own reward model, so the members are trained past it.

    python -m bench rm_headroom --model SmolLM2-135M-Instruct.Q4_1.gguf --seed 0 --labels 600 --variants all
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import rlhfkit
from bench import results_file
from bench.harness.runs import BENCH, Results, log
from bench.stamp import Stamp, summary
from rlhfkit.config.parts import GenerationArgs
from rlhfkit.demo.plan import chat_rows, plan
from rlhfkit.demo.support import EVAL_GENERATION
from rlhfkit.files import read_jsonl, write_jsonl
from rlhfkit.inference.evaluate import evaluate_policy, pair_agreement, sample_diagnostics
from rlhfkit.models.loading import load_tokenizer
from rlhfkit.models.reward import RewardScorer
from rlhfkit.tasks import get_judge
from rlhfkit.tasks.support import label_noise_ceiling, write_task_data

# name: (what the row changes, the rm options it changes, the rows it scores: "" the model, "average" OUT/average)
VARIANTS = {
    "center": ("centring loss 0.01", {"center_coef": 0.01}, ("",)),
    "epochs_3_keep_best": (
        "up to 3 epochs, best held-out loss",
        {"epochs": 3, "keep_best": True, "patience": 3},
        ("",),
    ),
    "ensemble_3": ("ensemble of 3: mean", {"ensemble": 3}, ("",)),
    "warm_3": ("ensemble of 3, one init", {"ensemble": 3, "weight_average": True}, ("", "average")),
}
ROW_NAMES = {"": "mean", "average": "weight average"}


def variant_options(settings: dict, steps: int, options: dict) -> dict:
    """The rm options of a variant row: the plan's, at ``steps`` a pass, changed as ``options`` says."""
    got = {**settings, "max_steps": steps, "eval_steps": steps}
    epochs = options.get("epochs", 1)
    if epochs > 1:  # evaluate three times a pass to pick from
        got.update(max_steps=steps * epochs, eval_steps=max(1, steps // 3))
    got.update({k: v for k, v in options.items() if k != "epochs"})
    return got


def print_table(run: dict) -> None:
    print(
        f"SFT policy: gold {run['sft_gold']:.3f} on {run['prompts']} held-out prompts x {run['samples_per_prompt']}; "
        f"label-noise ceiling of the held-out pairs {run['label_noise_ceiling']:.3f}"
    )
    print(
        "| labels | RM steps | held-out accuracy | agrees with the judge: held-out pairs | on the policy's pairs "
        "| best-of-N: random | RM pick | judge pick | captured |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    keys = ("rm/pairs_accuracy", "rm_judge/pairs_agreement", "rm_judge/on_policy_agreement", "best_of_n/random")
    keys += ("best_of_n/rm_pick", "best_of_n/judge_pick", "best_of_n/captured")
    for n, d in run["reward_models"].items():
        cells = ["—" if d.get(k) is None else f"{d[k]:.3f}" for k in keys]
        name = f"{n.split()[0]}, {d['variant']}" if d.get("variant") else n
        print(f"| {name} | {d['steps']} | " + " | ".join(cells) + " |")
    print(summary(run.get("stamp")))


def last_step(folder: Path) -> int:
    """The last training step a reward model's metrics.jsonl records (member 0's for an ensemble)."""
    return max(r.get("step", 0) for r in read_jsonl(folder / "metrics.jsonl"))


def trained(folder: Path) -> bool:
    return (folder / "adapter_config.json").is_file() or (folder / "config.json").is_file()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="the pretrained model (a folder or a .gguf file)")
    ap.add_argument("--seed", type=int, default=0, help="the task data's and the runs' seed")
    ap.add_argument("--labels", default="600,1200", help="label counts of the reward models, comma-separated")
    ap.add_argument("--samples", type=int, default=4, help="replies per held-out prompt (the N of best-of-N)")
    ap.add_argument("--prompts", type=int, default=100, help="held-out prompts")
    ap.add_argument("--variants", default="", help=f"reward models at the plan's label count that change one thing "
                    f"against it, comma-separated, or all: {', '.join(VARIANTS)}")  # fmt: skip
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--quick", action="store_true", help="the demo's --quick plan: a wiring check")
    ap.add_argument("--out", default=str(BENCH / "results" / "rm_headroom.json"), help="the result file to merge into")
    ap.add_argument("--work-dir", default=str(BENCH / "results" / "work" / "rm_headroom"), help="the runs' folders")
    args = results_file.parse_or_report(ap, argv, print_table)
    if args is None:
        return
    if not args.model:
        raise SystemExit("--model: the pretrained model to measure (a folder or a .gguf file)")
    defaults = vars(ap.parse_args([]))
    labels = sorted(int(n) for n in args.labels.split(","))
    variants = list(VARIANTS) if args.variants == "all" else [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"--variants: unknown {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    work = Path(args.work_dir) / f"seed{args.seed}"
    run_plan = plan(args.quick, args.model)
    base = (run_plan.sizes or {}).get("prefs_train", labels[0])
    if variants and base not in labels:
        labels = sorted([*labels, base])
    files = write_task_data(work / "data", seed=args.seed, sizes={**(run_plan.sizes or {}), "prefs_train": labels[-1]})
    data = {k: str(v) for k, v in chat_rows(files, args.model, work / "data" / "chat").items()}
    common = {"seed": args.seed, "progress": False, "overwrite_output_dir": True, "threads": args.threads}
    held_out = read_jsonl(data["prefs_eval"])
    results = Results(
        Path(args.out), Stamp(), "rm_headroom", defaults, args=vars(args), reward_models={},
        model=Path(args.model).name, samples_per_prompt=args.samples, prompts=args.prompts,
        label_noise_ceiling=label_noise_ceiling(held_out), seconds={},
    )  # fmt: skip

    sft = work / "sft"
    start = time.perf_counter()
    if not trained(sft):
        rlhfkit.sft(model=args.model, data=data["sft"], eval_data=data["sft_eval"], output_dir=str(sft),
                    **run_plan.settings["sft"], **common)  # fmt: skip
    results["seconds"]["sft"] = round(time.perf_counter() - start, 1)
    prompts = [r["prompt"] for r in read_jsonl(data["prompts_eval"])][: args.prompts] * args.samples
    start = time.perf_counter()
    sampled = work / f"sft_samples_{args.prompts}x{args.samples}.jsonl"
    if sampled.is_file():
        rows = read_jsonl(sampled)
    else:
        generation = GenerationArgs(**EVAL_GENERATION) if not args.quick else GenerationArgs(max_new_tokens=8)
        _, rows = evaluate_policy(str(sft), prompts, generation, judge=get_judge("support"), seed=args.seed)
        write_jsonl(sampled, rows)
    results["seconds"]["sample"] = round(time.perf_counter() - start, 1)
    results["sft_gold"] = sum(r["gold"] for r in rows) / len(rows)

    settings = run_plan.settings["rm"]
    every = read_jsonl(data["prefs_train"])
    tokenizer = load_tokenizer(str(sft))

    def measure(key: str, folder: Path, steps: int, **extra) -> None:
        scorer = RewardScorer.load(str(folder), "cpu")
        finished = [r["finished"] for r in rows]
        scores = scorer.score([r["prompt"] for r in rows], [r["response"] for r in rows], finished=finished).mean
        scored = [{**r, "score": s} for r, s in zip(rows, scores.tolist())]
        got = sample_diagnostics(scored)
        got.update(pair_agreement(scorer, get_judge("support"), tokenizer, held_out))
        results["reward_models"][key] = {"steps": steps, **extra, **got}
        log(f"{key}: {json.dumps(got)}")
        results.save()

    def pass_steps(n: int) -> int:
        return max(1, round(n / settings["batch_size"]))

    for n in labels:
        rm = work / f"rm_{n}"
        start = time.perf_counter()
        if not trained(rm):
            train = write_jsonl(work / "data" / f"prefs_{n}.jsonl", every[:n])
            rlhfkit.rm(model=str(sft), data=str(train), eval_data=data["prefs_eval"], output_dir=str(rm),
                       **{**settings, "max_steps": pass_steps(n), "eval_steps": pass_steps(n)}, **common)  # fmt: skip
        results["seconds"][f"rm_{n}"] = round(time.perf_counter() - start, 1)
        measure(str(n), rm, pass_steps(n))

    train = work / "data" / f"prefs_{base}.jsonl"
    for name in variants:
        what, options, scored_rows = VARIANTS[name]
        rm = work / f"rm_{base}_{name}"
        start = time.perf_counter()
        got = variant_options(settings, pass_steps(base), options)
        if not ((rm / "ensemble.json").is_file() if "ensemble" in options else (rm / "reward_stats.json").is_file()):
            if "ensemble" in options and not (rm / "reward_stats.json").is_file():
                shutil.copytree(work / f"rm_{base}", rm, dirs_exist_ok=True)  # member 0: the plan's model
            resume = {"overwrite_output_dir": False, "resume": True} if "ensemble" in options else {}
            rlhfkit.rm(model=str(sft), data=str(train), eval_data=data["prefs_eval"], output_dir=str(rm),
                       **got, **{**common, **resume})  # fmt: skip
        results["seconds"][f"rm_{base}_{name}"] = round(time.perf_counter() - start, 1)
        steps = last_step(rm)
        for part in scored_rows:
            label = what if len(scored_rows) == 1 else f"{what}: {ROW_NAMES[part]}"
            measure(f"{base} {name}{'/' + part if part else ''}", rm / part, steps, variant=label)
    results.close()
    print_table(results)
    print(f"saved to {results.where()}")


if __name__ == "__main__":
    main()
