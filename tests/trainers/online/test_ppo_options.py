"""PPO options beyond the default path: reference refresh, separate value model, non-finite rewards."""

from __future__ import annotations

import pytest
import torch

from rlhfkit import accel
from rlhfkit.config.parse import flat_dict
from rlhfkit.errors import UserError
from rlhfkit.trainers.online import train as train_online
from tests.helpers import update_apart

from .conftest import ScoreOut, ThanksScorer, parse, read_metrics
from .test_ppo_resume import make_reward_model

BASE = (
    "--reward-model none --batch-size 8 --max-new-tokens 6 --progress false --normalize-reward false "
    "--learning-rate 1e-3"
)


def train(cfg, **kwargs):
    """As the command runs: under its --accel mode, its performance options read there (``accel.switched``)."""
    with accel.switched(cfg.run.accel, options=flat_dict(cfg)):
        return train_online(cfg, **kwargs)


def test_reference_refresh_resets_kl(thanks_task, tmp_path):
    model, prompts = thanks_task
    train(
        parse(
            "ppo", f"--model {model} --data {prompts} --output-dir {tmp_path} --max-steps 4 --ref-update-steps 2 {BASE}"
        ),
        scorer=ThanksScorer(),
    )
    kl = {r["step"]: r["kl/ref"] for r in read_metrics(tmp_path)}
    # after the refresh at step 2 the policy that samples step 3 *is* the reference
    assert kl[1] == 0.0 and kl[3] == 0.0
    assert kl[2] != 0.0 and kl[4] != 0.0


def test_separate_value_model_from_reward_model(thanks_task, tmp_path):
    model, prompts = thanks_task
    rm = make_reward_model(model, tmp_path / "rm")
    train(
        parse(
            "ppo",
            f"--model {model} --data {prompts} --output-dir {tmp_path}/run --max-steps 3 --value-model {rm} {BASE}",
        ),
        scorer=ThanksScorer(),
    )
    rows = read_metrics(tmp_path / "run")
    # the value model starts from the RM's head, so values are non-zero from the first step
    assert rows[0]["value/mean"] != 0.0
    assert all(r["loss/value"] > 0 for r in rows)


class NaNScorer(ThanksScorer):
    def score(self, prompts, responses, batch_size=32, finished=None):
        return ScoreOut(torch.full((len(responses),), float("nan")))


def test_non_finite_rewards_skip_then_stop(thanks_task, tmp_path, capsys):
    model, prompts = thanks_task
    cfg = parse(
        "ppo",
        f"--model {model} --data {prompts} --output-dir {tmp_path} --max-steps 5 --save-steps 1 "
        f"--reward-clip none {BASE}",
    )
    with pytest.raises(UserError, match="non-finite"):
        train(cfg, scorer=NaNScorer())
    assert "skipped" in capsys.readouterr().err
    # skipped updates leave the weights as they were: whatever was checkpointed is finite
    from safetensors.torch import load_file

    for ckpt in (tmp_path / "checkpoints").glob("step-*"):
        assert all(torch.isfinite(t).all() for t in load_file(ckpt / "actor_critic.safetensors").values())


def test_non_finite_weights_are_never_saved(tmp_path):
    from rlhfkit.training.checkpoint import Checkpointer

    layer = torch.nn.Linear(2, 2)
    with torch.no_grad():
        layer.weight[0, 0] = float("inf")
    with pytest.raises(FloatingPointError):
        Checkpointer(tmp_path).save(1, {"model": layer}, {})
    assert Checkpointer(tmp_path).latest() is None


