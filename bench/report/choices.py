"""The tables behind the demo's and the commands' choices: DPO's β (bench/learning/dpo_beta.py), the reward model
with LoRA (rm_lora), PPO's value function (ppo_critic), GRPO's loss aggregation (loss_aggregation) and loading an
adapter chain (bench/speed/adapter_load.py). Standard library only."""

from __future__ import annotations

import statistics

from bench.report.demo import across_seeds, gain, seeds_of
from bench.report.parts import p_text, select, sources, table
from bench.stats import mean_se, pm, t_test_p, wins


def dpo_beta(selection: str) -> list[str]:
    """DPO's held-out preference accuracy and held-out DPO loss (the held-out labels' negative log-likelihood
    under the policy's implicit Bradley-Terry model) per β and demo seed (a seed's βs may come from several runs),
    with their means over seeds; the best mean of each is in bold."""
    runs = select(selection)
    got: dict[float, dict[int, dict]] = {}
    for run in runs:
        for beta, r in run["betas"].items():
            got.setdefault(float(beta), {})[int(run["args"]["seed"])] = r
    seeds = sorted({s for by_seed in got.values() for s in by_seed})
    full = [b for b in sorted(got) if len(got[b]) == len(seeds)]
    acc = {b: statistics.mean(r["accuracy"] for r in got[b].values()) for b in full}
    loss = {b: statistics.mean(r["loss"] for r in got[b].values()) for b in full}
    best_acc, best_loss = max(acc.values()), min(loss.values())

    def bold(text: str, on: bool) -> str:
        return f"**{text}**" if on else text

    rows = []
    for b in sorted(got):
        cells = [f"{b:g}"]
        cells += [f"{got[b][s]['accuracy']:.4f}" if s in got[b] else "—" for s in seeds]
        cells.append(bold(f"{acc[b]:.4f}", acc[b] == best_acc) if b in acc else "—")  # ties all in bold
        cells += [f"{got[b][s]['loss']:.3f}" if s in got[b] else "—" for s in seeds]
        cells.append(bold(f"{loss[b]:.3f}", loss[b] == best_loss) if b in loss else "—")
        rows.append(cells)
    header = ["β", *(f"accuracy: seed {s}" for s in seeds), "mean", *(f"loss: seed {s}" for s in seeds), "mean"]
    return [*table(header, rows), "", sources(*runs)]


def dpo_beta_gold(selection: str) -> list[str]:
    """Per β, over the demo seeds the runs of ``dpo_beta.py --gold`` cover (mean ± its standard error): DPO's
    held-out preference accuracy and held-out loss (what β could be chosen on), its gold gain over SFT, PPO's
    lead over it (the paired t-test's p across seeds, the seeds PPO led in) and its KL to SFT."""
    runs = select(selection)
    got: dict[float, dict[int, dict]] = {}
    for run in runs:
        for beta, r in run["betas"].items():
            g = r["gold"]
            got.setdefault(float(beta), {})[int(run["args"]["seed"])] = {
                "accuracy": r["accuracy"],
                "loss": r["loss"],
                "gain": g["gain"]["mean"],
                "lead": g["ppo_minus_dpo"]["mean"],
                "kl": g["kl"],
            }
    rows = []
    for beta in sorted(got):
        by_seed = list(got[beta].values())
        leads = [r["lead"] for r in by_seed]
        rows.append(
            [
                f"{beta:g}",
                str(len(by_seed)),
                pm(mean_se([r["accuracy"] for r in by_seed]), 3),
                pm(mean_se([r["loss"] for r in by_seed]), 3),
                pm(mean_se([r["gain"] for r in by_seed]), sign="+"),
                pm(mean_se(leads), sign="+"),
                across_seeds(leads).removesuffix(" seeds"),
                f"{statistics.mean(r['kl'] for r in by_seed):.2f}",
            ]
        )
    header = ["DPO's β", "seeds", "held-out accuracy", "held-out loss", "DPO: gold gain over SFT", "PPO − DPO"]
    header += ["PPO ahead: t-test, seeds", "DPO: KL to SFT"]
    return [*table(header, rows), "", sources(*runs)]


