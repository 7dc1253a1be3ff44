"""The vLLM engine against rlhfkit's own sampler on the same weights: greedy samples token for token (fp32), the
G completions of a prompt, the stop ids, the engine's log-probs against the trainer's, and the weights after
optimizer steps (full fine-tuning with tied embeddings, and LoRA merged beside the model)."""

from __future__ import annotations

import copy

import pytest
import torch

from rlhfkit.config.online import VLLMArgs
from rlhfkit.config.parts import GenerationArgs, LoraArgs
from rlhfkit.data.collate import pad_with_mask
from rlhfkit.models.forward import response_logprobs
from rlhfkit.models.loading import load_causal_lm, load_tokenizer
from rlhfkit.models.lora import apply_lora
from rlhfkit.models.sampling import sample_responses, stop_token_ids
from rlhfkit.models.vllm_engine import VLLMEngine, policy_weights
from rlhfkit.ops import logprob_gap
from rlhfkit.trainers.online.rollout import padded_logprobs

from .conftest import PROMPTS, needs_vllm

pytestmark = needs_vllm

CPU = torch.device("cpu")
GREEDY = GenerationArgs(max_new_tokens=24, top_k=1)


@pytest.fixture(scope="module")
def policy(brief_policy_dir):
    tok = load_tokenizer(str(brief_policy_dir))
    return tok, load_causal_lm(str(brief_policy_dir), tokenizer=tok)


@pytest.fixture(scope="module")
def engine(brief_policy_dir, policy):
    tok, model = policy
    return VLLMEngine.start(
        str(brief_policy_dir), stop_token_ids(model, tok), VLLMArgs(use_vllm=True), dtype=torch.float32,
        device=CPU, seed=0, max_model_len=160,
    )  # fmt: skip


def prompt_ids(tok, k: int = 6, group: int = 2) -> list[list[int]]:
    """``k`` prompts of different lengths (the last one short), each ``group`` times in a row."""
    texts = PROMPTS[: k - 1] + ["User: hello"]
    return [tok(t).input_ids for t in texts for _ in range(group)]


def own_greedy(model, tok, prompts):
    return sample_responses(model, tok, prompts, GREEDY, len(prompts), CPU)


def test_greedy_samples_equal_the_own_samplers(policy, engine):
    tok, model = policy
    prompts = prompt_ids(tok)
    own = own_greedy(model, tok, prompts)
    assert engine.sample(model, prompts, GREEDY) == own
    stops = stop_token_ids(model, tok)
    # the SFT'd policy ends its replies itself: the stop id is kept
    assert any(r[-1] in stops and len(r) < GREEDY.max_new_tokens for r in own)


def test_stop_ids_of_the_generation_config_end_a_reply(policy, engine):
    """An end-of-turn id listed in the model's generation config stops both samplers (here: the first token of
    a greedy reply, which then ends there)."""
    tok, model = policy
    prompts = prompt_ids(tok, k=3, group=1)
    reply = own_greedy(model, tok, prompts)[0]
    assert len(reply) > 1 and reply[0] != tok.eos_token_id
    end_of_turn = reply[0]
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tok.eos_token_id, end_of_turn]
    try:
        stops = stop_token_ids(model, tok)
        own = own_greedy(model, tok, prompts)
        stopped = VLLMEngine(engine.llm, stops).sample(model, prompts, GREEDY)
    finally:
        model.generation_config.eos_token_id = saved
    assert own[0] == [end_of_turn]
    assert stopped == own


def test_groups_sample_distinct_completions_and_the_engine_logprobs_match_the_trainers(policy, engine):
    """Temperature 1: a prompt's G completions differ (one request with n = G), and the engine's log-prob of
    each sampled token is the trainer's log pi_old of it, to fp32 rounding."""
    tok, model = policy
    prompts = prompt_ids(tok, k=4, group=4)
    responses = engine.sample(model, prompts, GenerationArgs(max_new_tokens=24))
    assert [len(r) > 0 for r in responses] == [True] * len(prompts)
    assert len({tuple(r) for r in responses[:4]}) > 1
    q, qm = pad_with_mask(prompts, tok.pad_token_id, "left", CPU)
    r, rm = pad_with_mask(responses, tok.pad_token_id, "right", CPU)
    trainer = response_logprobs(model, torch.cat([q, r], 1), torch.cat([qm, rm], 1), r.shape[1], 1.0)
    engine_lp = padded_logprobs(engine.last_logprobs, CPU)
    assert engine_lp.shape == trainer.shape
    gap = float(logprob_gap(trainer, engine_lp, rm.float()))
    assert gap < 1e-4, gap
    assert float(((trainer - engine_lp).abs() * rm).max()) < 1e-3


def train_steps(model, tok, prompts, steps: int, lr: float, engine) -> None:
    """``steps`` AdamW steps of next-token loss on the prompts, each followed by ``engine.updated()``."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    ids, mask = pad_with_mask(prompts, tok.pad_token_id, "right", CPU)
    labels = ids.masked_fill(mask == 0, -100)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        engine.updated()
    model.eval()


def test_after_optimizer_steps_the_engine_samples_as_the_trained_model(policy, engine):
    """Full fine-tuning: after k steps the engine's greedy samples are the trained model's (which moved: its
    samples changed), the tied output layer included."""
    tok, base = policy
    model = copy.deepcopy(base)
    prompts = prompt_ids(tok)
    before = own_greedy(model, tok, prompts)
    engine.sync_weights(model)
    assert engine.sample(model, prompts, GREEDY) == before
    train_steps(model, tok, prompts[::2], steps=3, lr=3e-2, engine=engine)
    after = own_greedy(model, tok, prompts)
    assert after != before
    assert engine.stale
    assert engine.sample(model, prompts, GREEDY) == after
    assert engine.take_metrics()["time/weight_sync_s"] > 0
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_lora_weights_reach_the_engine_merged_and_the_model_is_left_as_it_was(policy, engine):
    tok, base = policy
    model = apply_lora(copy.deepcopy(base), LoraArgs(lora_r=4, lora_alpha=8.0))
    prompts = prompt_ids(tok)
    before = own_greedy(model, tok, prompts)
    engine.sync_weights(model)  # another model than the last test's
    assert engine.sample(model, prompts, GREEDY) == before
    train_steps(model, tok, prompts[::2], steps=3, lr=5e-2, engine=engine)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    after = own_greedy(model, tok, prompts)
    assert after != before
    assert engine.sample(model, prompts, GREEDY) == after
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())  # nothing merged in place
    names = set(policy_weights(model))
    assert not any("lora_" in n or "base_layer" in n for n in names)
