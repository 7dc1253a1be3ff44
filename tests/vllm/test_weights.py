"""After a weight sync the engine holds the trainer's policy, parameter by parameter, for Llama models whose output
layer is tied to the embedding (the tiny test Llama and SmolLM2-135M-Instruct): after optimizer steps outside a
run, and at every sync of real GRPO runs (full fine-tuning and LoRA) on SmolLM2.

The engine's weights are read as its kernels use them: on a CPU vLLM keeps a linear layer's weight only in a
packed copy (its ``cpu_linear``), so each such layer is applied to the identity matrix, which gives its weight
back exactly; the tied output layer is read that way too, as the packed copy is what the logits come from.
"""

from __future__ import annotations

import copy

import pytest
import torch

import rlhfkit
from rlhfkit.config.online import VLLMArgs
from rlhfkit.config.parts import LoraArgs
from rlhfkit.data.collate import pad_with_mask
from rlhfkit.models.loading import load_causal_lm, load_tokenizer
from rlhfkit.models.lora import apply_lora
from rlhfkit.models.sampling import stop_token_ids
from rlhfkit.models.unwrap import base_model, without_ddp
from rlhfkit.models.vllm_engine import VLLMEngine, policy_weights
from tests.real.conftest import smollm2_dir, smollm2_gguf  # noqa: F401  (the fixtures)

from .conftest import PROMPTS, needs_vllm

pytestmark = needs_vllm

CPU = torch.device("cpu")
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _read_engine(worker) -> dict[str, torch.Tensor]:
    """In the engine's worker: every weight as its kernels use it, under vLLM's names, [out, in] for layers."""
    model = worker.model_runner.get_model()
    out = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            for pname, p in module.named_parameters(recurse=False):
                if p.numel():
                    out[f"{name}.{pname}"] = p.detach().clone()
            packed = getattr(module, "cpu_linear", None)
            if packed is not None and not name.endswith("embed_tokens"):  # the embedding is looked up, not applied
                width = getattr(module, "embedding_dim", None) or module.input_size_per_partition
                eye = torch.eye(width, dtype=module.weight.dtype)
                out[f"{name}.weight"] = packed(eye, module.weight, None).t().contiguous()
    return out


def engine_weights(engine: VLLMEngine) -> dict[str, torch.Tensor]:
    return engine.llm.collective_rpc(_read_engine)[0]


def expected_engine_weights(model) -> dict[str, torch.Tensor]:
    """The trainer's policy (LoRA merged) under vLLM's names: fused projections concatenated, the output layer the
    embedding when they are tied."""
    plain = policy_weights(model)
    out = {}
    for name, w in plain.items():
        module, _, leaf = name.rpartition(".")
        stem, _, last = module.rpartition(".")
        fused = next((f for f, parts in FUSED.items() if last in parts), None)
        if fused is None:
            out[name] = w
        elif last == FUSED[fused][0]:
            out[f"{stem}.{fused}.{leaf}"] = torch.cat([plain[f"{stem}.{part}.{leaf}"] for part in FUSED[fused]])
    if getattr(base_model(without_ddp(model)).config, "tie_word_embeddings", False):
        out["lm_head.weight"] = plain["model.embed_tokens.weight"]
    return out


def assert_engine_holds(engine: VLLMEngine, model) -> None:
    held, expected = engine_weights(engine), expected_engine_weights(model)
    assert set(expected) <= set(held), sorted(set(expected) - set(held))
    differ = []
    for name, w in expected.items():
        got = held[name][: w.shape[0]]  # a vocabulary padded by the engine: its extra rows are not the model's
        if got.shape != w.shape or not torch.allclose(got, w.to(got.dtype), rtol=0, atol=1e-6):
            differ.append(f"{name}: {float((got - w).abs().max()) if got.shape == w.shape else 'shape'}")
    assert not differ, f"{len(differ)} of {len(expected)} tensors differ: {differ[:8]}"


def adamw_steps(model, tok, steps: int, lr: float) -> None:
    ids, mask = pad_with_mask([tok(p).input_ids for p in PROMPTS[:8]], tok.pad_token_id, "right", CPU)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in range(steps):
        model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


@pytest.fixture(scope="module")
def tiny(brief_policy_dir):
    tok = load_tokenizer(str(brief_policy_dir))
    model = load_causal_lm(str(brief_policy_dir), tokenizer=tok)
    engine = VLLMEngine.start(
        str(brief_policy_dir), stop_token_ids(model, tok), VLLMArgs(use_vllm=True), dtype=torch.float32,
        device=CPU, seed=0, max_model_len=160,
    )  # fmt: skip
    return tok, model, engine


@pytest.mark.parametrize("lora", [False, True])
def test_tiny_tied_llama_engine_holds_the_trained_weights_after_each_sync(tiny, lora):
    tok, base, engine = tiny
    model = apply_lora(copy.deepcopy(base), LoraArgs(lora_r=4, lora_alpha=8.0)) if lora else copy.deepcopy(base)
    assert base.get_output_embeddings().weight is base.get_input_embeddings().weight
    engine.sync_weights(model)
    assert_engine_holds(engine, model)
    for _ in range(2):  # a second sync after more steps: the engine follows, not only its first load
        adamw_steps(model, tok, steps=2, lr=3e-2)
        engine.sync_weights(model)
        assert_engine_holds(engine, model)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_smollm2_grpo_engine_holds_the_trained_policy_at_every_sync(smollm2_dir, tmp_path, monkeypatch, lora):  # noqa: F811
    """A real run (chat prompts, tied embeddings, grouped-query attention): after every sync of the run, before
    sampling, the engine's weights are the trainer's (LoRA: merged) and the run's policy moved from the start."""
    syncs = []
    sync = VLLMEngine.sync_weights

    def checked_sync(self, model):
        seconds = sync(self, model)
        assert_engine_holds(self, model)
        syncs.append(sum(float(w.double().sum()) for w in expected_engine_weights(model).values()))
        return seconds

    monkeypatch.setattr(VLLMEngine, "sync_weights", checked_sync)
    prompts = tmp_path / "prompts.jsonl"
    questions = ["What is 3 + 4?", "Name a colour.", "What is 12 + 5?", "Say hello."]
    prompts.write_text("".join(f'{{"prompt": [{{"role": "user", "content": "{q}"}}]}}\n' for q in questions))
    rlhfkit.grpo(
        model=str(smollm2_dir), data=str(prompts), output_dir=tmp_path / "out",
        reward_fns=[lambda completions, **kw: [float(len(c[-1]["content"].split())) for c in completions]],
        batch_size=8, num_generations=4, max_new_tokens=8, max_steps=2, kl_coef=0.0, seed=0, progress=False,
        learning_rate=2e-3 if lora else 2e-4, lora_r=8 if lora else 0, use_vllm=True,
    )  # fmt: skip
    assert len(syncs) == 2 and syncs[0] != syncs[1]  # the start, then the policy after step 1
