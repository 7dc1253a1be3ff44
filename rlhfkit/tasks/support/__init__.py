"""The built-in customer-support reply task.

A customer message in one of `CATEGORIES` asks for an agent reply. A hidden gold
judge (`gold_score`) rewards one empathy phrase, naming the issue and product, the
right concrete action, a polite closing and concision, and punishes repetition,
wrong actions and gibberish. The data (mixed-quality SFT demonstrations, noisy
preference pairs) leaves room for RLHF to improve and for a policy to over-optimise
a learned reward model.
"""

from .categories import CATEGORIES, PRODUCTS
from .dataset import (
    DEFAULT_SIZES,
    RATER_TEMPERATURE,
    corpus_text,
    label_noise_ceiling,
    make_preference_rows,
    make_sft_rows,
    write_task_data,
)
from .judge import GoldBreakdown, gold_breakdown, gold_reward, gold_score
from .products import product_naming, product_naming_shares
from .prompts import format_prompt, make_prompts, parse_prompt
from .raters import SimulatedRaters
from .replies import ideal_reply, sample_reply

__all__ = [
    "CATEGORIES",
    "DEFAULT_SIZES",
    "PRODUCTS",
    "RATER_TEMPERATURE",
    "GoldBreakdown",
    "SimulatedRaters",
    "corpus_text",
    "format_prompt",
    "gold_breakdown",
    "gold_reward",
    "gold_score",
    "ideal_reply",
    "label_noise_ceiling",
    "make_preference_rows",
    "make_prompts",
    "make_sft_rows",
    "parse_prompt",
    "product_naming",
    "product_naming_shares",
    "sample_reply",
    "write_task_data",
]
