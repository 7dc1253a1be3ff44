"""The reward model of `rlhfkit iterate`: the first one (--reward-model, or trained on --prefs), and each round's
update on every pair so far with the settings it was trained with, measured on a held-out share of the round's
new pairs before and after."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import time
from pathlib import Path

from rlhfkit.commands import execute
from rlhfkit.config.commands import RMConfig
from rlhfkit.config.iterate import IterateConfig
from rlhfkit.config.parse import load_yaml
from rlhfkit.config.parts import DataArgs, LoraArgs, ModelArgs, OptimArgs
from rlhfkit.data.schema import load_examples
from rlhfkit.errors import UserError, option
from rlhfkit.files import write_json, write_jsonl
from rlhfkit.iterated.models import pair_accuracies
from rlhfkit.iterated.runs import COMMAND, ROUND_FILE, run_args
from rlhfkit.models.reward import ENSEMBLE_FILE, STATS_FILE
from rlhfkit.trainers import rm

logger = logging.getLogger(__name__)

MIN_HELDOUT_NOTE = 8  # held-out pairs from which an unmoved accuracy is worth a line (on fewer it is often chance)


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


def trained_options(model_dir: Path) -> dict:
    """The options a model was trained with: the config.yaml its command saved beside it ({} when none)."""
    path = model_dir / "config.yaml"
    return load_yaml(str(path)) if path.is_file() else {}


def split_heldout(prefs: list[dict], share: float, seed: int) -> tuple[list[dict], list[dict]]:
    """``prefs`` split at random (seeded) into (trained on, held out), ``share`` of them held out (at least one
    when ``share`` > 0 and there are two pairs or more), each part in its original order."""
    n = round(share * len(prefs))
    n = max(1, n) if share > 0 and len(prefs) >= 2 else 0
    order = list(range(len(prefs)))
    random.Random(seed).shuffle(order)
    held = set(order[:n])
    return [p for i, p in enumerate(prefs) if i not in held], [p for i, p in enumerate(prefs) if i in held]


class RewardModels:
    """The loop's reward models, round by round (``first``, then ``round`` for each round)."""

    def __init__(self, cfg: IterateConfig, out: Path, device):
        self.cfg, self.out, self.device = cfg, out, device
        self.sft, self.trust = cfg.model.model, cfg.model.trust_remote_code

    def settings(self, start: str | None) -> tuple[float, int, LoraArgs]:
        """The learning rate, batch size and LoRA settings of a reward model's training from ``start`` (a reward
        model's folder, or None for the first one from --model): --rm-learning-rate / --rm-batch-size when given,
        else what ``start`` was trained with (its config.yaml), else `rlhfkit rm`'s defaults. A model trained at
        1e-3 and continued at 2e-5 would not move."""
        saved = trained_options(Path(start)) if start else {}
        it, default = self.cfg.iterate, RMConfig().optim
        rate = it.rm_learning_rate or saved.get("learning_rate") or default.learning_rate
        batch = it.rm_batch_size or saved.get("batch_size") or default.batch_size
        lora = LoraArgs(**{f.name: saved[f.name] for f in dataclasses.fields(LoraArgs) if f.name in saved})
        if it.rm_lora_r:
            lora = dataclasses.replace(self.cfg.lora, lora_r=it.rm_lora_r)
        # saved as the run's policies are: merged, or (--save-merged false) the adapter the next round loads on its base
        return float(rate), int(batch), dataclasses.replace(lora, save_merged=self.cfg.lora.save_merged)

    def config(
        self, model: str, data: str, out: Path, steps: int, seed: int, start: str | None, ensemble: int = 1
    ) -> RMConfig:
        c = self.cfg
        rate, batch, lora = self.settings(start)
        return RMConfig(
            model=ModelArgs(model=model, trust_remote_code=self.trust),
            lora=lora,
            data=DataArgs(data=data, max_length=c.data.max_length, max_prompt_length=c.data.max_prompt_length),
            reward=dataclasses.replace(c.rm_reward, ensemble=ensemble),
            optim=OptimArgs(
                learning_rate=rate,
                batch_size=batch,
                max_steps=steps,
                max_grad_norm=c.optim.max_grad_norm,
            ),
            packing=dataclasses.replace(c.packing),
            run=run_args(self.cfg, out, seed),
        )

    def first(self) -> str:
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
            rm_cfg = self.config(self.sft, it.prefs, out, steps, self.cfg.run.seed, None, self.cfg.rm_reward.ensemble)
            rm_cfg.check()
            start = time.perf_counter()
            execute("rm", rm_cfg)
            write_json(self.out / "round-0" / ROUND_FILE, {"seconds": round(time.perf_counter() - start, 1)})
        return str(out)

    def update(self, previous: str, data: Path, out: Path, round_k: int) -> str:
        """``previous`` (each member from its own weights) trained --rm-steps more on ``data`` into ``out``."""
        steps = self.cfg.iterate.rm_steps
        if steps == 0:
            return previous
        members = _members(Path(previous))
        if rm_finished(out, len(members)):
            return str(out)
        examples = load_examples(str(data), "preference", COMMAND)
        for i, member in enumerate(members):
            seed = self.cfg.run.seed + 1000 * round_k + i
            member_cfg = self.config(str(Path(previous) / member), str(data), out / member, steps, seed, previous)
            member_cfg.check()
            rm.train_one(member_cfg, examples, [])
        if len(members) > 1:
            root_cfg = self.config(str(Path(previous)), str(data), out, steps, self.cfg.run.seed, previous)
            root_cfg.reward.ensemble = len(members)
            rm.write_ensemble(root_cfg, [out / m for m in members], examples, [])
        return str(out)

    def round(
        self,
        reward_model: str,
        prefs: list[dict],
        offline: list[dict],
        collected: list[dict],
        round_dir: Path,
        k: int,
        clock,
    ) -> tuple[str, dict]:
        """Steps 3-4 of a PPO round: the reward model's accuracy on the round's new pairs, then its update on every
        pair so far but the round's held-out share, and its accuracy on that share before and after."""
        c, it = self.cfg, self.cfg.iterate

        def accuracies(model: str, *row_sets: list[dict]) -> list:
            return clock("rm_accuracy", lambda: pair_accuracies(model, list(row_sets), self.device, self.trust))

        trained, held = split_heldout(prefs, it.rm_holdout, c.run.seed + k)
        write_jsonl(round_dir / "heldout.jsonl", held)
        before, held_before = accuracies(reward_model, prefs, held)
        shown = "-" if before is None else f"{before:.3f}"
        logger.info(f"round {k}: {len(prefs)} labelled pairs; the reward model's accuracy on them {shown}")
        data = round_dir / "rm_data.jsonl"
        write_jsonl(data, offline + collected + trained)
        updated = clock("rm", lambda: self.update(reward_model, data, round_dir / "rm", k))
        (held_after,) = accuracies(updated, held)
        if held:
            logger.info(
                f"round {k}: the reward model's accuracy on {len(held)} held-out new pairs {held_before:.3f} before "
                f"its update, {held_after:.3f} after"
            )
        if len(held) >= MIN_HELDOUT_NOTE and it.rm_steps and held_after == held_before:
            rate, _, _ = self.settings(reward_model)
            logger.warning(
                f"round {k}: the reward model's update left its accuracy on the {len(held)} held-out pairs at "
                f"{held_before:.3f}: its learning rate ({rate:g}, {option('rm_learning_rate')}) or "
                f"{option('rm_steps')} ({it.rm_steps}) may be too small to move it"
            )
        return updated, {
            "rm_accuracy_new_pairs": before,
            "heldout_pairs": len(held),
            "rm_accuracy_heldout_before": held_before,
            "rm_accuracy_heldout_after": held_after,
            "rm_pairs": len(offline) + len(collected) + len(trained),
        }
