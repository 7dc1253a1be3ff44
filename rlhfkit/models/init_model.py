"""`rlhfkit init-model`: a small randomly initialised causal LM and a BPE tokenizer trained on local text.

Nothing comes from a hub: the tokenizer is a byte-level BPE trained with the ``tokenizers`` library
on ``--corpus``, and the model is built from a ``transformers`` config. Dropout is 0 so log-probs are
the same in rollouts and updates (RL fine-tuning needs that).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

from rlhfkit.config.commands import InitModelConfig
from rlhfkit.errors import UserError

logger = logging.getLogger(__name__)

EOS, PAD = "<|endoftext|>", "<|pad|>"

# (hidden, layers, heads, intermediate, positions, default BPE vocabulary). The parameter counts these give are
# stated in the help of `--size` (InitModelConfig), and a test holds that text to them.
SIZES = {
    "tiny": dict(hidden=64, layers=4, heads=4, intermediate=176, positions=256, vocab=1024),
    "small": dict(hidden=384, layers=5, heads=6, intermediate=1024, positions=512, vocab=4096),
}


def _strings(obj) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _strings(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _strings(value)


def corpus_lines(path: str) -> list[str]:
    """Lines of a text file, or every string value of a JSONL file."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{path}: corpus file does not exist")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = p.read_bytes()[: exc.start].count(b"\n") + 1
        raise UserError(f"{path}: line {line}: not valid UTF-8") from None
    if p.suffix == ".jsonl":
        lines = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    lines += list(_strings(json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise UserError(f"{path}: line {number}: broken JSON ({exc.msg})") from None
    else:
        lines = text.splitlines()
    lines = [line for line in lines if line.strip()]
    if not lines:
        raise UserError(f"{path}: the corpus is empty")
    return lines


def train_tokenizer(lines: list[str], vocab_size: int):
    """Byte-level BPE with ``<|endoftext|>`` as BOS/EOS and a separate ``<|pad|>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(lines, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=EOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=None,
        model_max_length=SIZES["small"]["positions"],
    )


def model_config(arch: str, size: str, tokenizer):
    from transformers import GPT2Config, LlamaConfig

    s = SIZES[size]
    ids = dict(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if arch == "gpt2":
        return GPT2Config(
            n_embd=s["hidden"],
            n_layer=s["layers"],
            n_head=s["heads"],
            n_inner=s["intermediate"],
            n_positions=s["positions"],
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **ids,
        )
    return LlamaConfig(
        hidden_size=s["hidden"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["heads"],
        intermediate_size=s["intermediate"],
        max_position_embeddings=s["positions"],
        tie_word_embeddings=True,
        **ids,
    )


def build_model(arch: str, size: str, tokenizer, seed: int):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(model_config(arch, size, tokenizer))


def init_model(cfg: InitModelConfig) -> Path:
    """Entry point of `rlhfkit init-model`; returns the output directory."""
    lines = corpus_lines(cfg.corpus)
    tokenizer = train_tokenizer(lines, cfg.vocab_size or SIZES[cfg.size]["vocab"])
    model = build_model(cfg.arch, cfg.size, tokenizer, cfg.seed)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    logger.info(
        "wrote a %s %s model (%.2fM parameters, vocabulary %d) to %s", cfg.size, cfg.arch, n / 1e6, len(tokenizer), out
    )
    return out
