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

__all__ = [
    "DPOConfig",
    "DemoConfig",
    "EvalConfig",
    "GRPOConfig",
    "GenerateConfig",
    "InitModelConfig",
    "IterateConfig",
    "LabelConfig",
    "MergeConfig",
    "PPOConfig",
    "RLOOConfig",
    "RMConfig",
    "SFTConfig",
    "ScoreConfig",
    "ViewConfig",
]
