"""Each command's options as a dataclass (``SFTConfig``, ``PPOConfig``, ...), composed of shared parts."""

from rlhfkit.config.commands import (
    DemoConfig,
    DPOConfig,
    EvalConfig,
    GenerateConfig,
    GRPOConfig,
    InitModelConfig,
    PPOConfig,
    RLOOConfig,
    RMConfig,
    ScoreConfig,
    SFTConfig,
)

__all__ = [
    "DPOConfig",
    "DemoConfig",
    "EvalConfig",
    "GRPOConfig",
    "GenerateConfig",
    "InitModelConfig",
    "PPOConfig",
    "RLOOConfig",
    "RMConfig",
    "SFTConfig",
    "ScoreConfig",
]
