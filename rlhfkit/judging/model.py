"""A causal LM as a pairwise judge, read from its next-token probabilities rather than from text it writes.

For a pair (a, b) the judge is asked twice, with a in slot A and with b in slot A (``prompts.judge_messages``
rendered with its chat template, or the plain template without one). Each time the answer is the probability
of label A against label B at the next token,

    p = sum_{t in A} e^{z_t} / (sum_{t in A} e^{z_t} + sum_{t in B} e^{z_t})

over the tokens that spell each label (``A`` and `` A``: with and without a leading space). So p_first = P(a
better) with a first and p_second = P(b better) with b first. The pair's score averages the two orders (Lee et
al. 2023, "RLAIF", who also average over both orders against position bias):

    s_a = (p_first + (1 - p_second)) / 2,    confidence = max(s_a, 1 - s_a)

and the answer is a when both orders prefer a, b when both prefer b, and a tie (-1) when it flips with the order:
a judge that always picks the first slot ends with every pair a tie.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlhfkit.data.collate import pad_with_mask
from rlhfkit.data.encode import prompt_token_ids
from rlhfkit.errors import UserError, option
from rlhfkit.judging.pairs import Pair
from rlhfkit.judging.prompts import LABELS, judge_messages
from rlhfkit.models.loading import load_causal_lm, load_tokenizer, model_folder, position_limit
from rlhfkit.models.unwrap import base_model
from rlhfkit.models.vllm_engine import require_vllm
from rlhfkit.training.runtime import pick_device

try:  # chat templates are rendered with jinja2; a template may refuse a system turn
    from jinja2 import TemplateError
except ImportError:  # without jinja2 no chat template renders at all
    TemplateError = ValueError


@dataclass(frozen=True)
class Verdict:
    """The judge's two answers for one pair (a, b)."""

    p_first: float  # P(label A) with a in slot A: the probability that a is better
    p_second: float  # P(label A) with b in slot A: the probability that b is better

    @property
    def score_a(self) -> float:
        """P(a better), averaged over both orders."""
        return (self.p_first + 1.0 - self.p_second) / 2

    @property
    def confidence(self) -> float:
        return max(self.score_a, 1.0 - self.score_a)

    @property
    def consistent(self) -> bool:
        """Whether both orders prefer the same reply (an even 0.5 prefers neither)."""
        return (self.p_first > 0.5 and self.p_second < 0.5) or (self.p_first < 0.5 and self.p_second > 0.5)

    def answer(self, min_confidence: float = 0.5) -> int:
        """0 (a is better), 1 (b is better) or -1 (no answer: a tie between the orders, or below
        ``min_confidence``), as TRL's pairwise judges answer."""
        if not self.consistent or self.confidence < min_confidence:
            return -1
        return 0 if self.score_a > 0.5 else 1


def label_token_ids(tokenizer) -> tuple[list[int], list[int]]:
    """The first token of each spelling of each label (``A``, `` A``; ``B``, `` B``): tokens that would start
    either label are left out, and a label with no token of its own is an error."""
    found = []
    for label in LABELS:
        ids = set()
        for spelling in (label, " " + label):
            tokens = tokenizer(spelling, add_special_tokens=False)["input_ids"]
            if tokens:
                ids.add(int(tokens[0]))
        found.append(ids)
    shared = found[0] & found[1]
    a, b = sorted(found[0] - shared), sorted(found[1] - shared)
    if not a or not b:
        raise UserError(f"the judge's tokenizer has no token of its own for the labels {LABELS[0]} and {LABELS[1]}")
    return a, b


def encode_pairs(
    tokenizer, pairs: list[Pair], principles: tuple[str, ...], max_length: int, positions: tuple[int, str] | None = None
) -> list[tuple[list[int], list[int]]]:
    """Each pair's two judge prompts as token ids (a first, b first); a prompt over ``max_length`` tokens, or over
    the model's ``positions`` (its limit and the config key naming it), stops here, naming its row, before any pair
    is judged."""
    out = []
    for pair in pairs:
        both = (
            _prompt_ids(tokenizer, judge_messages(pair.prompt, pair.a, pair.b, principles)),
            _prompt_ids(tokenizer, judge_messages(pair.prompt, pair.b, pair.a, principles)),
        )
        longest = max(map(len, both))
        if positions is not None and longest > positions[0]:
            raise UserError(
                f"{pair.where}: the judge prompt is {longest} tokens, over the judge model's {positions[0]} positions "
                f"(its {positions[1]}); shorten the replies or the principles"
            )
        if longest > max_length:
            raise UserError(
                f"{pair.where}: the judge prompt is {longest} tokens, over {option('max_length', max_length)}; "
                "raise it (within the judge's context) or shorten the replies"
            )
        out.append(both)
    return out


def _prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    try:
        return prompt_token_ids(tokenizer, messages)
    except TemplateError:  # a chat template without a system turn: the principles go into the user's message
        merged = [{"role": "user", "content": messages[0]["content"] + "\n\n" + messages[1]["content"]}]
        return prompt_token_ids(tokenizer, merged)


