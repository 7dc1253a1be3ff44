"""Each command's options as a dataclass (``SFTConfig``, ``PPOConfig``, ...), composed of shared parts
(``parts.py``; an option several parts have is defined once in ``options.py``). A field's docstring is its help
text, ``parse.py`` turns a config into the command line and reads ``--config`` YAML files, and each config's
``check()`` raises ``UserError`` for values out of range. Options that name registered things take their choices
from the registry (``rlhfkit.ops`` for the math, ``rlhfkit.tasks`` for the built-in tasks, ``trackers.py`` for
``--report-to``); nothing here loads a model or touches a device."""

from rlhfkit.config.commands import (
    DemoConfig,
    DPOConfig,
    EvalConfig,
    GenerateConfig,
    GRPOConfig,
    InitModelConfig,
    LabelConfig,
    MergeConfig,
    PPOConfig,
    RLOOConfig,
    RMConfig,
    ScoreConfig,
    SFTConfig,
    ViewConfig,
)
from rlhfkit.config.iterate import IterateConfig
from rlhfkit.config.judging import JudgeConfig, ReviseConfig

__all__ = [
    "DPOConfig",
    "DemoConfig",
    "EvalConfig",
    "GRPOConfig",
    "GenerateConfig",
    "InitModelConfig",
    "IterateConfig",
    "JudgeConfig",
    "LabelConfig",
    "MergeConfig",
    "PPOConfig",
    "RLOOConfig",
    "RMConfig",
    "ReviseConfig",
    "SFTConfig",
    "ScoreConfig",
    "ViewConfig",
]
