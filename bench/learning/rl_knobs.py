"""PPO's options one at a time on the support task with a pretrained model, against PPO with a critic and DPO at
the same 600 labels, scored by the gold judge.

    python -m bench rl_knobs --model SmolLM2-135M-Instruct.Q4_1.gguf --seed 0 --variants rloo
    python -m bench rl_knobs --report bench/reported/rl_knobs.json

``--labels N`` trains the reward model and DPO on N labels instead (one pass each, as the plan does), everything
else the same: what more labels do for RL from a reward model against DPO at equal labels.

For one seed: the task data, then the demo plan's SFT, reward model and DPO (``rlhfkit/recipes/demo/``), PPO at the
plan's settings with a critic (``ppo``: GAE, a value model started from the reward model, 16 steps; the plan's own
RL stage is the variant ``rloo_steps_26``), and one PPO run per ``--variants`` name, each that run with only the
options of ``VARIANTS[name]`` changed. Every policy is evaluated as the demo evaluates (the held-out prompts, the plan's
samples a prompt, the evaluation's sampling settings, the seed), so replies pair one by one: each policy's gain over
SFT, a variant's difference from PPO with a critic (what the one change did) and from DPO, each ± its paired standard
error over the replies. Also each PPO run's reward-model score over its first and last quarter of steps (does it
climb its reward model?), its KL to SFT and its seconds. Models already in ``--work-dir`` are kept, so an
interrupted seed resumes and a
policy evaluated once is not evaluated again (its rows are kept beside it); ``--quick`` uses the demo's --quick plan (a wiring check).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

import torch

import rlhfkit
from bench import results_file, stats
from bench.harness.runs import BENCH, Results, log
from bench.stamp import Stamp, summary
from rlhfkit.config.parts import GenerationArgs
from rlhfkit.demo.plan import chat_rows, plan
from rlhfkit.demo.support import EVAL_GENERATION, loop_options
from rlhfkit.files import read_jsonl, write_jsonl
from rlhfkit.inference.evaluate import evaluate_policy
from rlhfkit.models.loading import load_causal_lm, load_tokenizer
from rlhfkit.tasks import get_judge
from rlhfkit.tasks.support import write_task_data

# The run every variant changes ("ppo"): the plan's PPO options with a critic instead of its leave-one-out
# advantages: GAE, a value model started from the reward model, one reply to each of 16 prompts a step, 16 steps.
CRITIC = {"advantage": "gae", "num_generations": 1, "max_steps": 16, "gold_steps": 16, "sample_steps": 8}


def critic_run(ppo_settings: dict, reward_model: str, quick: bool = False) -> dict:
    """The baseline's options from the plan's PPO stage ``ppo_settings`` (``--quick``: its step counts kept)."""
    critic = {k: v for k, v in CRITIC.items() if not quick or k in ("advantage", "num_generations")}
    return {**ppo_settings, **critic, "value_model": reward_model}


# Each variant is that run with these options changed (None: the option left out, its default). A critic-free
# estimator samples 4 replies to each of 4 prompts, so the rollouts a step stay 16.
GROUPED = {"num_generations": 4, "value_model": None}
VARIANTS: dict[str, dict] = {
    "rloo": {"advantage": "rloo", **GROUPED},
    "grpo": {"advantage": "grpo", **GROUPED},
    "value_head": {"value_model": None},
    # 4 steps that train the value model alone on the SFT policy's rollouts, then the 16 PPO steps
    "value_warmup_4": {"value_warmup_steps": 4, "max_steps": 20},
    "whiten_rewards": {"whiten_rewards": True},
    "missing_eos_penalty": {"missing_eos_penalty": 1.0},
    "rollouts_64": {"batch_size": 64, "ppo_epochs": 1, "num_minibatches": 4},
    "kl_0.02": {"kl_coef": 0.02},
    "kl_0.1": {"kl_coef": 0.1},
    # the ceiling at this budget: the leave-one-out run with the gold judge itself as its reward, against "rloo"
    "rloo_gold_reward": {"advantage": "rloo", **GROUPED, "reward_model": None, "reward_fn": ["support"]},
    # the leave-one-out run at the critic's time: its step costs about 0.6 of a critic step, so 26 steps (the
    # plan's RL stage)
    "rloo_steps_26": {"advantage": "rloo", **GROUPED, "max_steps": 26},
    # the plan's RL stage run three times as long: the RL budget alone
    "rloo_steps_78": {"advantage": "rloo", **GROUPED, "max_steps": 78},
    # the plan's RL stage on the mean score of 3 reward models (Coste et al. 2023) from the same 600 labels, seeds
    # seed..seed+2 at the plan's settings; member 0 is the seed's reward model itself
    "rloo_ensemble_3": {"advantage": "rloo", **GROUPED, "max_steps": 26, "reward_model": "rm_ensemble_3"},
    # (a moving reference, --ref-update-steps or --ref-ema, needs full fine-tuning: with LoRA the reference is
    # the base weights)
}
# The plan's loops that label the policy's own pairs, at the same labels (half the offline pairs, then the simulated
# raters on the policy's pairs, round by round): iterated PPO (the plan's RL stage each round) and online DPO, each
# with the options of its stage of the plan, as the demo runs them.
LOOPS = {"iterated": "iterate", "online_dpo": "online_dpo"}
# a variant that changes one option of another variant rather than of the baseline is also paired with that one;
# iterated PPO with online DPO, its control at the same labels
BASE = {
    "rloo_gold_reward": "rloo",
    "rloo_steps_26": "rloo",
    "rloo_steps_78": "rloo_steps_26",
    "rloo_ensemble_3": "rloo_steps_26",
    "iterated": "online_dpo",
}
# reward models a variant names by folder (``VARIANTS[v]["reward_model"]``): their ensemble size
ENSEMBLES = {"rm_ensemble_3": 3}


def trained_runs(variants: list[str], critic_baseline: bool = True) -> list[str]:
    """The runs a seed trains after SFT, the reward model and DPO, in order: the critic baseline, then the
    variants."""
    return (["ppo"] if critic_baseline else []) + [v for v in variants if v != "ppo"]


def trained(folder: Path) -> bool:
    return (folder / "adapter_config.json").is_file() or (folder / "config.json").is_file()


def ensemble_rm(work: Path, folder: str, members: int, pairs: dict, settings: dict, common: dict) -> Path:
    """The seed's reward model as member 0 of a ``members``-model ensemble in ``work/folder``: the other members
    trained by ``rlhfkit rm --ensemble`` resuming past member 0 (the same settings and seed it was trained with)."""
    out = work / folder
    if not (out / "ensemble.json").is_file():
        if not (out / "reward_stats.json").is_file():
            shutil.copytree(work / "rm", out, dirs_exist_ok=True)
        log(f"{folder}: training members 1..{members - 1}")
        options = {**settings["rm"], **common, "overwrite_output_dir": False, "resume": True}
        rlhfkit.rm(**pairs, output_dir=str(out), ensemble=members, **options)
    return out


def with_labels(settings: dict, sizes: dict, labels: int) -> tuple[dict, dict]:
    """The plan's settings and task sizes with ``labels`` preference pairs (0: the plan's): the reward model and
    DPO take as many steps a pass over them as the plan's take over its own (their evaluation, if once at the end,
    stays there)."""
    planned = sizes.get("prefs_train")
    if not labels or labels == planned:
        return settings, sizes
    if not planned:
        raise SystemExit("--labels: this plan does not say how many labels it trains on")
    settings = dict(settings)
    for stage in ("rm", "dpo"):
        options = dict(settings[stage])
        steps = max(1, round(options["max_steps"] * labels / planned))
        if options.get("eval_steps") == options["max_steps"]:
            options["eval_steps"] = steps
        options["max_steps"] = steps
        settings[stage] = options
    return settings, {**sizes, "prefs_train": labels}


def rm_accuracy(folder: Path) -> float | None:
    """A reward model's held-out accuracy as its training measured it (an ensemble's: of its members' mean)."""
    ensemble = folder / "ensemble.json"
    if ensemble.is_file():
        return json.loads(ensemble.read_text()).get("eval", {}).get("accuracy")
    rows = read_jsonl(folder / "metrics.jsonl")
    return next((r["eval/accuracy"] for r in reversed(rows) if "eval/accuracy" in r), None)


