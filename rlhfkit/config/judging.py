"""Options of the commands where a local model stands in for people: `rlhfkit judge` (a model labels pairs,
RLAIF) and `rlhfkit revise` (a model critiques and rewrites its own replies, Constitutional AI's supervised
stage)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from rlhfkit.config import options
from rlhfkit.config.checks import at_least, positive
from rlhfkit.config.parts import GenerationArgs, ModelArgs
from rlhfkit.errors import UserError, option


@dataclass
class JudgeArgs:
    data: str = ""
    """Pairs to judge: rows with 'prompt' and 'responses' (a list of two, as `rlhfkit generate --num-samples 2`
    writes), or preference rows ('prompt', 'chosen', 'rejected'), whose order is not read as a label."""
    output_dir: str = ""
    """Where prefs.jsonl (the judged pairs, for `rlhfkit rm` and `rlhfkit dpo`), judgments.jsonl (every pair with
    the judge's probabilities) and report.json go."""
    principles: str = ""
    """Text file of principles, one per line (a constitution), that the judge is asked to judge by; empty: a short
    helpful, honest and harmless default."""
    reference: str = ""
    """People's labels of the same pairs, as preference rows (e.g. `rlhfkit label --export`'s prefs.jsonl): the
    report adds the judge's agreement with them, Cohen's kappa, and the agreement on the pairs it was confident
    about."""
    min_confidence: float = 0.5
    """Drop a pair unless the judge's probability for its preferred reply (averaged over both orders) is at least
    this; 0.5 keeps every pair whose answer holds in both orders."""
    confident_at: float = 0.8
    """Confidence from which the report counts a pair as one the judge was confident about."""
    max_length: int = 1024
    """Longest judge prompt in tokens (principles, conversation and both replies); a longer one stops the command
    before any pair is judged, naming its row."""
    batch_size: int = 8
    """Judge prompts per forward pass (each pair is two: both orders)."""
    use_vllm: bool = False
    """Read the choice probabilities from a vLLM engine instead of the model's own forward passes (needs vLLM
    installed)."""
    seed: int = options.seed()
    cpu: bool = options.cpu()
    threads: int = options.threads()
    progress: bool = True
    """Show a progress bar."""
    accel: Literal["auto", "off"] = options.accel()


@dataclass
class JudgeConfig:
    """RLAIF (Lee et al. 2023): a local causal LM says which of two replies is better. The answer is read from its
    next-token probabilities of the choice labels A and B after a prompt in its chat template, asked in both
    orders; a pair whose answer flips with the order is a tie and dropped."""

    REQUIRED: ClassVar[tuple[str, ...]] = ("model", "data", "output_dir")
    model: ModelArgs = field(default_factory=ModelArgs)
    judge: JudgeArgs = field(default_factory=JudgeArgs)

    def check(self) -> None:
        j = self.judge
        positive(batch_size=j.batch_size, max_length=j.max_length)
        at_least(0, threads=j.threads)
        for name in ("min_confidence", "confident_at"):
            value = getattr(j, name)
            if not 0.5 <= value <= 1.0:
                raise UserError(f"{option(name)} must be in [0.5, 1], got {value}")
        check_principles_file(j.principles)
        if j.reference and not Path(j.reference).exists():
            raise UserError(f"{j.reference}: {option('reference')} file does not exist")


def check_principles_file(path: str, name: str = "principles") -> None:
    if path and not Path(path).is_file():
        raise UserError(f"{path}: {option(name)} file does not exist")


@dataclass
class ReviseArgs:
    data: str = ""
    """Prompts to answer: rows with 'prompt' (a string or a list of chat messages)."""
    output_dir: str = ""
    """Where sft.jsonl (prompt and revised reply, for `rlhfkit sft`), pairs.jsonl (chosen: the revision, rejected:
    the first reply, for `rlhfkit rm` and `rlhfkit dpo`), revisions.jsonl (every step's text) and report.json
    go."""
    principles: str = ""
    """Text file of principles, one per line; each prompt's critique and revision follow one of them, drawn at
    random (seeded by --seed); empty: a short helpful, honest and harmless default."""
    batch_size: int = 8
    """Prompts sampled per forward pass."""
    seed: int = options.seed()
    cpu: bool = options.cpu()
    threads: int = options.threads()
    max_prompt_length: int = options.max_prompt_length(512)
    progress: bool = True
    """Show a progress bar."""
    accel: Literal["auto", "off"] = options.accel()


@dataclass
class ReviseConfig:
    """The supervised stage of Constitutional AI (Bai et al. 2022): the model answers each prompt, critiques its
    answer against a principle, and rewrites it; the revisions are SFT data and (revision, first answer) pairs
    preference data."""

    REQUIRED: ClassVar[tuple[str, ...]] = ("model", "data", "output_dir")
    model: ModelArgs = field(default_factory=ModelArgs)
    revise: ReviseArgs = field(default_factory=ReviseArgs)
    generation: GenerationArgs = field(default_factory=lambda: GenerationArgs(max_new_tokens=96, temperature=0.7))

    def check(self) -> None:
        g = self.generation
        positive(
            batch_size=self.revise.batch_size,
            temperature=g.temperature,
            max_new_tokens=g.max_new_tokens,
            max_prompt_length=self.revise.max_prompt_length,
        )
        at_least(0, threads=self.revise.threads)
        check_principles_file(self.revise.principles)
