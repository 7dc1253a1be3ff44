"""`rlhfkit iterate`: rounds of (pairs from the current policy -> labels -> reward model updated -> PPO
continued), composed of the commands' own runs (``rm``, ``ppo``), each round's models plain Hugging Face
folders:

    OUT/round-0/rm/            the first reward model, trained on --prefs (absent with --reward-model)
    OUT/round-0/round.json     how long it took
    OUT/round-K/candidates.jsonl  the prompts and the policy's two replies to each (the pairs to judge)
    OUT/round-K/pairs.jsonl    the judged pairs as preference rows (written once labelled: a restart keeps them)
    OUT/round-K/labels/        with --judge human: the round's label store and its export (of to_label.jsonl)
    OUT/round-K/rm_data.jsonl  all pairs so far, what the reward model continued on
    OUT/round-K/rm/            the reward model after round K
    OUT/round-K/ppo/           the policy after round K (value/: its value model)
    OUT/round-K/round.json     the round's record, with its seconds per phase (written last: the round is done)
    OUT/final/                 the last policy
    OUT/config.yaml            this run's options (`rlhfkit iterate --config OUT/config.yaml` repeats it)
    OUT/summary.json           per round: labels, the old reward model's accuracy on the new pairs, reward, KL,
                               gold (with --gold-judge); totals

Per round K (policy pi_{K-1}, reward model R_{K-1}, value model V_{K-1}):
  1. sample two replies to each of --pairs-per-round prompts from pi_{K-1};
  2. the judge labels them (a function, or people on the labelling page); -1 and identical replies drop out;
  3. R_{K-1}'s accuracy on these new on-policy pairs is measured (what the round's labels teach it);
  4. R_K = R_{K-1} trained --rm-steps more on all pairs so far (--prefs and rounds 1..K);
  5. pi_K, V_K = PPO from pi_{K-1}, V_{K-1} against R_K for --max-steps, with the KL to --model (the SFT model).
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path

from rlhfkit.config.commands import RMConfig
from rlhfkit.config.iterate import HUMAN, IterateConfig
from rlhfkit.config.online import PPOConfig
from rlhfkit.config.parse import save_config
from rlhfkit.config.parts import DataArgs, ModelArgs, OptimArgs, RunArgs
from rlhfkit.data.schema import load_examples
from rlhfkit.errors import UserError, option
from rlhfkit.iterated.judges import load_judge
from rlhfkit.iterated.models import VALUE_DIR, copy_model, pair_accuracy, sample_pairs, save_value_model
from rlhfkit.models.reward import ENSEMBLE_FILE, STATS_FILE
from rlhfkit.training.runtime import pick_device

ROUND_FILE = "round.json"
COMMAND = "rlhfkit iterate"


def _write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def usable(row: dict) -> bool:
    """Whether a candidate pair can be judged and trained on: two different, non-empty replies."""
    a, b = row["responses"]
    return a != b and bool(a.strip()) and bool(b.strip())


def rm_finished(path: Path, members: int = 1) -> bool:
    """Whether ``path`` holds a finished reward model of ``members`` members (a model's statistics are written
    last, and an ensemble's list after all its members)."""
    return (path / (ENSEMBLE_FILE if members > 1 else STATS_FILE)).is_file()


def _members(rm_dir: Path) -> list[str]:
    """The member folders of a reward model relative to it ("." for a single model)."""
    path = rm_dir / ENSEMBLE_FILE
    if not path.is_file():
        return ["."]
    info = json.loads(path.read_text(encoding="utf-8"))
    return list(info.get("members", ["."]))


def _metrics_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return _read_jsonl(path) if path.is_file() else []


def _last_mean(rows: list[dict], key: str, k: int = 5) -> float | None:
    """The mean of ``key`` over the last ``k`` logged steps that have it (None if none)."""
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return sum(values[-k:]) / len(values[-k:]) if values else None


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

    # -- the reward model -----------------------------------------------------------------------------------

    def _rm_config(self, model: str, data: str, out: Path, steps: int, seed: int, ensemble: int = 1) -> RMConfig:
        c = self.cfg
        return RMConfig(
            model=ModelArgs(model=model, trust_remote_code=self.trust),
            data=DataArgs(data=data, max_length=c.data.max_length, max_prompt_length=c.data.max_prompt_length),
            reward=dataclasses.replace(c.rm_reward, ensemble=ensemble),
            optim=OptimArgs(
                learning_rate=c.iterate.rm_learning_rate,
                batch_size=c.iterate.rm_batch_size,
                max_steps=steps,
                max_grad_norm=c.optim.max_grad_norm,
            ),
            packing=dataclasses.replace(c.packing),
            run=RunArgs(
                output_dir=str(out),
                overwrite_output_dir=True,  # what a stopped run left of this unfinished model is replaced
                seed=seed,
                logging_steps=c.run.logging_steps,
                mixed_precision=c.run.mixed_precision,
                cpu=c.run.cpu,
                progress=c.run.progress,
            ),
        )

    def first_reward_model(self) -> str:
        """--reward-model, or one trained on --prefs from --model into OUT/round-0/rm."""
        if self.cfg.reward.reward_model:
            return self.cfg.reward.reward_model
        out = self.out / "round-0" / "rm"
        if not rm_finished(out, self.cfg.rm_reward.ensemble):
            it = self.cfg.iterate
            steps = it.rm_initial_steps or it.rm_steps
            if steps == 0:
                raise UserError(
                    f"{option('rm_steps')} or {option('rm_initial_steps')} must be > 0 to train on {option('prefs')}"
                )
            rm_cfg = self._rm_config(self.sft, it.prefs, out, steps, self.cfg.run.seed, self.cfg.rm_reward.ensemble)
            rm_cfg.check()
            start = time.perf_counter()
            _execute("rm", rm_cfg)
            _write_json(self.out / "round-0" / ROUND_FILE, {"seconds": round(time.perf_counter() - start, 1)})
        return str(out)

    def first_rm_seconds(self) -> float:
        """How long training the first reward model took (0 with --reward-model; recorded once, so a resumed
        run's totals still count it)."""
        path = self.out / "round-0" / ROUND_FILE
        return json.loads(path.read_text(encoding="utf-8"))["seconds"] if path.is_file() else 0.0

    def update_reward_model(self, previous: str, data: Path, out: Path, round_k: int) -> str:
        """``previous`` (each member from its own weights) trained --rm-steps more on ``data`` into ``out``."""
        from rlhfkit.trainers import rm

        steps = self.cfg.iterate.rm_steps
        if steps == 0:
            return previous
        members = _members(Path(previous))
        if rm_finished(out, len(members)):
            return str(out)
        examples = load_examples(str(data), "preference", COMMAND)
        for i, member in enumerate(members):
            seed = self.cfg.run.seed + 1000 * round_k + i
            member_cfg = self._rm_config(str(Path(previous) / member), str(data), out / member, steps, seed)
            member_cfg.check()
            rm.train_one(member_cfg, examples, [])
        if len(members) > 1:
            root_cfg = self._rm_config(str(Path(previous)), str(data), out, steps, self.cfg.run.seed)
            root_cfg.reward.ensemble = len(members)
            rm.write_ensemble(root_cfg, [out / m for m in members], examples, [])
        return str(out)

    # -- the pairs ------------------------------------------------------------------------------------------

    def candidates(self, round_dir: Path, policy: str, examples: list, round_k: int) -> list[dict]:
        """Round K's prompts with the policy's two replies (sampled once: a restart reads them back)."""
        path = round_dir / "candidates.jsonl"
        if path.is_file():
            return _read_jsonl(path)
        n = self.cfg.iterate.pairs_per_round
        order = list(range(len(examples)))
        random.Random(self.cfg.run.seed).shuffle(order)
        start = (round_k - 1) * n
        picked = [examples[order[(start + i) % len(order)]] for i in range(n)]
        pairs = sample_pairs(
            policy,
            [ex.prompt for ex in picked],
            self.cfg.generation,
            self.cfg.data.max_prompt_length,
            self.cfg.optim.batch_size,
            self.device,
            self.cfg.run.seed + round_k,
            self.trust,
        )
        rows = [
            {"prompt": ex.prompt, "responses": [a, b], **{k: v for k, v in ex.extra.items() if k != "responses"}}
            for ex, (a, b) in zip(picked, pairs)
        ]
        round_dir.mkdir(parents=True, exist_ok=True)
        _write_jsonl(path, rows)
        return rows

    def labels(self, round_dir: Path, rows: list[dict], judge, human) -> tuple[list[dict], dict]:
        """The round's preference rows (``pairs.jsonl``) and counts (``labels.json``), from the judge function or
        from people on the page; read back when the round was labelled before a restart."""
        path, counts_path = round_dir / "pairs.jsonl", round_dir / "labels.json"
        if path.is_file():
            return _read_jsonl(path), json.loads(counts_path.read_text(encoding="utf-8"))
        if human is not None:
            to_label = round_dir / "to_label.jsonl"
            if not to_label.is_file():
                _write_jsonl(to_label, [r for r in rows if usable(r)])
            prefs = human.label(round_dir, to_label, self.cfg.iterate.min_labels)
            counts = {"pairs": len(rows), "unusable": sum(not usable(r) for r in rows)}
        else:
            prefs, counts = self.judge_pairs(judge, rows)
        _write_json(counts_path, counts)
        _write_jsonl(path, prefs)  # last: its presence means the round is labelled
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

    def ppo_config(self, policy: str, reward_model: str, value_model: str, out: Path, round_k: int) -> PPOConfig:
        c = self.cfg
        parts = {f.name: dataclasses.replace(getattr(c, f.name)) for f in dataclasses.fields(PPOConfig)}
        ppo = PPOConfig(**parts)
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
        ppo.check()
        return ppo

    # -- the loop -------------------------------------------------------------------------------------------

    def run(self) -> dict:
        c, it = self.cfg, self.cfg.iterate
        examples = load_examples(c.data.data, "prompt", COMMAND)
        judge = HUMAN if it.judge == HUMAN else load_judge(it.judge, c.run.seed)
        if it.prefs:
            load_examples(it.prefs, "preference", COMMAND)  # every row checked before anything is trained
        started = [p for p in self.out.glob("round-*") if p.is_dir()] if self.out.is_dir() else []
        if started and c.run.overwrite_output_dir and not c.run.resume:
            from rlhfkit.training.session import clear_output_dir

            clear_output_dir(c, self.out)
        elif started and not c.run.resume:
            raise UserError(
                f"{self.out}: holds the rounds of an earlier run; continue it with {option('resume', True)} or "
                f"give {option('overwrite_output_dir', True)} to replace them, or a new {option('output_dir')}"
            )
        self.out.mkdir(parents=True, exist_ok=True)
        save_config(c, self.out)
        human = None
        if judge == HUMAN:
            from rlhfkit.iterated.human import HumanJudge

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
        reward_model = self.first_reward_model()
        first_rm, first_rm_seconds = reward_model, self.first_rm_seconds()
        policy = self.sft
        value_model = c.critic.value_model or reward_model  # the value model starts from the reward model
        offline = [_preference_row(ex) for ex in load_examples(it.prefs, "preference", COMMAND)] if it.prefs else []
        collected: list[dict] = []
        records: list[dict] = []
        for k in range(1, it.rounds + 1):
            round_dir = self.out / f"round-{k}"
            done = round_dir / ROUND_FILE
            ppo_dir = round_dir / "ppo"
            if done.is_file():
                record = json.loads(done.read_text(encoding="utf-8"))
                collected += _read_jsonl(round_dir / "pairs.jsonl")
                records.append(record)
                reward_model, policy = record["reward_model"], str(ppo_dir)
                value_model = str(ppo_dir / VALUE_DIR) if (ppo_dir / VALUE_DIR).is_dir() else value_model
                continue
            start = time.perf_counter()
            clock = _Phases()
            # 1-2. pairs from the current policy, judged (once: a restart reads the labels back)
            rows = clock("sample", lambda: self.candidates(round_dir, policy, examples, k))
            prefs, counts = clock("label", lambda: self.labels(round_dir, rows, judge, human))
            # 3. how well the reward model so far predicts the labels of the policy's own replies
            pack = c.packing.pack_sequences
            accuracy = clock("rm_accuracy", lambda: pair_accuracy(reward_model, prefs, self.device, self.trust, pack))
            shown = "-" if accuracy is None else f"{accuracy:.3f}"
            print(f"round {k}: {len(prefs)} labelled pairs; the reward model's accuracy on them {shown}", flush=True)
            # 4. the reward model continued on every pair so far
            collected += prefs
            data = round_dir / "rm_data.jsonl"
            _write_jsonl(data, offline + collected)
            reward_model = clock("rm", lambda: self.update_reward_model(reward_model, data, round_dir / "rm", k))
            after = clock("rm_accuracy", lambda: pair_accuracy(reward_model, prefs, self.device, self.trust, pack))
            # 5. PPO continued from the last policy and value model, against the new reward model
            ppo_cfg = self.ppo_config(policy, reward_model, value_model, ppo_dir, k)
            clock("ppo", lambda: _execute("ppo", ppo_cfg))
            policy = str(ppo_dir)
            if ppo_cfg.needs_critic:
                value_model = str(clock("ppo", lambda: save_value_model(ppo_dir, value_model, self.trust, c.lora)))
            metrics = _metrics_rows(ppo_dir)
            record = {
                "round": k,
                "labels": len(prefs),
                **counts,
                "rm_accuracy_new_pairs": accuracy,
                "rm_accuracy_new_pairs_after_update": after,
                "rm_pairs": len(offline) + len(collected),
                "rm_steps": it.rm_steps,
                "ppo_steps": c.optim.max_steps,
                "reward": _last_mean(metrics, "reward/score"),
                "kl": _last_mean(metrics, "kl/ref"),
                "gold": _last_mean(metrics, "reward/gold", 1),
                "seconds": round(time.perf_counter() - start, 1),
                "phase_seconds": clock.seconds,
                "reward_model": reward_model,
                "policy": policy,
            }
            _write_json(done, record)
            records.append(record)
            _write_json(self.out / "summary.json", _summary(records, first_rm, first_rm_seconds))
        copy_model(Path(policy), self.out / "final")
        summary = _summary(records, first_rm, first_rm_seconds)
        _write_json(self.out / "summary.json", summary)
        print(f"final policy saved to {(self.out / 'final').resolve()}", flush=True)
        return summary


def _preference_row(ex) -> dict:
    """A preference example as the row `rlhfkit rm` reads (whatever format the file gave it in)."""
    row = {"prompt": ex.prompt, "chosen": ex.chosen, "rejected": ex.rejected}
    return {**row, "margin": ex.margin} if ex.margin is not None else row


def _summary(records: list[dict], first_rm: str, first_rm_seconds: float) -> dict:
    finite = [r["rm_accuracy_new_pairs"] for r in records if r["rm_accuracy_new_pairs"] is not None]
    return {
        "rounds": records,
        "first_reward_model": first_rm,
        "first_reward_model_seconds": first_rm_seconds,
        "totals": {
            "rounds": len(records),
            "labels": sum(r["labels"] for r in records),
            "rm_steps": sum(r["rm_steps"] for r in records),
            "ppo_steps": sum(r["ppo_steps"] for r in records),
            "seconds": round(first_rm_seconds + sum(r["seconds"] for r in records), 1),  # first RM's too
        },
        "rm_accuracy_new_pairs": finite,
    }


def _execute(command: str, config) -> dict:
    from rlhfkit.cli.main import execute

    return execute(command, config)


def run(cfg: IterateConfig) -> dict:
    """Entry point of `rlhfkit iterate`; returns the summary (also in OUT/summary.json)."""
    return Iteration(cfg).run()
