"""`rlhfkit demo`: one built-in task end to end with a report. ``--task support`` (the default,
``rlhfkit.demo.support``): init-model -> SFT -> reward model -> PPO (KL on) -> PPO (beta = 0) -> DPO -> iterated
PPO -> evaluation; ``--task arithmetic`` (``rlhfkit.demo.arithmetic``): SFT -> GRPO on a checkable reward;
``--task tools`` (``rlhfkit.demo.tools``): SFT -> GRPO with a tool the policy learns to call."""

from __future__ import annotations

from rlhfkit.config.commands import DemoConfig
from rlhfkit.demo import arithmetic, support, tools
from rlhfkit.errors import UserError, option

TASKS = {"support": support, "arithmetic": arithmetic, "tools": tools}


def run(cfg: DemoConfig) -> dict:
    if cfg.model and cfg.task != "support":
        raise UserError(f"demo: {option('model')} runs the support task; the {cfg.task} task trains its own model")
    return TASKS[cfg.task].run(cfg)
