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

__all__ = [
    "DPOConfig",
    "DemoConfig",
    "EvalConfig",
    "GRPOConfig",
    "GenerateConfig",
    "InitModelConfig",
    "LabelConfig",
    "MergeConfig",
    "PPOConfig",
    "RLOOConfig",
    "RMConfig",
    "SFTConfig",
    "ScoreConfig",
    "ViewConfig",
]
