"""The value model a round hands to the next: read from PPO's last checkpoint, with the adapters PPO trained on
its backbone (--lora-r) merged into its weights, or (--save-merged false) saved as a reward model's adapter."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from rlhfkit.config.parts import LoraArgs
from rlhfkit.iterated.models import VALUE_DIR, save_value_model
from rlhfkit.models import loading
from rlhfkit.models.lora import apply_lora
from rlhfkit.models.reward import build_reward_model
from rlhfkit.trainers.online.policy import SeparateValueModel
from rlhfkit.training.checkpoint import META_FILE


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "adapter"])
def test_the_value_models_adapters_are_in_the_saved_folder(tiny_model_dir, tmp_path, merged):
    tokenizer = loading.load_tokenizer(str(tiny_model_dir))
    rm_dir = tmp_path / "rm"
    build_reward_model(str(tiny_model_dir), tokenizer).save_pretrained(rm_dir)
    tokenizer.save_pretrained(rm_dir)
    # the value model as PPO builds it with --lora-r 4, its adapters and score head moved by "training"
    lora = LoraArgs(lora_r=4, lora_alpha=8.0)
    value = SeparateValueModel(loading.load_reward_model(str(rm_dir)))
    value.backbone = apply_lora(value.backbone, lora, task_type="FEATURE_EXTRACTION")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in value.named_parameters():
            if "lora_B" in name or name.startswith("score."):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    holder = nn.Module()
    holder.value_model = value  # the actor-critic's name for it in the checkpoint
    step = tmp_path / "ppo" / "checkpoints" / "step-3"
    step.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in holder.state_dict().items()}, str(step / "actor_critic.safetensors"))
    (step / META_FILE).write_text(json.dumps({"files": {}}))

    saved = save_value_model(tmp_path / "ppo", str(rm_dir), lora=dataclasses.replace(lora, save_merged=merged))

    assert saved == tmp_path / "ppo" / VALUE_DIR and not (tmp_path / "ppo" / "checkpoints").exists()
    # merged: a whole reward model; else the adapter alone, on the reward model it started from
    assert (saved / "model.safetensors").is_file() == merged
    assert (saved / "adapter_model.safetensors").is_file() != merged
    if not merged:
        assert loading.adapter_base(str(saved)) == str(rm_dir.resolve())
    plain = SeparateValueModel(loading.load_reward_model(str(saved))).eval()
    value.eval()
    ids = torch.randint(3, tokenizer.vocab_size, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        trained, reloaded = value(ids, mask, 5), plain(ids, mask, 5)
        start = SeparateValueModel(loading.load_reward_model(str(rm_dir))).eval()(ids, mask, 5)
    assert torch.allclose(reloaded, trained, atol=1e-5), (reloaded - trained).abs().max()
    assert not torch.allclose(reloaded, start, atol=1e-3)  # the adapters' update is in the weights