def rm_lora(selection: str) -> list[str]:
    """The pretrained demo's reward model trained with LoRA against in full: one row per variant of each run,
    with the held-out pairs' label-noise ceiling."""
    runs = select(selection)
    rows = []
    for run in runs:
        for got in run["variants"].values():
            rows.append(
                [
                    run["args"]["seed"],
                    "LoRA r = 16, score head in full" if got["variant"] == "lora" else "in full",
                    f"{got['learning_rate']:g}",
                    f"{got['accuracy']:.3f} ({run['ceiling']:.3f})",
                    f"{got['loss']:.3f}",
                    f"{got['seconds']:.0f}",
                    f"{got['bytes'] / 1e6:.0f}",
                ]
            )
    header = ["seed", "reward model", "learning rate", "held-out accuracy (ceiling)", "held-out loss", "seconds"]
    return [*table([*header, "MB saved"], rows), "", sources(*runs)]


PLAN_LABELS = "600"  # the pretrained demo plan's label count: rm_headroom compares its other rows with this one


def rm_headroom(selection: str) -> list[str]:
    """The support task's reward model against the gold judge before RL, on the pretrained demo's SFT model: one row
    per reward model (a label count, or one change at the plan's count), its means over the seeds that measured
    it (held-out accuracy, agreement with the judge on held-out pairs and on the SFT policy's own pairs, best-of-N
    with the reward model's pick, the share of the judge's best-of-N gain it captures), and its on-policy
    agreement against the plan's reward model of the same seed: paired mean ± s.e., t-test, sign count. A seed's
    row measured by several runs is the newest run's (the same model on the same replies)."""
    runs = sorted(select(selection), key=lambda run: run["stamp"]["date"])
    got: dict[str, dict[int, dict]] = {}
    names: dict[str, str] = {}
    ceilings = []
    for run in runs:
        ceilings.append(run["label_noise_ceiling"])
        for key, measured in run["reward_models"].items():
            got.setdefault(key, {})[int(run["args"]["seed"])] = measured
            variant = measured.get("variant")
            names[key] = f"{key.split()[0]}, {variant}" if variant else f"{key}, one pass"
    base = got.get(PLAN_LABELS, {})
    order = sorted((k for k in got if " " not in k), key=int) + [k for k in got if " " in k]
    rows = []
    for key in order:
        by_seed = got[key]
        seeds = sorted(by_seed)

        def ms(name: str, digits: int = 3) -> str:
            return pm(mean_se(by_seed[s][name] for s in seeds), digits)

        if key == PLAN_LABELS:
            against = "(the plan's)"
        else:
            paired = [s for s in seeds if s in base]
            d = [by_seed[s]["rm_judge/on_policy_agreement"] - base[s]["rm_judge/on_policy_agreement"] for s in paired]
            against = f"{pm(mean_se(d), 3, '+')} ({p_text(t_test_p(d))}, {wins(d)} of {len(d)})" if d else "—"
        rows.append(
            [
                names[key],
                ",".join(str(s) for s in seeds),
                ms("rm/pairs_accuracy"),
                ms("rm_judge/pairs_agreement"),
                ms("rm_judge/on_policy_agreement"),
                against,
                ms("best_of_n/rm_pick", 2),
                f"{mean_se(by_seed[s]['best_of_n/captured'] for s in seeds)[0]:.0%}",
            ]
        )
    n = int(runs[0]["samples_per_prompt"])
    header = ["reward model (labels)", "seeds", f"held-out accuracy (ceiling {statistics.mean(ceilings):.3f})"]
    header += ["agrees with the judge: held-out pairs", "SFT's own pairs", "own pairs − the plan's"]
    header += [f"best-of-{n} gold, RM pick", "captured"]
    return [*table(header, rows), "", sources(*runs)]


def adapter_load(selection: str) -> list[str]:
    """Loading a LoRA adapter chain with rlhfkit's direct merge against PEFT's: one row per model folder (named
    by its place in the demo's folder)."""
    runs = select(selection)
    rows = []
    for run in runs:
        for got in run["models"].values():
            parts = got["model"].rstrip("/").split("/")
            name = "/".join(parts[-2:]) if parts[-1] == "final" else parts[-1]
            rows.append(
                [
                    name,
                    got["adapters"],
                    f"{got['direct_s']:.1f}",
                    f"{got['peft_s']:.1f}",
                    "0 (the same)" if got["max_difference"] == 0 else f"{got['max_difference']:.1g}",
                ]
            )
    header = ["model", "adapters in its chain", "seconds: direct merge", "seconds: PEFT's merge", "weight difference"]
    return [*table(header, rows), "", sources(*runs)]