def test_reusing_the_first_epochs_forward_changes_nothing(thanks_task, tmp_path, monkeypatch):
    """One minibatch: epoch 1's forward doubles as the rollout's old-log-prob/value pass. Turning that
    off (a separate no-grad pass, as with several minibatches) must give the same update."""
    from safetensors.torch import load_file

    from rlhfkit.trainers.online.policy import ActorCritic
    from rlhfkit.trainers.online.trainer import OnlineTrainer

    model, prompts = thanks_task
    args = f"--model {model} --data {prompts} --max-steps 1 --ppo-epochs 2 {BASE}"
    calls = []
    forward = ActorCritic.forward
    monkeypatch.setattr(ActorCritic, "forward", lambda self, *a, **k: calls.append(1) or forward(self, *a, **k))
    results = []
    for reuse in (True, False):
        if not reuse:
            monkeypatch.setattr(OnlineTrainer, "reuses_first_pass", property(lambda self: False))
        out = tmp_path / f"reuse-{reuse}"
        calls.clear()
        torch.manual_seed(0)
        metrics = train(parse("ppo", f"{args} --output-dir {out}"), scorer=ThanksScorer())
        results.append((metrics, load_file(out / "model.safetensors")))
        assert len(calls) == (2 if reuse else 3)  # rollout pass + 2 epochs, the first shared when reused
    (m_reuse, w_reuse), (m_plain, w_plain) = results
    for key in ("loss/policy", "loss/value", "policy/clipfrac", "kl/ref", "reward/score"):
        assert m_reuse[key] == pytest.approx(m_plain[key], abs=1e-5), key
    start = load_file(model / "model.safetensors")
    apart, moved = update_apart(w_reuse, w_plain, start)
    print(f"weights apart {apart:.3g}, moved {moved:.3g}")
    assert moved > 1e-2 and apart < 1e-2 * moved


class FinishedRecorder(ThanksScorer):
    def __init__(self):
        self.finished = []

    def score(self, prompts, responses, batch_size=32, finished=None):
        self.finished += finished
        return super().score(prompts, responses)


def test_cut_off_responses_reach_the_scorer_as_unfinished(thanks_task, tmp_path):
    model, prompts = thanks_task
    flags = {}
    for n in (2, 16):  # the task's replies are ~5 tokens + EOS: all cut at 2, nearly all finished at 16
        scorer = FinishedRecorder()
        train(
            parse(
                "ppo",
                f"--model {model} --data {prompts} --output-dir {tmp_path}/n{n} --max-steps 1 "
                f"{BASE.replace('--max-new-tokens 6', f'--max-new-tokens {n}')}",
            ),
            scorer=scorer,
        )
        flags[n] = scorer.finished
    assert len(flags[2]) == 8 and not any(flags[2])
    assert sum(flags[16]) >= 6


@pytest.mark.parametrize("value", ["head", "separate"])
def test_packed_sequences_give_the_padded_update(thanks_task, tmp_path, monkeypatch, value):
    """--pack-sequences runs every teacher-forced pass (old log-probs and values, reference, PPO epochs)
    on packed rows; two steps with and without it must log the same metrics and reach the same weights."""
    from safetensors.torch import load_file

    from rlhfkit.accel import packing

    monkeypatch.setattr(packing, "SPAN_PER_HIDDEN", 10**6)  # attention looks free: pack as tightly as possible
    packed_calls = []
    pack_batch = packing.pack_batch
    monkeypatch.setattr(
        "rlhfkit.accel.passes.pack_batch", lambda *a: packed_calls.append(pack_batch(*a)) or packed_calls[-1]
    )
    model, prompts = thanks_task
    extra = f"--value-model {make_reward_model(model, tmp_path / 'rm')}" if value == "separate" else ""
    args = f"--model {model} --data {prompts} --max-steps 2 --ppo-epochs 2 --num-minibatches 2 {extra} {BASE}"
    results = []
    for packs in ("true", "false"):
        out = tmp_path / f"pack-{packs}"
        torch.manual_seed(0)
        train(parse("ppo", f"{args} --pack-sequences {packs} --output-dir {out}"), scorer=ThanksScorer())
        results.append((read_metrics(out), load_file(out / "model.safetensors")))
    # per step: one packing for the rollout (shared by the value model and the reference) + one per minibatch
    # (2 epochs x 2), and a separate value model's pass after the policy's packs each minibatch's quarters (4 rows:
    # 4 x 1)
    from rlhfkit.accel.online import VALUE_PASS_SPLIT

    per_update = 1 + VALUE_PASS_SPLIT if value == "separate" else 1
    assert len(packed_calls) == 2 * (1 + 4 * per_update) and sum(p is not None for p in packed_calls) > 5
    assert len(packed_calls[0].input_ids) < 8  # the rollout's 8 sequences share rows
    (rows_packed, w_packed), (rows_padded, w_padded) = results
    for a, b in zip(rows_packed, rows_padded):
        for key in ("loss/policy", "loss/value", "policy/clipfrac", "kl/ref", "reward/score", "value/mean"):
            assert a[key] == pytest.approx(b[key], abs=1e-4), key
    start = load_file(model / "model.safetensors")
    apart, moved = update_apart(w_packed, w_padded, start)
    print(f"weights apart {apart:.3g}, moved {moved:.3g}")
    assert moved > 1e-2 and apart < 1e-2 * moved


