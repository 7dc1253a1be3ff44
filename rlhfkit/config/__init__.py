"""Each command's options as a dataclass (``SFTConfig``, ``PPOConfig``, ...), composed of shared parts."""

from rlhfkit.config.commands import (
    DemoConfig,
    DPOConfig,
    EvalConfig,
    GenerateConfig,
    InitModelConfig,
    PPOConfig,
    RMConfig,
    ScoreConfig,
    SFTConfig,
)

__all__ = [
    "DPOConfig",
    "DemoConfig",
    "EvalConfig",
    "GenerateConfig",
    "InitModelConfig",
    "PPOConfig",
    "RMConfig",
    "SFTConfig",
    "ScoreConfig",
]