def loss_aggregation(selection: str) -> list[str]:
    """Held-out accuracy gained over SFT on the arithmetic task, per command, aggregation and seed."""
    (run,) = select(selection)
    seeds = list(run["seeds"])
    sft = [run["seeds"][s]["sft"] for s in seeds]
    rows = [
        [
            "SFT: its accuracy",
            "",
            " / ".join(f"{x['accuracy']:.3f}" for x in sft),
            "",
            f"{statistics.mean(x['reply_tokens'] for x in sft):.2f}",
        ]
    ]
    for name in run["seeds"][seeds[0]]["runs"]:
        got = [run["seeds"][s]["runs"][name] for s in seeds]
        command, aggregation = name.split(" ")
        rows.append(
            [
                command,
                f"`{aggregation}`",
                " / ".join(f"{g['gain']:+.3f}" for g in got),
                pm(mean_se([g["gain"] for g in got]), 3, sign="+"),
                f"{statistics.mean(g['reply_tokens'] for g in got):.2f}",
            ]
        )
    header = ["command", "--loss-aggregation", f"held-out accuracy gain over SFT, seeds {' / '.join(seeds)}"]
    return [*table([*header, "mean ± s.e.", "reply tokens"], rows), "", sources(run)]


def ppo_critic(selection: str, demo_selection: str) -> list[str]:
    """PPO's value function on the pretrained demo: ``critic_table`` of the runs of bench/learning/ppo_critic.py,
    with each variant's gain less the DPO gain of the demo runs ``demo_selection`` (each seed's own DPO, from the
    same SFT model and labels)."""
    runs, demo = select(selection), select(demo_selection)
    dpo = {int(seed): got for seed, got in seeds_of(demo)}
    return [*critic_table([run.data for run in runs], dpo), "", sources(*runs, *demo)]


def critic_table(runs: list[dict], dpo: dict[int, dict] | None = None) -> list[str]:
    """bench/learning/ppo_critic.py's runs: per seed and variant, the demo's own PPO (a separate value model started
    from the reward model) and the variant run again from the same SFT model, reward model and settings, both
    evaluated as the demo evaluates: gold gained over SFT, KL to SFT, median seconds a PPO step, and the variant's
    gold less the demo's PPO's (paired over the same replies, ± s.e.); then per variant the means over seeds ± s.e.
    with the t-test across seeds, and with ``dpo`` (demo summaries by seed) the same for the variant's gain less
    DPO's."""
    by_variant: dict[str, dict[int, tuple[dict, dict]]] = {}
    demo: dict[int, dict] = {}  # per seed, what any run recorded of the demo's own PPO
    for run in runs:
        for seed, got in run["seeds"].items():
            for key, value in got.items():
                if value is not None:
                    demo.setdefault(int(seed), {}).setdefault(key, value)
            for variant, x in got.get("variants", {}).items():
                by_variant.setdefault(variant, {})[int(seed)] = (got, x)

    def number(value, digits: int = 2) -> str:
        return "—" if value is None else f"{value:.{digits}f}"

    def summary(diffs: list[float]) -> str:
        return f"{pm(mean_se(diffs), sign='+')} ({p_text(t_test_p(diffs))}, ahead in {wins(diffs)} of {len(diffs)})"

    header = ["variant", "seed", "value model: gain", "KL", "s a step", "variant: gain", "KL", "s a step"]
    header.append("variant − value model")
    rows = []
    for variant in sorted(by_variant):
        critic, steps = variant.split(":")
        name = f"{'value head' if critic == 'head' else 'value model'}, {steps} steps"
        demo_gains, gains, diffs = [], [], []
        for seed, (got, x) in sorted(by_variant[variant].items()):
            demo_gains.append(got["gold/ppo"] - got["gold/sft"])
            gains.append(x["gain"]["mean"])
            diffs.append(x["minus_demo_ppo"]["mean"])
            rows.append(
                [
                    "" if len(gains) > 1 else name,  # the variant's name on its first row
                    str(seed),
                    f"{demo_gains[-1]:+.2f}",
                    number(demo[seed].get("demo_kl/ppo")),
                    number(demo[seed].get("demo_ppo_step_seconds"), 1),
                    pm((x["gain"]["mean"], x["gain"]["se"]), sign="+"),
                    number(x["kl"]),
                    number(x["step_seconds"], 1),
                    pm((x["minus_demo_ppo"]["mean"], x["minus_demo_ppo"]["se"]), sign="+"),
                ]
            )
        mean = ["mean", f"{len(diffs)} seeds", pm(mean_se(demo_gains), sign="+"), "", ""]
        rows.append([*mean, pm(mean_se(gains), sign="+"), "", "", summary(diffs)])
        if dpo is not None:
            over_dpo = [x["gain"]["mean"] - gain(dpo[seed], "dpo")[0] for seed, (_, x) in by_variant[variant].items()]
            rows.append(["− the demo's DPO", "", *[""] * 6, summary(over_dpo)])
    return table(header, rows)


