"""Online DPO, the control of `rlhfkit iterate --algorithm dpo`: the same rounds, judge and labels, with DPO
continued from the last policy on each round's new pairs instead of a reward model and PPO; the reference stays
--model (with --prefs, DPO first trains on them, as PPO's first reward model does)."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

from rlhfkit.commands import execute
from rlhfkit.config.commands import DPOArgs, DPOConfig
from rlhfkit.config.iterate import IterateConfig
from rlhfkit.config.parts import DataArgs, ModelArgs, OptimArgs
from rlhfkit.data.schema import load_examples
from rlhfkit.files import write_json
from rlhfkit.iterated.runs import COMMAND, ROUND_FILE, last_mean, metrics_rows, run_args


class OnlineDPO:
    """The loop's DPO stages (``first``, then ``config`` for each round's run and ``record`` of it)."""

    def __init__(self, cfg: IterateConfig, out: Path, device):
        self.cfg, self.out, self.device = cfg, out, device
        self.sft, self.trust = cfg.model.model, cfg.model.trust_remote_code

    def config(
        self,
        policy: str,
        data: Path,
        pairs: int,
        out: Path,
        round_k: int,
        carried: Path | None = None,
        position: int = 0,
    ) -> DPOConfig | None:
        """DPO from ``policy`` on the ``pairs`` rows of ``data`` for --dpo-epochs passes at --learning-rate, the
        reference --model (None when there are no pairs to learn from). With --carry-optimizer (rounds 1 on), from
        the optimizer state ``carried`` (None: afresh) on a schedule that has run ``position`` steps and decays to
        0 at the end of the last round, each round left taking as many steps as this one."""
        c, it = self.cfg, self.cfg.iterate
        if pairs == 0:
            return None
        batch = min(DPOConfig().optim.batch_size, pairs)
        steps = max(1, math.ceil(it.dpo_epochs * pairs / batch))
        cfg = DPOConfig(
            model=ModelArgs(model=policy, trust_remote_code=self.trust),
            lora=dataclasses.replace(c.lora),
            data=DataArgs(data=str(data), max_length=c.data.max_length, max_prompt_length=c.data.max_prompt_length),
            dpo=DPOArgs(beta=it.dpo_beta, ref_model=self.sft if policy != self.sft else ""),
            optim=OptimArgs(
                learning_rate=c.optim.learning_rate,
                batch_size=batch,
                max_steps=steps,
                max_grad_norm=c.optim.max_grad_norm,
            ),
            packing=dataclasses.replace(c.packing),
            run=run_args(c, out, c.run.seed + round_k),
        )
        if it.carry_optimizer and round_k > 0:
            cfg.optim.optimizer_state = str(carried or "")
            cfg.optim.schedule_steps = position + (it.rounds - round_k + 1) * steps
            cfg.run.save_steps, cfg.run.save_total_limit = steps, 1  # the last step's checkpoint holds the state
        cfg.check()
        return cfg

    def first(self) -> str:
        """With --prefs: DPO on them from --model into OUT/round-0/dpo (the counterpart of PPO's first reward
        model, so both see the same labels); else --model."""
        it = self.cfg.iterate
        if not it.prefs:
            return self.sft
        out = self.out / "round-0" / "dpo"
        if not (self.out / "round-0" / ROUND_FILE).is_file():
            rows = load_examples(it.prefs, "preference", COMMAND)
            cfg = self.config(self.sft, Path(it.prefs), len(rows), out, 0)
            start = time.perf_counter()
            execute("dpo", cfg)
            write_json(self.out / "round-0" / ROUND_FILE, {"seconds": round(time.perf_counter() - start, 1)})
        return str(out)

    @staticmethod
    def record(run_dir: Path, cfg: DPOConfig | None) -> dict:
        metrics = metrics_rows(run_dir) if cfg is not None else []
        return {
            "dpo_steps": cfg.optim.max_steps if cfg is not None else 0,
            "dpo_loss": last_mean(metrics, "loss"),
            "dpo_accuracy": last_mean(metrics, "rewards/accuracy"),
        }
