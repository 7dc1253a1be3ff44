"""Each command's options as a dataclass (``SFTConfig``, ``PPOConfig``, ...), composed of shared parts."""

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