@torch.no_grad()
def first_label_probabilities(
    model, prompts_ids: list[list[int]], labels: tuple[list[int], list[int]], pad_id: int, batch_size: int, device,
    progress: Callable[[int], None] | None = None,
) -> list[float]:  # fmt: skip
    """P(label A) at the next token of each prompt; prompts of similar length share a batch."""
    head = model.get_output_embeddings()
    body = getattr(base_model(model), "base_model", model)
    a_ids, b_ids = (torch.tensor(ids, device=device) for ids in labels)
    order = sorted(range(len(prompts_ids)), key=lambda i: len(prompts_ids[i]))
    out = [0.0] * len(prompts_ids)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        ids, mask = pad_with_mask([prompts_ids[i] for i in rows], pad_id, "right", device)
        hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, L, H]
        last = hidden[torch.arange(len(rows), device=device), mask.sum(1) - 1]  # [B, H]: each row's last token
        logits = head(last).float()  # [B, V]: the vocabulary head on one position per row, not all
        margin = logits[:, a_ids].logsumexp(-1) - logits[:, b_ids].logsumexp(-1)  # [B]
        for i, p in zip(rows, torch.sigmoid(margin).tolist()):
            out[i] = p
        if progress is not None:
            progress(len(rows))
    return out


def _logsumexp(xs: list[float]) -> float:
    top = max(xs)
    return top + math.log(sum(math.exp(x - top) for x in xs))


def vllm_first_label_probabilities(
    folder: str, prompts_ids: list[list[int]], labels: tuple[list[int], list[int]], seed: int
) -> list[float]:
    """``first_label_probabilities`` from a vLLM engine: each prompt is sent once per label token with that token
    appended, and the engine's log-prob of the appended token is read (its prefix cache computes the shared
    prompt once)."""
    require_vllm()
    from vllm import LLM, SamplingParams

    llm = LLM(model=folder, skip_tokenizer_init=True, seed=seed, enable_prefix_caching=True, generation_config="vllm")
    tokens = labels[0] + labels[1]
    requests = [{"prompt_token_ids": ids + [t]} for ids in prompts_ids for t in tokens]
    outputs = llm.generate(requests, SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False))
    probs = []
    for i in range(len(prompts_ids)):
        logprobs = [
            outputs[i * len(tokens) + j].prompt_logprobs[-1][t].logprob for j, t in enumerate(tokens)
        ]  # fmt: skip
        margin = _logsumexp(logprobs[: len(labels[0])]) - _logsumexp(logprobs[len(labels[0]) :])
        probs.append(1.0 / (1.0 + math.exp(-margin)) if margin > -700 else 0.0)
    del llm
    return probs


class ModelJudge:
    """A local causal LM (a Hugging Face folder or a ``.gguf`` file) judging pairs by ``principles``.

    ``verdicts(pairs)`` gives each pair's ``Verdict``; called as ``judge(prompts, completions)`` it answers as
    TRL's pairwise judges do (0, 1, or -1 for no answer), which is how `rlhfkit iterate --judge model:PATH` uses
    it. The model is loaded for each call and let go after, so it holds no memory between an iterate round's
    judging and its training."""

    def __init__(
        self,
        path: str,
        principles: tuple[str, ...],
        *,
        min_confidence: float = 0.5,
        batch_size: int = 8,
        max_length: int = 1024,
        cpu: bool = False,
        trust_remote_code: bool = False,
        use_vllm: bool = False,
        seed: int = 0,
    ):
        self.path, self.principles = path, principles
        self.min_confidence, self.batch_size, self.max_length = min_confidence, batch_size, max_length
        self.device = pick_device(cpu)
        self.trust, self.use_vllm, self.seed = trust_remote_code, use_vllm, seed
        self.last_verdicts: list[Verdict] = []

    def tokenizer(self):
        return load_tokenizer(self.path, self.trust, what="judge model")

    def verdicts(
        self, pairs: list[Pair], progress: Callable[[int], None] | None = None, tokenizer=None
    ) -> list[Verdict]:
        """Both orders of every pair asked; ``progress(n)`` is called as judge prompts are done."""
        tokenizer = tokenizer or self.tokenizer()
        labels = label_token_ids(tokenizer)
        positions = position_limit(self.path)
        encoded = encode_pairs(tokenizer, pairs, self.principles, self.max_length, positions)
        flat = [ids for both in encoded for ids in both]
        if self.use_vllm:
            probs = vllm_first_label_probabilities(model_folder(self.path, "judge model"), flat, labels, self.seed)
            if progress is not None:
                progress(len(flat))
        else:
            model = load_causal_lm(self.path, self.trust, tokenizer).to(self.device).eval()
            try:
                probs = first_label_probabilities(
                    model, flat, labels, tokenizer.pad_token_id, self.batch_size, self.device, progress
                )
            finally:
                del model
                gc.collect()
        self.last_verdicts = [Verdict(probs[2 * i], probs[2 * i + 1]) for i in range(len(pairs))]
        return self.last_verdicts

    def __call__(self, prompts: list, completions: list[list], **kwargs) -> list[int]:
        pairs = [Pair(p, a, b, f"pair {i + 1}") for i, (p, (a, b)) in enumerate(zip(prompts, completions))]
        return [v.answer(self.min_confidence) for v in self.verdicts(pairs)]
