"""SFT on a tiny model: the loss falls, the output is a plain Hugging Face model, `generate` writes aligned rows,
and gradient accumulation gives exactly the loss and weights of one big batch."""

from __future__ import annotations

import pytest
import torch
import yaml

from ...helpers import max_weight_diff, metrics, read_jsonl, run_cli, sft_args, sft_rows, weights, write_jsonl


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """One SFT run shared by the tests below: 30 steps of batch 8 with eval data."""
    root = tmp_path_factory.mktemp("sft")
    train = write_jsonl(root / "train.jsonl", sft_rows(64, seed=0))
    evals = write_jsonl(root / "eval.jsonl", sft_rows(16, seed=99))
    out = root / "out"
    from rlhfkit.cli.main import main

    code = main(
        sft_args(
            tiny_model_dir, train, out, max_steps=30, learning_rate=3e-3, batch_size=8, eval_data=evals, eval_steps=15
        )
    )
    assert code == 0
    return out


def test_sft_loss_falls_by_at_least_30_percent(trained):
    rows = metrics(trained)
    losses = [r["loss"] for r in rows]
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert losses[-1] <= 0.7 * losses[0], f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    evals = [(r["step"], r["eval/loss"]) for r in rows if "eval/loss" in r]
    assert [s for s, _ in evals] == [15, 30]
    assert evals[-1][1] < evals[0][1] < 0.8 * losses[0]
    lrs = [r["learning_rate"] for r in rows]
    assert lrs[0] == pytest.approx(3e-3) and all(a > b for a, b in zip(lrs, lrs[1:]))  # linear decay


def test_sft_writes_config_tensorboard_and_no_checkpoints_by_default(trained):
    cfg = yaml.safe_load((trained / "config.yaml").read_text())
    assert cfg["learning_rate"] == 0.003 and cfg["max_steps"] == 30 and cfg["output_dir"] == str(trained)
    assert any((trained / "tensorboard").iterdir())
    assert not (trained / "checkpoints").exists()


def test_sft_output_loads_with_plain_transformers_and_generates(trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(trained)
    tok = AutoTokenizer.from_pretrained(trained)
    saved = weights(trained)
    assert torch.equal(model.state_dict()["transformer.wte.weight"], saved["transformer.wte.weight"])
    prompt = tok("Question: what does carol want? Answer:", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > prompt["input_ids"].shape[1]
    # the fine-tuned model prefers the trained answer over a scrambled one
    good = tok("Question: what does carol want? Answer: carol wants the", return_tensors="pt")
    bad = tok("Question: what does carol want? Answer: the wants carol", return_tensors="pt")
    with torch.no_grad():
        nll = [model(**x, labels=x["input_ids"]).loss.item() for x in (good, bad)]
    assert nll[0] < nll[1] - 0.5


def test_generate_writes_rows_aligned_with_inputs(trained, tmp_path, capsys):
    prompts = [
        {"prompt": f"Question: what does {n} want? Answer:", "id": i, "meta": {"n": n}}
        for i, n in enumerate(["alice", "bob", "carol", "dave", "erin"])
    ]
    prompts.append({"prompt": [{"role": "user", "content": "please give bob the hat"}], "id": 5})
    data = write_jsonl(tmp_path / "prompts.jsonl", prompts)
    args = [
        "generate",
        "--model",
        trained,
        "--data",
        data,
        "--max-new-tokens",
        10,
        "--batch-size",
        4,
        "--temperature",
        0.3,
    ]
    code, _, err = run_cli(capsys, *args, "--output", tmp_path / "a.jsonl")
    assert code == 0 and "wrote 6 responses" in err
    rows = read_jsonl(tmp_path / "a.jsonl")
    assert [r["prompt"] for r in rows] == [p["prompt"] for p in prompts]
    assert [r["id"] for r in rows] == list(range(6)) and rows[2]["meta"] == {"n": "carol"}
    assert list(rows[0]) == ["prompt", "response", "id", "meta"]
    assert all(isinstance(r["response"], str) for r in rows)
    # the fine-tuned model answers in the trained pattern for most prompts
    assert sum("wants" in r["response"] for r in rows[:5]) >= 3, rows
    # same seed -> same rows; another seed -> different samples
    run_cli(capsys, *args, "--output", tmp_path / "b.jsonl")
    run_cli(capsys, *args, "--output", tmp_path / "c.jsonl", "--seed", 7, "--temperature", 1.5)
    assert read_jsonl(tmp_path / "b.jsonl") == rows
    assert read_jsonl(tmp_path / "c.jsonl") != rows


def _run_sft(capsys, model, data, out, **flags):
    code, _, err = run_cli(capsys, *sft_args(model, data, out, **flags))
    assert code == 0, err
    return metrics(out), weights(out)


def test_gradient_accumulation_invariance(tiny_model_dir, tmp_path, capsys):
    """batch 8 x 1 micro-batch vs batch 1 x 8 accumulated: same losses and weights (variable-length rows)."""
    rows = sft_rows(32, seed=5)
    lengths = {len(r["prompt"] + r["completion"]) for r in rows}
    assert len(lengths) > 5  # rows differ in length, so padding and token counts differ per micro-batch
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    common = dict(max_steps=4, learning_rate=1e-3, warmup_steps=1)
    big, w_big = _run_sft(capsys, tiny_model_dir, data, tmp_path / "big", batch_size=8, **common)
    acc, w_acc = _run_sft(
        capsys, tiny_model_dir, data, tmp_path / "acc", batch_size=8, gradient_accumulation_steps=8, **common
    )
    base = weights(tiny_model_dir)
    assert max_weight_diff(w_big, base) > 1e-3  # training moved the weights
    for a, b in zip(big, acc):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    assert max_weight_diff(w_big, w_acc) < 1e-5


def test_lora_sft_saves_a_merged_model_and_the_adapter(tiny_model_dir, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    data = write_jsonl(tmp_path / "d.jsonl", sft_rows(16, seed=3))
    out = tmp_path / "out"
    rows, merged = _run_sft(capsys, tiny_model_dir, data, out, max_steps=4, learning_rate=1e-2, lora_r=4)
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert (out / "adapter" / "adapter_config.json").is_file()
    base = weights(tiny_model_dir)
    assert merged.keys() == base.keys()  # the root is a plain model: no LoRA tensors
    assert max_weight_diff(merged, base) > 1e-4
    assert type(AutoModelForCausalLM.from_pretrained(out)).__name__ == "GPT2LMHeadModel"
