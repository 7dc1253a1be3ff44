"""PPO's value function in the support demo: a value head on the policy against the demo's separate value model
(a network started from the reward model), on the demo's own SFT model, reward model and settings.

    python -m bench ppo_critic --demo-dirs runs/demo/seed0,runs/demo/seed1 --model PATH.gguf [--variants head:16,model:24]
    python -m bench ppo_critic --report bench/reported/ppo_critic.json

For each finished demo folder (one per seed, as bench/learning/demo_seeds.py leaves them), `rlhfkit ppo` runs again from the
folder's own PPO settings (its ppo/config.yaml: the SFT model, the reward model, the data, the seed) once per
variant, changing only what the variant names: ``head:N`` a value head on the policy (``--value-model ''``) and N
steps, ``model:N`` the demo's value model and N steps. Every policy is then evaluated as the demo evaluates (the same
held-out prompts, samples, sampling settings and seed: bench/learning/dpo_beta.py's ``evaluated``), the demo's own SFT and PPO
models too, so each variant's gold is paired reply by reply with SFT's (its gain) and with the demo's PPO (the
difference the variant makes). Also each run's seconds, its median seconds a step and its KL to SFT. Results merge
into --out under the machine and the commit (bench/results_file.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bench import results_file
from bench.harness.runs import BENCH, Results, check, log, rlhfkit_cmd, run_measured
from bench.learning.dpo_beta import evaluated, paired
from bench.report.choices import critic_table
from bench.stamp import Stamp, summary
from rlhfkit.config.parse import load_yaml
from rlhfkit.ops.estimators import get_advantage_estimator


def variant_command(demo: Path, variant: str, out: Path, threads: int) -> list[str]:
    """`rlhfkit ppo` with the demo's own settings, the value function and steps of ``variant`` changed."""
    critic, steps = variant.split(":")
    cmd = rlhfkit_cmd("ppo", "--config", str(demo / "ppo" / "config.yaml"), "--output-dir", str(out))
    cmd += ["--max-steps", steps, "--threads", str(threads), "--progress", "false", "--report-to", "none"]
    if critic == "head":
        cmd += ["--value-model", ""]
    elif critic != "model":
        raise SystemExit(f"ppo_critic: a variant is head:STEPS or model:STEPS, got {variant!r}")
    return cmd


def demo_estimator(demo: Path) -> str:
    """The advantage estimator of the demo's PPO run (its ppo/config.yaml, flat or by part)."""
    saved = load_yaml(str(demo / "ppo" / "config.yaml"))
    part = saved.get("advantage")
    return part.get("advantage", "gae") if isinstance(part, dict) else (part or "gae")


def step_seconds(out: Path) -> float:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return statistics.median(r["time/step_s"] for r in rows if "time/step_s" in r)


def one_seed(args, demo: Path, results: Results) -> None:
    estimator = demo_estimator(demo)
    if not get_advantage_estimator(estimator).needs_critic:
        raise SystemExit(
            f"ppo_critic: {demo}'s PPO ran --advantage {estimator}, without a value function; this compares value "
            "functions of a demo whose PPO has a critic (gae, sequence)"
        )
    demo_summary = json.loads((demo / "summary.json").read_text())
    seed = int(demo_summary["seed"])
    ns = argparse.Namespace(demo_dir=str(demo), model=args.model, seed=seed, quick=args.quick)
    sft = [r["gold"] for r in evaluated(ns, demo / "sft")]
    ppo = [r["gold"] for r in evaluated(ns, demo / "ppo")]
    got = results["seeds"].setdefault(str(seed), {})
    got.update(
        {
            "demo_dir": str(demo),
            "gold/sft": sum(sft) / len(sft),
            "gold/ppo": sum(ppo) / len(ppo),
            "demo_gold/sft": demo_summary.get("gold/sft"),
            "demo_gold/ppo": demo_summary.get("gold/ppo"),
            "demo_ppo_seconds": demo_summary.get("stage_seconds", {}).get("PPO (KL penalty on)"),
            "demo_ppo_step_seconds": round(step_seconds(demo / "ppo"), 2),
            "demo_kl/ppo": demo_summary.get("kl/ppo"),
            "variants": {},
        }
    )
    for variant in args.variants.split(","):
        out = Path(args.work_dir) / f"seed{seed}" / variant.replace(":", "")
        start = time.perf_counter()
        check(run_measured(variant_command(demo, variant, out, args.threads), out.parent / f"{out.name}.log"), variant)
        seconds = time.perf_counter() - start
        rows = evaluated(ns, out)
        gold = [r["gold"] for r in rows]
        got["variants"][variant] = {
            "seconds": round(seconds, 1),
            "step_seconds": round(step_seconds(out), 2),
            "gold": sum(gold) / len(gold),
            "gain": paired(gold, sft),
            "minus_demo_ppo": paired(gold, ppo),
            "kl": sum(r["kl"] for r in rows) / len(rows),
        }
        log(f"seed {seed} {variant}: gain {got['variants'][variant]['gain']['mean']:+.3f}, {seconds:.0f} s")
        results.save()


def print_table(run: dict) -> None:
    print("\n".join(critic_table([run])))
    print(summary(run.get("stamp")))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo-dirs", default="", help="comma-separated finished demo folders, one per seed")
    ap.add_argument("--model", default="", help="the demos' --model (the evaluation's samples per prompt)")
    ap.add_argument("--variants", default="head:16", help="comma-separated head:STEPS or model:STEPS, one run each")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads of each run and the evaluation")
    ap.add_argument("--quick", action="store_true", help="demo folders of `rlhfkit demo --quick`: a wiring check")
    ap.add_argument("--out", default=str(BENCH / "results" / "ppo_critic.json"), help="the result file to merge into")
    ap.add_argument("--work-dir", default=str(BENCH / "results" / "work" / "ppo_critic"), help="the runs' folders")
    args = results_file.parse_or_report(ap, argv, print_table)
    if args is None:
        return
    if not args.demo_dirs:
        raise SystemExit("ppo_critic: --demo-dirs names the demo folders to run from")
    torch.set_num_threads(args.threads)
    defaults = vars(ap.parse_args([]))
    # the run's key names the model file and the demo folders, not where this machine keeps them
    demo_names = ",".join(Path(d).name for d in args.demo_dirs.split(","))
    record = dict(vars(args), model=Path(args.model).name if args.model else "", demo_dirs=demo_names)
    results = Results(Path(args.out), Stamp(), "ppo_critic", defaults, args=record, seeds={})
    for demo in args.demo_dirs.split(","):
        one_seed(args, Path(demo), results)
    results.close()
    print_table(results)
    print(f"saved to {results.where()}")


if __name__ == "__main__":
    main()
