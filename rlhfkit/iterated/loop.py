"""`rlhfkit iterate`: rounds of (pairs from the current policy -> labels -> reward model updated -> PPO
continued), or with ``--algorithm dpo`` (pairs -> labels -> DPO continued), composed of the commands' own runs
(``rm``, ``ppo``, ``dpo``), each round's models plain Hugging Face folders:

    OUT/round-0/rm/            the first reward model, trained on --prefs (absent with --reward-model)
    OUT/round-0/dpo/           with --algorithm dpo and --prefs: DPO on them from --model
    OUT/round-0/round.json     how long it took
    OUT/round-K/sampling.json  the round's collapse watch: distinct replies, near-identical pairs, who sampled
    OUT/round-K/candidates.jsonl  the prompts and the two replies to each (the pairs to judge)
    OUT/round-K/pairs.jsonl    the judged pairs as preference rows (written once labelled: a restart keeps them)
    OUT/round-K/heldout.jsonl  the part of them the round's reward-model update does not train on
    OUT/round-K/labels/        with --judge human (or human+model:PATH, for people's share): the round's label
                               store and its export (of to_label.jsonl)
    OUT/round-K/rm_data.jsonl  the pairs the reward model continued on
    OUT/round-K/rm/            the reward model after round K
    OUT/round-K/ppo/           the policy after round K (value/: its value model); with dpo: OUT/round-K/dpo/
    OUT/round-K/round.json     the round's record, with its seconds per phase (written last: the round is done)
    OUT/final/                 the last policy
    OUT/config.yaml            this run's options (`rlhfkit iterate --config OUT/config.yaml` repeats it)
    OUT/summary.json           per round: labels, the reward model's accuracy on the new pairs and on the
                               held-out ones before / after its update, reward, KL, gold (with --gold-judge),
                               the collapse watch; totals

Per round K (policy pi_{K-1}, reward model R_{K-1}, value model V_{K-1}):
  1. sample two replies to each of --pairs-per-round prompts from pi_{K-1}; when --collapse-similar of its
     pairs or more are near-identical (and more than the starting policy's), pi_{K-1} has collapsed: the second
     reply of each pair comes from the last policy that had not, so the judge still sees replies that differ;
  2. the judge labels them (a function, a local model, or people on the labelling page, or people a share and a
     model the rest); -1 and identical replies drop out;
  3. R_{K-1}'s accuracy on these new on-policy pairs is measured (what the round's labels teach it), and on a
     held-out share (--rm-holdout) that the update does not train on;
  4. R_K = R_{K-1} trained --rm-steps more on all pairs so far but the held-out ones, with the settings it was
     trained with (learning rate, batch size, LoRA; options override); its held-out accuracy is measured again;
  5. pi_K, V_K = PPO from pi_{K-1}, V_{K-1} against R_K for --max-steps, with the KL to --model (the SFT model).
With --algorithm dpo, steps 3-5 are: pi_K = DPO from pi_{K-1} on the round's pairs, the reference --model.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import shutil
import time
from pathlib import Path

from rlhfkit.commands import execute
from rlhfkit.config.iterate import HUMAN, IterateConfig, needs_people
from rlhfkit.config.online import PPOConfig
from rlhfkit.config.parse import save_config
from rlhfkit.data.schema import load_examples
from rlhfkit.errors import UserError, option
from rlhfkit.files import read_jsonl, write_json, write_jsonl
from rlhfkit.iterated.health import collapsed, distinct_share, similar_share
from rlhfkit.iterated.human import HumanJudge
from rlhfkit.iterated.judges import judge_record, load_judge
from rlhfkit.iterated.mixed import mixed_labels
from rlhfkit.iterated.models import VALUE_DIR, copy_model, sample_replies, save_value_model
from rlhfkit.iterated.online_dpo import OnlineDPO
from rlhfkit.iterated.reward_models import RewardModels
from rlhfkit.iterated.runs import COMMAND, OPTIMIZER_FILE, ROUND_FILE, keep_optimizer_state, last_mean, metrics_rows
from rlhfkit.training.runtime import pick_device
from rlhfkit.training.session import clear_output_dir

logger = logging.getLogger(__name__)


def usable(row: dict) -> bool:
    """Whether a candidate pair can be judged and trained on: two different, non-empty replies."""
    a, b = row["responses"]
    return a != b and bool(a.strip()) and bool(b.strip())


class _Phases:
    """Seconds per phase of a round (sample, label, rm_accuracy, rm, ppo), summed over a phase's calls."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str, fn):
        start = time.perf_counter()
        result = fn()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 1)
        return result


