"""`rlhfkit demo` on the built-in customer-support task: init-model -> SFT -> reward model -> PPO (KL on) -> PPO
(beta = 0) -> DPO -> PPO with the gold judge as reward -> iterated PPO -> online DPO -> evaluation, with a report.

Every stage runs its command on a config built from the plan's options (``rlhfkit.demo.plan``). The gold judge
of the task evaluates every policy and trains only the PPO run that takes it as its reward (the ceiling). With a
core to spare, two stages run at once: iterated PPO in a child process beside the reward model, PPO, DPO and the
gold-reward PPO, then the beta = 0 run in a child process beside online DPO; the stages that then run alone (SFT,
the evaluation, and online DPO without the beta = 0 run) take both stages' threads.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from rlhfkit.config.commands import DemoConfig
from rlhfkit.config.parts import GenerationArgs
from rlhfkit.data.schema import load_examples
from rlhfkit.demo.plan import Plan, needs_critic, plan
from rlhfkit.demo.report import write_report
from rlhfkit.demo.stages import announce_report, begin, run_stage, stage_config
from rlhfkit.errors import UserError, option
from rlhfkit.files import read_jsonl, write_jsonl
from rlhfkit.inference.evaluate import evaluate_policy, pair_agreement, sample_diagnostics
from rlhfkit.models.loading import load_causal_lm, load_tokenizer
from rlhfkit.models.reward import RewardScorer
from rlhfkit.tasks import get_judge
from rlhfkit.tasks.support import label_noise_ceiling, product_naming_shares, write_task_data
from rlhfkit.training.runtime import cpu_threads

GOLD_REWARD_STAGE = "PPO with the gold judge as reward"
EVAL_GENERATION = {"max_new_tokens": 40, "temperature": 0.7}  # as the PPO rollouts sample


def seconds_done(run_dir: Path) -> float:
    """The seconds an earlier run of ``rlhfkit iterate`` (iterated PPO, online DPO) in ``run_dir`` spent on its
    finished rounds and its first model (what ``rlhfkit iterate --resume`` keeps of it)."""
    path = run_dir / "summary.json"
    return json.loads(path.read_text(encoding="utf-8"))["totals"]["seconds"] if path.is_file() else 0.0


def split_labels(out: Path, data: dict[str, str], rounds: int, run_plan: Plan) -> tuple[Path, int]:
    """The labels of the loops that label their own pairs (iterated PPO, online DPO), as many as the reward model
    and DPO learn from: the first half of the offline pairs (written to ``data/prefs_half.jsonl``) and, for the
    other half, the pairs the task's simulated raters label each round. Returns (that file, pairs per round)."""
    rows = read_jsonl(data["prefs_train"])
    half = len(rows) // 2
    offline = write_jsonl(out / "data" / "prefs_half.jsonl", rows[:half])
    return offline, run_plan.pairs_per_round or max(1, (len(rows) - half) // rounds)


def loop_options(out: Path, data: dict[str, str], settings: dict, run_plan: Plan, common: dict, name: str) -> dict:
    """``rlhfkit iterate``'s options for iterated PPO or online DPO (``settings``), into ``OUT/name``: the first
    half of the offline pairs first (the reward model's, or DPO's), then the task's simulated raters (``--judge
    support``, the rule that labelled those pairs) label the policy's own pairs, round by round."""
    offline, per_round = split_labels(out, data, settings["rounds"], run_plan)
    return {
        "model": f"{out}/sft",
        "prefs": str(offline),
        "data": data["prompts_train"],
        "eval_data": data["prompts_eval"],
        "judge": "support",
        "gold_judge": "support",
        "pairs_per_round": per_round,
        "output_dir": f"{out}/{name}",
        **settings,
        **common,
    }


ADAPTER_SHARE = 0.05  # a LoRA adapter's size against its model's: rank 16 on every linear layer of SmolLM2 is 3.6%


def disk_needed(run_plan: Plan, ablation: bool, gold_reward: bool = False) -> int:
    """Bytes a demo on a given model writes, roughly: each model it saves (SFT, the reward model, PPO, DPO, the
    beta = 0 run when it runs, iterated PPO's first reward model, each round's reward model, policy and value
    model (where its advantage estimator needs one) and its final policy, online DPO's first policy, each round's
    and its final one) whole in the model's dtype, or a LoRA adapter when its stage saves adapters alone
    (``--save-merged false``). 0 for the built-in model."""
    whole = run_plan.parameter_bytes * run_plan.parameters

    def size(settings: dict, rank: str = "lora_r") -> float:
        adapter = settings.get(rank, 0) > 0 and not settings.get("save_merged", True)
        return whole * ADAPTER_SHARE if adapter else whole

    s = run_plan.settings
    it, online = s["iterate"], s["online_dpo"]
    policies = size(s["sft"]) + size(s["ppo"]) * (1 + ablation + gold_reward) + size(s["dpo"])
    iterated = size(it, "rm_lora_r") * (1 + it["rounds"]) + size(it) * ((1 + needs_critic(it)) * it["rounds"] + 1)
    return int(policies + size(s["rm"]) + iterated + size(online) * (online["rounds"] + 2))


def _bytes_in(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def check_disk(out: Path, needed: int) -> None:
    """Stop before the first stage when the disk holding ``out`` has less free space than the run still has to
    write (``needed`` less what an earlier run left there), rather than hours later in a checkpoint save."""
    if not needed:
        return
    where = next(p for p in (out, *out.parents) if p.exists())
    free = shutil.disk_usage(where).free
    remaining = needed - _bytes_in(out)
    if free < remaining:
        gb = 1024**3
        raise UserError(
            f"demo: {where} has {free / gb:.1f} GiB free; this run writes about {remaining / gb:.1f} GiB more "
            f"(the models it trains). Free some space or choose another {option('output_dir')}."
        )


def schedule_threads(threads: int, ablation: bool, cores: int) -> tuple[bool, int, int]:
    """(whether a core is to spare, the threads of a stage that runs alone, online DPO's threads) for stages of
    ``threads`` threads each (0: torch's default, all cores) on ``cores`` cores. With a core to spare (at least
    twice the threads) two stages run at once, one of them in a child process: iterated PPO, the longest stage,
    which needs only the SFT model (it trains its own reward models), beside the reward model, PPO and DPO; then
    the beta = 0 run, which needs the reward model, beside online DPO. The stages that then run alone (SFT, the
    evaluation, and online DPO when the beta = 0 run is off) take both stages' threads."""
    spare = bool(threads) and 2 * threads <= cores
    alone = 2 * threads if spare else threads
    return spare, alone, threads if ablation and spare else alone


def run(cfg: DemoConfig) -> dict:
    start = time.perf_counter()
    run_plan = plan(cfg.quick, cfg.model)
    settings = run_plan.settings
    # The beta = 0 run shows what the KL penalty is for; on a pretrained model it is one more PPO run, so it runs
    # there only when asked.
    ablation = cfg.kl_ablation if cfg.kl_ablation is not None else not cfg.model
    # PPO with the gold judge as its reward: the ceiling the reward model's run is measured against
    gold_reward = cfg.gold_reward if cfg.gold_reward is not None else not cfg.model
    total = (9 if cfg.model else 10) - (not ablation) + gold_reward
    check_disk(Path(cfg.output_dir), disk_needed(run_plan, ablation, gold_reward))
    out, data, stages = begin(cfg, write_task_data, total=total, sizes=run_plan.sizes)
    base = cfg.model or f"{out}/base"
    # every stage's seed and progress bar; what a stopped run left in a stage's folder is replaced (a --resume
    # continues iterated PPO at its round instead)
    common = {"seed": cfg.seed, "progress": cfg.progress, "overwrite_output_dir": True}
    spare, alone, online_threads = schedule_threads(cfg.threads, ablation, os.cpu_count() or 1)
    sft = {"model": base, "data": data["sft"], "eval_data": data["sft_eval"], "output_dir": f"{out}/sft"}
    stages.run("SFT", lambda: run_stage("sft", {**sft, **settings["sft"], **common, "threads": alone}))
    rm = {
        "model": f"{out}/sft",
        "data": data["prefs_train"],
        "eval_data": data["prefs_eval"],
        "output_dir": f"{out}/rm",
    }
    ppo = {
        "model": f"{out}/sft",
        "reward_model": f"{out}/rm",
        "data": data["prompts_train"],
        "eval_data": data["prompts_eval"],
        "gold_judge": "support",
        **({"value_model": f"{out}/rm"} if run_plan.value_model else {}),
        **settings["ppo"],
        **common,
    }
    # one change from PPO: the reward (its value model, when it has one, still starts from the reward model)
    gold_ppo = {k: v for k, v in ppo.items() if k != "reward_model"}
    gold_ppo.update({"reward_fn": ["support"], "output_dir": f"{out}/ppo_gold"})
    no_kl_name = "PPO without KL (beta = 0)"
    no_kl = {
        **ppo,
        "output_dir": f"{out}/ppo_no_kl",
        "kl_coef": 0.0,
        "log_ref_kl": True,
        "max_steps": run_plan.no_kl_steps,
    }
    # a --resume continues iterated PPO and online DPO at their first unfinished round
    loop_common = {**common, "overwrite_output_dir": not cfg.resume, "resume": cfg.resume}
    iterated = loop_options(out, data, settings["iterate"], run_plan, loop_common, "iterated")
    iterated_name = "iterated PPO"
    iterated_before = seconds_done(out / "iterated") if cfg.resume else 0.0  # its rounds an earlier run finished
    online = loop_options(out, data, settings["online_dpo"], run_plan, loop_common, "online_dpo")
    online["algorithm"] = "dpo"
    online_name = "online DPO"
    dpo = {"model": f"{out}/sft", "data": data["prefs_train"], "eval_data": data["prefs_eval"]}
    jobs = []

    def in_child(name: str, command: str, options: dict, log: str, done_before: float = 0.0) -> None:
        # The log is the only place the child's progress shows, so it draws its bar there whatever --progress says.
        config = stage_config(command, {**options, "progress": True})
        jobs.append(stages.start(name, command, config, out / log, cfg.threads, done_before=done_before))

    def wait_for_children() -> None:
        for job in [j for j in jobs if j is not None]:
            stages.wait(job)
        jobs.clear()

    try:
        if spare:
            in_child(iterated_name, "iterate", iterated, "iterated.log", done_before=iterated_before)
        stages.run("reward model", lambda: run_stage("rm", {**rm, **settings["rm"], **common}))
        stages.run("PPO (KL penalty on)", lambda: run_stage("ppo", {**ppo, "output_dir": f"{out}/ppo"}))
        if ablation and not spare:
            stages.run(no_kl_name, lambda: run_stage("ppo", no_kl))
        stages.run("DPO", lambda: run_stage("dpo", {**dpo, "output_dir": f"{out}/dpo", **settings["dpo"], **common}))
        if gold_reward:
            stages.run(GOLD_REWARD_STAGE, lambda: run_stage("ppo", gold_ppo))
        if not spare:
            stages.run(iterated_name, lambda: run_stage("iterate", iterated), done_before=iterated_before)
        wait_for_children()
        if ablation and spare:
            in_child(no_kl_name, "ppo", no_kl, "ppo_no_kl.log")
        stages.run(
            online_name,
            lambda: run_stage("iterate", {**online, "threads": online_threads}),
            done_before=seconds_done(out / "online_dpo") if cfg.resume else 0.0,
        )
    except BaseException:
        for job in jobs:
            if job is not None:
                job.process.kill()
        raise
    wait_for_children()

    diagnostics: dict = {}

    def evaluate_all():
        prompts = [ex.prompt for ex in load_examples(data["prompts_eval"], "prompt", "rlhfkit demo")]
        prompts = prompts * run_plan.eval_samples  # the list repeated: samples 0..99 differ
        gen = GenerationArgs(**EVAL_GENERATION) if not cfg.quick else GenerationArgs(max_new_tokens=8)
        results = {}
        policies = {name: out / name for name in ("sft", "ppo", "ppo_no_kl", "dpo") if ablation or name != "ppo_no_kl"}
        if gold_reward:
            policies["ppo_gold"] = out / "ppo_gold"
        policies["iterated"] = out / "iterated" / "final"
        policies["online_dpo"] = out / "online_dpo" / "final"
        # the reward model and the reference loaded once for every policy (sampling draws from the seed alone)
        scorer = RewardScorer.load(str(out / "rm"), "cpu")
        reference = load_causal_lm(str(out / "sft"), tokenizer=load_tokenizer(str(out / "sft"))).eval()
        for name, policy in policies.items():
            metrics, rows = evaluate_policy(
                str(policy),
                prompts,
                gen,
                reward_model=scorer,
                reference=reference if name != "sft" else None,  # the SFT model's KL to itself is 0
                judge=get_judge("support"),
                seed=cfg.seed,
            )
            metrics.update(product_naming_shares([r["prompt"] for r in rows], [r["response"] for r in rows]))
            results[name] = {"metrics": metrics, "samples": rows}
        # how far the reward model carries: against the judge on the held-out pairs, and on each policy's own
        # replies (its samples of a prompt paired); best-of-N on the SFT model is the headroom RL starts from
        held_out = pair_agreement(
            scorer, get_judge("support"), load_tokenizer(str(out / "sft")), read_jsonl(data["prefs_eval"])
        )
        on_policy = {name: sample_diagnostics(r["samples"]) for name, r in results.items()}
        diagnostics.update({"held_out": held_out, "policies": on_policy})
        return results

    def evaluate_alone():
        with cpu_threads(alone):
            return evaluate_all()

    results = stages.run("evaluation on held-out prompts", evaluate_alone, keep=False)
    ceiling = label_noise_ceiling(read_jsonl(data["prefs_eval"]))
    summary = write_report(
        out,
        results,
        ceiling,
        stages,
        time.perf_counter() - start + stages.earlier_seconds,
        cfg.quick,
        run_plan,
        cfg.model,
        cfg.seed,
        diagnostics=diagnostics,
    )
    announce_report(out)
    return summary
