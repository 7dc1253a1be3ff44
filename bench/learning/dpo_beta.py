"""DPO's beta for the support demo, chosen on held-out preference pairs (never on the gold judge).

    python -m bench dpo_beta --demo-dir runs/demo [--betas 0.03,0.1,0.3] [--model PATH]
    python -m bench dpo_beta --demo-dir runs/demo --betas 0.1,0.3,1 --gold   # after the choice: gold at each beta
    python -m bench dpo_beta --report bench/reported/dpo_beta.json

``--labels N``: a folder whose training pairs are N rather than the plan's (``bench rl_knobs --labels N``'s
``--work-dir``/seedS): DPO takes one pass over them, as the plan's DPO takes over its own. A β already trained in
``--work-dir`` with its held-out evaluation is read, not trained again.

``--quick``: the demo's --quick settings (a demo folder made with `rlhfkit demo --quick`): a wiring check.

From a finished (or half-finished) demo folder, its SFT model and data: `rlhfkit dpo` with the demo's DPO settings
(rlhfkit.demo.plan, for the built-in model or for --model) once per beta, each on all the training pairs; then
each run's accuracy on the held-out pairs (``eval/rewards/accuracy``: the share of held-out pairs whose chosen reply
the policy's implicit reward ranks first) and its held-out DPO loss. The beta with the highest held-out accuracy
is the one to use. The held-out pairs are the raters' noisy labels, as the reward model is measured on; the gold
judge is not read. The result is merged into --out under the machine and the commit (bench/results_file.py).

``--gold`` is for afterwards, once beta is fixed: how much the choice matters to the demo's comparison. Each DPO
policy, and the demo's SFT and PPO models, are evaluated as the demo evaluates (the same held-out prompts, samples,
sampling settings and seed, so SFT's and PPO's gold equal the demo's own): gold gained over SFT and PPO's gold
less DPO's, each with its paired standard error over the replies, and DPO's KL to SFT.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from bench import results_file, stats
from bench.harness.runs import BENCH, Results, flags, log, run_measured
from bench.learning.rl_knobs import trained, with_labels
from bench.stamp import Stamp, summary
from rlhfkit.config.parts import GenerationArgs
from rlhfkit.data.schema import load_examples
from rlhfkit.demo.plan import plan
from rlhfkit.demo.support import EVAL_GENERATION
from rlhfkit.files import read_jsonl
from rlhfkit.inference.evaluate import evaluate_policy
from rlhfkit.tasks import get_judge


def dpo_options(args, beta: float) -> dict:
    """The plan's DPO options at ``beta`` (``--labels``: its steps scaled to one pass over that many pairs), its
    held-out pairs evaluated once at the end whatever the plan does."""
    run_plan = plan(args.quick, args.model)
    settings, _ = with_labels(run_plan.settings, run_plan.sizes or {}, getattr(args, "labels", 0))
    return {**settings["dpo"], "beta": beta, "eval_steps": 0}


def dpo_command(args, beta: float, out: Path) -> list[str]:
    return pairs_command(args, "dpo", dpo_options(args, beta), out)


def pairs_command(args, command: str, options: dict, out: Path) -> list[str]:
    """`rlhfkit COMMAND` from a demo folder's SFT model on its preference pairs (held-out pairs evaluated) with
    ``options`` as flags, into ``out`` (also bench/learning/rm_lora.py's reward-model runs)."""
    demo = Path(args.demo_dir)
    data = data_dir(demo)
    cmd = [sys.executable, "-m", "rlhfkit.cli.main", command, "--model", str(demo / "sft")]
    cmd += ["--data", str(data / "prefs_train.jsonl"), "--eval-data", str(data / "prefs_eval.jsonl")]
    cmd += ["--output-dir", str(out), "--seed", str(args.seed), "--threads", str(args.threads), "--progress", "false"]
    return [*cmd, "--overwrite-output-dir", *flags(options)]


def data_dir(demo: Path) -> Path:
    return demo / "data" / ("chat" if (demo / "data" / "chat").is_dir() else "")


def evaluated(args, policy: Path) -> list[dict]:
    """The demo's evaluation of ``policy``: its rows (gold, KL to the demo's SFT model) in prompt order."""
    demo = Path(args.demo_dir)
    prompts = [ex.prompt for ex in load_examples(str(data_dir(demo) / "prompts_eval.jsonl"), "prompt", "dpo_beta")]
    prompts = prompts * plan(args.quick, args.model).eval_samples
    sft = demo / "sft"
    _, rows = evaluate_policy(
        str(policy),
        prompts,
        GenerationArgs(**EVAL_GENERATION),
        reference=str(sft) if policy != sft else "",
        judge=get_judge("support"),
        seed=args.seed,
    )
    return rows


def paired(a: list[float], b: list[float]) -> dict:
    """mean(a - b) and its standard error, reply by reply."""
    mean, se = stats.paired(a, b)
    return {"mean": mean, "se": se}


def gold_of(args, out: Path, sft: list[float], ppo: list[float]) -> dict:
    rows = evaluated(args, out)
    gold = [r["gold"] for r in rows]
    return {
        "gold": sum(gold) / len(gold),
        "gain": paired(gold, sft),
        "ppo_minus_dpo": paired(ppo, gold),
        "kl": sum(r["kl"] for r in rows) / len(rows),
    }


def held_out(out: Path) -> dict | None:
    """The last held-out evaluation of the run in ``out`` (None: none logged)."""
    metrics = out / "metrics.jsonl"
    rows = read_jsonl(metrics) if metrics.is_file() else []
    evaluated = [r for r in rows if "eval/rewards/accuracy" in r]
    if not evaluated:
        return None
    last = evaluated[-1]
    return {"step": last["step"], "accuracy": last["eval/rewards/accuracy"], "loss": last["eval/loss"]}


def print_table(run: dict) -> None:
    gold = run.get("gold")
    extra = " gold gain over SFT | PPO − DPO | KL to SFT |" if gold else ""
    print("| beta | held-out accuracy | held-out DPO loss | seconds |" + extra)
    print("|---|---|---|---|" + ("---|---|---|" if gold else ""))
    for beta, got in run["betas"].items():
        cells = f"| {beta} | {got['accuracy']:.4f} | {got['loss']:.4f} | {got['seconds']:.0f} |"
        if "gold" in got:
            g = got["gold"]
            cells += f" {g['gain']['mean']:+.2f} ± {g['gain']['se']:.2f} |"
            cells += f" {g['ppo_minus_dpo']['mean']:+.2f} ± {g['ppo_minus_dpo']['se']:.2f} | {g['kl']:.2f} |"
        print(cells)
    if gold:
        print(f"SFT gold {gold['sft']:.3f}, PPO gold {gold['ppo']:.3f} (the demo's evaluation)")
    if run.get("chosen") is not None:
        print(f"chosen: beta = {run['chosen']} (highest held-out accuracy)")
    print(summary(run.get("stamp")))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo-dir", default="runs/demo", help="a demo's output folder (its sft/ and data/ are used)")
    ap.add_argument("--model", default="", help="the demo's --model (its DPO settings); empty: the built-in one")
    ap.add_argument("--betas", default="0.03,0.1,0.3", help="comma-separated betas, one DPO run each")
    ap.add_argument("--seed", type=int, default=0, help="the DPO runs' seed")
    ap.add_argument("--labels", type=int, default=0, help="the training pairs in the demo folder, when not the "
                    "plan's (bench rl_knobs --labels N's folders): DPO takes one pass over them (0: the plan's)")  # fmt: skip
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads of each run")
    ap.add_argument(
        "--gold",
        action="store_true",
        help="also each policy's gold gain over SFT and PPO's lead over it, as the demo evaluates (not for choosing)",
    )
    ap.add_argument("--quick", action="store_true", help="the demo's --quick settings: a wiring check")
    ap.add_argument("--out", default=str(BENCH / "results" / "dpo_beta.json"), help="the result file to merge into")
    ap.add_argument("--work-dir", default=str(BENCH / "results" / "work" / "dpo_beta"), help="the runs' folders")
    args = results_file.parse_or_report(ap, argv, print_table)
    if args is None:
        return
    defaults = vars(ap.parse_args([]))
    results = Results(Path(args.out), Stamp(), "dpo_beta", defaults, args=vars(args), betas={}, chosen=None)
    sft = ppo = None
    if args.gold:
        torch.set_num_threads(args.threads)
        demo = Path(args.demo_dir)
        sft = [r["gold"] for r in evaluated(args, demo / "sft")]
        ppo = [r["gold"] for r in evaluated(args, demo / "ppo")]
        results["gold"] = {"sft": sum(sft) / len(sft), "ppo": sum(ppo) / len(ppo)}
    for beta in [float(b) for b in args.betas.split(",")]:
        out = Path(args.work_dir) / f"beta{beta:g}"
        start = time.perf_counter()
        got = held_out(out) if trained(out) else None
        if got is None:  # not trained yet, or stopped before its held-out evaluation
            measured = run_measured(dpo_command(args, beta, out), out.parent / f"{out.name}.log")
            if measured.returncode != 0:
                raise SystemExit(f"beta {beta:g}: DPO failed; its log: {measured.log}")
            got = held_out(out)
            if got is None:
                raise SystemExit(f"beta {beta:g}: DPO logged no held-out evaluation; its log: {measured.log}")
        results["betas"][f"{beta:g}"] = {**got, "seconds": round(time.perf_counter() - start, 1)}
        if args.gold:
            results["betas"][f"{beta:g}"]["gold"] = gold_of(args, out, sft, ppo)
        log(f"beta {beta:g}: held-out accuracy {results['betas'][f'{beta:g}']['accuracy']:.4f}")
        results.save()
    results["chosen"] = max(results["betas"], key=lambda b: results["betas"][b]["accuracy"])
    results.close()
    print_table(results)
    print(f"saved to {results.where()}")


if __name__ == "__main__":
    main()
