"""The models a round hands to the next: the policy's replies, the reward model's accuracy on them, the value
model PPO trained (kept as a plain Hugging Face folder so the next round's PPO starts from it), the final
policy."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from rlhfkit.config.parts import GenerationArgs
from rlhfkit.data.encode import encode_prompt
from rlhfkit.models.loading import load_causal_lm, load_reward_model, load_tokenizer
from rlhfkit.models.lora import apply_lora, merged_lora_weights, save_pretrained
from rlhfkit.models.reward import RewardScorer
from rlhfkit.models.sampling import decode, sample_responses
from rlhfkit.training.checkpoint import Checkpointer
from rlhfkit.training.runtime import seed_everything

VALUE_DIR = "value"  # OUT/round-K/ppo/value: the value model PPO trained that round
RUN_FILES = ("metrics.jsonl", "samples.jsonl", "config.yaml")  # a run's records, not part of a model folder


@torch.no_grad()
def sample_replies(
    policy_dir: str,
    prompts: list,
    generation: GenerationArgs,
    max_prompt_length: int,
    batch_size: int,
    device,
    seed: int,
    trust_remote_code: bool = False,
    per_prompt: int = 2,
) -> list[tuple[str, ...]]:
    """``per_prompt`` replies of the policy to each prompt: ``[(a, b, ...)]`` aligned with ``prompts``."""
    tokenizer = load_tokenizer(policy_dir, trust_remote_code)
    model = load_causal_lm(policy_dir, trust_remote_code, tokenizer).to(device).eval()
    ids = [encode_prompt(tokenizer, p, max_prompt_length) for p in prompts]
    seed_everything(seed)
    responses = sample_responses(
        model, tokenizer, [i for i in ids for _ in range(per_prompt)], generation, batch_size, device
    )
    texts = [decode(tokenizer, r) for r in responses]
    return [tuple(texts[per_prompt * i : per_prompt * (i + 1)]) for i in range(len(prompts))]


def sample_pairs(policy_dir: str, prompts: list, *args, **kwargs) -> list[tuple[str, str]]:
    """Two replies of the policy to each prompt: ``[(a, b)]`` aligned with ``prompts``."""
    return sample_replies(policy_dir, prompts, *args, **kwargs, per_prompt=2)


def pair_accuracies(rm_dir: str, row_sets: list[list[dict]], device, trust_remote_code: bool = False) -> list:
    """Per set of preference rows: how often the reward model (an ensemble: its mean) scores ``chosen`` above
    ``rejected`` (a tie counts one half); None for an empty set. The model is loaded once (not at all when every
    set is empty)."""
    if not any(row_sets):
        return [None] * len(row_sets)
    scorer = RewardScorer.load(rm_dir, device, trust_remote_code)  # (packing: the command's, rlhfkit.accel)
    accuracies = []
    for rows in row_sets:
        if not rows:
            accuracies.append(None)
            continue
        prompts = [r["prompt"] for r in rows]
        chosen = scorer.score(prompts, [r["chosen"] for r in rows]).mean.float().cpu()
        rejected = scorer.score(prompts, [r["rejected"] for r in rows]).mean.float().cpu()
        accuracies.append(float(((chosen > rejected).float() + 0.5 * (chosen == rejected).float()).mean()))
    return accuracies


def save_value_model(ppo_dir: Path, value_init: str, trust_remote_code: bool = False, lora=None) -> Path:
    """Write the value model of PPO's last checkpoint in ``ppo_dir`` as ``ppo_dir/value`` (a reward-model
    folder: the architecture of ``value_init``, the trained weights), then drop the checkpoints (the policy is
    already saved in ``ppo_dir``). ``lora``: the run's ``LoraArgs``; with a rank, the adapters PPO trained on
    the value model's backbone are merged into its weights, or with ``save_merged`` false written alone, as a
    reward model's LoRA adapter on ``value_init`` (its score head saved whole)."""
    latest = Checkpointer(ppo_dir).latest()
    assert latest is not None, f"{ppo_dir}: PPO left no checkpoint to take the value model from"
    weights = load_file(str(latest / "actor_critic.safetensors"))
    tokenizer = load_tokenizer(value_init, trust_remote_code)
    model = load_reward_model(value_init, trust_remote_code, tokenizer)
    prefix, backbone_keys, score_keys = model.base_model_prefix, "value_model.backbone.", "value_model.score."
    backbone = {k[len(backbone_keys) :]: v for k, v in weights.items() if k.startswith(backbone_keys)}
    if lora is not None and lora.lora_r > 0 and not lora.save_merged:
        out = _save_value_adapter(model, tokenizer, weights, lora, ppo_dir / VALUE_DIR)
        shutil.rmtree(ppo_dir / "checkpoints", ignore_errors=True)
        return out
    if lora is not None and lora.lora_r > 0:  # the adapters' names and scale come from the same wrapping as PPO's
        wrapped = load_reward_model(value_init, trust_remote_code, tokenizer)
        wrapped = apply_lora(getattr(wrapped, prefix), lora, task_type="FEATURE_EXTRACTION")
        # the checkpoint holds what trained (adapters, score head); the frozen weights are value_init's
        backbone = merged_lora_weights(wrapped, {**wrapped.state_dict(), **backbone})
    state = {f"{prefix}.{k}": v for k, v in backbone.items()}
    state.update({f"score.{k[len(score_keys) :]}": v for k, v in weights.items() if k.startswith(score_keys)})
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    out = save_pretrained(model, tokenizer, ppo_dir / VALUE_DIR)
    shutil.rmtree(ppo_dir / "checkpoints", ignore_errors=True)
    return out


def _save_value_adapter(model, tokenizer, weights: dict, lora, out: Path) -> Path:
    """PPO's trained value model as a reward model's LoRA adapter on ``model`` (what the value model started
    from): the adapters PPO trained on its backbone, renamed to where a reward model's wrapping puts them, and
    its score head, saved whole."""
    backbone_keys, score_keys = "value_model.backbone.base_model.model.", "value_model.score."
    wrapped = apply_lora(model, lora, task_type="SEQ_CLS")  # the score head becomes a module saved whole
    prefix = f"base_model.model.{model.base_model_prefix}."
    adapters = {k: v for k, v in weights.items() if k.startswith(backbone_keys) and ".lora_" in k}
    state = {prefix + k[len(backbone_keys) :]: v for k, v in adapters.items()}
    names = set(wrapped.state_dict())
    for key, value in weights.items():
        if key.startswith(score_keys):
            rest = key[len(score_keys) :]
            state.update({n: value for n in names if n.endswith(f"score.modules_to_save.default.{rest}")})
    missing = [n for n in names if (".lora_" in n or ".modules_to_save." in n) and n not in state]
    unknown = [n for n in state if n not in names]
    assert not missing and not unknown, (missing[:3], unknown[:3])
    wrapped.load_state_dict(state, strict=False)
    return save_pretrained(wrapped, tokenizer, out, merged=False)


def copy_model(src: Path, dst: Path) -> None:
    """The model files of a run folder (weights, config, tokenizer; not its records or sub-folders) into
    ``dst``, replacing what was there."""
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in RUN_FILES:
            shutil.copy2(f, tmp / f.name)
    shutil.rmtree(dst, ignore_errors=True)
    tmp.replace(dst)
