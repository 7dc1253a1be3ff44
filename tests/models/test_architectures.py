"""`rlhfkit sft` and `rlhfkit generate` on tiny GPT-2, Llama, Qwen2 and GPT-NeoX directories made with plain
`transformers` configs and a `tokenizers` BPE, and the outputs load back with plain `transformers`."""

from __future__ import annotations

import pytest
import torch

from ..conftest import tiny_corpus_lines
from ..helpers import max_weight_diff, metrics, read_jsonl, run_cli, sft_args, sft_rows, weights, write_jsonl

DIMS = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128
)


def make_config(arch: str, vocab: int, eos: int):
    import transformers as tf

    ids = dict(vocab_size=vocab, bos_token_id=eos, eos_token_id=eos)
    if arch == "gpt2":
        return tf.GPT2Config(n_embd=32, n_inner=64, n_layer=2, n_head=4, n_positions=128, **ids)
    if arch == "llama":
        return tf.LlamaConfig(num_key_value_heads=2, **DIMS, **ids)
    if arch == "qwen2":
        return tf.Qwen2Config(num_key_value_heads=2, **DIMS, **ids)
    if arch == "gpt_neox":
        return tf.GPTNeoXConfig(rotary_pct=0.5, **DIMS, **ids)
    raise ValueError(arch)


def make_model_dir(path, arch: str, with_pad: bool):
    """A random model of ``arch`` and a byte-level BPE tokenizer; ``with_pad=False`` leaves the pad token unset."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>"] + (["<pad>"] if with_pad else [])  # Qwen2/NeoX tokenizer classes expect <|endoftext|>
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        tiny_corpus_lines(),
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=specials,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|endoftext|>", **({"pad_token": "<pad>"} if with_pad else {})
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config(arch, len(tok), tok.eos_token_id))
    model.save_pretrained(path)  # safetensors by default
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize(
    "arch,with_pad,model_class",
    [
        ("gpt2", True, "GPT2LMHeadModel"),
        ("llama", False, "LlamaForCausalLM"),
        ("qwen2", False, "Qwen2ForCausalLM"),
        ("gpt_neox", True, "GPTNeoXForCausalLM"),
    ],
)
def test_sft_and_generate_work_on_common_architectures(tmp_path, capsys, arch, with_pad, model_class):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = make_model_dir(tmp_path / "base", arch, with_pad)
    data = write_jsonl(tmp_path / "d.jsonl", sft_rows(16, seed=2))
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, *sft_args(base, data, out, max_steps=6, batch_size=8, learning_rate=1e-2))
    assert code == 0, err
    losses = [r["loss"] for r in metrics(out)]
    assert losses[-1] < 0.9 * losses[0], losses

    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == model_class
    assert max_weight_diff(weights(out), weights(base)) > 1e-3
    assert tok.pad_token is not None  # a missing pad token was filled in and saved
    prompt = tok("Question: what does alice want? Answer:", return_tensors="pt", return_token_type_ids=False)
    generated = model.generate(**prompt, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    assert generated.shape[1] > prompt["input_ids"].shape[1]

    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Question: what does bob want? Answer:"}, {"prompt": "hi"}])
    code, _, err = run_cli(
        capsys, "generate", "--model", out, "--data", prompts, "--output", tmp_path / "g.jsonl", "--max-new-tokens", 6
    )
    assert code == 0, err
    assert [r["prompt"] for r in read_jsonl(tmp_path / "g.jsonl")] == ["Question: what does bob want? Answer:", "hi"]


def test_disable_dropout_makes_training_mode_deterministic_for_functional_attention_dropout():
    """Llama-style attention applies ``attention_dropout`` functionally in training mode; PPO's reused
    first pass runs in training mode, so that rate must be zeroed too."""
    import transformers as tf

    from rlhfkit.training.runtime import disable_dropout

    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(
        tf.LlamaConfig(num_key_value_heads=2, attention_dropout=0.5, vocab_size=64, **DIMS)
    ).train()
    ids = torch.randint(0, 64, (2, 9))
    assert not torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)  # dropout is live
    disable_dropout(model)
    train_mode = model(input_ids=ids).logits
    assert torch.allclose(train_mode, model.eval()(input_ids=ids).logits, atol=1e-6)