class Iteration:
    """One run of `rlhfkit iterate` (see the module docstring)."""

    def __init__(self, cfg: IterateConfig):
        self.cfg = cfg
        self.out = Path(cfg.run.output_dir)
        self.sft = cfg.model.model
        self.device = pick_device(cfg.run.cpu)
        self.trust = cfg.model.trust_remote_code
        self.reward_models = RewardModels(cfg, self.out, self.device)
        self.dpo = OnlineDPO(cfg, self.out, self.device)

    def first_seconds(self) -> float:
        """How long the first stage took (the first reward model, or with dpo the first DPO; 0 with
        --reward-model; recorded once, so a resumed run's totals still count it)."""
        path = self.out / "round-0" / ROUND_FILE
        return json.loads(path.read_text(encoding="utf-8"))["seconds"] if path.is_file() else 0.0

    # -- the pairs ------------------------------------------------------------------------------------------

    def candidates(
        self, round_dir: Path, policy: str, examples: list, round_k: int, baseline: float | None, healthy: str
    ) -> tuple[list[dict], dict]:
        """Round K's prompts with two replies to each, and the round's sampling record (``sampling.json``): the
        policy's share of distinct replies, its share of near-identical pairs, and whether it has collapsed (that
        share at --collapse-similar or more, and above ``baseline``, the starting policy's). A collapsed policy's
        second replies come from ``healthy``, the last policy that had not. Sampled once: a restart reads both
        back."""
        path, record_path = round_dir / "candidates.jsonl", round_dir / "sampling.json"
        if path.is_file() and record_path.is_file():
            return read_jsonl(path), json.loads(record_path.read_text(encoding="utf-8"))
        n = self.cfg.iterate.pairs_per_round
        order = list(range(len(examples)))
        random.Random(self.cfg.run.seed).shuffle(order)
        start = (round_k - 1) * n
        picked = [examples[order[(start + i) % len(order)]] for i in range(n)]
        prompts = [ex.prompt for ex in picked]
        pairs = self._replies(policy, prompts, round_k, 2)
        similar = similar_share(pairs)
        threshold = self.cfg.iterate.collapse_similar
        record = {
            "distinct_replies": round(distinct_share([r for pair in pairs for r in pair]), 4),
            "similar_pairs": round(similar, 4),
            "collapsed": baseline is not None and policy != healthy and collapsed(similar, baseline, threshold),
            "sampled_from": [policy, policy],
        }
        if record["collapsed"]:
            others = self._replies(healthy, prompts, round_k, 1)
            pairs = [(a, other[0]) for (a, _), other in zip(pairs, others)]
            record["sampled_from"] = [policy, healthy]
            record["similar_pairs_after"] = round(similar_share(pairs), 4)
            logger.info(
                f"round {round_k}: the policy has collapsed ({similar:.0%} of its pairs near-identical, "
                f"{baseline:.0%} at the start); each pair's second reply comes from {healthy}"
            )
        rows = [
            {"prompt": ex.prompt, "responses": [a, b], **{k: v for k, v in ex.extra.items() if k != "responses"}}
            for ex, (a, b) in zip(picked, pairs)
        ]
        round_dir.mkdir(parents=True, exist_ok=True)
        write_json(record_path, record)
        write_jsonl(path, rows)
        return rows, record

    def _replies(self, policy: str, prompts: list, round_k: int, per_prompt: int) -> list[tuple[str, ...]]:
        c = self.cfg
        return sample_replies(
            policy,
            prompts,
            c.generation,
            c.data.max_prompt_length,
            c.optim.batch_size,
            self.device,
            c.run.seed + round_k,
            self.trust,
            per_prompt,
        )

    def labels(self, round_dir: Path, rows: list[dict], judge, human) -> tuple[list[dict], dict]:
        """The round's preference rows (``pairs.jsonl``) and counts (``labels.json``), from the judge function or
        from people on the page; read back when the round was labelled before a restart."""
        path, counts_path = round_dir / "pairs.jsonl", round_dir / "labels.json"
        if path.is_file():
            return read_jsonl(path), json.loads(counts_path.read_text(encoding="utf-8"))
        if human is not None and judge != HUMAN:  # people label a share, a model judge the rest
            it, distinct = self.cfg.iterate, [r for r in rows if usable(r)]
            prefs, counts = mixed_labels(
                round_dir, distinct, judge, human, it.human_share, self.cfg.run.seed, it.min_labels
            )
            counts = {"pairs": len(rows), "unusable": len(rows) - len(distinct), **counts}
        elif human is not None:
            to_label = round_dir / "to_label.jsonl"
            if not to_label.is_file():
                write_jsonl(to_label, [r for r in rows if usable(r)])
            prefs = human.label(round_dir, to_label, self.cfg.iterate.min_labels)
            counts = {"pairs": len(rows), "unusable": sum(not usable(r) for r in rows)}
        else:
            prefs, counts = self.judge_pairs(judge, rows)
            counts.update(judge_record(judge))  # a model judge's ties, order consistency and confidence
        write_json(counts_path, counts)
        write_jsonl(path, prefs)  # last: its presence means the round is labelled
        return prefs, counts

    def judge_pairs(self, judge, rows: list[dict]) -> tuple[list[dict], dict]:
        """The judge function's preference rows over the usable pairs, and the counts of what was dropped."""
        distinct = [r for r in rows if usable(r)]
        columns = {k: [r.get(k) for r in distinct] for k in dict.fromkeys(k for r in distinct for k in r)}
        for k in ("prompt", "responses"):
            columns.pop(k, None)
        answers = judge([r["prompt"] for r in distinct], [list(r["responses"]) for r in distinct], columns)
        prefs = []
        for r, answer in zip(distinct, answers):
            if answer == -1:
                continue
            a, b = r["responses"]
            chosen, rejected = (a, b) if answer == 0 else (b, a)
            prefs.append({"prompt": r["prompt"], "chosen": chosen, "rejected": rejected})
        counts = {"pairs": len(rows), "unusable": len(rows) - len(distinct), "no_preference": answers.count(-1)}
        return prefs, counts

    # -- PPO ------------------------------------------------------------------------------------------------

    def ppo_config(
        self,
        policy: str,
        reward_model: str,
        value_model: str,
        out: Path,
        round_k: int,
        kl_coef: float | None = None,
        carried: Path | None = None,
    ) -> PPOConfig:
        """One round's PPO: the run's PPO options, from ``policy`` against ``reward_model``, the KL coefficient
        ``kl_coef`` (None: --kl-coef); with --carry-optimizer, from the optimizer state ``carried`` (the last
        round's; None in round 1) on one schedule over every round's steps."""
        c = self.cfg
        parts = {f.name: dataclasses.replace(getattr(c, f.name)) for f in dataclasses.fields(PPOConfig)}
        ppo = PPOConfig(**parts)
        if kl_coef is not None:
            ppo.kl.kl_coef = kl_coef
        ppo.model.model = policy
        ppo.reward.reward_model = reward_model
        if ppo.needs_critic:
            ppo.critic.value_model = value_model
        if not c.kl.ref_model and not c.kl.ref_update_steps and policy != self.sft:
            ppo.kl.ref_model = self.sft  # the reference stays the SFT model in every round
        steps = c.optim.max_steps
        ppo.run.output_dir, ppo.run.resume, ppo.run.seed = str(out), False, c.run.seed + round_k
        ppo.run.overwrite_output_dir = True  # a round without its record is redone from its labels
        ppo.run.save_steps, ppo.run.save_total_limit = steps, 1  # the last step's checkpoint holds the value model
        if c.iterate.carry_optimizer:
            ppo.optim.optimizer_state = str(carried or "")
            ppo.optim.schedule_steps = c.iterate.rounds * steps
        ppo.check()
        return ppo

    def carry(self, run_dir: Path, drop_checkpoints: bool = False) -> Path | None:
        """With --carry-optimizer: the round's optimizer state, kept for the next round; else None."""
        if not self.cfg.iterate.carry_optimizer:
            return None
        kept = keep_optimizer_state(run_dir)
        if drop_checkpoints:
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        return kept

    # -- the loop -------------------------------------------------------------------------------------------

    def run(self) -> dict:
        c, it = self.cfg, self.cfg.iterate
        examples = load_examples(c.data.data, "prompt", COMMAND)
        judge = HUMAN if it.judge == HUMAN else load_judge(it.judge, c.run.seed, it.judge_principles)
        if it.prefs:
            load_examples(it.prefs, "preference", COMMAND)  # every row checked before anything is trained
        started = [p for p in self.out.glob("round-*") if p.is_dir()] if self.out.is_dir() else []
        if started and c.run.overwrite_output_dir and not c.run.resume:
            clear_output_dir(c, self.out)
        elif started and not c.run.resume:
            raise UserError(
                f"{self.out}: holds the rounds of an earlier run; continue it with {option('resume', True)} or "
                f"give {option('overwrite_output_dir', True)} to replace them, or a new {option('output_dir')}"
            )
        self.out.mkdir(parents=True, exist_ok=True)
        save_config(c, self.out)
        human = None
        if needs_people(it.judge):
            names = [n.strip() for n in it.annotators.split(",") if n.strip()]
            human = HumanJudge(
                self.out, names, it.labels_per_item, c.serve.host, c.serve.port, it.poll_seconds, it.guidelines
            )
        try:
            return self._rounds(examples, judge, human)
        finally:
            if human is not None:
                human.close()

    def _rounds(self, examples: list, judge, human) -> dict:
        c, it = self.cfg, self.cfg.iterate
        dpo = it.algorithm == "dpo"
        reward_model = None if dpo else self.reward_models.first()
        policy = self.dpo.first() if dpo else self.sft
        first_rm, first_seconds = reward_model, self.first_seconds()
        value_model = c.critic.value_model or reward_model  # the value model starts from the reward model
        healthy = policy  # the last policy that had not collapsed
        kl_coef = c.kl.kl_coef  # doubled each round the policy outran the reward model (--rm-trust)
        offline = [_preference_row(ex) for ex in load_examples(it.prefs, "preference", COMMAND)] if it.prefs else []
        collected: list[dict] = []
        records: list[dict] = []
        carried: Path | None = None  # --carry-optimizer: the last round's optimizer state
        for k in range(1, it.rounds + 1):
            round_dir = self.out / f"round-{k}"
            done = round_dir / ROUND_FILE
            run_dir = round_dir / ("dpo" if dpo else "ppo")
            baseline = records[0]["similar_pairs"] if records else None
            if done.is_file():
                record = json.loads(done.read_text(encoding="utf-8"))
                collected += read_jsonl(round_dir / "pairs.jsonl")
                records.append(record)
                if not record.get("collapsed"):  # (a record of an earlier version has no collapse watch)
                    healthy = record.get("sampled_from", [healthy])[0]
                reward_model, policy = record["reward_model"], str(run_dir)
                kl_coef = record.get("kl_coef", kl_coef)
                value_model = str(run_dir / VALUE_DIR) if (run_dir / VALUE_DIR).is_dir() else value_model
                carried = run_dir / OPTIMIZER_FILE if (run_dir / OPTIMIZER_FILE).is_file() else carried
                continue
            start = time.perf_counter()
            clock = _Phases()
            before = carried
            # 1-2. pairs from the current policy (a collapsed one's against the last healthy one), judged (once: a
            #      restart reads the labels back)
            rows, sampling = clock("sample", lambda: self.candidates(round_dir, policy, examples, k, baseline, healthy))
            if not sampling["collapsed"]:
                healthy = policy
            prefs, counts = clock("label", lambda: self.labels(round_dir, rows, judge, human))
            record = {"round": k, "labels": len(prefs), **counts, **sampling}
            if dpo:
                # 3-5. DPO continued from the policy on the round's pairs, the reference staying --model
                position = sum(r.get("dpo_steps", 0) for r in records)  # the schedule's steps so far
                dpo_cfg = self.dpo.config(policy, round_dir / "pairs.jsonl", len(prefs), run_dir, k, carried, position)
                if dpo_cfg is not None:
                    clock("dpo", lambda: execute("dpo", dpo_cfg))
                    policy = str(run_dir)
                    carried = self.carry(run_dir, drop_checkpoints=True)
                record.update(self.dpo.record(run_dir, dpo_cfg))
            else:
                reward_model, measured = self.reward_models.round(
                    reward_model, prefs, offline, collected, round_dir, k, clock
                )
                record.update(measured)
                accuracy = measured["rm_accuracy_new_pairs"]
                # from round 2 on: round 1's pairs are the starting policy's, where a low accuracy means a weak
                # reward model, not a policy that outran it
                if k > 1 and it.rm_trust and accuracy is not None and accuracy < it.rm_trust and kl_coef > 0:
                    kl_coef *= 2
                    logger.info(
                        f"round {k}: the reward model ranked the policy's new pairs at {accuracy:.3f}, under "
                        f"{option('rm_trust')} {it.rm_trust:g}: the policy outran it; KL coefficient now {kl_coef:g}"
                    )
                # 5. PPO continued from the last policy and value model, against the new reward model
                ppo_cfg = self.ppo_config(policy, reward_model, value_model, run_dir, k, kl_coef, carried)
                record["kl_coef"] = kl_coef
                clock("ppo", lambda: execute("ppo", ppo_cfg))
                policy = str(run_dir)
                carried = self.carry(run_dir)  # before the value model's save drops the checkpoints
                if ppo_cfg.needs_critic:
                    value_model = str(clock("ppo", lambda: save_value_model(run_dir, value_model, self.trust, c.lora)))
                metrics = metrics_rows(run_dir)
                record.update(
                    rm_steps=it.rm_steps,
                    ppo_steps=c.optim.max_steps,
                    reward=last_mean(metrics, "reward/score"),
                    reward_std=last_mean(metrics, "reward/score_std"),
                    kl=last_mean(metrics, "kl/ref"),
                    gold=last_mean(metrics, "reward/gold", 1),
                )
            collected += prefs
            record.update(
                seconds=round(time.perf_counter() - start, 1),
                phase_seconds=clock.seconds,
                reward_model=reward_model,
                policy=policy,
            )
            write_json(done, record)
            records.append(record)
            if before is not None and before != carried:  # only an unfinished round reads the state before its own
                before.unlink(missing_ok=True)
            write_json(self.out / "summary.json", _summary(records, first_rm, first_seconds))
        copy_model(Path(policy), self.out / "final")
        summary = _summary(records, first_rm, first_seconds)
        write_json(self.out / "summary.json", summary)
        logger.info(f"final policy saved to {(self.out / 'final').resolve()}")
        return summary


