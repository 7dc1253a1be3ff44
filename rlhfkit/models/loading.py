"""Load local Hugging Face models and tokenizers: safetensors only, nothing from a hub.

A model is a Hugging Face folder, or a ``.gguf`` file: that is de-quantised once into a folder in rlhfkit's
cache (``rlhfkit.models.gguf``) and loaded from there.

A missing pad token is set to EOS (so padding works); ``trust_remote_code`` is passed only when the
user asks for it. Every ``from_pretrained`` here passes ``local_files_only=True``, so no hub is contacted.
Each loaded model goes through ``prepare_loaded``, here and only here.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlhfkit.errors import UserError, invocation
from rlhfkit.models.fastpath import replaceable
from rlhfkit.models.gguf import dequantised_folder, is_gguf

STATS_FILE = "reward_stats.json"  # beside a reward model made by ``rlhfkit rm`` (``rlhfkit.models.reward``)


def model_folder(path: str, what: str = "model") -> str:
    """The Hugging Face folder to load: ``path`` itself, or for a ``.gguf`` file its de-quantised folder."""
    return str(dequantised_folder(path, what)) if is_gguf(path) else str(path)


def check_model_dir(path: str, what: str = "model") -> Path:
    """Raise a UserError unless ``path`` is a local model directory with safetensors weights (or a ``.gguf``
    file, checked and de-quantised by ``model_folder``)."""
    p = Path(model_folder(path, what))
    if not p.exists():
        raise UserError(f"{path}: {what} directory does not exist")
    if not p.is_dir():
        raise UserError(f"{path}: {what} must be a directory (config.json, *.safetensors, tokenizer files)")
    if not (p / "config.json").is_file():
        if (p / "adapter_config.json").is_file():
            merge = invocation("merge", adapter=str(path), output_dir="MERGED")
            raise UserError(f"{path}: a LoRA adapter without its base weights; merge it into a full model: {merge}")
        raise UserError(f"{path}: not a Hugging Face {what} directory (no config.json)")
    try:
        json.loads((p / "config.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{path}/config.json: not valid JSON") from None
    if not any(p.glob("*.safetensors")):
        pickled = [f.name for f in p.glob("*.bin")] + [f.name for f in p.glob("*.pt")]
        hint = (
            f" (found {', '.join(pickled)}: pickled weights are not loaded; convert them to safetensors)"
            if pickled
            else ""
        )
        raise UserError(f"{path}: no *.safetensors weights{hint}")
    return p


def load_tokenizer(path: str, trust_remote_code: bool = False, padding_side: str = "right", what: str = "model"):
    from transformers import AutoTokenizer

    path = str(check_model_dir(path, what))  # a clear message for a missing or non-model directory first
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot load the tokenizer ({str(exc).splitlines()[0]})") from None
    if tok.eos_token is None and tok.pad_token is None:
        raise UserError(f"{path}: the tokenizer has neither an EOS nor a pad token")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = padding_side
    return tok


def load_pretrained(auto_cls, path: str, what: str, trust_remote_code: bool, **kwargs):
    """``auto_cls.from_pretrained`` on a checked local directory (safetensors, no hub), then ``prepare_loaded``."""
    path = str(check_model_dir(path, what))
    try:
        model = auto_cls.from_pretrained(
            path, trust_remote_code=trust_remote_code, use_safetensors=True, local_files_only=True, **kwargs
        )
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"{path}: cannot load as a {what} ({str(exc).splitlines()[0]})") from None
    prepare_loaded(model)
    return model


@replaceable
def prepare_loaded(model) -> None:
    """Called on each model ``load_pretrained`` loads; in the plain code, nothing (a faster implementation may
    change how its modules compute, never what: ``rlhfkit.models.fastpath``)."""


def load_causal_lm(path: str, trust_remote_code: bool = False, tokenizer=None):
    """``AutoModelForCausalLM`` from a local directory, its pad token id set from the tokenizer. A reward
    model's directory is refused before loading (``check_kind``)."""
    from transformers import AutoModelForCausalLM

    check_kind(path, "causal LM")
    model = load_pretrained(AutoModelForCausalLM, path, "causal LM", trust_remote_code)
    if tokenizer is not None:
        match_tokenizer(model, tokenizer, path)
    return model


POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")


def position_limit(path: str) -> tuple[int, str] | None:
    """The most positions the model at ``path`` reads, and the config.json key that says so (a multimodal
    model's ``text_config`` included); None when its config names no limit."""
    config = json.loads((Path(model_folder(path)) / "config.json").read_text(encoding="utf-8"))
    for part in (config, config.get("text_config") if isinstance(config, dict) else None):
        if not isinstance(part, dict):
            continue
        for key in POSITION_KEYS:
            value = part.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, key
    return None


def architectures(path: str) -> list[str]:
    """The model classes a checked model directory's config.json names (``architectures``)."""
    config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    names = config.get("architectures") if isinstance(config, dict) else None
    return [str(name) for name in names or []]


def causal_lm_class(path: str) -> str | None:
    """The class a checked model directory's config.json names when it is a language model (e.g.
    ``GPT2LMHeadModel``, ``LlamaForCausalLM``) and not a sequence classifier; None otherwise."""
    names = architectures(path)
    if any("ForSequenceClassification" in name for name in names):
        return None
    lm = [name for name in names if name.endswith(("ForCausalLM", "LMHeadModel"))]
    return lm[0] if lm else None


def classifier_class(path: str) -> str | None:
    """What makes a checked model directory a reward model: the sequence-classifier class its config.json
    names (e.g. ``GPT2ForSequenceClassification``), or rlhfkit's score statistics beside it (``rlhfkit rm``
    writes them); None otherwise."""
    names = [name for name in architectures(path) if name.endswith("ForSequenceClassification")]
    if names:
        return names[0]
    return f"made by rlhfkit rm: {STATS_FILE}" if (Path(path) / STATS_FILE).is_file() else None


def check_kind(path: str, expected: str) -> None:
    """Raise a UserError, before any weights load, when the directory at ``path`` is the other kind of model
    than ``expected`` ("causal LM": a language model that generates, for a policy, a reference, generation
    and evaluation; "reward model": a sequence classifier with one output that scores). Decided by
    config.json's ``architectures`` (and rlhfkit's reward statistics); a directory naming neither passes."""
    folder = str(check_model_dir(path, expected))
    if expected == "causal LM":
        classifier = classifier_class(folder)
        if classifier is not None:
            raise UserError(
                f"{path}: is a reward model ({classifier}), not a causal LM: a policy, reference or model to "
                "sample from must be a language model that generates text (e.g. the SFT model a reward model "
                "was trained from)"
            )
        return
    lm = causal_lm_class(folder)
    if lm is not None:
        train = invocation("rm", model=str(path), data="PREFS.jsonl", output_dir="OUT")
        raise UserError(
            f"{path}: is a causal LM ({lm}), not a reward model (a sequence classifier with one output); "
            f"train a reward model from it on preference pairs: {train}"
        )


def load_reward_model(path: str, trust_remote_code: bool = False, tokenizer=None):
    """``AutoModelForSequenceClassification`` with one output (the scalar reward). A causal LM's directory
    is refused before loading (``check_kind``): transformers would give it a random two-output head."""
    from transformers import AutoModelForSequenceClassification

    check_kind(path, "reward model")
    model = load_pretrained(AutoModelForSequenceClassification, path, "reward model", trust_remote_code)
    if model.config.num_labels != 1:
        raise UserError(f"{path}: a reward model needs one output label, this one has {model.config.num_labels}")
    if tokenizer is not None:
        match_tokenizer(model, tokenizer, path)
    return model


def match_tokenizer(model, tokenizer, path: str) -> None:
    """Check the tokenizer fits the embedding; set the model's pad token id (batches > 1 need it)."""
    vocab = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > vocab:
        raise UserError(f"{path}: the tokenizer has {len(tokenizer)} tokens but the model's embedding only {vocab}")
    model.config.pad_token_id = tokenizer.pad_token_id
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.pad_token_id = tokenizer.pad_token_id