@pytest.mark.parametrize("lora", [0, 4])
def test_gradient_checkpointing_gives_the_same_update(thanks_task, tmp_path, lora):
    """PPO with the value head on the policy, full and LoRA: the same metrics and weights with the layers'
    activations recomputed in the backward pass."""
    from safetensors.torch import load_file

    model, prompts = thanks_task
    args = f"--model {model} --data {prompts} --max-steps 2 --lora-r {lora} --learning-rate 1e-3 {BASE}"
    results = []
    for checkpointing in ("false", "true"):
        out = tmp_path / f"gc-{checkpointing}"
        torch.manual_seed(0)
        cfg = parse("ppo", f"{args} --gradient-checkpointing {checkpointing} --output-dir {out}")
        train(cfg, scorer=ThanksScorer())
        results.append((read_metrics(out), load_file(out / "model.safetensors")))
    (rows_plain, w_plain), (rows_gc, w_gc) = results
    for a, b in zip(rows_plain, rows_gc):
        for key in ("loss/policy", "loss/value", "kl/ref", "reward/score"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
    assert max(float((w_plain[k] - w_gc[k]).abs().max()) for k in w_plain) < 1e-5


@pytest.mark.parametrize("lora", [0, 4])
def test_the_lm_head_taken_block_by_block_gives_the_same_update(thanks_task, tmp_path, monkeypatch, lora):
    """With blocks small enough that every teacher-forced pass takes the LM head and its log-probs together
    (``response_token_stats`` without logits), PPO logs the same metrics and reaches the same weights."""
    from safetensors.torch import load_file

    from rlhfkit.accel import vocab

    model, prompts = thanks_task
    args = f"--model {model} --data {prompts} --max-steps 2 --lora-r {lora} --learning-rate 1e-3 {BASE}"
    fused_calls = []
    head_logprobs = vocab.head_logprobs
    monkeypatch.setattr(vocab, "head_logprobs", lambda *a, **k: fused_calls.append(1) or head_logprobs(*a, **k))
    results = []
    for block in (None, 3 * 400):  # default (the tiny vocabulary's logits fit one block), then 3 positions a block
        if block is not None:
            monkeypatch.setattr(vocab, "CHUNK_ELEMENTS", block)
        out = tmp_path / f"block-{block}"
        torch.manual_seed(0)
        train(parse("ppo", f"{args} --output-dir {out}"), scorer=ThanksScorer())
        results.append((read_metrics(out), load_file(out / "model.safetensors")))
        assert bool(fused_calls) == (block is not None)
    (rows_plain, w_plain), (rows_fused, w_fused) = results
    for a, b in zip(rows_plain, rows_fused):
        for key in ("loss/policy", "loss/value", "kl/ref", "policy/entropy", "reward/score"):
            assert a[key] == pytest.approx(b[key], abs=1e-4), key
    # Adam moves a weight whose gradient is near 0 by up to the learning rate whatever that gradient's rounding,
    # so the two runs' weights are compared through the whole update: their difference against what training
    # changed (a wrong gradient would make the two about equal).
    start = load_file(model / "model.safetensors")
    keys = [k for k in w_plain if k in start]
    apart = sum(float((w_plain[k] - w_fused[k]).square().sum()) for k in keys) ** 0.5
    moved = sum(float((w_plain[k] - start[k]).square().sum()) for k in keys) ** 0.5
    print(f"weights apart {apart:.3g}, moved {moved:.3g}")
    assert moved > 0 and apart < 1e-2 * moved


@pytest.mark.parametrize("lora", [0, 4])
def test_ref_model_sets_the_reference_of_the_kl_terms(thanks_task, tmp_path, lora):
    """--ref-model: the starting policy's own folder gives the default run's numbers; another model (the policy's
    base before SFT) is a different reference, so the KL at the first step, before any update, is far from 0."""
    model, prompts = thanks_task
    args = f"--model {model} --data {prompts} --max-steps 1 --lora-r {lora} {BASE}"
    runs = {}
    for name, extra in (
        ("default", ""),
        ("same", f"--ref-model {model}"),
        ("base", f"--ref-model {model.parent}/base"),
    ):
        torch.manual_seed(0)
        train(parse("ppo", f"{args} {extra} --output-dir {tmp_path}/{name}"), scorer=ThanksScorer())
        runs[name] = read_metrics(tmp_path / name)[0]
    assert runs["same"]["kl/ref"] == pytest.approx(runs["default"]["kl/ref"], abs=1e-6)
    assert abs(runs["default"]["kl/ref"]) < 1e-4  # before the first update the policy is its own reference
    assert runs["base"]["kl/ref"] > 1.0  # the SFT policy is far from the untrained base
    with pytest.raises(UserError, match="ref-update-steps.*cannot be combined with --ref-model"):
        parse("ppo", f"{args} --ref-model {model} --ref-update-steps 2 --output-dir {tmp_path}/x")


@pytest.mark.parametrize("minibatches", [1, 2])
def test_value_model_pass_apart_gives_the_joint_update(thanks_task, tmp_path, monkeypatch, minibatches):
    """A separate value model runs its forward and backward apart from the policy's (in quarter-size
    micro-batches), never beside it: the same metrics and weights, policy and value model, as one joint loss.
    One minibatch reuses the rollout's forward for the policy; the value model's rollout pass runs alone."""
    from safetensors.torch import load_file

    from rlhfkit.accel.online import VALUE_PASS_SPLIT
    from rlhfkit.trainers.online.policy import ActorCritic, Networks

    model, prompts = thanks_task
    rm = make_reward_model(model, tmp_path / "rm")
    args = (
        f"--model {model} --data {prompts} --max-steps 2 --save-steps 2 --ppo-epochs 2 "
        f"--num-minibatches {minibatches} --value-model {rm} {BASE}"
    )
    parts = []
    forward = ActorCritic.forward

    def recorded(self, *a, networks=Networks.ALL, **k):
        parts.append(networks)
        return forward(self, *a, networks=networks, **k)

    monkeypatch.setattr(ActorCritic, "forward", recorded)
    results = []
    for apart in (True, False):
        out = tmp_path / f"apart-{apart}"
        parts.clear()
        torch.manual_seed(0)
        train(parse("ppo", f"{args} --value-pass-apart {str(apart).lower()} --output-dir {out}"), scorer=ThanksScorer())
        weights = load_file(next((out / "checkpoints").glob("step-2")) / "actor_critic.safetensors")
        results.append((read_metrics(out), weights, list(parts)))
    (rows_apart, w_apart, parts_apart), (rows_joint, w_joint, parts_joint) = results
    # with gradients the networks run apart; the rollout's pass without them runs both unless it is reused
    assert parts_apart.count(Networks.ALL) == (0 if minibatches == 1 else 2)
    assert parts_apart.count(Networks.VALUE) > parts_apart.count(Networks.POLICY) > 0
    if minibatches == 1:  # 2 steps x (2 epochs x the quarters of one minibatch + the rollout's values)
        assert parts_apart.count(Networks.VALUE) == 2 * (2 * VALUE_PASS_SPLIT + 1)
    assert set(parts_joint) == {Networks.ALL}
    for a, b in zip(rows_apart, rows_joint):
        for key in ("loss/policy", "loss/value", "loss/total", "value/mean", "kl/ref"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
        # a count of float ties (clipped vs unclipped error, equal wherever the value model has not moved yet):
        # the two ways pack their rows differently, and a few of the ~80 tokens may fall either way
        assert a["value/clipfrac"] == pytest.approx(b["value/clipfrac"], abs=0.05)
    assert any(k.startswith("value_model.") for k in w_apart)
    start = load_file(model / "model.safetensors")
    apart, moved = update_apart(w_apart, w_joint, start, key=lambda k: k.removeprefix("policy."))
    print(f"weights apart {apart:.3g}, moved {moved:.3g}")
    assert moved > 1e-2 and apart < 1e-2 * moved


def test_lora_also_adapts_a_separate_value_model(thanks_task, tmp_path):
    """With --lora-r the value model's backbone trains adapters only and its score head in full."""
    from rlhfkit.models.loading import load_tokenizer
    from rlhfkit.trainers.online.run import build_models

    model, prompts = thanks_task
    rm = make_reward_model(model, tmp_path / "rm")
    argv = f"--model {model} --data {prompts} --output-dir {tmp_path}/run --max-steps 3 --value-model {rm} {BASE}"
    actor_critic, _ = build_models(parse("ppo", argv + " --lora-r 4"), load_tokenizer(str(model)))
    trainable = [n for n, p in actor_critic.value_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or n.startswith("score.") for n in trainable)
    assert any(n.startswith("score.") for n in trainable)
    train(parse("ppo", argv + " --lora-r 4 --save-steps 3"), scorer=ThanksScorer())
    rows = read_metrics(tmp_path / "run")
    assert all(r["loss/value"] > 0 for r in rows)
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "run" / "checkpoints" / "step-3" / "actor_critic.safetensors")
    start = load_file(rm / "model.safetensors")
    # the checkpoint holds what trained: the backbone's adapters and the head (which moved), not the frozen weights
    backbone = [k for k in saved if k.startswith("value_model.backbone")]
    assert backbone and all(".lora_" in k for k in backbone)
    assert not torch.equal(saved["value_model.score.weight"], start["score.weight"])


def test_value_warmup_trains_the_value_model_alone_first(thanks_task, tmp_path):
    """--value-warmup-steps 2 of 3: after steps 1-2 the policy is as it started and the value model has moved
    from the reward model's weights; step 3 updates the policy."""
    from safetensors.torch import load_file

    model, prompts = thanks_task
    rm = make_reward_model(model, tmp_path / "rm")
    out = tmp_path / "run"
    args = f"--model {model} --data {prompts} --output-dir {out} --max-steps 3 --value-model {rm} {BASE}"
    args += " --save-steps 1 --save-total-limit 3"
    train(parse("ppo", f"{args} --value-warmup-steps 2"), scorer=ThanksScorer())
    start, value_start = load_file(model / "model.safetensors"), load_file(rm / "model.safetensors")

    def weights(step: int) -> dict:
        return load_file(out / "checkpoints" / f"step-{step}" / "actor_critic.safetensors")

    def policy_moved(w: dict) -> float:
        return max(
            (w[f"policy.{k}"].float() - v.float()).abs().max().item() for k, v in start.items() if f"policy.{k}" in w
        )

    def value_moved(w: dict) -> float:
        pairs = [(w[f"value_model.{k}"], v) for k, v in value_start.items() if f"value_model.{k}" in w]
        assert pairs
        return max((a.float() - b.float()).abs().max().item() for a, b in pairs)

    assert policy_moved(weights(2)) == 0.0 and value_moved(weights(1)) > 0
    assert policy_moved(weights(3)) > 1e-4
    rows = read_metrics(out)
    assert [r.get("value/warmup", 0.0) for r in rows] == [1.0, 1.0, 0.0]


def test_value_warmup_needs_a_value_model_and_steps_after_it(thanks_task, tmp_path):
    model, prompts = thanks_task
    args = f"--model {model} --data {prompts} --output-dir {tmp_path} --max-steps 3 {BASE}"
    with pytest.raises(UserError, match="--value-warmup-steps trains a separate value model alone"):
        parse("ppo", f"{args} --value-warmup-steps 1")
    with pytest.raises(UserError, match="--value-warmup-steps 3 leaves none of --max-steps 3"):
        parse("ppo", f"{args} --value-warmup-steps 3 --value-model {model}")