def _preference_row(ex) -> dict:
    """A preference example as the row `rlhfkit rm` reads (whatever format the file gave it in)."""
    row = {"prompt": ex.prompt, "chosen": ex.chosen, "rejected": ex.rejected}
    return {**row, "margin": ex.margin} if ex.margin is not None else row


def _summary(records: list[dict], first_rm: str | None, first_seconds: float) -> dict:
    finite = [r["rm_accuracy_new_pairs"] for r in records if r.get("rm_accuracy_new_pairs") is not None]
    return {
        "rounds": records,
        "first_reward_model": first_rm,
        "first_reward_model_seconds": first_seconds,
        "totals": {
            "rounds": len(records),
            "labels": sum(r["labels"] for r in records),
            "rm_steps": sum(r.get("rm_steps", 0) for r in records),
            "ppo_steps": sum(r.get("ppo_steps", 0) for r in records),
            "dpo_steps": sum(r.get("dpo_steps", 0) for r in records),
            "collapsed_rounds": sum(bool(r.get("collapsed")) for r in records),
            "seconds": round(first_seconds + sum(r["seconds"] for r in records), 1),  # the first model's too
        },
        "rm_accuracy_new_pairs": finite,
        "rm_accuracy_heldout": [
            [r.get("rm_accuracy_heldout_before"), r.get("rm_accuracy_heldout_after")]
            for r in records
            if "heldout_pairs" in r
        ],
    }


def run(cfg: IterateConfig) -> dict:
    """Entry point of `rlhfkit iterate`; returns the summary (also in OUT/summary.json)."""
    return Iteration(cfg).run()
