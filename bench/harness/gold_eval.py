"""The benchmark's learning measure: fresh samples for the held-out prompts from a policy, with one decoding
for every policy (both frameworks' and the SFT start), scored by the task's hidden gold judge and the RM."""

from __future__ import annotations

import statistics

import torch

from bench.harness.models import SETTINGS

EVAL_SEED = 1234  # the same samples' randomness for every policy evaluated


@torch.no_grad()
def sample_responses(
    model_dir: str, prompts: list[str], samples: int, seed: int = EVAL_SEED
) -> tuple[list[str], list[bool]]:
    """The one decoding used for every policy: left-padded prompts (rlhfkit's encoding), temperature-1
    sampling of up to 32 tokens with a fixed seed, cut at the first EOS. Returns texts and, per text,
    whether it ended with EOS (False: cut off at 32 tokens)."""
    from transformers import AutoModelForCausalLM

    from rlhfkit.data.encode import encode_prompt
    from rlhfkit.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows = [encode_prompt(tokenizer, p, 128) for p in prompts for _ in range(samples)]
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    gen = torch.Generator().manual_seed(seed)
    texts: list[str] = []
    finished: list[bool] = []
    for start in range(0, len(rows), 64):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        out = model.generate(
            input_ids=ids[start : start + 64],
            attention_mask=mask[start : start + 64],
            do_sample=True,
            temperature=SETTINGS["temperature"],
            top_k=None,
            top_p=1.0,
            max_new_tokens=SETTINGS["max_new_tokens"],
            eos_token_id=eos,
            pad_token_id=pad,
        )
        for row in out[:, width:].tolist():
            finished.append(eos in row)
            row = row[: row.index(eos)] if eos in row else row
            texts.append(tokenizer.decode(row, skip_special_tokens=True))
    return texts, finished


def evaluate(model_dir: str, rm_dir: str, prompts: list[str], samples: int) -> dict:
    from rlhfkit.models.reward import RewardScorer
    from rlhfkit.tasks.support import gold_score

    texts, finished = sample_responses(model_dir, prompts, samples)
    repeated = [p for p in prompts for _ in range(samples)]
    gold = [gold_score(p, t) for p, t in zip(repeated, texts)]
    scorer = RewardScorer.load(rm_dir, torch.device("cpu"))
    rm = scorer.score(repeated, texts, finished=finished).mean.float()
    return {
        "gold": statistics.mean(gold),
        "rm_score": float(rm.mean()),
        "finished": statistics.mean(finished),
        "length_words": statistics.mean(len(t.split()) for t in texts),
        "example": texts[0],
    }
