"""Saving a LoRA model: a plain merged model at the root, computed in place (no second copy in memory)."""

from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM

from rlhfkit.config.parts import LoraArgs
from rlhfkit.models.loading import load_causal_lm, load_tokenizer
from rlhfkit.models.lora import apply_lora, is_lora, save_pretrained


def test_merged_save_matches_the_adapted_model_and_leaves_it_intact(tiny_model_dir, tmp_path, monkeypatch):
    tok = load_tokenizer(str(tiny_model_dir))
    model = apply_lora(
        load_causal_lm(str(tiny_model_dir), tokenizer=tok), LoraArgs(lora_r=4, lora_target_modules="all-linear")
    )
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # B starts at 0; make the adapters change the model
                p.normal_(0, 0.2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, len(tok), (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
    deepcopy = copy.deepcopy

    def no_model_copies(obj, *args, **kwargs):
        assert not isinstance(obj, torch.nn.Module), "a second copy of the model while saving"
        return deepcopy(obj, *args, **kwargs)

    monkeypatch.setattr(copy, "deepcopy", no_model_copies)
    save_pretrained(model, tok, tmp_path)
    monkeypatch.undo()
    plain = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert not any("lora" in k for k in plain.state_dict())
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, adapted, atol=1e-5)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(input_ids=ids).logits
    assert (adapted - base).abs().max() > 1e-3  # the adapters matter, so the merge is what makes them equal
    assert is_lora(model) and (tmp_path / "adapter" / "adapter_config.json").is_file()
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert max(float((after[k] - before[k]).abs().max()) for k in before) < 1e-6  # unmerged again