def ppo_options(base: dict, variant: dict) -> dict:
    options = dict(base)
    for key, value in variant.items():
        if value is None:
            options.pop(key, None)
        else:
            options[key] = value
    return options


def training_curve(out: Path) -> dict:
    """The reward model's score on the rollouts over the first and the last quarter of the steps, and the KL."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "reward/score" in r]
    quarter = max(1, len(rows) // 4)
    return {
        "score_first": statistics.fmean(r["reward/score"] for r in rows[:quarter]),
        "score_last": statistics.fmean(r["reward/score"] for r in rows[-quarter:]),
        "kl_last": statistics.fmean(r.get("kl/ref", 0.0) for r in rows[-quarter:]),
        "step_s": statistics.median(r["time/step_s"] for r in rows if "time/step_s" in r),
    }


def paired(a: list[float], b: list[float]) -> dict:
    mean, se = stats.paired(a, b)
    return {"mean": mean, "se": se}


def print_table(run: dict) -> None:
    policies = run.get("policies", {})
    if "sft" not in policies:
        print("(no policy evaluated yet)")
        return
    print(f"seed {run['args']['seed']}: SFT gold {policies['sft']['gold']:.3f}")
    print(
        "| policy | gain over SFT | − PPO with a critic, or − its base | − DPO | KL to SFT "
        "| RM score: first → last quarter | s/step |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, got in policies.items():
        if name == "sft":
            continue

        def cell(key: str) -> str:
            if key == "minus_ppo" and "minus_base" in got:  # one change from another variant: paired with that
                return f"{got['minus_base']['base']}: {cell('minus_base')}"
            d = got.get(key)
            return "—" if d is None else f"{d['mean']:+.2f} ± {d['se']:.2f}"

        curve = got.get("curve")
        climb = f"{curve['score_first']:.2f} → {curve['score_last']:.2f}" if curve else "—"
        step = f"{curve['step_s']:.1f}" if curve else "—"
        print(
            f"| {name} | {cell('gain')} | {cell('minus_ppo')} | {cell('minus_dpo')} | {got['kl']:.2f} | {climb} | {step} |"
        )
    accuracy = {n: g["rm_accuracy"] for n, g in policies.items() if g.get("rm_accuracy") is not None}
    if accuracy:
        print(
            "reward model's held-out accuracy, by the run on it: "
            + ", ".join(f"{n} {a:.3f}" for n, a in accuracy.items())
        )
    print(summary(run.get("stamp")))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="the pretrained model (a folder or a .gguf file)")
    ap.add_argument("--seed", type=int, default=0, help="the task data's and the runs' seed")
    ap.add_argument("--variants", default="rloo", help=f"comma-separated, of: {', '.join(VARIANTS)}")
    ap.add_argument("--labels", type=int, default=0, help="preference labels for the reward model and DPO, each "
                    "trained one pass over them as the plan does (0: the plan's)")  # fmt: skip
    ap.add_argument("--no-critic-baseline", action="store_true", help="leave out PPO with a critic, the run each "
                    "variant is otherwise paired against (the variants are still paired against DPO)")  # fmt: skip
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--quick", action="store_true", help="the demo's --quick plan: a wiring check")
    ap.add_argument("--out", default=str(BENCH / "results" / "rl_knobs.json"), help="the result file to merge into")
    ap.add_argument("--work-dir", default=str(BENCH / "results" / "work" / "rl_knobs"), help="the runs' folders")
    args = results_file.parse_or_report(ap, argv, print_table)
    if args is None:
        return
    if not args.model:
        raise SystemExit("--model: the pretrained model to measure (a folder or a .gguf file)")
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS and v not in LOOPS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {', '.join([*VARIANTS, *LOOPS])}")
    # the loops run first: a variant paired with one (iterated PPO with online DPO) finds it evaluated
    variants = sorted(variants, key=lambda v: (v not in LOOPS, v != "online_dpo"))
    torch.set_num_threads(args.threads)
    defaults = vars(ap.parse_args([]))
    work = Path(args.work_dir) / f"seed{args.seed}"
    run_plan = plan(args.quick, args.model)
    settings, sizes = with_labels(run_plan.settings, run_plan.sizes or {}, args.labels)
    if args.labels and set(variants) & set(LOOPS):
        raise SystemExit("--labels: the loops (online_dpo, iterated) keep the plan's labels; run them without it")
    files = write_task_data(work / "data", seed=args.seed, sizes=sizes)
    data = {k: str(v) for k, v in chat_rows(files, args.model, work / "data" / "chat").items()}
    common = {"seed": args.seed, "progress": False, "overwrite_output_dir": True, "threads": args.threads}
    results = Results(
        Path(args.out), Stamp(), "rl_knobs", defaults, args=vars(args), model=Path(args.model).name,
        variants={v: VARIANTS[v] for v in variants if v in VARIANTS}, seconds={}, policies={},
    )  # fmt: skip

    def policy(name: str) -> Path:
        return work / name / "final" if name in LOOPS else work / name

    def stage(name: str, train) -> None:
        start = time.perf_counter()
        if not trained(policy(name)):
            train(str(work / name))
            results["seconds"][name] = round(time.perf_counter() - start, 1)
            results.save()
        log(f"seed {args.seed}: {name} ready")

    sft = str(work / "sft")
    pairs = {"model": sft, "data": data["prefs_train"], "eval_data": data["prefs_eval"]}
    stage("sft", lambda o: rlhfkit.sft(model=args.model, data=data["sft"], eval_data=data["sft_eval"], output_dir=o,
                                       **settings["sft"], **common))  # fmt: skip
    stage("rm", lambda o: rlhfkit.rm(**pairs, output_dir=o, **settings["rm"], **common))
    stage("dpo", lambda o: rlhfkit.dpo(**pairs, output_dir=o, **settings["dpo"], **common))
    base = {
        "model": sft,
        "reward_model": str(work / "rm"),
        "data": data["prompts_train"],
        "eval_data": data["prompts_eval"],
        "gold_judge": "support",
        **critic_run(settings["ppo"], str(work / "rm"), args.quick),
        **common,
    }
    runs = trained_runs(variants, critic_baseline=not args.no_critic_baseline)
    for name in runs:
        if name in LOOPS:
            loop = loop_options(work, data, settings[LOOPS[name]], run_plan, common, name)
            loop.update({"algorithm": "dpo"} if name == "online_dpo" else {})
            stage(name, lambda o, loop=loop: rlhfkit.iterate(**loop))
            continue
        options = ppo_options(base, VARIANTS.get(name, {}))
        members = ENSEMBLES.get(options.get("reward_model", ""))
        if members:
            options["reward_model"] = str(ensemble_rm(work, options["reward_model"], members, pairs, settings, common))
        stage(name, lambda o, options=options: rlhfkit.ppo(**{**options, "output_dir": o}))

    prompts = [r["prompt"] for r in read_jsonl(data["prompts_eval"])] * run_plan.eval_samples
    generation = GenerationArgs(**EVAL_GENERATION) if not args.quick else GenerationArgs(max_new_tokens=8)
    reference = load_causal_lm(sft, tokenizer=load_tokenizer(sft)).eval()
    gold: dict[str, list[float]] = {}
    for name in ["sft", "dpo", *runs]:
        start = time.perf_counter()
        kept = work / name / "rl_knobs_eval.jsonl"  # a policy evaluated by an earlier run of this seed
        if kept.is_file():
            rows = read_jsonl(str(kept))
        else:
            _, rows = evaluate_policy(str(policy(name)), prompts, generation, judge=get_judge("support"),
                                      reference=reference if name != "sft" else None, seed=args.seed)  # fmt: skip
            write_jsonl(kept, rows)
        gold[name] = [r["gold"] for r in rows]
        got = {"gold": statistics.fmean(gold[name]), "kl": statistics.fmean(r.get("kl", 0.0) for r in rows)}
        if name != "sft":
            got["gain"] = paired(gold[name], gold["sft"])
        if name not in ("sft", "dpo"):
            got["minus_dpo"] = paired(gold[name], gold["dpo"])
        if name not in ("sft", "dpo", *LOOPS):
            got["curve"] = training_curve(work / name)
        reward_model = "rm" if name == "ppo" else VARIANTS.get(name, {}).get("reward_model")
        if reward_model in ("rm", *ENSEMBLES):  # the reward model's held-out accuracy, beside the run on it
            got["rm_accuracy"] = rm_accuracy(work / reward_model)
        if name not in ("sft", "dpo", "ppo") and "ppo" in gold:
            got["minus_ppo"] = paired(gold[name], gold["ppo"])
        base = BASE.get(name)
        if base and (work / base / "rl_knobs_eval.jsonl").is_file():  # its base, evaluated by this seed's runs
            base_gold = [r["gold"] for r in read_jsonl(str(work / base / "rl_knobs_eval.jsonl"))]
            got["minus_base"] = {"base": base, **paired(gold[name], base_gold)}
        results["policies"][name] = got
        results["seconds"][f"eval_{name}"] = round(time.perf_counter() - start, 1)
        log(f"seed {args.seed}: {name} gold {got['gold']:.3f}")
        results.save()
    results.close()
    print_table(results)
    print(f"saved to {results.where()}")


if __name__ == "__main__":
    main()
