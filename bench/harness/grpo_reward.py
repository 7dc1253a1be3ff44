"""The reward of bench/vs_trl/grpo_vs_trl.py, one file both frameworks load: the support task's gold judge as a
Python reward function with TRL's signature.

    rlhfkit grpo --reward-fn bench/harness/grpo_reward.py:support_gold ...
    GRPOTrainer(reward_funcs=[support_gold], ...)      # bench/vs_trl/trl_grpo_runner.py imports this file

The judge (``rlhfkit/tasks/support``) uses only the standard library and relative imports, so this file loads
that package on its own, under a private name, without importing rlhfkit (which TRL's environment does not
have). Both frameworks therefore run the same judge code from the same checkout.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SUPPORT_DIR = Path(__file__).resolve().parents[2] / "rlhfkit" / "tasks" / "support"
_PACKAGE = "bench_support_task"


def _load_support():
    if _PACKAGE in sys.modules:
        return sys.modules[_PACKAGE]
    spec = importlib.util.spec_from_file_location(
        _PACKAGE, SUPPORT_DIR / "__init__.py", submodule_search_locations=[str(SUPPORT_DIR)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[_PACKAGE] = module  # before executing it, so its relative imports find the package
    spec.loader.exec_module(module)
    return module


gold_score = _load_support().gold_score


def support_gold(prompts: list, completions: list[str], **kwargs) -> list[float]:
    """The gold judge's score of each completion in [-3, 5] (deterministic): one empathy phrase, the issue and
    product named, the right action for the customer's issue, one polite closing, concise, no repetition or
    out-of-vocabulary words. ``kwargs`` (completion ids, other columns, TRL's trainer state) are not used."""
    return [gold_score(prompt, completion) for prompt, completion in zip(prompts, completions)]
