"""`rlhfkit dpo` end to end on the tiny yes/no preference task (see conftest.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.cli.main import main
from rlhfkit.errors import UserError
from rlhfkit.trainers import dpo
from rlhfkit.training.session import Session

from .dpo_task import HELD_OUT_ITEMS, read_metrics, reply_rates

SPEC_METRICS = {"loss", "rewards/chosen", "rewards/rejected", "rewards/margin", "rewards/accuracy"}


def weights(output_dir) -> dict[str, torch.Tensor]:
    return load_file(str(Path(output_dir) / "model.safetensors"))


def test_dpo_learns_the_preference_and_shifts_samples(task, dpo_config):
    yes_before, no_before = reply_rates(task.base, HELD_OUT_ITEMS)
    cfg = dpo_config(
        "run",
        "--eval-data",
        task.prefs_eval,
        "--max-steps",
        "30",
        "--batch-size",
        "8",
        "--learning-rate",
        "1e-3",
        "--beta",
        "0.1",
        "--eval-steps",
        "15",
    )
    dpo.train(cfg)
    rows = read_metrics(cfg.run.output_dir)
    first, last = rows[0], rows[-1]
    assert SPEC_METRICS | {"logps/chosen", "logps/rejected"} <= set(first)
    assert {f"eval/{k}" for k in SPEC_METRICS} <= set(last)
    # Step 1: the policy is the reference, so the implicit rewards are exactly 0 and the loss is log 2.
    assert first["rewards/chosen"] == 0 and first["rewards/rejected"] == 0
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert [r["step"] for r in rows if "eval/loss" in r] == [15, 30]
    # Held-out pairs (items never in the preference data): the implicit reward ranks them right.
    assert last["eval/rewards/accuracy"] > 0.8
    assert last["eval/rewards/margin"] > 1.0
    assert last["eval/loss"] < 0.4
    # Fresh samples on held-out prompts: from about half "yes" to nearly all, and "no" nearly gone.
    yes_after, no_after = reply_rates(cfg.run.output_dir, HELD_OUT_ITEMS)
    assert 0.2 < yes_before < 0.8 and 0.2 < no_before < 0.8
    assert yes_after > 0.9 and no_after < 0.1
    assert (Path(cfg.run.output_dir) / "config.yaml").is_file() and any(
        Path(cfg.run.output_dir, "tensorboard").iterdir()
    )


def test_resume_ends_with_the_same_weights(dpo_config, monkeypatch):
    full = dpo_config("full", "--save-steps", "3")
    dpo.train(full)

    killed = dpo_config("killed", "--save-steps", "3")
    real_save = Session.save

    def save_then_die(self, step, models, state, optimizer=None):
        real_save(self, step, models, state, optimizer)
        raise KeyboardInterrupt("killed after the step-3 checkpoint")

    monkeypatch.setattr(Session, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        dpo.train(killed)
    monkeypatch.setattr(Session, "save", real_save)
    assert not (Path(killed.run.output_dir) / "model.safetensors").exists()
    killed.run.resume = True
    dpo.train(killed)

    a, b = weights(full.run.output_dir), weights(killed.run.output_dir)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
    assert [r["loss"] for r in read_metrics(full.run.output_dir)] == [
        r["loss"] for r in read_metrics(killed.run.output_dir)
    ]


def test_precomputed_reference_gives_the_same_loss_curve(dpo_config):
    live = dpo_config("live")
    pre = dpo_config("pre", "--precompute-ref", "true")
    dpo.train(live)
    dpo.train(pre)
    a, b = read_metrics(live.run.output_dir), read_metrics(pre.run.output_dir)
    assert len(a) == len(b) == 6
    assert a[-1]["loss"] < a[0]["loss"] - 0.1  # the curve moves, so the comparison means something
    # The reference's log-probs agree up to float rounding (the precomputing batches pack their rows differently:
    # the tokens all rows share depend on the batch); at this learning rate, training magnifies that rounding
    # from ~1e-7 at step 1 to ~1e-4 by step 4. A wrong reference would differ from step 2 on by far more.
    for ra, rb in zip(a, b):
        for key in ("loss", "rewards/chosen", "rewards/rejected"):
            assert ra[key] == pytest.approx(rb[key], abs=1e-6 if ra["step"] == 1 else 1e-3), (ra["step"], key)


def test_eval_steps_minus_one_checks_the_held_out_rows_and_evaluates_none(task, dpo_config, tmp_path):
    plain = dpo_config("plain", "--max-steps", "4")
    never = dpo_config("never", "--max-steps", "4", "--eval-data", task.prefs_eval, "--eval-steps", "-1")
    dpo.train(plain)
    dpo.train(never)
    assert not any(k.startswith("eval/") for r in read_metrics(never.run.output_dir) for k in r)
    a, b = weights(plain.run.output_dir), weights(never.run.output_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the rows are still checked before training: a broken one stops the run
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "q", "chosen": "a"}\n')
    with pytest.raises(UserError, match="rejected"):
        dpo.train(dpo_config("broken", "--max-steps", "4", "--eval-data", str(broken), "--eval-steps", "-1"))
    with pytest.raises(UserError, match="eval-steps"):
        dpo_config("wrong", "--eval-steps", "-2")


def test_keep_best_and_patience_follow_the_held_out_dpo_loss(task, dpo_config):
    # A learning rate too small to move fp32 weights: the first evaluation stays the best.
    cfg = dpo_config("stop", "--max-steps", "10", "--learning-rate", "1e-15", "--eval-data", task.prefs_eval,
                     "--eval-steps", "1", "--patience", "2", "--keep-best")  # fmt: skip
    dpo.train(cfg)
    rows = read_metrics(cfg.run.output_dir)
    assert [r["step"] for r in rows if "eval/loss" in r] == [1, 2, 3]
    assert (Path(cfg.run.output_dir) / "model.safetensors").is_file()


def test_gradient_accumulation_matches_one_big_batch(dpo_config):
    big = dpo_config("big", "--max-steps", "4")
    accumulated = dpo_config("acc", "--max-steps", "4", "--gradient-accumulation-steps", "2")
    dpo.train(big)
    dpo.train(accumulated)
    for ra, rb in zip(read_metrics(big.run.output_dir), read_metrics(accumulated.run.output_dir)):
        assert ra["loss"] == pytest.approx(rb["loss"], abs=1e-5)
        assert ra["grad_norm"] == pytest.approx(rb["grad_norm"], rel=1e-4)


def test_lora_trains_adapters_against_the_base_model(task, dpo_config):
    cfg = dpo_config(
        "lora", "--lora-r", "4", "--learning-rate", "2e-2", "--max-steps", "10", "--eval-data", task.prefs_eval
    )
    dpo.train(cfg)
    rows = read_metrics(cfg.run.output_dir)
    # LoRA starts as the identity (B = 0), so step 1's reference (adapters off) equals the policy.
    assert rows[0]["rewards/chosen"] == 0 and rows[0]["rewards/rejected"] == 0
    assert rows[-1]["loss"] < 0.5 and rows[-1]["eval/rewards/accuracy"] > 0.8
    out = Path(cfg.run.output_dir)
    assert (out / "adapter" / "adapter_config.json").is_file()
    merged, base = weights(out), load_file(str(Path(task.base) / "model.safetensors"))
    assert merged.keys() == base.keys()  # the root holds a plain merged model
    assert any(not torch.equal(merged[k], base[k]) for k in base)


@pytest.mark.parametrize(
    "flags, first_loss",
    [
        (("--loss-type", "ipo", "--beta", "0.5"), (1 / (2 * 0.5)) ** 2),  # h = 0 at step 1: (0 - 1/(2 beta))^2
        (
            (
                "--label-smoothing",
                "0.2",
            ),
            math.log(2),
        ),  # h = 0: -(0.8 + 0.2) log sigma(0)
    ],
)
def test_ipo_and_label_smoothing_train(dpo_config, flags, first_loss):
    cfg = dpo_config("run", *flags)
    dpo.train(cfg)
    losses = [r["loss"] for r in read_metrics(cfg.run.output_dir)]
    assert losses[0] == pytest.approx(first_loss, abs=1e-6)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.1


def test_cli_rejects_sft_rows_with_one_line(task, tmp_path, capsys):
    code = main(["dpo", "--model", task.base, "--data", task.sft, "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.startswith("error: ") and task.sft in err and "'chosen' and 'rejected'" in err and "\n" not in err


def test_cli_rejects_label_smoothing_with_ipo(task, tmp_path, capsys):
    code = main(
        [
            "dpo",
            "--model",
            task.base,
            "--data",
            task.prefs_train,
            "--output-dir",
            str(tmp_path / "out"),
            "--loss-type",
            "ipo",
            "--label-smoothing",
            "0.1",
        ]
    )
    assert code == 1 and "--label-smoothing" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _mean_chosen_logp(model_dir: str, prefs: str) -> float:
    """log pi(chosen | prompt) of ``model_dir``, averaged over the pairs of ``prefs``."""
    from rlhfkit.config.parts import DataArgs
    from rlhfkit.data.schema import load_examples
    from rlhfkit.models.forward import sequence_logprobs
    from rlhfkit.models.loading import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, tokenizer=tokenizer).eval()
    examples = load_examples(prefs, "preference", "test")
    pairs = dpo.encode_all(tokenizer, examples, DataArgs())  # the lengths the runs use (the defaults)
    batch = dpo.make_batch(pairs, list(range(len(pairs))), tokenizer.pad_token_id, "cpu")
    with torch.no_grad():
        chosen, _ = dpo.split_pairs(sequence_logprobs(model, batch.seqs))
    return float(chosen.mean())


@pytest.mark.parametrize("lora", [(), ("--lora-r", "4")])
def test_ref_model_is_the_reference_of_the_loss(task, dpo_config, lora):
    init = str(task.root / "init")  # the random model SFT started from: the same tokenizer, other log-probs
    runs = {
        "own": dpo_config("own", "--eval-data", task.prefs_eval, "--max-steps", "2", *lora),
        "other": dpo_config("other", "--eval-data", task.prefs_eval, "--max-steps", "2", "--ref-model", init, *lora),
    }
    implied = {}
    for name, cfg in runs.items():
        dpo.train(cfg)
        last = read_metrics(cfg.run.output_dir)[-1]
        # eval/rewards/chosen = beta (log pi - log pi_ref), eval/logps/chosen = log pi, both means over the pairs
        implied[name] = last["eval/logps/chosen"] - last["eval/rewards/chosen"] / cfg.dpo.beta
    assert implied["own"] == pytest.approx(_mean_chosen_logp(task.base, task.prefs_eval), abs=1e-3)
    assert implied["other"] == pytest.approx(_mean_chosen_logp(init, task.prefs_eval), abs=1e-3)
    assert abs(implied["own"] - implied["other"]) > 1.0
    first = read_metrics(runs["other"].run.output_dir)[0]
    assert first["rewards/chosen"] != 0  # the policy starts away from this reference
