"""rlhfkit: RLHF on one machine — SFT, Bradley–Terry reward models, PPO with a KL penalty, DPO, and the
critic-free family (GRPO, Dr. GRPO, RLOO, REINFORCE++) with rewards written as Python functions; a web page
where people label preferences (``rlhfkit label``) and one that shows training runs (``rlhfkit view``).

The command line is ``rlhfkit COMMAND``; the same commands are Python functions here::

    import rlhfkit
    result = rlhfkit.sft(model="base", data="sft.jsonl", output_dir="out/sft", max_steps=100)

See ``rlhfkit.api`` for what they take and return.
"""

from rlhfkit.api import (
    Result,
    demo,
    dpo,
    evaluate,
    generate,
    grpo,
    init_model,
    iterate,
    judge,
    label,
    merge,
    ppo,
    revise,
    rloo,
    rm,
    score,
    sft,
    view,
)
from rlhfkit.errors import UserError

__version__ = "0.1.0"
__all__ = [
    "Result",
    "UserError",
    "__version__",
    "demo",
    "dpo",
    "evaluate",
    "generate",
    "grpo",
    "init_model",
    "iterate",
    "judge",
    "label",
    "merge",
    "ppo",
    "revise",
    "rloo",
    "rm",
    "score",
    "sft",
    "view",
]