PLAN_RL_VARIANT = "rloo_steps_26"  # the rl_knobs variant that runs the pretrained demo plan's RL stage


def rl_knobs(selection: str) -> list[str]:
    """PPO's options one at a time on the pretrained demo's support task (bench/learning/rl_knobs.py), one row a
    policy: its gold gain over SFT in each seed ± the paired standard error over the replies, the mean over seeds ±
    its standard error, its difference from PPO with a critic (the one change; or from the variant it changes one
    option of) and from DPO at the same labels as the mean over seeds ± its standard error with the paired t-test's
    p across seeds and how many seeds were ahead, its KL to SFT, and whether it climbed its reward during training
    (the mean score over the first and the last quarter of its steps, averaged over seeds)."""
    runs = select(selection)
    by_seed: dict[int, dict] = {}
    for run in runs:
        by_seed.setdefault(int(run["args"]["seed"]), {}).update(run.get("policies", {}))
    seeds = sorted(by_seed)
    names: list[str] = []
    for got in by_seed.values():
        names += [n for n in got if n != "sft" and n not in names]
    changed: dict[str, dict] = {}
    for run in runs:
        changed.update(run.get("variants", {}))
    labels = {
        "dpo": "DPO",
        "ppo": "PPO with a critic (GAE, value model from the RM)",
        "online_dpo": "online DPO (the plan's)",
        "iterated": "iterated PPO (the plan's)",
        "rloo_ensemble_3": "the plan's RL stage on a 3-member reward-model ensemble's mean",
    }

    def label_of(name: str) -> str:
        label = labels.get(name) or (f"`{option_flags(changed[name])}`" if name in changed else name)
        return label + " (the plan)" if name == PLAN_RL_VARIANT else label

    rows = []
    for name in names:
        got = [by_seed[s].get(name) for s in seeds]
        label = label_of(name)
        cells = [label, *("—" if g is None else f"{g['gain']['mean']:+.2f} ± {g['gain']['se']:.2f}" for g in got)]
        got = [g for g in got if g is not None]
        cells.append(pm(mean_se([g["gain"]["mean"] for g in got]), sign="+") if len(got) > 1 else "—")
        for key in ("minus_ppo", "minus_dpo"):
            if key == "minus_ppo" and any("minus_base" in g for g in got):  # one change from another variant
                key = "minus_base"
            diffs = [g[key]["mean"] for g in got if key in g]
            cell = f"{pm(mean_se(diffs), sign='+')} ({across_seeds(diffs)})" if len(diffs) > 1 else "—"
            base = next((g[key]["base"] for g in got if key in g), None) if key == "minus_base" else None
            cells.append(f"− the {label_of(base)} row: {cell}" if base else cell)
        curves = [g["curve"] for g in got if "curve" in g]
        climb = (
            f"{statistics.mean(c['score_first'] for c in curves):.2f} → "
            f"{statistics.mean(c['score_last'] for c in curves):.2f}"
            if curves
            else "—"
        )
        rows.append([*cells, f"{statistics.mean(g['kl'] for g in got):.1f}", climb])
    header = ["policy", *(f"gain: seed {s}" for s in seeds), "mean", "− PPO with a critic", "− DPO", "KL to SFT"]
    return [*table([*header, "reward in training: first → last quarter"], rows), "", sources(*runs)]


def option_flags(options: dict) -> str:
    """The command-line flags of the options a variant changes: `{"advantage": "rloo", "value_model": None}` is
    `--advantage rloo, no --value-model`."""

    def value(v) -> str:
        return "" if v is True else " " + (",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v))

    set_ = [f"--{k.replace('_', '-')}{value(v)}" for k, v in options.items() if v is not None]
    dropped = [f"no --{k.replace('_', '-')}" for k, v in options.items() if v is None]
    return ", ".join([" ".join(set_), *dropped]) if set_ else ", ".join(dropped)
